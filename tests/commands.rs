//! Commands end to end: the real binary, the CP simulator and the real test
//! bed. Every test reads the cluster back.

mod support;

use std::time::Duration;

use nexo_cpsim::{Endpoint, Fault, FaultAction};
use nexo_manager::kube::Client;
use serde_json::{Value, json};
use support::commands::{ack_of, command, configmap, ns_path, proxy, secret, wait_ack};
use support::fixture::Fixture;
use support::manager::{Manager, STOP_WAIT};

const WAIT: Duration = Duration::from_secs(60);
const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn crd_deploy(f: &Fixture, id: &str, name: &str) -> Value {
    command(
        id,
        "deploy",
        json!({"deployment": {"name": name, "namespace": f.ns.name}, "format": "crd",
        "manifests": [proxy(name), configmap(&format!("{name}-config")), secret(&format!("{name}-db"))]}),
    )
}

fn legacy_deployment(name: &str) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
           "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [{"name": "proxy", "image": "registry.example.com/nexo/proxy:1.3.0"}]}}}})
}

fn get(c: &Client, path: &str) -> Option<Value> {
    c.get_opt::<Value>(path).unwrap()
}

fn actions(ack: &Value) -> Vec<(String, String)> {
    ack["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                format!(
                    "{}/{}",
                    r["kind"].as_str().unwrap(),
                    r["name"].as_str().unwrap()
                ),
                r["action"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// [`actions`], sorted.
fn sorted_actions(ack: &Value) -> Vec<(String, String)> {
    let mut got = actions(ack);
    got.sort();
    got
}

/// Sends an uninstall of `name` and waits for its ack.
fn uninstall(f: &Fixture, m: &mut Manager, id: &str, name: &str) -> Value {
    let payload = json!({"deployment": {"name": name, "namespace": f.ns.name}});
    f.sim
        .enqueue_command(&f.env_id, command(id, "uninstall", payload));
    wait_ack(f, m, id)
}

/// An ack's result and its resources' actions.
fn ack_line(ack: &Value) -> (&str, Vec<(String, String)>) {
    (ack["result"].as_str().unwrap_or_default(), actions(ack))
}

/// A fixture with the CRDs, and its Manager with probes on (on a port of
/// its own: a test may read its /metrics).
fn start(prefix: &str) -> (Fixture, Manager) {
    let f = Fixture::new(prefix);
    let m = f.spawn_with_probes(&[]);
    (f, m)
}

/// The ack requests posted for `id`, in the order they were sent.
fn ack_posts(f: &Fixture, id: &str) -> Vec<nexo_cpsim::LoggedRequest> {
    let path = format!("/commands/{id}/ack");
    f.sim
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with(&path))
        .collect()
}

#[test]
fn deploy_crd_then_rollout_then_uninstall_with_garbage_collection() {
    let (f, mut m) = start("cmd-crd");
    let c = f.tb.admin();
    let started = std::time::Instant::now();
    f.sim
        .enqueue_command(&f.env_id, crd_deploy(&f, "deploy-1", "orders"));
    let ack = wait_ack(&f, &mut m, "deploy-1");
    eprintln!(
        "deploy of 3 objects acknowledged in {:?} (including the heartbeat wait)",
        started.elapsed()
    );
    m.check(
        ack["result"] == "applied",
        &format!("deploy applied: {ack}"),
    );
    let got = sorted_actions(&ack);
    assert_eq!(
        got,
        [
            ("ConfigMap/orders-config".into(), "created".into()),
            ("NexoProxy/orders".into(), "created".into()),
            ("Secret/orders-db".into(), "created".into())
        ]
    );

    let p = get(&c, &ns_path(&f, "NexoProxy", "orders")).expect("the NexoProxy exists");
    assert_eq!(p["metadata"]["labels"]["nexo.io/owner-id"], json!(f.env_id));
    assert_eq!(
        p["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "nexo-manager"
    );
    assert_eq!(p["metadata"]["labels"]["nexo.io/deployment"], "orders");
    // As an apply made it, the proof (set once the uid was known) with it.
    let entries = p["metadata"]["managedFields"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0]["manager"], "nexo-manager");
    assert_eq!(entries[0]["operation"], "Apply");
    assert!(
        !entries[0]["fieldsV1"]["f:metadata"]["f:annotations"]["f:nexo.io/proof"].is_null(),
        "{entries:?}"
    );
    let uid = p["metadata"]["uid"].as_str().unwrap();
    for (kind, name) in [("ConfigMap", "orders-config"), ("Secret", "orders-db")] {
        let o = get(&c, &ns_path(&f, kind, name)).unwrap();
        assert_eq!(
            o["metadata"]["ownerReferences"][0]["uid"], uid,
            "{kind} is owned by the NexoProxy"
        );
        assert_eq!(o["metadata"]["labels"]["nexo.io/owner-id"], json!(f.env_id));
    }

    // Repeating the deploy changes nothing.
    let rv = p["metadata"]["resourceVersion"].clone();
    f.sim
        .enqueue_command(&f.env_id, crd_deploy(&f, "deploy-2", "orders"));
    let ack = wait_ack(&f, &mut m, "deploy-2");
    assert!(actions(&ack).iter().all(|(_, a)| a == "unchanged"), "{ack}");
    assert_eq!(
        get(&c, &ns_path(&f, "NexoProxy", "orders")).unwrap()["metadata"]["resourceVersion"],
        rv
    );

    // Rollout to a new tag, then the inventory shows it.
    f.sim.enqueue_command(
        &f.env_id,
        command("rollout-1", "rollout", json!({"imageTag": "1.4.3"})),
    );
    let ack = wait_ack(&f, &mut m, "rollout-1");
    assert_eq!(ack["result"], "applied", "{ack}");
    assert_eq!(
        actions(&ack),
        [("NexoProxy/orders".into(), "configured".into())]
    );
    let p = get(&c, &ns_path(&f, "NexoProxy", "orders")).unwrap();
    assert_eq!(p["spec"]["image"], "registry.example.com/nexo/proxy:1.4.3");
    assert_eq!(p["spec"]["replicas"], 2, "rollout touches the image only");
    let seen = f.sim.heartbeats().len();
    m.wait_until(WAIT, "a heartbeat reporting the new image", || {
        f.sim.heartbeats().len() > seen + 1
    });
    let hb = f.sim.heartbeats().pop().unwrap();
    assert_eq!(
        hb["deployments"][0]["image"],
        "registry.example.com/nexo/proxy:1.4.3"
    );

    // A later deploy wins over the rollout's update of the image (the Manager's own field).
    f.sim
        .enqueue_command(&f.env_id, crd_deploy(&f, "deploy-3", "orders"));
    let ack = wait_ack(&f, &mut m, "deploy-3");
    assert_eq!(ack["result"], "applied", "{ack}");
    let p = get(&c, &ns_path(&f, "NexoProxy", "orders")).unwrap();
    assert_eq!(p["spec"]["image"], "registry.example.com/nexo/proxy:1.4.2");

    // Uninstall: the NexoProxy goes; the garbage collector removes its runtime objects.
    let ack = uninstall(&f, &mut m, "uninstall-1", "orders");
    assert_eq!(
        ack_line(&ack),
        (
            "applied",
            vec![("NexoProxy/orders".into(), "deleted".into())]
        )
    );
    support::wait_for(WAIT, "garbage collection of the runtime objects", || {
        (get(&c, &ns_path(&f, "NexoProxy", "orders")).is_none()
            && get(&c, &ns_path(&f, "ConfigMap", "orders-config")).is_none()
            && get(&c, &ns_path(&f, "Secret", "orders-db")).is_none())
        .then_some(())
    });
    // Uninstall is idempotent.
    let ack = uninstall(&f, &mut m, "uninstall-2", "orders");
    assert_eq!(
        ack_line(&ack),
        (
            "applied",
            vec![("NexoProxy/orders".into(), "absent".into())]
        )
    );
}

/// A `crd` deploy's NexoPipeline belongs to its NexoProxy as its
/// ConfigMaps and Secrets do: the uninstall of the NexoProxy takes it too
/// (the garbage collector), and nothing of the deployment stays behind.
#[test]
fn an_uninstall_takes_the_deployments_nexopipeline_with_it() {
    let (f, mut m) = start("cmd-pipe");
    let c = f.tb.admin();
    let pipeline = json!({"apiVersion": "nexo.io/v1alpha1", "kind": "NexoPipeline",
        "metadata": {"name": "orders-pipeline"},
        "spec": {"references": [{"kind": "NexoProxy", "name": "orders"}, {"kind": "ConfigMap", "name": "orders-config"}]}});
    let deploy = command(
        "deploy-pipe",
        "deploy",
        json!({"deployment": {"name": "orders", "namespace": f.ns.name}, "format": "crd",
        "manifests": [proxy("orders"), configmap("orders-config"), pipeline]}),
    );
    f.sim.enqueue_command(&f.env_id, deploy);
    let ack = wait_ack(&f, &mut m, "deploy-pipe");
    m.check(
        ack["result"] == "applied",
        &format!("deploy applied: {ack}"),
    );
    let proxy_uid =
        get(&c, &ns_path(&f, "NexoProxy", "orders")).unwrap()["metadata"]["uid"].clone();
    let p =
        get(&c, &ns_path(&f, "NexoPipeline", "orders-pipeline")).expect("the NexoPipeline exists");
    assert_eq!(
        p["metadata"]["ownerReferences"][0]["uid"], proxy_uid,
        "the NexoPipeline belongs to its NexoProxy: {p}"
    );
    let ack = uninstall(&f, &mut m, "uninstall-pipe", "orders");
    assert_eq!(ack["result"], "applied", "{ack}");
    support::wait_for(WAIT, "garbage collection of the NexoPipeline", || {
        (get(&c, &ns_path(&f, "NexoProxy", "orders")).is_none()
            && get(&c, &ns_path(&f, "ConfigMap", "orders-config")).is_none()
            && get(&c, &ns_path(&f, "NexoPipeline", "orders-pipeline")).is_none())
        .then_some(())
    });
}

#[test]
fn legacy_deploy_and_uninstall_by_label() {
    let (f, mut m) = start("cmd-legacy");
    let c = f.tb.admin();
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "billing"},
                     "spec": {"selector": {"app": "billing"}, "ports": [{"port": 27017}]}});
    f.sim.enqueue_command(&f.env_id, command("legacy-1", "deploy", json!({"deployment": {"name": "billing", "namespace": f.ns.name},
        "format": "legacy", "manifests": [legacy_deployment("billing"), svc, configmap("billing-config")]})));
    let ack = wait_ack(&f, &mut m, "legacy-1");
    assert_eq!(ack["result"], "applied", "{ack}");
    let d = get(&c, &ns_path(&f, "Deployment", "billing")).unwrap();
    assert_eq!(d["metadata"]["labels"]["nexo.io/owner-id"], json!(f.env_id));
    assert!(
        d["metadata"].get("ownerReferences").is_none(),
        "legacy objects get no owner reference"
    );
    // An unrelated ConfigMap in the namespace, not labelled: untouched by the uninstall.
    c.create(
        &format!("/api/v1/namespaces/{}/configmaps", f.ns.name),
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bystander"}}),
    )
    .unwrap();
    f.sim.enqueue_command(
        &f.env_id,
        command(
            "legacy-2",
            "uninstall",
            json!({"deployment": {"name": "billing", "namespace": f.ns.name}}),
        ),
    );
    let ack = wait_ack(&f, &mut m, "legacy-2");
    let got = sorted_actions(&ack);
    assert_eq!(
        got,
        [
            ("ConfigMap/billing-config".into(), "deleted".into()),
            ("Deployment/billing".into(), "deleted".into()),
            ("Service/billing".into(), "deleted".into())
        ],
        "{ack}"
    );
    assert!(get(&c, &ns_path(&f, "Service", "billing")).is_none());
    assert!(get(&c, &ns_path(&f, "ConfigMap", "bystander")).is_some());
}

