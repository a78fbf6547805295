//! The shipped `manifests/` on the real test bed: installed with
//! `kubectl apply -k`, the Manager runs as its ServiceAccount under the shipped
//! RBAC with the environment the Deployment sets, and the pod template meets
//! the restricted Pod Security Standard.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use nexo_cpsim::{SimConfig, Simulator};
use serde_json::{Value, json};
use support::manager::Manager;
use support::{run_ok_with_input as ok, testbed};

const NS: &str = "nexo-system";
/// The namespace the Manager manages in these tests.
const MANAGED: &str = "nexo-proxies";
const WAIT: Duration = Duration::from_secs(60);
const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

static INSTALL: Mutex<bool> = Mutex::new(false);

/// `kubectl apply -k manifests/`, once per test binary.
fn install() {
    let mut done = INSTALL.lock().unwrap_or_else(|p| p.into_inner());
    if *done {
        return;
    }
    let tb = testbed();
    // A fresh install on a shared test bed: a Deployment a previous run
    // upgraded keeps its image and its stalled rollout (no kubelet here), and
    // the Manager would rightly report it.
    let admin = tb.admin();
    let deployment = format!("/apis/apps/v1/namespaces/{NS}/deployments/nexo-manager");
    match admin.delete(&deployment, "Background") {
        Ok(_) => {}
        Err(e) if e.is_not_found() => {}
        Err(e) => panic!("cannot delete {deployment} a previous run left: {e}"),
    }
    // README.md's order: the CRDs' base, the namespace, the Manager's base.
    for args in [
        ["apply", "-k", "manifests/crds"],
        ["apply", "-f", "manifests/namespace.yaml"],
        ["apply", "-k", "manifests"],
    ] {
        ok(
            tb.kubectl_cmd()
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .args(args),
            None,
        );
    }
    *done = true;
}

/// Adds `ns` as a managed namespace, as README.md "Adding a managed
/// namespace" says: the Manager's RoleBinding to read it, the executor's
/// ServiceAccount and its RoleBinding.
fn add_managed_namespace(ns: &str) {
    let tb = testbed();
    let kubectl = |args: &[&str]| {
        let out = tb.kubectl_cmd().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() || err.contains("AlreadyExists") || err.contains("already exists"),
            "kubectl {args:?}: {err}"
        );
    };
    kubectl(&["create", "namespace", ns]);
    kubectl(&[
        "label",
        "--overwrite",
        "namespace",
        ns,
        "pod-security.kubernetes.io/enforce=restricted",
    ]);
    kubectl(&[
        "-n",
        ns,
        "create",
        "rolebinding",
        "nexo-manager-managed",
        "--clusterrole=nexo-manager-managed",
        &format!("--serviceaccount={NS}:nexo-manager"),
    ]);
    kubectl(&["-n", ns, "create", "serviceaccount", "nexo-executor"]);
    kubectl(&[
        "-n",
        ns,
        "create",
        "rolebinding",
        "nexo-executor",
        "--clusterrole=nexo-manager-executor",
        &format!("--serviceaccount={ns}:nexo-executor"),
    ]);
}

/// A command whose id is unique to this run: the state Secret in
/// `nexo-system` outlives a test binary when the test bed is shared.
fn command(id: &str, class: &str, payload: Value) -> Value {
    let id = format!("{id}-{}", std::process::id());
    json!({"id": id, "class": class, "issuedAt": "2026-12-02T00:00:00Z", "payload": payload})
}

fn proxy(name: &str) -> Value {
    json!({"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy", "metadata": {"name": name},
           "spec": {"image": "registry.example.com/nexo/proxy:1.4.2", "mongodb": {"secretRef": {"name": format!("{name}-db")}}}})
}

