//! Kubernetes Events (docs/protocol.md, "Kubernetes Events") against the real API
//! server: each command applied, refused or failed is an Event about the
//! owned NexoProxy it names (never about another's); repeats are one
//! Event whose series counts them; a phase turning `failed` is an Event;
//! an Event the API server denies is a warning and costs the command
//! nothing.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::commands::{command, ns_path, proxy, secret, wait_ack};
use support::fixture::Fixture;
use support::manager::Manager;

const WAIT: Duration = Duration::from_secs(60);

/// The Manager's Events in the test's namespace.
fn events(f: &Fixture) -> Vec<Value> {
    f.events()
        .into_iter()
        .filter(|e| e["reportingController"] == "nexo.io/manager")
        .collect()
}

/// Waits for the one Event of `reason` and `action` about `name` that
/// satisfies `pred`, and returns it.
fn wait_event(
    f: &Fixture,
    m: &mut Manager,
    name: &str,
    reason: &str,
    action: &str,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let what = format!("an Event {reason}/{action} about {name}");
    let mut found = None;
    m.wait_until(WAIT, &what, || {
        found = events(f).into_iter().find(|e| {
            e["regarding"]["name"] == name
                && e["reason"] == reason
                && e["action"] == action
                && pred(e)
        });
        found.is_some()
    });
    found.unwrap()
}

fn uid(f: &Fixture, kind: &str, name: &str) -> String {
    let o: Value = f.tb.admin().get(&ns_path(f, kind, name)).unwrap();
    o["metadata"]["uid"].as_str().unwrap().to_owned()
}

#[test]
fn commands_refusals_and_a_failed_rollout_are_events_about_the_owned_object() {
    let f = Fixture::new("events");
    let mut m = f.spawn_with_probes(&[("NEXO_PROGRESS_DEADLINE", "3s")]);
    let ns = f.ns.name.clone();
    let deploy = command(
        "ev-deploy",
        "deploy",
        json!({"deployment": {"name": "orders", "namespace": ns}, "format": "crd",
               "manifests": [proxy("orders"), secret("orders-db")]}),
    );
    f.sim.enqueue_command(&f.env_id, deploy);
    let ack = wait_ack(&f, &mut m, "ev-deploy");
    m.check(ack["result"] == "applied", &format!("{ack}"));
    let orders = uid(&f, "NexoProxy", "orders");

    let applied = wait_event(&f, &mut m, "orders", "Applied", "Deploy", |_| true);
    m.check(
        applied["type"] == "Normal"
            && applied["regarding"]["kind"] == "NexoProxy"
            && applied["regarding"]["apiVersion"] == "nexo.io/v1alpha1"
            && applied["regarding"]["uid"] == orders.as_str()
            && applied["reportingInstance"] == "nexo-manager-test"
            && applied["note"].as_str().unwrap().contains("ev-deploy")
            && applied["eventTime"].is_string(),
        &format!("the deploy's Event: {applied}"),
    );

    // Two rollouts within ten minutes: one Event, its series counting 2.
    for (id, tag) in [("ev-roll-1", "1.4.3"), ("ev-roll-2", "1.4.4")] {
        let roll = command(
            id,
            "rollout",
            json!({"imageTag": tag, "targets": [{"name": "orders", "namespace": ns}]}),
        );
        f.sim.enqueue_command(&f.env_id, roll);
        let ack = wait_ack(&f, &mut m, id);
        m.check(ack["result"] == "applied", &format!("{ack}"));
    }
    wait_event(&f, &mut m, "orders", "Applied", "Rollout", |e| {
        e["series"]["count"] == 2
    });
    let rollouts: Vec<Value> = events(&f)
        .into_iter()
        .filter(|e| e["action"] == "Rollout")
        .collect();
    m.check(
        rollouts.len() == 1,
        &format!("one Event for the repeated rollout: {rollouts:?}"),
    );

    // Refused by the content policy: a Warning about the owned proxy.
    let mut evil = proxy("orders");
    evil["spec"]["image"] = json!("evil.example.com/miner:1");
    let refused = command(
        "ev-refused",
        "deploy",
        json!({"deployment": {"name": "orders", "namespace": ns}, "format": "crd",
               "manifests": [evil, secret("orders-db")]}),
    );
    f.sim.enqueue_command(&f.env_id, refused);
    let ack = wait_ack(&f, &mut m, "ev-refused");
    m.check(ack["result"] == "failed", &format!("{ack}"));
    let e = wait_event(&f, &mut m, "orders", "Refused", "Deploy", |_| true);
    m.check(
        e["type"] == "Warning" && e["note"].as_str().unwrap().contains("ev-refused"),
        &format!("the refusal's Event: {e}"),
    );

    // Another's NexoProxy of the same name as a deploy: failed, and no
    // Event about it (the Manager tells nothing on others' objects).
    f.create_proxy(
        "theirs",
        json!({"app.kubernetes.io/managed-by": "someone-else"}),
        1,
        support::fixture::PROXY_IMAGE,
    );
    let theirs = command(
        "ev-theirs",
        "deploy",
        json!({"deployment": {"name": "theirs", "namespace": ns}, "format": "crd",
               "manifests": [proxy("theirs"), secret("theirs-db")]}),
    );
    f.sim.enqueue_command(&f.env_id, theirs);
    let ack = wait_ack(&f, &mut m, "ev-theirs");
    m.check(ack["result"] == "failed", &format!("{ack}"));

    // The proxy's operator never reports it ready: past the 3 s deadline
    // the rollout has failed, a Warning.
    let e = wait_event(
        &f,
        &mut m,
        "orders",
        "ProgressFailed",
        "ObserveStatus",
        |_| true,
    );
    m.check(
        e["type"] == "Warning" && e["regarding"]["uid"] == orders.as_str(),
        &format!("the failed phase's Event: {e}"),
    );
    let about_theirs: Vec<Value> = events(&f)
        .into_iter()
        .filter(|e| e["regarding"]["name"] == "theirs")
        .collect();
    m.check(
        about_theirs.is_empty(),
        &format!("no Event about another's object: {about_theirs:?}"),
    );
    let written = m.metric("nexo_manager_events_written_total").unwrap_or(0.0);
    m.check(written >= 4.0, &format!("events written: {written}"));
    let metrics = m.metrics();
    // Every cause is present at zero from the start (an alert's rate has a
    // series to read): none counted one.
    let dropped: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("nexo_manager_events_dropped_total{"))
        .collect();
    m.check(
        dropped.len() == 3 && dropped.iter().all(|l| l.ends_with(" 0")),
        &format!("no Event dropped: {metrics}"),
    );
    m.stop_expecting_exit_0();
}