#[test]
fn upgrade_patches_the_managers_own_deployment_only_with_a_digest() {
    let (f, mut m) = start("cmd-upgrade");
    let c = f.tb.admin();
    let mut own = legacy_deployment("nexo-manager");
    own["spec"]["template"]["spec"]["containers"] = json!([{"name": "manager", "image": "registry.example.com/nexo/manager:0.2.0"}, {"name": "sidecar", "image": "s:1"}]);
    c.create(
        &format!("/apis/apps/v1/namespaces/{}/deployments", f.ns.name),
        &own,
    )
    .unwrap();
    // The deployment controller writes status; the spec's generation tells a change.
    let generation = |c: &Client| {
        get(c, &ns_path(&f, "Deployment", "nexo-manager")).unwrap()["metadata"]["generation"]
            .clone()
    };
    let before = generation(&c);
    f.sim.enqueue_command(&f.env_id, command("up-tag", "upgrade", json!({"bundleVersion": "0.3.0", "managerImage": "registry.example.com/nexo/manager:0.3.0"})));
    let ack = wait_ack(&f, &mut m, "up-tag");
    assert_eq!(ack["result"], "failed");
    assert!(
        ack["message"]
            .as_str()
            .unwrap()
            .starts_with("invalid payload: managerImage"),
        "{ack}"
    );
    assert_eq!(generation(&c), before, "a refused upgrade changes nothing");
    let image = format!("registry.example.com/nexo/manager@{DIGEST}");
    f.sim.enqueue_command(
        &f.env_id,
        command(
            "up-1",
            "upgrade",
            json!({"bundleVersion": "0.3.0", "managerImage": image}),
        ),
    );
    let ack = wait_ack(&f, &mut m, "up-1");
    assert_eq!(ack["result"], "applied", "{ack}");
    let d = get(&c, &ns_path(&f, "Deployment", "nexo-manager")).unwrap();
    let cs = d["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(cs[0]["image"], json!(image));
    assert_eq!(cs[1]["image"], "s:1", "the other container is untouched");
    // The new pod reports, and compares downgrades with, the bundle it runs;
    // the chart reads the annotation (a helm upgrade never takes it back).
    assert_eq!(
        cs[0]["env"],
        json!([{"name": "NEXO_BUNDLE_VERSION", "value": "0.3.0"}]),
        "{d}"
    );
    assert!(
        cs[1].get("env").is_none(),
        "the other container has no env: {d}"
    );
    assert_eq!(
        d["metadata"]["annotations"]["nexo.io/upgraded-bundle"],
        "0.3.0"
    );
    // And it owns none of it: a server-side apply of a newer chart (Helm 4)
    // would otherwise conflict with nexo-manager.
    let managers: Vec<(&str, &str)> = d["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["manager"].as_str().unwrap(),
                e["operation"].as_str().unwrap(),
            )
        })
        .collect();
    assert!(
        !managers.contains(&("nexo-manager", "Update")),
        "the Manager handed its fields back: {managers:?}"
    );
}