#[test]
fn the_manager_runs_a_full_lifecycle_under_the_shipped_rbac() {
    install();
    let tb = testbed();
    let admin = tb.admin();
    let sim = Arc::new(Simulator::start(SimConfig::default()));
    let env_id = format!("env-manifests-{}", std::process::id());
    let token = sim.add_environment(&env_id);
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("manifests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    sim.write_ca(&dir.join("cp-ca.pem"));
    std::fs::write(dir.join("connect-token"), &token).unwrap();
    // The namespace it manages, added as README says.
    add_managed_namespace(MANAGED);
    // A legacy object of the 0.2.0 line, in the way of a deploy.
    let legacy = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "old-config", "labels": {"app.kubernetes.io/part-of": "nexo"}}});
    let _ = admin.create(&format!("/api/v1/namespaces/{MANAGED}/configmaps"), &legacy);

    let mut env = tb.deployment_env(NS, "nexo-manager");
    // And its own, which it reads by default and where no command may
    // write (no executor there).
    env.insert("NEXO_NAMESPACES".into(), format!("{MANAGED},{NS}"));
    assert_eq!(
        env["NEXO_CONNECT_TOKEN_FILE"],
        "/var/run/secrets/nexo/connect-token"
    );
    // Only what points at the simulator and at the API server from outside a pod differs.
    env.insert("NEXO_CONTROL_PLANE_URL".into(), sim.url());
    env.insert(
        "NEXO_CONTROL_PLANE_CA_FILE".into(),
        dir.join("cp-ca.pem").display().to_string(),
    );
    env.insert(
        "NEXO_CONNECT_TOKEN_FILE".into(),
        dir.join("connect-token").display().to_string(),
    );
    env.insert("NEXO_HEARTBEAT_INTERVAL".into(), "1s".into());
    // Outside a pod, port 8080 of the host may be taken: any free port.
    env.insert(
        "NEXO_LISTEN_ADDR".into(),
        support::PROBES_ON_ANY_PORT.into(),
    );
    // A fresh install: the state Secret a previous run on a shared test
    // bed left is another environment's, and the Manager would rightly
    // refuse it (exit 2).
    let state = format!("/api/v1/namespaces/{NS}/secrets/nexo-manager-state");
    match admin.delete(&state, "Background") {
        Ok(_) => {}
        Err(e) if e.is_not_found() => {}
        Err(e) => panic!("cannot delete the state Secret {state} a previous run left: {e}"),
    }
    let sa_token = tb.token(NS, "nexo-manager");
    env.insert(
        "KUBECONFIG".into(),
        tb.kubeconfig_for_token(&sa_token, "nexo-manager")
            .display()
            .to_string(),
    );
    env.insert("RUST_LOG".into(), "trace".into());
    let mut m = Manager::spawn(&env).with_sim(&sim);

    let wait_ack = |m: &mut Manager, id: &str| -> Value {
        m.wait_until(WAIT, &format!("the ack of {id}"), || {
            sim.acks().iter().any(|a| a["commandId"] == id)
        });
        sim.acks()
            .into_iter()
            .find(|a| a["commandId"] == id)
            .unwrap()
    };
    let steps = vec![
        (
            command(
                "m-crd",
                "deploy",
                json!({"deployment": {"name": "orders", "namespace": MANAGED}, "format": "crd",
            "manifests": [proxy("orders"), {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "orders-config"}, "data": {}}]}),
            ),
            "applied",
        ),
        (
            command(
                "m-legacy",
                "deploy",
                json!({"deployment": {"name": "billing", "namespace": MANAGED}, "format": "legacy",
            "manifests": [{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "billing"},
                "spec": {"selector": {"matchLabels": {"app": "billing"}}, "template": {"metadata": {"labels": {"app": "billing"}},
                // nexo-proxies enforces restricted: the Manager holds the
                // template to it (read under the shipped RBAC).
                "spec": {"securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{"name": "proxy", "image": "registry.example.com/nexo/proxy:1.3.0",
                    "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]}}}},
                {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "billing"}, "spec": {"selector": {"app": "billing"}, "ports": [{"port": 27017}]}}]}),
            ),
            "applied",
        ),
        (
            command("m-rollout", "rollout", json!({"imageTag": "1.4.3"})),
            "applied",
        ),
        // No command writes in the Manager's own namespace: the API server
        // refuses its executor there.
        (
            command(
                "m-own",
                "deploy",
                json!({"deployment": {"name": "loot", "namespace": NS}, "format": "crd",
            "manifests": [proxy("loot"), {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "loot-db"}, "stringData": {"uri": "x"}}]}),
            ),
            "failed",
        ),
        (
            command(
                "m-upgrade",
                "upgrade",
                json!({"bundleVersion": support::chart::next_patch(env!("CARGO_PKG_VERSION")), "managerImage": format!("registry.example.com/nexo/manager@{DIGEST}")}),
            ),
            "applied",
        ),
        // The shipped Deployment keeps the cluster half of the gate closed.
        (
            command(
                "m-gate",
                "deploy",
                json!({"deployment": {"name": "old", "namespace": MANAGED}, "format": "crd", "migration": {"adoptLegacy": true},
            "manifests": [proxy("old"), {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "old-config"}, "data": {}}]}),
            ),
            "failed",
        ),
        (
            command(
                "m-uninstall-crd",
                "uninstall",
                json!({"deployment": {"name": "orders", "namespace": MANAGED}}),
            ),
            "applied",
        ),
        (
            command(
                "m-uninstall-legacy",
                "uninstall",
                json!({"deployment": {"name": "billing", "namespace": MANAGED}}),
            ),
            "applied",
        ),
    ];
    for (cmd, want) in steps {
        let id = cmd["id"].as_str().unwrap().to_owned();
        sim.enqueue_command(&env_id, cmd);
        let ack = wait_ack(&mut m, &id);
        m.check(
            ack["result"] == want,
            &format!("{id}: expected {want}: {ack}"),
        );
    }
    let d: Value = admin
        .get(&format!(
            "/apis/apps/v1/namespaces/{NS}/deployments/nexo-manager"
        ))
        .unwrap();
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"][0]["image"],
        format!("registry.example.com/nexo/manager@{DIGEST}")
    );
    assert!(
        admin
            .get_opt::<Value>(&format!(
                "/apis/nexo.io/v1alpha1/namespaces/{MANAGED}/nexoproxies/orders"
            ))
            .unwrap()
            .is_none()
    );
    assert!(
        admin
            .get_opt::<Value>(&format!(
                "/apis/apps/v1/namespaces/{MANAGED}/deployments/billing"
            ))
            .unwrap()
            .is_none()
    );
    let own_id = format!("m-own-{}", std::process::id());
    let own = sim
        .acks()
        .into_iter()
        .find(|a| a["commandId"] == own_id.as_str())
        .unwrap();
    let executor = format!("system:serviceaccount:{NS}:nexo-executor");
    m.check(
        own["message"]
            .as_str()
            .is_some_and(|s| s.contains("forbidden") && s.contains(&executor)),
        &format!("the API server's 403 to the executor: {own}"),
    );
    for path in [
        format!("/apis/nexo.io/v1alpha1/namespaces/{NS}/nexoproxies/loot"),
        format!("/api/v1/namespaces/{NS}/secrets/loot-db"),
    ] {
        m.check(
            admin.get_opt::<Value>(&path).unwrap().is_none(),
            &format!("nothing written in its own namespace: {path}"),
        );
    }
    let gate_id = format!("m-gate-{}", std::process::id());
    let gate = sim
        .acks()
        .into_iter()
        .find(|a| a["commandId"] == gate_id.as_str())
        .unwrap();
    assert!(
        gate["message"]
            .as_str()
            .unwrap()
            .contains("NEXO_ALLOW_LEGACY_ADOPTION"),
        "{gate}"
    );
    // The shipped RBAC lets the Manager tell what it did as Events.
    let events: Value = admin
        .get(&format!(
            "/apis/events.k8s.io/v1/namespaces/{MANAGED}/events"
        ))
        .unwrap();
    let told: Vec<(String, String)> = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reportingController"] == "nexo.io/manager")
        .map(|e| {
            (
                e["action"].as_str().unwrap_or_default().to_owned(),
                e["regarding"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    for (action, name) in [
        ("Deploy", "orders"),
        ("Deploy", "billing"),
        ("Rollout", "orders"),
    ] {
        m.check(
            told.iter().any(|(a, n)| a == action && n == name),
            &format!("an Event {action} about {name} under the shipped RBAC: {told:?}"),
        );
    }
    m.check(
        !m.stderr().contains("event not written"),
        "no Event denied under the shipped RBAC",
    );
    let hb = sim.heartbeats().pop().unwrap();
    m.check(
        hb.get("inventoryErrors").is_none(),
        &format!("the shipped RBAC reads the whole inventory: {hb}"),
    );
    m.check(
        hb["releaseContract"]["errors"] == json!([])
            && hb["releaseContract"]["schemaFingerprint"].is_string(),
        &format!("and the whole release contract: {}", hb["releaseContract"]),
    );
    // Its own Deployment, the release contract's CRDs and the nodes are
    // watched, not read every few minutes: the shipped RBAC allows each
    // watch (a forbidden one says "not watched").
    let log = m.stderr();
    let refused: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("not watched; read every few minutes instead"))
        .collect();
    m.check(
        refused.is_empty(),
        &format!("every watch allowed under the shipped RBAC: {refused:#?}"),
    );
    m.stop_expecting_exit_0();
}

#[test]
fn the_service_account_cannot_leave_its_lane() {
    install();
    let tb = testbed();
    let sa = tb.client_with_token(&tb.token(NS, "nexo-manager"));
    let forbidden = |what: &str, r: Result<Value, nexo_manager::kube::Error>| {
        let e = r.expect_err(what);
        assert_eq!(e.status(), Some(403), "{what}: {e}");
    };
    forbidden(
        "read Secrets in an unmanaged namespace",
        sa.get::<Value>("/api/v1/namespaces/default/secrets"),
    );
    // (Secrets of a managed namespace are readable: what a command plans from.
    // Its own namespace is read by default; the connect token there is mounted into its pod anyway.)
    // It writes nothing a command asks for itself: only as an executor.
    forbidden(
        "write a ConfigMap in its own namespace",
        sa.create(
            &format!("/api/v1/namespaces/{NS}/configmaps"),
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "nexo-evil"}}),
        ),
    );
    forbidden(
        "write a Secret in its own namespace as an executor",
        sa.executor("nexo-executor").create(
            &format!("/api/v1/namespaces/{NS}/secrets"),
            &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "nexo-evil"}}),
        ),
    );
    forbidden(
        "create a Namespace",
        sa.create(
            "/api/v1/namespaces",
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "nexo-evil"}}),
        ),
    );
    forbidden("create a ClusterRole", sa.create("/apis/rbac.authorization.k8s.io/v1/clusterroles",
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "nexo-evil"}, "rules": []})));
    forbidden("create a RoleBinding", sa.create(&format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/rolebindings"),
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "nexo-evil"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": "nexo-manager", "namespace": NS}]})));
    forbidden(
        "read another namespace than kube-system",
        sa.get::<Value>("/api/v1/namespaces/default"),
    );
    // And what it needs works.
    sa.get::<Value>("/api/v1/namespaces/kube-system")
        .expect("the cluster uid is readable");
    sa.get::<Value>(&format!(
        "/apis/nexo.io/v1alpha1/namespaces/{NS}/nexoproxies"
    ))
    .expect("the inventory is readable");
}

#[test]
fn the_pod_template_meets_the_restricted_pod_security_standard() {
    install();
    let tb = testbed();
    let admin = tb.admin();
    let ns = tb.namespace("psa");
    admin
        .patch(&format!("/api/v1/namespaces/{}", ns.name), nexo_manager::kube::client::MERGE_PATCH,
            &json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}}))
        .unwrap();
    let d: Value = admin
        .get(&format!(
            "/apis/apps/v1/namespaces/{NS}/deployments/nexo-manager"
        ))
        .unwrap();
    let mut deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "nexo-manager"}, "spec": d["spec"].clone()});
    deployment["spec"]["template"]["spec"]["serviceAccountName"] = json!("default");
    admin
        .create(
            &format!(
                "/apis/apps/v1/namespaces/{}/deployments?dryRun=All",
                ns.name
            ),
            &deployment,
        )
        .expect("the Deployment is admitted");
    // Pod Security is enforced on pods: the template as a pod is admitted...
    let pod = |spec: Value| json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "nexo-manager-psa"}, "spec": spec});
    let spec = deployment["spec"]["template"]["spec"].clone();
    admin
        .create(
            &format!("/api/v1/namespaces/{}/pods?dryRun=All", ns.name),
            &pod(spec.clone()),
        )
        .expect("the pod is admitted as restricted");
    // ...and the check is real: without runAsNonRoot and dropped capabilities it is not.
    let mut weaker = spec;
    weaker["securityContext"] = json!({});
    weaker["containers"][0]["securityContext"] = json!({});
    let e = admin
        .create(
            &format!("/api/v1/namespaces/{}/pods?dryRun=All", ns.name),
            &pod(weaker),
        )
        .unwrap_err();
    assert_eq!(e.status(), Some(403), "{e}");
}

