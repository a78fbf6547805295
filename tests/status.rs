//! Deployment status (`status.v1`) against the real API server: a
//! NexoProxy's phase from the status its operator writes (the test writes
//! it, as the operator would), its progress deadline, `degraded`, and the
//! command's progress ending in exactly one heartbeat; a legacy
//! Deployment's phase from what the deployment controller writes, its own
//! progress deadline included, and only the pods its own ReplicaSets own
//! read to say why it failed.

mod support;

use nexo_manager::kube::client::MERGE_PATCH;
use serde_json::{Value, json};
use support::commands::{command, configmap, ns_path, proxy, secret, wait_ack, wait_heartbeat};
use support::fixture::Fixture;
use support::manager::Manager;

/// The entry of `name` in a heartbeat.
fn entry<'a>(hb: &'a Value, name: &str) -> Option<&'a Value> {
    hb["deployments"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
}

/// Waits for a heartbeat after the `after`th whose entry of `name`
/// satisfies `pred`; returns its position and the entry.
fn wait_entry(
    f: &Fixture,
    m: &mut Manager,
    after: usize,
    name: &str,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> (usize, Value) {
    wait_heartbeat(f, m, after, what, |hb| {
        entry(hb, name).filter(|e| pred(e)).cloned()
    })
}

fn write_status(f: &Fixture, name: &str, status: Value) {
    let path = format!("{}/status", ns_path(f, "NexoProxy", name));
    f.tb.admin()
        .patch(&path, MERGE_PATCH, &json!({ "status": status }))
        .unwrap_or_else(|e| panic!("write the status of {name}: {e}"));
}

fn generation(f: &Fixture, kind: &str, name: &str) -> i64 {
    let o: Value = f.tb.admin().get(&ns_path(f, kind, name)).unwrap();
    o["metadata"]["generation"].as_i64().unwrap()
}

#[test]
fn a_proxys_phase_follows_its_status_and_its_commands_end_once() {
    let f = Fixture::new("status");
    let mut m = f.spawn_with_probes(&[("NEXO_PROGRESS_DEADLINE", "4s")]);
    let payload = json!({"deployment": {"name": "orders", "namespace": f.ns.name}, "format": "crd",
        "manifests": [proxy("orders"), configmap("orders-config"), secret("orders-db")]});
    f.sim
        .enqueue_command(&f.env_id, command("st-deploy", "deploy", payload));
    let ack = wait_ack(&f, &mut m, "st-deploy");
    m.check(ack["result"] == "applied", &format!("deploy: {ack}"));
    let g = generation(&f, "NexoProxy", "orders");

    // No status yet: progressing, and the deploy in progress.
    let (_, e) = wait_entry(
        &f,
        &mut m,
        0,
        "orders",
        "progressing, NoStatus, the deploy in progress",
        |e| e["status"]["phase"] == "progressing" && e["status"]["command"]["id"] == "st-deploy",
    );
    m.check(
        e["status"]["reason"] == "NoStatus"
            && e["status"]["generation"] == g
            && e["status"]["command"]
                == json!({"id": "st-deploy", "class": "deploy", "phase": "progressing"}),
        &format!("no status yet: {e}"),
    );

    // The operator reports every replica ready: available, and the deploy's
    // end shown once.
    write_status(
        &f,
        "orders",
        json!({"observedGeneration": g, "readyReplicas": 2, "replicas": 2,
        "conditions": [{"type": "Ready", "status": "True", "reason": "Running", "message": "2 of 2 pods ready",
            "lastTransitionTime": "2026-12-07T10:00:00Z"}]}),
    );
    let (i, e) = wait_entry(&f, &mut m, 0, "orders", "available", |e| {
        e["status"]["phase"] == "available"
    });
    m.check(
        e["status"]["command"]
            == json!({"id": "st-deploy", "class": "deploy", "phase": "available"})
            && e["status"]["reason"] == "Running"
            && e["status"]["message"] == "2 of 2 pods ready"
            && e["status"]["readyReplicas"] == 2
            && e["status"]["observedGeneration"] == g,
        &format!("the first available heartbeat shows the deploy's end: {e}"),
    );
    let since = e["status"]["since"].clone();
    let (_, later) = wait_entry(&f, &mut m, i + 2, "orders", "two heartbeats later", |_| {
        true
    });
    m.check(
        later["status"]["phase"] == "available"
            && later["status"].get("command").is_none()
            && later["status"]["since"] == since,
        &format!("the command's end is shown once; since stays: {later}"),
    );

    // Fewer ready at the same generation: degraded.
    write_status(&f, "orders", json!({"readyReplicas": 1}));
    let (i, e) = wait_entry(&f, &mut m, i, "orders", "degraded", |e| {
        e["status"]["phase"] == "degraded"
    });
    m.check(
        e["status"]["readyReplicas"] == 1
            && e["status"]["since"] != since
            && e["status"].get("command").is_none(),
        &format!("degraded: {e}"),
    );

    // A rollout the operator never reports on: failed after the deadline.
    f.sim.enqueue_command(
        &f.env_id,
        command("st-rollout", "rollout", json!({"imageTag": "1.4.3"})),
    );
    let ack = wait_ack(&f, &mut m, "st-rollout");
    m.check(ack["result"] == "applied", &format!("rollout: {ack}"));
    let (j, e) = wait_entry(&f, &mut m, i, "orders", "the rollout in progress", |e| {
        e["status"]["command"]["id"] == "st-rollout"
    });
    m.check(
        e["status"]["phase"] == "progressing" && e["status"]["command"]["phase"] == "progressing",
        &format!("the rollout in progress: {e}"),
    );
    let (k, e) = wait_entry(&f, &mut m, j, "orders", "failed at the deadline", |e| {
        e["status"]["phase"] == "failed"
    });
    let message = e["status"]["message"].as_str().unwrap_or_default();
    m.check(
        e["status"]["command"]
            == json!({"id": "st-rollout", "class": "rollout", "phase": "failed"})
            && e["status"]["reason"] == "ProgressDeadlineExceeded"
            && message == "2 of 2 pods ready",
        &format!("failed, with the rollout's end, the deadline as the reason and the condition's message: {e}"),
    );
    let (_, later) = wait_entry(&f, &mut m, k + 1, "orders", "a heartbeat later", |_| true);
    m.check(
        later["status"]["phase"] == "failed" && later["status"].get("command").is_none(),
        &format!("failed stays; the command's end is not shown again: {later}"),
    );
    // Each turn is a Warning Event about the proxy; the phase a metric.
    let events = f.events();
    let turns: Vec<(&str, &str)> = events
        .iter()
        .filter(|e| e["action"] == "ObserveStatus" && e["regarding"]["name"] == "orders")
        .map(|e| (e["reason"].as_str().unwrap(), e["type"].as_str().unwrap()))
        .collect();
    m.check(
        turns.contains(&("Degraded", "Warning")) && turns.contains(&("ProgressFailed", "Warning")),
        &format!("Degraded and ProgressFailed Events: {turns:?}"),
    );
    let failed = m.metric("nexo_manager_deployments{phase=\"failed\"}");
    m.check(
        failed == Some(1.0),
        &format!("one deployment failed: {failed:?}"),
    );
    m.stop_expecting_exit_0();
}

#[test]
fn a_legacy_deployment_fails_at_its_controllers_progress_deadline() {
    let f = Fixture::new("status-legacy");
    let mut m = f.spawn_with_probes(&[]);
    // The test bed has no node: its pods never run, and the deployment
    // controller gives up after 2 s.
    let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "billing"},
        "spec": {"replicas": 1, "progressDeadlineSeconds": 2, "selector": {"matchLabels": {"app": "billing"}},
                 "template": {"metadata": {"labels": {"app": "billing"}},
                              "spec": {"containers": [{"name": "proxy", "image": "registry.example.com/nexo/proxy:1.3.0"}]}}}});
    // A pod of another controller that carries the Deployment's selector
    // labels, whose kubelet message holds a secret: not the Deployment's,
    // so nothing of it may reach a heartbeat or an Event.
    let stranger = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "stranger", "namespace": f.ns.name, "labels": {"app": "billing"}},
        "spec": {"containers": [{"name": "proxy", "image": "registry.example.com/other:1"}]}});
    let pods = format!("/api/v1/namespaces/{}/pods", f.ns.name);
    f.tb.admin()
        .create(&pods, &stranger)
        .expect("create the stranger pod");
    let leak = json!({"status": {"containerStatuses": [{"name": "proxy", "ready": false, "restartCount": 0,
        "image": "registry.example.com/other:1", "imageID": "",
        "state": {"waiting": {"reason": "CreateContainerConfigError",
                              "message": "couldn't find key in env DB_PASSWORD=hunter2"}}}]}});
    let _: Value =
        f.tb.admin()
            .patch(&format!("{pods}/stranger/status"), MERGE_PATCH, &leak)
            .expect("write the stranger pod's status");
    let payload = json!({"deployment": {"name": "billing", "namespace": f.ns.name}, "format": "legacy",
        "manifests": [deployment]});
    f.sim
        .enqueue_command(&f.env_id, command("st-legacy", "deploy", payload));
    let ack = wait_ack(&f, &mut m, "st-legacy");
    m.check(ack["result"] == "applied", &format!("deploy: {ack}"));
    let (_, e) = wait_entry(
        &f,
        &mut m,
        0,
        "billing",
        "failed at the controller's deadline",
        |e| e["status"]["phase"] == "failed",
    );
    m.check(
        e["kind"] == "Deployment"
            && e["status"]["reason"] == "ProgressDeadlineExceeded"
            && e["status"]["message"]
                .as_str()
                .is_some_and(|s| s.contains("timed out progressing"))
            && e["status"]["command"]
                == json!({"id": "st-legacy", "class": "deploy", "phase": "failed"})
            && e["status"]["updatedReplicas"].is_i64(),
        &format!("the deployment controller's verdict: {e}"),
    );
    // The next heartbeats, the log and the Events know nothing of the
    // stranger's pod.
    let seen = f.sim.heartbeats().len();
    wait_heartbeat(&f, &mut m, seen + 1, "two more heartbeats", |_| Some(()));
    let heartbeats = serde_json::to_string(&f.sim.heartbeats()).unwrap();
    let events = serde_json::to_string(&f.events()).unwrap();
    m.check(
        !heartbeats.contains("hunter2") && !heartbeats.contains("stranger"),
        "no heartbeat quotes the stranger's pod",
    );
    m.check(
        !events.contains("hunter2") && events.contains("ProgressFailed"),
        &format!("the ProgressFailed Event does not quote the stranger's pod: {events}"),
    );
    m.check(
        !m.stderr().contains("hunter2"),
        "the log does not quote the stranger's pod",
    );
    m.stop_expecting_exit_0();
}
