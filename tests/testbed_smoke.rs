//! Smoke tests of the test bed through the project's own Kubernetes client:
//! each one asserts the behaviour of a real kube-apiserver, etcd and
//! kube-controller-manager.

mod support;

use std::time::Duration;

use nexo_manager::kube::ApplyParams;
use nexo_manager::kube::client::Method;
use serde_json::{Value, json};
use support::{testbed, wait_for};

fn configmap(name: &str, data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data})
}

#[test]
fn runs_the_pinned_kubernetes_release() {
    let tb = testbed();
    let version: Value = tb.admin().get("/version").expect("GET /version");
    assert_eq!(version["gitVersion"], json!(tb.version));
    // The release asked for (NEXO_K8S_VERSION), else the newest supported.
    let supported = std::process::Command::new("bash")
        .arg(support::script())
        .args(["bin", "--versions"])
        .output()
        .expect("testbed.sh bin --versions");
    let supported = String::from_utf8(supported.stdout).unwrap();
    let supported: Vec<&str> = supported.split_whitespace().collect();
    let wanted = std::env::var("NEXO_K8S_VERSION")
        .unwrap_or_else(|_| supported.last().expect("supported releases").to_string());
    assert!(
        supported.contains(&wanted.as_str()),
        "{wanted} not in {supported:?}"
    );
    assert_eq!(tb.version, wanted);
}

#[test]
fn configmaps_create_get_list_paged_apply_delete() {
    let tb = testbed();
    let ns = tb.namespace("smoke-cm");
    let client = tb.admin();
    let collection = format!("/api/v1/namespaces/{}/configmaps", ns.name);

    for i in 0..7 {
        let created = client
            .create(
                &collection,
                &configmap(&format!("cm-{i}"), json!({"i": i.to_string()})),
            )
            .expect("create");
        assert_eq!(created["metadata"]["name"], format!("cm-{i}"));
    }
    // Creating the same name again is refused with AlreadyExists.
    let again = client
        .create(&collection, &configmap("cm-0", json!({})))
        .unwrap_err();
    assert_eq!(
        (again.status(), again.reason()),
        (Some(409), Some("AlreadyExists"))
    );

    let got: Value = client.get(&format!("{collection}/cm-3")).expect("get");
    assert_eq!(got["data"]["i"], "3");

    // Paging: 7 objects (plus the namespace's kube-root-ca.crt, when the
    // controller manager has made it) with pages of 3.
    let selector = "!nonexistent-label";
    let (first, token) = client
        .list_page(&collection, Some(selector), 3, None)
        .expect("first page");
    assert_eq!(first.len(), 3);
    let token = token.expect("a continue token on the first page of a longer list");
    let (second, _) = client
        .list_page(&collection, Some(selector), 3, Some(&token))
        .expect("second page");
    assert_eq!(second.len(), 3);
    assert_ne!(first[0]["metadata"]["name"], second[0]["metadata"]["name"]);
    let mut names = Vec::new();
    let mut pages = 0;
    let mut token = None;
    loop {
        let (items, next) = client
            .list_page(&collection, None, 3, token.as_deref())
            .unwrap();
        pages += 1;
        names.extend(
            items
                .iter()
                .map(|o| o["metadata"]["name"].as_str().unwrap().to_owned()),
        );
        match next {
            Some(n) => token = Some(n),
            None => break,
        }
    }
    let ours: Vec<_> = names.iter().filter(|n| n.starts_with("cm-")).collect();
    assert_eq!(ours.len(), 7, "all objects across pages: {names:?}");
    assert!(
        pages >= 3,
        "7+ objects in pages of 3 take 3 pages or more, took {pages}"
    );
    let mut each = 0;
    client
        .list_each(&collection, None, 2, |_| each += 1)
        .unwrap();
    assert_eq!(each, names.len());

    // Server-side apply as nexo-manager: creates, then is a no-op when repeated.
    let path = format!("{collection}/applied");
    let desired = configmap("applied", json!({"k": "v"}));
    let applied = client
        .apply(&path, &desired, ApplyParams::WRITE)
        .expect("apply");
    let rv = applied["metadata"]["resourceVersion"].clone();
    let managers = applied["metadata"]["managedFields"].as_array().unwrap();
    assert!(
        managers
            .iter()
            .any(|m| m["manager"] == "nexo-manager" && m["operation"] == "Apply")
    );
    let repeated = client
        .apply(&path, &desired, ApplyParams::WRITE)
        .expect("apply again");
    assert_eq!(
        repeated["metadata"]["resourceVersion"], rv,
        "a repeated apply changes nothing"
    );
    // A dry run validates without persisting.
    let dry = client
        .apply(
            &path,
            &configmap("applied", json!({"k": "dry"})),
            ApplyParams::DRY_RUN,
        )
        .unwrap();
    assert_eq!(dry["data"]["k"], "dry");
    let stored: Value = client.get(&path).unwrap();
    assert_eq!(stored["data"]["k"], "v");

    client.delete(&path, "Background").expect("delete");
    let gone = client.get::<Value>(&path).unwrap_err();
    assert!(gone.is_not_found(), "{gone}");
    assert_eq!(gone.reason(), Some("NotFound"));
    assert!(client.get_opt::<Value>(&path).unwrap().is_none());
}