#[test]
fn with_self_upgrade_off_upgrade_is_not_advertised_and_refused() {
    let f = Fixture::new("cmd-no-upgrade");
    let mut m = f.spawn_with_probes(&[("NEXO_ALLOW_SELF_UPGRADE", "false")]);
    let c = f.tb.admin();
    let mut own = legacy_deployment("nexo-manager");
    own["spec"]["template"]["spec"]["containers"] =
        json!([{"name": "manager", "image": "registry.example.com/nexo/manager:0.2.0"}]);
    let own = c
        .create(
            &format!("/apis/apps/v1/namespaces/{}/deployments", f.ns.name),
            &own,
        )
        .unwrap();
    let image = format!("registry.example.com/nexo/manager@{DIGEST}");
    f.sim.enqueue_command(
        &f.env_id,
        command(
            "up-off",
            "upgrade",
            json!({"bundleVersion": "0.9.0", "managerImage": image}),
        ),
    );
    let ack = wait_ack(&f, &mut m, "up-off");
    assert_eq!(ack["result"], "failed", "{ack}");
    assert_eq!(
        ack["message"], "unsupported capability: command.upgrade",
        "{ack}"
    );
    // The deployment controller writes status; the spec's generation
    // tells a change.
    let d = get(&c, &ns_path(&f, "Deployment", "nexo-manager")).unwrap();
    assert_eq!(
        (
            &d["metadata"]["generation"],
            &d["metadata"]["annotations"]["nexo.io/upgraded-bundle"]
        ),
        (&own["metadata"]["generation"], &Value::Null),
        "a refused upgrade changes nothing: {d}"
    );
    for (what, body) in [
        (
            "connect",
            f.sim
                .requests()
                .into_iter()
                .find(|r| r.path.ends_with("/connect")),
        ),
        (
            "heartbeat",
            f.sim
                .requests()
                .into_iter()
                .find(|r| r.path.ends_with("/heartbeat")),
        ),
    ] {
        let body: Value =
            serde_json::from_slice(&body.unwrap_or_else(|| panic!("no {what}")).body).unwrap();
        let caps = body["manager"]["capabilities"].as_array().unwrap();
        assert!(
            !caps.contains(&json!("command.upgrade")) && caps.contains(&json!("command.rollout")),
            "the {what} advertises {caps:?}"
        );
    }
    m.stop_expecting_exit_0();
}