#[test]
fn a_denied_event_is_a_warning_and_the_command_still_applies() {
    let f = Fixture::new("events-denied");
    f.tb.install_crds();
    let admin = f.tb.admin();
    let ns = f.ns.name.clone();
    // Everything a deploy needs, and no Events.
    admin
        .create(
            &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
            &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "mgr"}}),
        )
        .unwrap();
    let all = [
        "get", "list", "watch", "create", "update", "patch", "delete",
    ];
    admin
        .create(
            &format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles"),
            &json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "mgr"},
        "rules": [
            {"apiGroups": ["nexo.io"], "resources": ["nexoproxies"], "verbs": all},
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": all},
            {"apiGroups": [""], "resources": ["secrets", "configmaps"], "verbs": all},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": all},
            // What a command writes is written as the namespace's executor.
            {"apiGroups": [""], "resources": ["serviceaccounts"], "resourceNames": ["nexo-executor"], "verbs": ["impersonate"]}]}),
        )
        .unwrap();
    admin.create(&format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings"), &json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "mgr"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "mgr"},
        "subjects": [{"kind": "ServiceAccount", "name": "mgr", "namespace": ns}]})).unwrap();
    let cr = format!("nexo-test-{ns}");
    admin.create("/apis/rbac.authorization.k8s.io/v1/clusterroles", &json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": cr},
        "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}]})).unwrap();
    admin.create("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", &json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": cr},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cr},
        "subjects": [{"kind": "ServiceAccount", "name": "mgr", "namespace": ns}]})).unwrap();
    let token = f.tb.token(&ns, "mgr");
    let mut env = f.env();
    env.insert(
        "KUBECONFIG".into(),
        f.tb.kubeconfig_for_token(&token, "mgr")
            .display()
            .to_string(),
    );
    env.insert(
        "NEXO_LISTEN_ADDR".into(),
        support::PROBES_ON_ANY_PORT.into(),
    );
    let mut m = f.spawn(&env);
    let deploy = command(
        "ev-denied",
        "deploy",
        json!({"deployment": {"name": "orders", "namespace": ns}, "format": "crd",
               "manifests": [proxy("orders"), secret("orders-db")]}),
    );
    f.sim.enqueue_command(&f.env_id, deploy);
    let ack = wait_ack(&f, &mut m, "ev-denied");
    m.check(ack["result"] == "applied", &format!("{ack}"));
    let addr = m.probe_addr();
    m.wait_until(WAIT, "the denied Event counted", || {
        support::metric(addr, "nexo_manager_events_dropped_total{cause=\"denied\"}")
            .is_some_and(|n| n >= 1.0)
    });
    let log = m.stderr();
    m.check(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains("event not written") && l.contains("403")),
        "a warning names the denied Event",
    );
    m.check(events(&f).is_empty(), "no Event was written");
    m.stop_expecting_exit_0();
    for path in [
        format!("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{cr}"),
        format!("/apis/rbac.authorization.k8s.io/v1/clusterroles/{cr}"),
    ] {
        admin.delete(&path, "Background").unwrap();
    }
}