/// The path of `to` relative to the folder `from` (both absolute), as a
/// kustomization's `resources` entry needs it.
fn relative(from: &std::path::Path, to: &std::path::Path) -> String {
    let from: Vec<_> = from.components().collect();
    let to: Vec<_> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<String> = vec!["..".into(); from.len() - common];
    parts.extend(
        to[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    parts.join("/")
}

/// An overlay with a namePrefix and a nameSuffix, as a user installs a
/// second Manager:
/// every name the Manager is told and the Role grants follows the prefix,
/// so it binds, leads, keeps its state and deploys under the base's RBAC;
/// applying the overlay again leaves the token created by hand; `kubectl
/// delete -k` leaves the CRDs, the token and the state.
#[test]
fn an_overlay_with_a_name_prefix_and_suffix_installs_a_manager_that_works() {
    let tb = testbed();
    tb.install_crds();
    let admin = tb.admin();
    let ns = tb.namespace("kz-prefix");
    let overlay = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("overlay-{}", std::process::id()));
    std::fs::create_dir_all(&overlay).unwrap();
    let base = relative(
        &overlay,
        std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/manifests")),
    );
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamePrefix: team-\nnameSuffix: -blue\nnamespace: {}\nresources:\n  - {base}\n",
            ns.name
        ),
    )
    .unwrap();
    let rendered = ok(tb.kubectl_cmd().arg("kustomize").arg(&overlay), None);
    assert!(
        !rendered.contains("kind: Secret") && !rendered.contains("kind: Namespace"),
        "the base creates no Secret and no namespace:\n{rendered}"
    );
    ok(tb.kubectl_cmd().arg("apply").arg("-k").arg(&overlay), None);
    let name = "team-nexo-manager-blue";

    let sim = Arc::new(Simulator::start(SimConfig::default()));
    let env_id = format!("env-prefix-{}", std::process::id());
    let token = sim.add_environment(&env_id);
    // The token Secret, created once by hand (README.md).
    ok(
        tb.kubectl_cmd().args([
            "-n",
            &ns.name,
            "create",
            "secret",
            "generic",
            "nexo-connect-token",
            &format!("--from-literal=connect-token={token}"),
        ]),
        None,
    );
    // It deploys in its own namespace, which ships without an executor:
    // one bound to the overlay's (prefixed) executor ClusterRole, as
    // README.md "Adding a managed namespace" does.
    for args in [
        vec!["create", "serviceaccount", "nexo-executor"],
        vec![
            "create",
            "rolebinding",
            "nexo-executor",
            "--clusterrole=team-nexo-manager-executor-blue",
        ],
    ] {
        let mut cmd = tb.kubectl_cmd();
        cmd.args(["-n", &ns.name]).args(&args);
        if args[1] == "rolebinding" {
            cmd.arg(format!("--serviceaccount={}:nexo-executor", ns.name));
        }
        ok(&mut cmd, None);
    }
    let token_path = format!("/api/v1/namespaces/{}/secrets/nexo-connect-token", ns.name);
    let token_rv = admin.get::<Value>(&token_path).unwrap()["metadata"]["resourceVersion"].clone();

    let dir = overlay.join("run");
    std::fs::create_dir_all(&dir).unwrap();
    sim.write_ca(&dir.join("cp-ca.pem"));
    std::fs::write(dir.join("connect-token"), &token).unwrap();
    let mut env = tb.deployment_env(&ns.name, name);
    assert_eq!(env["NEXO_SELF_DEPLOYMENT"], name);
    assert_eq!(env["NEXO_LEASE_NAME"], name);
    assert_eq!(env["NEXO_STATE_SECRET"], "team-nexo-manager-state-blue");
    for (k, v) in [
        ("NEXO_CONTROL_PLANE_URL", sim.url()),
        (
            "NEXO_CONTROL_PLANE_CA_FILE",
            dir.join("cp-ca.pem").display().to_string(),
        ),
        (
            "NEXO_CONNECT_TOKEN_FILE",
            dir.join("connect-token").display().to_string(),
        ),
        ("NEXO_HEARTBEAT_INTERVAL", "1s".into()),
        ("NEXO_LISTEN_ADDR", support::PROBES_ON_ANY_PORT.into()),
        (
            "KUBECONFIG",
            tb.kubeconfig_for_token(&tb.token(&ns.name, name), name)
                .display()
                .to_string(),
        ),
        ("RUST_LOG", "trace".into()),
    ] {
        env.insert(k.into(), v);
    }
    let mut m = Manager::spawn(&env).with_sim(&sim);
    let id = format!("kz-deploy-{}", std::process::id());
    sim.enqueue_command(
        &env_id,
        json!({"id": id, "class": "deploy", "issuedAt": "2026-12-06T00:00:00Z",
               "payload": {"deployment": {"name": "orders", "namespace": ns.name},
                           "format": "crd", "manifests": [proxy("orders")]}}),
    );
    m.wait_until(WAIT, "the deploy's ack", || {
        sim.acks().iter().any(|a| a["commandId"] == id.as_str())
    });
    let ack = sim
        .acks()
        .into_iter()
        .find(|a| a["commandId"] == id.as_str())
        .unwrap();
    m.check(
        ack["result"] == "applied",
        &format!("deployed under the prefixed RBAC: {ack}"),
    );
    let lease = format!(
        "/apis/coordination.k8s.io/v1/namespaces/{}/leases/{name}",
        ns.name
    );
    let state = format!(
        "/api/v1/namespaces/{}/secrets/team-nexo-manager-state-blue",
        ns.name
    );
    m.check(
        admin.get_opt::<Value>(&lease).unwrap().is_some()
            && admin.get_opt::<Value>(&state).unwrap().is_some(),
        "the prefixed Lease and state Secret exist",
    );
    m.stop_expecting_exit_0();

    // Applied again: the token created by hand is untouched.
    ok(tb.kubectl_cmd().arg("apply").arg("-k").arg(&overlay), None);
    assert_eq!(
        admin.get::<Value>(&token_path).unwrap()["metadata"]["resourceVersion"],
        token_rv,
        "applying the base again changed the token Secret"
    );
    // Deleted: the Manager's objects go, the CRDs, token and state stay.
    ok(
        tb.kubectl_cmd()
            .arg("delete")
            .arg("-k")
            .arg(&overlay)
            .arg("--wait=false"),
        None,
    );
    for gone in [
        format!("/apis/apps/v1/namespaces/{}/deployments/{name}", ns.name),
        format!("/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}-cluster"),
    ] {
        assert!(
            admin.get_opt::<Value>(&gone).unwrap().is_none(),
            "{gone} is left"
        );
    }
    for kept in [
        token_path.clone(),
        state,
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/nexoproxies.nexo.io".into(),
        format!(
            "/apis/nexo.io/v1alpha1/namespaces/{}/nexoproxies/orders",
            ns.name
        ),
    ] {
        assert!(
            admin.get_opt::<Value>(&kept).unwrap().is_some(),
            "{kept} is gone"
        );
    }
}