#[test]
fn refusals_change_nothing() {
    let (f, mut m) = start("cmd-refuse");
    let c = f.tb.admin();
    let ns = f.ns.name.clone();
    let other_env =
        json!({"app.kubernetes.io/managed-by": "nexo-manager", "nexo.io/owner-id": "env-other"});
    let legacy = json!({"app.kubernetes.io/part-of": "nexo"});
    let mk = |name: &str, labels: Value| {
        c.create(&format!("/api/v1/namespaces/{ns}/configmaps"), &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "labels": labels}, "data": {"k": "v"}})).unwrap()
    };
    mk("foreign-config", other_env.clone());
    mk("legacy-config", legacy.clone());
    mk("unrelated-config", json!({"team": "db"}));
    f.create_proxy("theirs", other_env, 1, "proxy:1");
    let snapshot = || -> Vec<(String, Value)> {
        let mut out = Vec::new();
        for (kind, path) in [
            ("configmaps", format!("/api/v1/namespaces/{ns}/configmaps")),
            (
                "nexoproxies",
                format!("/apis/nexo.io/v1alpha1/namespaces/{ns}/nexoproxies"),
            ),
        ] {
            c.list_each(&path, None, 100, |o| {
                out.push((
                    format!("{kind}/{}", o["metadata"]["name"].as_str().unwrap()),
                    o["metadata"]["resourceVersion"].clone(),
                ))
            })
            .unwrap();
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    };
    let before = snapshot();
    let deploy_over = |id: &str, cm: &str, adopt: bool| {
        command(
            id,
            "deploy",
            json!({"deployment": {"name": "orders", "namespace": ns}, "format": "crd", "migration": {"adoptLegacy": adopt},
            "manifests": [proxy("orders"), configmap(cm)]}),
        )
    };
    let mut bad_schema = proxy("orders");
    bad_schema["spec"]["replicas"] = json!(-3);
    let cases: Vec<(Value, &str)> = vec![
        (
            deploy_over("r-foreign", "foreign-config", true),
            "belongs to environment env-other",
        ),
        (
            deploy_over("r-legacy-cluster-closed", "legacy-config", true),
            "legacy",
        ),
        (
            deploy_over("r-legacy-command-closed", "legacy-config", false),
            "legacy",
        ),
        (
            deploy_over("r-unrelated", "unrelated-config", true),
            "not managed by nexo-manager",
        ),
        (
            command(
                "r-cluster-scoped",
                "deploy",
                json!({"deployment": {"name": "orders", "namespace": ns}, "format": "crd",
            "manifests": [proxy("orders"), {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "evil"}}]}),
            ),
            "invalid payload: manifests[1]: Namespace is cluster-scoped",
        ),
        (
            command(
                "r-kind",
                "deploy",
                json!({"deployment": {"name": "orders", "namespace": ns}, "format": "crd",
            "manifests": [proxy("orders"), legacy_deployment("x")]}),
            ),
            "invalid payload: manifests[1]: apps/v1 Deployment is not allowed",
        ),
        (
            command(
                "r-wrong-ns",
                "deploy",
                json!({"deployment": {"name": "orders", "namespace": ns}, "format": "crd",
            "manifests": [proxy("orders"), {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "default"}}]}),
            ),
            "differs from deployment.namespace",
        ),
        (
            command(
                "r-unmanaged-ns",
                "deploy",
                json!({"deployment": {"name": "orders", "namespace": "default"}, "format": "crd", "manifests": [proxy("orders")]}),
            ),
            "invalid payload: namespace default is not managed",
        ),
        (
            command(
                "r-dry-run",
                "deploy",
                json!({"deployment": {"name": "orders", "namespace": ns}, "format": "crd",
            "manifests": [configmap("fine-config"), bad_schema, secret("fine-secret")]}),
            ),
            "dry run refused, nothing applied",
        ),
        (
            command(
                "r-rollout-theirs",
                "rollout",
                json!({"imageTag": "9.9", "targets": [{"name": "theirs", "namespace": ns}]}),
            ),
            "belongs to environment env-other",
        ),
        (
            command(
                "r-rollout-absent",
                "rollout",
                json!({"imageTag": "9.9", "targets": [{"name": "nothing", "namespace": ns}]}),
            ),
            "does not exist",
        ),
        (
            command(
                "r-uninstall-theirs",
                "uninstall",
                json!({"deployment": {"name": "theirs", "namespace": ns}}),
            ),
            "belongs to environment env-other",
        ),
    ];
    for (cmd, _) in &cases {
        f.sim.enqueue_command(&f.env_id, cmd.clone());
    }
    for (cmd, needle) in &cases {
        let id = cmd["id"].as_str().unwrap();
        let ack = wait_ack(&f, &mut m, id);
        m.check(ack["result"] == "failed", &format!("{id} must fail: {ack}"));
        m.check(
            ack["message"].as_str().unwrap().contains(needle),
            &format!("{id}: message should contain {needle:?}: {ack}"),
        );
    }
    assert_eq!(snapshot(), before, "no refusal changed anything");
    assert!(
        get(&c, &ns_path(&f, "ConfigMap", "fine-config")).is_none(),
        "the dry run failure applied nothing"
    );
}