#[test]
fn the_managers_own_life_is_events_on_its_own_deployment() {
    let f = Fixture::new("events-own");
    f.tb.install_crds();
    // The Deployment the Manager runs from (NEXO_SELF_DEPLOYMENT's
    // default), no pod of it needed: what its own Events are about.
    let own = f
        .tb
        .admin()
        .create(
            &format!("/apis/apps/v1/namespaces/{}/deployments", f.ns.name),
            &json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "nexo-manager", "labels": {"app.kubernetes.io/name": "nexo-manager"}},
                "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "nexo-manager"}},
                         "template": {"metadata": {"labels": {"app": "nexo-manager"}},
                                      "spec": {"containers": [{"name": "manager", "image": "registry.example.com/nexo/manager:0.4.0"}]}}}}),
        )
        .unwrap();
    let own_uid = own["metadata"]["uid"].as_str().unwrap().to_owned();
    let mut a = f.spawn(&f.pod_env("pod-a"));
    let about_own = |e: &Value| e["regarding"]["uid"] == own_uid.as_str();
    let bound = wait_event(&f, &mut a, "nexo-manager", "Bound", "Connect", about_own);
    a.check(
        bound["type"] == "Normal"
            && bound["regarding"]["kind"] == "Deployment"
            && bound["note"]
                .as_str()
                .is_some_and(|n| n.contains(&f.env_id)),
        &format!("bound, on the own Deployment: {bound}"),
    );
    let first = wait_event(&f, &mut a, "nexo-manager", "LeaderElected", "Lead", |e| {
        about_own(e)
            && e["note"]
                .as_str()
                .is_some_and(|n| n.contains("pod pod-a leads"))
    });
    a.check(
        first["note"]
            .as_str()
            .is_some_and(|n| n.contains("was free")),
        &format!("the first leader took a free lease: {first}"),
    );
    // A lease change: pod-a stops without releasing the lease (SIGKILL);
    // pod-b takes it over once it expires and says from whom.
    let mut b = f.spawn(&f.pod_env("pod-b"));
    a.signal("KILL");
    let took = wait_event(&f, &mut b, "nexo-manager", "LeaderElected", "Lead", |e| {
        about_own(e)
            && e["note"]
                .as_str()
                .is_some_and(|n| n.contains("pod pod-b leads"))
    });
    b.check(
        took["note"]
            .as_str()
            .is_some_and(|n| n.contains("took the lease over from pod-a")),
        &format!("the new leader names the one it took over from: {took}"),
    );
    // An unsigned command with keys configured (the simulator does not
    // sign): refused, and an Event on the own Deployment says so.
    b.stop_expecting_exit_0();
    let keys = f.dir.join("own-command-keys");
    let signer = nexo_cpsim::signing::Signer::generate("k1");
    std::fs::write(&keys, format!("{}\n", signer.key_line())).unwrap();
    let mut env = f.pod_env("pod-b");
    env.insert("NEXO_COMMAND_KEYS_FILE".into(), keys.display().to_string());
    f.sim.enqueue_command(
        &f.env_id,
        json!({"id": "unsigned-1", "class": "uninstall", "issuedAt": "2026-12-07T00:00:00Z",
               "payload": {"deployment": {"name": "orders", "namespace": f.ns.name}}}),
    );
    let mut c = f.spawn(&env);
    let ack = wait_ack(&f, &mut c, "unsigned-1");
    c.check(ack["result"] == "failed", &format!("{ack}"));
    let refused = wait_event(
        &f,
        &mut c,
        "nexo-manager",
        "SignatureRefused",
        "Verify",
        |e| about_own(e) && e["note"].as_str().is_some_and(|n| n.contains("unsigned-1")),
    );
    c.check(refused["type"] == "Warning", &format!("{refused}"));
    c.stop_expecting_exit_0();
}