#[test]
fn nexoproxy_crd_enforces_its_schema() {
    let tb = testbed();
    tb.install_crds();
    let ns = tb.namespace("smoke-crd");
    let client = tb.admin();
    let collection = format!("/apis/nexo.io/v1alpha1/namespaces/{}/nexoproxies", ns.name);
    let valid = json!({"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy", "metadata": {"name": "orders"},
        "spec": {"image": "registry.example.com/nexo/proxy:1.4.2", "mongodb": {"secretRef": {"name": "orders-db"}}}});
    let created = client
        .create(&collection, &valid)
        .expect("a valid NexoProxy is accepted");
    // Defaults come from the structural schema.
    assert_eq!(created["spec"]["replicas"], 1);
    assert_eq!(created["spec"]["listenPort"], 27017);

    let invalid = [
        (
            "replicas-not-a-number",
            json!({"image": "proxy:1", "replicas": "three", "mongodb": {"secretRef": {"name": "s"}}}),
        ),
        (
            "negative-replicas",
            json!({"image": "proxy:1", "replicas": -1, "mongodb": {"secretRef": {"name": "s"}}}),
        ),
        (
            "missing-image",
            json!({"mongodb": {"secretRef": {"name": "s"}}}),
        ),
        ("missing-mongodb", json!({"image": "proxy:1"})),
        (
            "port-out-of-range",
            json!({"image": "proxy:1", "listenPort": 70000, "mongodb": {"secretRef": {"name": "s"}}}),
        ),
    ];
    for (name, spec) in invalid {
        let obj = json!({"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy", "metadata": {"name": name}, "spec": spec});
        let err = client.create(&collection, &obj).expect_err(name);
        assert_eq!(
            (err.status(), err.reason()),
            (Some(422), Some("Invalid")),
            "{name}: {err}"
        );
    }
    // Nothing invalid was stored.
    let (items, _) = client.list_page(&collection, None, 50, None).unwrap();
    assert_eq!(items.len(), 1);

    // The pipeline CRD's reference kinds are an enum.
    let pipelines = format!(
        "/apis/nexo.io/v1alpha1/namespaces/{}/nexopipelines",
        ns.name
    );
    let bad = json!({"apiVersion": "nexo.io/v1alpha1", "kind": "NexoPipeline", "metadata": {"name": "p"},
        "spec": {"references": [{"kind": "Deployment", "name": "x"}]}});
    let err = client.create(&pipelines, &bad).unwrap_err();
    assert_eq!(err.status(), Some(422), "{err}");
}

#[test]
fn garbage_collector_removes_dependents_of_a_deleted_owner() {
    let tb = testbed();
    let ns = tb.namespace("smoke-gc");
    let client = tb.admin();
    let collection = format!("/api/v1/namespaces/{}/configmaps", ns.name);
    let owner = client
        .create(&collection, &configmap("owner", json!({})))
        .unwrap();
    let uid = owner["metadata"]["uid"].as_str().unwrap();
    let mut dependent = configmap("dependent", json!({}));
    dependent["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}]);
    client.create(&collection, &dependent).unwrap();
    // An unrelated object stays.
    client
        .create(&collection, &configmap("bystander", json!({})))
        .unwrap();

    client
        .delete(&format!("{collection}/owner"), "Background")
        .unwrap();
    wait_for(
        Duration::from_secs(60),
        "the garbage collector to delete the dependent",
        || {
            matches!(
                client.get_opt::<Value>(&format!("{collection}/dependent")),
                Ok(None)
            )
            .then_some(())
        },
    );
    assert!(
        client
            .get_opt::<Value>(&format!("{collection}/bystander"))
            .unwrap()
            .is_some()
    );
}

#[test]
fn service_account_without_rbac_is_forbidden() {
    let tb = testbed();
    let ns = tb.namespace("smoke-rbac");
    let admin = tb.admin();
    admin
        .create(
            &format!("/api/v1/namespaces/{}/serviceaccounts", ns.name),
            &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "nobody"}}),
        )
        .unwrap();
    let token = tb.token(&ns.name, "nobody");
    let client = tb.client_with_token(&token);
    // Authenticated (not 401) but not authorized.
    let err = client
        .get::<Value>(&format!("/api/v1/namespaces/{}/configmaps", ns.name))
        .unwrap_err();
    assert_eq!(
        (err.status(), err.reason()),
        (Some(403), Some("Forbidden")),
        "{err}"
    );
    assert!(
        !err.to_string().contains(&token),
        "the token must not reach error text"
    );
    // The same read as admin works, so the 403 is RBAC and not a broken path.
    admin
        .request(
            Method::GET,
            &format!("/api/v1/namespaces/{}/configmaps", ns.name),
            None,
        )
        .unwrap();
}