#[test]
fn the_migration_gate_adopts_a_legacy_object_when_both_halves_are_open() {
    let f = Fixture::new("cmd-gate");
    f.tb.install_crds();
    let c = f.tb.admin();
    c.create(&format!("/api/v1/namespaces/{}/configmaps", f.ns.name), &json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "orders-config", "labels": {"app.kubernetes.io/part-of": "nexo"}}, "data": {"listen": "1"}})).unwrap();
    let mut env = f.env();
    env.insert("NEXO_ALLOW_LEGACY_ADOPTION".into(), "true".into());
    let mut m = f.spawn(&env);
    f.sim.enqueue_command(&f.env_id, command("adopt-1", "deploy", json!({"deployment": {"name": "orders", "namespace": f.ns.name},
        "format": "crd", "migration": {"adoptLegacy": true}, "manifests": [proxy("orders"), configmap("orders-config")]})));
    let ack = wait_ack(&f, &mut m, "adopt-1");
    assert_eq!(ack["result"], "applied", "{ack}");
    assert!(
        actions(&ack).contains(&("ConfigMap/orders-config".into(), "configured".into())),
        "{ack}"
    );
    let cm = get(&c, &ns_path(&f, "ConfigMap", "orders-config")).unwrap();
    assert_eq!(
        cm["metadata"]["labels"]["nexo.io/owner-id"],
        json!(f.env_id)
    );
    assert_eq!(cm["data"]["listen"], "27017");
}

#[test]
fn a_bad_input_corpus_in_one_batch_with_one_good_command() {
    let (f, mut m) = start("cmd-corpus");
    let ns = f.ns.name.clone();
    let mut bad: Vec<Value> = vec![
        json!({"id": "b01", "class": "explode", "payload": {}}),
        json!({"id": "b02", "class": ["deploy"], "payload": {}}),
        json!({"id": "b03", "class": "deploy"}),
        json!({"id": "b04", "class": "deploy", "payload": "yes"}),
        json!({"id": "b05", "class": "deploy", "payload": {"deployment": {"name": 5, "namespace": ns}}}),
        json!({"id": "b06", "class": "deploy", "payload": {"deployment": {"name": "x", "namespace": ns}, "format": "crd", "manifests": "all"}}),
        json!({"id": "b07", "class": "deploy", "payload": {"deployment": {"name": "x", "namespace": ns}, "format": "crd", "manifests": [42]}}),
        json!({"id": "b08", "class": "deploy", "payload": {"deployment": {"name": "x", "namespace": ns}, "format": "crd", "manifests": vec![proxy("x"); 65]}}),
        json!({"id": "b09", "class": "deploy", "payload": {"deployment": {"name": "x", "namespace": ns}, "format": "crd", "manifests": [proxy("x"), {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"}, "data": {"b": "x".repeat(300 * 1024)}}]}}),
        json!({"id": "b10", "class": "deploy", "payload": {"deployment": {"name": "x", "namespace": ns}, "format": "crd", "manifests": [proxy("x"), {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "root"}}]}}),
        json!({"id": "b11", "class": "deploy", "payload": {"deployment": {"name": "x", "namespace": ns}, "format": "legacy", "manifests": [proxy("x")]}}),
        json!({"id": "b12", "class": "deploy", "payload": {"deployment": {"name": "x", "namespace": ns}, "format": "yaml", "manifests": [proxy("x")]}}),
        json!({"id": "b13", "class": "deploy", "payload": {"deployment": {"name": "x", "namespace": ns}, "format": "crd", "manifests": [proxy("y")]}}),
        json!({"id": "b14", "class": "deploy", "payload": {"deployment": {"name": "x", "namespace": ns}, "format": "crd", "manifests": [proxy("x"), proxy("x")]}}),
        json!({"id": "b15", "class": "deploy", "payload": {"deployment": {"name": "x", "namespace": "kube-system"}, "format": "crd", "manifests": [proxy("x")]}}),
        json!({"id": "b16", "class": "deploy", "requires": ["command.deploy.helm"], "payload": {}}),
        json!({"id": "b17", "class": "deploy", "requires": [7], "payload": {}}),
        json!({"id": "b18", "class": "rollout", "payload": {"imageTag": "../../etc"}}),
        json!({"id": "b19", "class": "rollout", "payload": {"imageTag": "sha256:short"}}),
        json!({"id": "b20", "class": "rollout", "payload": {"targets": {"name": "x"}}}),
        json!({"id": "b21", "class": "upgrade", "payload": {"bundleVersion": "1", "managerImage": "manager:latest"}}),
        json!({"id": "b22", "class": "upgrade", "payload": {"bundleVersion": 1, "managerImage": format!("m@{DIGEST}")}}),
        json!({"id": "b23", "class": "uninstall", "payload": {"deployment": {"name": "x"}}}),
        json!({"id": "b24", "class": "uninstall", "payload": {"deployment": {"name": "x", "namespace": "../x"}}}),
        json!({"id": "b25", "class": "deploy", "payload": {"deployment": {"name": "x", "namespace": ns}, "format": "crd", "migration": true, "manifests": [proxy("x")]}}),
        json!({"id": "b26", "class": null, "payload": {}}),
    ];
    let mut long_name = proxy("x");
    long_name["metadata"]["name"] = json!("x".repeat(300));
    bad.push(json!({"id": "b27", "class": "deploy", "payload": {"deployment": {"name": "x", "namespace": ns}, "format": "crd", "manifests": [proxy("x"), long_name]}}));
    for c in &bad {
        f.sim.enqueue_command(&f.env_id, c.clone());
    }
    f.sim
        .enqueue_command(&f.env_id, json!({"class": "deploy", "payload": {}}));
    f.sim
        .enqueue_command(&f.env_id, crd_deploy(&f, "good-1", "orders"));
    let ack = wait_ack(&f, &mut m, "good-1");
    m.check(
        ack["result"] == "applied",
        &format!("the good command is applied: {ack}"),
    );
    for c in &bad {
        let id = c["id"].as_str().unwrap();
        let a = ack_of(&f, id).unwrap_or_else(|| m.fail(&format!("no ack for {id}")));
        m.check(a["result"] == "failed", &format!("{id} failed"));
        let msg = a["message"].as_str().unwrap();
        m.check(
            msg.starts_with("unsupported class")
                || msg.starts_with("unsupported capability")
                || msg.starts_with("invalid payload"),
            &format!("{id}: {msg}"),
        );
    }
    let skipped = m.metric("nexo_manager_commands_refused_total{reason=\"no_id\"}");
    m.check(
        skipped == Some(1.0),
        &format!("the id-less command is skipped: {skipped:?}"),
    );
    let alive = m.running();
    m.check(alive, "the process stays up");
    let c = f.tb.admin();
    let mut names = Vec::new();
    c.list_each(
        &format!(
            "/apis/nexo.io/v1alpha1/namespaces/{}/nexoproxies",
            f.ns.name
        ),
        None,
        100,
        |o| names.push(o["metadata"]["name"].as_str().unwrap().to_owned()),
    )
    .unwrap();
    assert_eq!(names, ["orders"], "nothing from the bad commands");
    eprintln!("bad inputs tried: {} (+1 without an id)", bad.len());
}

#[test]
fn acks_are_retried_then_carried_by_heartbeats() {
    let (f, mut m) = start("cmd-ack");
    f.sim.inject(
        Fault::new(
            Endpoint::Ack,
            FaultAction::Status {
                status: 503,
                code: "busy".into(),
                message: "later".into(),
                retry_after: None,
            },
        )
        .times(3),
    );
    f.sim.enqueue_command(
        &f.env_id,
        command(
            "a-1",
            "uninstall",
            json!({"deployment": {"name": "none", "namespace": f.ns.name}}),
        ),
    );
    let ack = wait_ack(&f, &mut m, "a-1");
    assert_eq!(ack["attempt"], 4, "delivered on attempt 4: {ack}");

    f.sim.inject(
        Fault::new(
            Endpoint::Ack,
            FaultAction::Status {
                status: 503,
                code: "busy".into(),
                message: "later".into(),
                retry_after: None,
            },
        )
        .times(5),
    );
    f.sim.enqueue_command(
        &f.env_id,
        command(
            "a-2",
            "uninstall",
            json!({"deployment": {"name": "none", "namespace": f.ns.name}}),
        ),
    );
    m.wait_until(WAIT, "a-2 in pendingAcks", || {
        f.sim.heartbeats().iter().any(|h| {
            h["pendingAcks"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a["commandId"] == "a-2")
        })
    });
    let ack = wait_ack(&f, &mut m, "a-2");
    assert_eq!(ack["result"], "applied");
    let tries = f
        .sim
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/commands/a-2/ack"))
        .count();
    assert_eq!(tries, 5, "5 attempts in all before pendingAcks");
    let seen = f.sim.heartbeats().len();
    m.wait_until(WAIT, "two more heartbeats", || {
        f.sim.heartbeats().len() >= seen + 2
    });
    let last = f.sim.heartbeats().pop().unwrap();
    assert_eq!(
        last["pendingAcks"],
        json!([]),
        "a delivered pending ack leaves the list"
    );
}

#[test]
fn a_crash_between_execute_and_ack_neither_reexecutes_nor_loses_the_ack() {
    let (f, mut m) = start("cmd-crash");
    let c = f.tb.admin();
    f.sim
        .inject(Fault::new(Endpoint::Ack, FaultAction::Reset).times(100));
    f.sim
        .enqueue_command(&f.env_id, crd_deploy(&f, "crash-1", "orders"));
    m.wait_until(WAIT, "a first ack attempt", || {
        f.sim
            .requests()
            .iter()
            .any(|r| r.path.ends_with("/commands/crash-1/ack"))
    });
    m.signal("KILL");
    m.wait_exit(STOP_WAIT);
    f.sim.clear_faults();
    let rv = get(&c, &ns_path(&f, "NexoProxy", "orders")).expect("executed before the crash")["metadata"]["resourceVersion"].clone();
    assert!(ack_of(&f, "crash-1").is_none());
    // The CP sends the command again; the restarted Manager acknowledges the recorded result.
    f.sim
        .enqueue_command(&f.env_id, crd_deploy(&f, "crash-1", "orders"));
    let mut m2 = f.spawn(&f.env());
    let ack = wait_ack(&f, &mut m2, "crash-1");
    assert_eq!(ack["result"], "applied");
    assert!(
        actions(&ack).iter().all(|(_, a)| a == "created"),
        "the recorded result, not a new run: {ack}"
    );
    // The first Manager's attempts were reset (status 0); an answered one
    // is the second Manager acknowledging the re-sent command (200, or 409
    // when its pendingAcks got there first).
    m2.wait_until(WAIT, "the re-sent command handled", || {
        ack_posts(&f, "crash-1")
            .iter()
            .any(|r| r.done && r.status != 0)
    });
    assert_eq!(
        get(&c, &ns_path(&f, "NexoProxy", "orders")).unwrap()["metadata"]["resourceVersion"],
        rv,
        "not executed again"
    );
    drop(m);
}

#[test]
fn the_same_command_id_twice_is_executed_once() {
    let (f, mut m) = start("cmd-dup");
    let c = f.tb.admin();
    let cmd = crd_deploy(&f, "dup-1", "orders");
    f.sim.enqueue_command(&f.env_id, cmd.clone());
    f.sim.enqueue_command(&f.env_id, cmd.clone());
    let first = wait_ack(&f, &mut m, "dup-1");
    let rv = get(&c, &ns_path(&f, "NexoProxy", "orders")).unwrap()["metadata"]["resourceVersion"]
        .clone();
    f.sim.enqueue_command(&f.env_id, cmd);
    m.wait_until(WAIT, "two re-acknowledgements, answered", || {
        let posts = ack_posts(&f, "dup-1");
        posts.len() >= 3 && posts.iter().all(|r| r.done)
    });
    let posts = ack_posts(&f, "dup-1");
    let statuses: Vec<u16> = posts.iter().map(|r| r.status).collect();
    assert_eq!(
        statuses,
        [200, 409, 409],
        "acknowledged each time, the CP saw it once"
    );
    let bodies: Vec<Value> = posts.iter().map(|r| r.json.clone().unwrap()).collect();
    assert!(
        bodies
            .iter()
            .all(|b| b["result"] == first["result"] && b["message"] == first["message"]),
        "the same result each time"
    );
    // A delivered entry keeps no resources (docs/protocol.md, "State"): the
    // acks sent again after the first was delivered list none.
    assert!(
        bodies[1..].iter().all(|b| b["resources"] == json!([])),
        "{bodies:?}"
    );
    assert_eq!(
        get(&c, &ns_path(&f, "NexoProxy", "orders")).unwrap()["metadata"]["resourceVersion"],
        rv
    );
}

#[test]
fn sigterm_during_a_command_finishes_records_and_acks_it() {
    let (f, mut m) = start("cmd-term");
    f.sim.inject(Fault::new(
        Endpoint::Ack,
        FaultAction::Delay(Duration::from_secs(2)),
    ));
    f.sim
        .enqueue_command(&f.env_id, crd_deploy(&f, "term-1", "orders"));
    // The NexoProxy is applied first: the signal comes while the command's
    // ConfigMap, Secret, record and ack (delayed 2 s) are still to do.
    let c = f.tb.admin();
    m.wait_until(WAIT, "the command's NexoProxy in the cluster", || {
        get(&c, &ns_path(&f, "NexoProxy", "orders")).is_some()
    });
    m.signal("TERM");
    let status = m.wait_exit(STOP_WAIT);
    m.check(status.code() == Some(0), "exit 0 after finishing");
    m.check(
        ack_of(&f, "term-1").is_some_and(|a| a["result"] == "applied" && actions(&a).len() == 3),
        "the whole command was applied and acknowledged",
    );
    let secret: Value =
        f.tb.admin()
            .get(&format!(
                "/api/v1/namespaces/{}/secrets/nexo-manager-state",
                f.ns.name
            ))
            .unwrap();
    assert!(
        secret["data"]["state.json"].is_string(),
        "the result is recorded"
    );
    let state = nexo_manager::state::StateSecret::new(&f.ns.name, "nexo-manager-state", &f.env_id)
        .load(&f.tb.admin())
        .unwrap();
    let entry = state.find("term-1").expect("term-1 in the ledger");
    assert!(
        entry.delivered,
        "the ack is recorded as delivered: {entry:?}"
    );
}

#[test]
fn deep_nesting_and_lone_surrogates_cannot_poison_the_batch() {
    let (f, mut m) = start("cmd-raw");
    let good = crd_deploy(&f, "raw-good", "orders").to_string();
    let deep = format!("{}{}", "[".repeat(400), "]".repeat(400));
    let body = format!(
        r#"{{"commands": [{{"id": "raw-deep", "class": "deploy", "payload": {deep}}}, {{"id": "raw-surrogate", "class": "deploy", "payload": {{"format": "\ud800"}}}}, {good}]}}"#
    );
    f.sim.inject(Fault::new(
        Endpoint::Heartbeat,
        FaultAction::Raw { status: 200, body },
    ));
    let c = f.tb.admin();
    m.wait_until(WAIT, "the good command applied", || {
        get(&c, &ns_path(&f, "NexoProxy", "orders")).is_some()
    });
    let raw_acks = || -> Vec<(String, u16)> {
        f.sim
            .requests()
            .into_iter()
            .filter(|r| r.path.contains("/commands/raw-") && r.done)
            .map(|r| (r.path, r.status))
            .collect()
    };
    m.wait_until(WAIT, "three ack attempts, answered", || {
        raw_acks().len() >= 3
    });
    let ack = |id: &str| {
        f.sim
            .requests()
            .into_iter()
            .find(|r| r.path.ends_with(&format!("/commands/{id}/ack")))
            .and_then(|r| r.json)
            .unwrap()
    };
    assert!(
        ack("raw-deep")["message"]
            .as_str()
            .unwrap()
            .starts_with("invalid payload: recursion limit exceeded")
    );
    assert!(
        ack("raw-surrogate")["message"]
            .as_str()
            .unwrap()
            .starts_with("invalid payload:")
    );
    assert_eq!(ack("raw-good")["result"], "applied");
    // The CP never delivered these through its queue: its 404 counts as
    // delivered, so none is tried again nor carried in a heartbeat.
    let seen = f.sim.heartbeat_count();
    m.wait_until(WAIT, "two more heartbeats", || {
        f.sim.heartbeat_count() >= seen + 2
    });
    let posts = raw_acks();
    m.check(
        posts.len() == 3 && posts.iter().all(|(_, status)| *status == 404),
        &format!("one ack each, answered 404: {posts:?}"),
    );
    let last = f.sim.last_heartbeat().unwrap();
    m.check(
        last["pendingAcks"] == json!([]),
        &format!("no pending ack: {}", last["pendingAcks"]),
    );
    let alive = m.running();
    m.check(alive, "the process stays up");
}

/// Prints the time from a command's arrival (the heartbeat answer that
/// carries it) to its ack, for three-object deploys. A figure, not a bound.
#[test]
fn deploy_latency_figures() {
    let (f, mut m) = start("cmd-latency");
    let mut took = Vec::new();
    for i in 0..20 {
        let id = format!("lat-{i}");
        f.sim
            .enqueue_command(&f.env_id, crd_deploy(&f, &id, &format!("p{i}")));
        wait_ack(&f, &mut m, &id);
        let reqs = f.sim.requests();
        let ack_at = reqs
            .iter()
            .find(|r| r.path.ends_with(&format!("/commands/{id}/ack")))
            .unwrap()
            .at;
        // The heartbeat that delivered it is the last one answered before the ack.
        let hb_at = reqs
            .iter()
            .rfind(|r| r.path.ends_with("/heartbeat") && r.at <= ack_at)
            .unwrap()
            .at;
        took.push(ack_at.duration_since(hb_at).unwrap());
    }
    took.sort();
    let ack = ack_of(&f, "lat-19").unwrap();
    assert_eq!(ack["result"], "applied");
    eprintln!(
        "three-object deploy, arrival to ack over {}: median {:?}, worst {:?}",
        took.len(),
        took[took.len() / 2],
        took[took.len() - 1]
    );
}

#[test]
fn a_field_owned_by_another_manager_is_not_taken_over() {
    let (f, mut m) = start("cmd-conflict");
    let c = f.tb.admin();
    let path = ns_path(&f, "ConfigMap", "orders-config");
    let mut theirs = configmap("orders-config");
    theirs["metadata"]["labels"] = f.owned_labels("orders");
    theirs["data"] = json!({"listen": "1"});
    c.request(
        nexo_manager::kube::client::Method::PATCH,
        &format!("{path}?fieldManager=someone-else"),
        Some(nexo_manager::kube::client::Body {
            content_type: nexo_manager::kube::client::APPLY_PATCH,
            bytes: theirs.to_string().as_bytes(),
        }),
    )
    .unwrap();
    // An object of the deployment, proven as the Manager's.
    let collection = format!("/api/v1/namespaces/{}/configmaps", f.ns.name);
    f.prove(&collection, &get(&c, &path).unwrap());
    let before = get(&c, &path).unwrap()["metadata"]["resourceVersion"].clone();
    f.sim
        .enqueue_command(&f.env_id, crd_deploy(&f, "conflict-1", "orders"));
    let ack = wait_ack(&f, &mut m, "conflict-1");
    assert_eq!(ack["result"], "failed", "{ack}");
    let msg = ack["message"].as_str().unwrap();
    assert!(
        msg.contains("conflict with another field manager") && msg.contains("someone-else"),
        "{msg}"
    );
    assert_eq!(
        get(&c, &path).unwrap()["metadata"]["resourceVersion"],
        before
    );
    assert!(
        get(&c, &ns_path(&f, "NexoProxy", "orders")).is_none(),
        "nothing applied"
    );
}

#[test]
fn a_finished_command_costs_one_state_write_and_delivered_entries_keep_no_resources() {
    let (f, mut m) = start("cmd-one-write");
    let c = f.tb.admin();
    m.wait_until(Duration::from_secs(30), "a heartbeat", || {
        f.sim.heartbeat_count() >= 1
    });
    let writes = |m: &mut Manager| {
        m.metric("nexo_manager_state_writes_total")
            .expect("the state writes metric")
    };
    let before = writes(&mut m);
    // Ten deploys, in two answers of five.
    for round in 0..2 {
        for i in 0..5 {
            let name = format!("w{round}{i}");
            f.sim.enqueue_command(
                &f.env_id,
                command(
                    &format!("one-{round}-{i}"),
                    "deploy",
                    json!({"deployment": {"name": name, "namespace": f.ns.name}, "format": "crd",
                           "manifests": [proxy(&name), configmap(&format!("{name}-config"))]}),
                ),
            );
        }
        wait_ack(&f, &mut m, &format!("one-{round}-4"));
    }
    // One more heartbeat, so that nothing is in flight.
    let beats = f.sim.heartbeat_count();
    m.wait_until(Duration::from_secs(30), "a heartbeat", || {
        f.sim.heartbeat_count() > beats
    });
    let spent = writes(&mut m) - before;
    m.check(
        spent <= 10.0,
        &format!("ten commands cost {spent} state writes"),
    );
    // The delivered entries keep their class, result and message, not
    // their resources; the last one's flag waits for the next write.
    let state = nexo_manager::state::StateSecret::new(&f.ns.name, "nexo-manager-state", &f.env_id)
        .load(&c)
        .unwrap();
    let first = state.find("one-0-0").expect("recorded");
    m.check(
        first.delivered
            && first.resources.is_empty()
            && first.class == "deploy"
            && first.message.starts_with("applied"),
        &format!("a delivered entry: {first:?}"),
    );
    // Sent again, it is acknowledged again with its result and message.
    let acked = ack_posts(&f, "one-0-0").len();
    f.sim.enqueue_command(
        &f.env_id,
        command(
            "one-0-0",
            "deploy",
            json!({"deployment": {"name": "w00", "namespace": f.ns.name}, "format": "crd",
                   "manifests": [proxy("w00"), configmap("w00-config")]}),
        ),
    );
    m.wait_until(Duration::from_secs(30), "the ack sent again", || {
        ack_posts(&f, "one-0-0").len() > acked
    });
    let again = ack_posts(&f, "one-0-0")
        .pop()
        .and_then(|r| r.json)
        .unwrap_or_default();
    m.check(
        again["result"] == "applied" && again["message"] == json!(first.message),
        &format!("acknowledged again with its recorded result: {again}"),
    );
    m.stop_expecting_exit_0();
    // The clean stop wrote the flags that waited.
    let state = nexo_manager::state::StateSecret::new(&f.ns.name, "nexo-manager-state", &f.env_id)
        .load(&c)
        .unwrap();
    m.check(
        state.ledger.iter().all(|e| e.delivered),
        "every ack delivered and recorded so by the clean stop",
    );
}
