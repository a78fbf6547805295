//! Rollback on failure (`rollback.v1`) against the real API server: a
//! deploy and a rollout with `onFailure: rollback` whose change turns
//! `failed` (a NexoProxy that is not available within
//! `NEXO_PROGRESS_DEADLINE`: no operator runs here) get the change before
//! restored, once, with the command's progress, a `RolledBack` Event and
//! the metric; a deployment with no previous change is left and says so; a
//! deploy whose writes fail midway (the API server answers 500 on its third
//! object) is restored at once; the content policy refuses a restore that
//! breaks it now, and a history edited in the cluster is never restored;
//! and a leader stopped past its lease never restores after its successor
//! acted.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};
use support::apiproxy::{ApiProxy, Faults};
use support::commands::{command, configmap, ns_path, proxy, secret, wait_ack, wait_heartbeat};
use support::fixture::{Fixture, PROXY_IMAGE};
use support::manager::Manager;

/// `status.command` of `name` in a heartbeat.
fn progress<'a>(hb: &'a Value, name: &str) -> Option<&'a Value> {
    hb["deployments"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
        .map(|e| &e["status"]["command"])
        .filter(|c| c.is_object())
}

/// Waits for a heartbeat after the `after`th where the progress of `id` on
/// `name` is `phase`.
fn wait_progress(
    f: &Fixture,
    m: &mut Manager,
    after: usize,
    name: &str,
    id: &str,
    phase: &str,
) -> (usize, Value) {
    wait_heartbeat(f, m, after, &format!("{id} {phase} on {name}"), |hb| {
        progress(hb, name)
            .filter(|c| c["id"] == id && c["phase"] == phase)
            .cloned()
    })
}

fn deploy(f: &Fixture, name: &str, listen: &str, extra: &[Value], on_failure: &str) -> Value {
    let mut config = configmap(&format!("{name}-config"));
    config["data"]["listen"] = json!(listen);
    let mut manifests = vec![proxy(name), config, secret(&format!("{name}-db"))];
    manifests.extend_from_slice(extra);
    json!({"deployment": {"name": name, "namespace": f.ns.name}, "format": "crd",
           "manifests": manifests, "onFailure": on_failure})
}

fn send(f: &Fixture, m: &mut Manager, id: &str, class: &str, payload: Value) -> Value {
    f.sim
        .enqueue_command(&f.env_id, command(id, class, payload));
    let ack = wait_ack(f, m, id);
    m.check(ack["result"] == "applied", &format!("{id} applied: {ack}"));
    ack
}

fn get(f: &Fixture, kind: &str, name: &str) -> Option<Value> {
    f.tb.admin().get_opt(&ns_path(f, kind, name)).unwrap()
}

fn listen(f: &Fixture, name: &str) -> Value {
    get(f, "ConfigMap", name).map_or(Value::Null, |c| c["data"]["listen"].clone())
}

/// The value of `nexo_manager_rollbacks_total{result=…}`.
fn rollbacks(m: &mut Manager, result: &str) -> String {
    let metrics = m.metrics();
    let line = format!("nexo_manager_rollbacks_total{{result=\"{result}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&line))
        .unwrap_or("(absent)")
        .to_owned()
}

/// The `RolledBack` Events' notes.
fn rolled_back_events(f: &Fixture) -> Vec<String> {
    f.events()
        .iter()
        .filter(|e| e["reason"] == "RolledBack")
        .map(|e| {
            format!(
                "{} {}: {}",
                e["type"].as_str().unwrap_or_default(),
                e["regarding"]["name"].as_str().unwrap_or_default(),
                e["note"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

/// The rollback counted once under `result`, and told in one `RolledBack`
/// Event whose note holds `note`.
fn told_once(f: &Fixture, m: &mut Manager, result: &str, note: &str) {
    let counted = rollbacks(m, result) == "1";
    m.check(counted, &format!("one rollback counted as {result}"));
    let events = rolled_back_events(f);
    m.check(
        events.len() == 1 && events[0].contains(note),
        &format!("one RolledBack Event saying {note:?}: {events:?}"),
    );
}

/// The history a deployment's record keeps.
fn history(f: &Fixture, name: &str) -> Value {
    let record = get(f, "Secret", &format!("nexo-applied-{name}")).expect("the record");
    let text = support::drift::base64_decode(record["data"]["history"].as_str().unwrap());
    serde_json::from_slice(&text).unwrap()
}

#[test]
fn a_failed_deploy_and_a_failed_rollout_are_restored_once() {
    let f = Fixture::new("rollback");
    let mut m = f.spawn_with_probes(&[("NEXO_PROGRESS_DEADLINE", "3s")]);
    let counted = rollbacks(&mut m, "rolled_back") == "0";
    m.check(counted, "the counter is there before the first rollback");
    // An object the deployment once had: the change to go back to leaves
    // it out, the failed change lists it again without creating it.
    let keep = configmap("orders-keep");
    let d0 = deploy(&f, "orders", "27017", std::slice::from_ref(&keep), "stay");
    send(&f, &mut m, "d-0", "deploy", d0);
    // The change to go back to: left as it is when it fails itself.
    send(
        &f,
        &mut m,
        "d-1",
        "deploy",
        deploy(&f, "orders", "27017", &[], "stay"),
    );
    // The change that fails: a value changed, an object added.
    let extra = [configmap("orders-extra"), keep];
    let start = f.sim.heartbeats().len();
    send(
        &f,
        &mut m,
        "d-2",
        "deploy",
        deploy(&f, "orders", "27018", &extra, "rollback"),
    );
    m.check(
        listen(&f, "orders-config") == "27018" && get(&f, "ConfigMap", "orders-extra").is_some(),
        "d-2 applied",
    );
    let (_, c) = wait_progress(&f, &mut m, start, "orders", "d-2", "rolledBack");
    m.check(
        c == json!({"id": "d-2", "class": "deploy", "phase": "rolledBack", "rolledBackTo": "d-1"}),
        &format!("the progress names the command restored: {c}"),
    );
    m.check(
        listen(&f, "orders-config") == "27017",
        "the changed value restored",
    );
    m.check(
        get(&f, "ConfigMap", "orders-extra").is_none(),
        "the object the failed change created is deleted",
    );
    m.check(
        get(&f, "ConfigMap", "orders-keep").is_some(),
        "an object it listed without creating it is left",
    );
    let events = rolled_back_events(&f);
    m.check(
        events.len() == 1
            && events[0] == "Warning orders: command d-2 failed; rolled back to command d-1",
        &format!("one RolledBack Event naming both commands: {events:?}"),
    );
    let counted = rollbacks(&mut m, "rolled_back") == "1";
    m.check(counted, "the rollback counted");
    let h = history(&f, "orders");
    m.check(
        h["command"] == "d-1" && h["rolledBackFrom"] == "d-2" && h.get("previous").is_none(),
        &format!("the record holds the restored change, marked: {h}"),
    );

    // Once: the restored change fails too (no operator), and stays.
    let now = f.sim.heartbeats().len();
    wait_heartbeat(&f, &mut m, now + 6, "six heartbeats", |_| Some(()));
    let counted = rollbacks(&mut m, "rolled_back") == "1" && rolled_back_events(&f).len() == 1;
    m.check(counted, "never rolled back twice");
    m.check(
        listen(&f, "orders-config") == "27017",
        "the restored change left as it is",
    );

    // A rollout that fails: its image put back.
    let start = f.sim.heartbeats().len();
    send(
        &f,
        &mut m,
        "r-1",
        "rollout",
        json!({"imageTag": "9.9.9", "targets": [{"name": "orders", "namespace": f.ns.name}],
               "onFailure": "rollback"}),
    );
    let image = |f: &Fixture| get(f, "NexoProxy", "orders").unwrap()["spec"]["image"].clone();
    m.check(
        image(&f).as_str().is_some_and(|i| i.ends_with(":9.9.9")),
        "r-1 applied",
    );
    let (_, c) = wait_progress(&f, &mut m, start, "orders", "r-1", "rolledBack");
    m.check(
        c["rolledBackTo"] == "d-1",
        &format!("back to d-1's change: {c}"),
    );
    m.check(
        image(&f) == PROXY_IMAGE,
        &format!("the image restored: {}", image(&f)),
    );
    let counted = rollbacks(&mut m, "rolled_back") == "2";
    m.check(counted, "the rollout's rollback counted");
    m.stop_expecting_exit_0();
}

#[test]
fn a_deployment_with_no_previous_change_is_left_and_says_so() {
    let f = Fixture::new("rollback-first");
    let mut m = f.spawn_with_probes(&[("NEXO_PROGRESS_DEADLINE", "3s")]);
    let start = f.sim.heartbeats().len();
    send(
        &f,
        &mut m,
        "n-1",
        "deploy",
        deploy(&f, "solo", "27017", &[], "rollback"),
    );
    let (_, c) = wait_progress(&f, &mut m, start, "solo", "n-1", "rollbackFailed");
    m.check(
        c["reason"] == "no previous change is recorded; left as it is"
            && c.get("rolledBackTo").is_none(),
        &format!("it says why: {c}"),
    );
    m.check(
        get(&f, "NexoProxy", "solo").is_some() && listen(&f, "solo-config") == "27017",
        "left as it is",
    );
    told_once(
        &f,
        &mut m,
        "nothing_to_restore",
        "not rolled back: no previous change",
    );
    let counted = rollbacks(&mut m, "rolled_back") == "0";
    m.check(counted, "not counted as rolled back");
    m.stop_expecting_exit_0();
}

#[test]
fn a_deploy_failing_midway_is_restored_at_once() {
    let f = Fixture::new("rollback-midway");
    f.tb.install_crds();
    let proxy_api = ApiProxy::with(
        f.tb,
        Faults {
            fail_create_once: Some("/configmaps".into()),
            ..Faults::default()
        },
    );
    let mut env = f.env();
    env.insert(
        "KUBECONFIG".into(),
        proxy_api.kubeconfig(&f.dir).display().to_string(),
    );
    // The proxy writes as the test bed's administrator: no executor here.
    env.insert("NEXO_EXECUTOR".into(), "off".into());
    env.insert(
        "NEXO_LISTEN_ADDR".into(),
        support::PROBES_ON_ANY_PORT.into(),
    );
    // A create of d-1's ConfigMap is the one that fails: made first here,
    // around the proxy.
    f.tb.admin()
        .create(
            &format!("/api/v1/namespaces/{}/configmaps", f.ns.name),
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "unrelated"}}),
        )
        .unwrap();
    let mut m = f.spawn(&env);
    let mut payload = deploy(&f, "orders", "27017", &[], "stay");
    // d-1 without a ConfigMap: its creates go through.
    payload["manifests"].as_array_mut().unwrap().remove(1);
    send(&f, &mut m, "d-1", "deploy", payload);
    // d-2: the NexoProxy changed, a Secret added, then a ConfigMap whose
    // create answers 500: two writes done, the third failed.
    let mut d2 = deploy(&f, "orders", "27018", &[], "rollback");
    d2["manifests"][0]["spec"]["replicas"] = json!(5);
    d2["manifests"][2] = secret("orders-new");
    let config = d2["manifests"][1].take();
    d2["manifests"][1] = d2["manifests"][2].take();
    d2["manifests"][2] = config;
    f.sim
        .enqueue_command(&f.env_id, command("d-2", "deploy", d2));
    let ack = wait_ack(&f, &mut m, "d-2");
    m.check(
        ack["result"] == "failed"
            && ack["message"].as_str().is_some_and(|s| {
                s.contains("after 2 of 3 objects") && s.ends_with("; rolled back to command d-1")
            }),
        &format!("the ack says the deploy failed midway and was rolled back: {ack}"),
    );
    let p = get(&f, "NexoProxy", "orders").unwrap();
    m.check(
        p["spec"]["replicas"] == 2,
        &format!("the NexoProxy's change restored: {}", p["spec"]),
    );
    m.check(
        get(&f, "Secret", "orders-new").is_none(),
        "the Secret it created deleted",
    );
    m.check(
        get(&f, "ConfigMap", "unrelated").is_some(),
        "nothing else touched",
    );
    told_once(
        &f,
        &mut m,
        "rolled_back",
        "command d-2 failed; rolled back to command d-1",
    );
    m.stop_expecting_exit_0();
}

#[test]
fn the_content_policy_refuses_a_restore_that_breaks_it() {
    let f = Fixture::new("rollback-policy");
    let mut m = f.spawn_with_probes(&[("NEXO_PROGRESS_DEADLINE", "3s")]);
    send(
        &f,
        &mut m,
        "d-1",
        "deploy",
        deploy(&f, "orders", "27017", &[], "stay"),
    );
    m.stop_expecting_exit_0();
    // The operator moves the Proxy image to another repository: d-1's
    // image is no longer one a deploy may use.
    let image = "registry.example.com/nexo-next/proxy:2.0.0";
    let mut m = f.spawn_with_probes(&[
        ("NEXO_PROGRESS_DEADLINE", "3s"),
        ("NEXO_PROXY_IMAGE", image),
    ]);
    let mut d2 = deploy(&f, "orders", "27018", &[], "rollback");
    d2["manifests"][0]["spec"]["image"] = json!(image);
    let start = f.sim.heartbeats().len();
    send(&f, &mut m, "d-2", "deploy", d2);
    let (_, c) = wait_progress(&f, &mut m, start, "orders", "d-2", "rollbackFailed");
    m.check(
        c["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("policy: ") && r.contains("nexo/proxy")),
        &format!("the restore refused by the policy, named: {c}"),
    );
    m.check(
        listen(&f, "orders-config") == "27018"
            && get(&f, "NexoProxy", "orders").unwrap()["spec"]["image"] == image,
        "nothing restored",
    );
    let counted = rollbacks(&mut m, "failed") == "1";
    m.check(counted, "counted as failed");
    m.stop_expecting_exit_0();
}

#[test]
fn a_history_edited_in_the_cluster_is_never_restored() {
    let f = Fixture::new("rollback-forged");
    let mut m = f.spawn_with_probes(&[("NEXO_PROGRESS_DEADLINE", "5s")]);
    send(
        &f,
        &mut m,
        "d-1",
        "deploy",
        deploy(&f, "orders", "27017", &[], "stay"),
    );
    let start = f.sim.heartbeats().len();
    send(
        &f,
        &mut m,
        "d-2",
        "deploy",
        deploy(&f, "orders", "27018", &[], "rollback"),
    );
    // A tenant who may write Secrets rewrites the change to go back to.
    let mut forged = history(&f, "orders");
    forged["previous"]["payload"]["manifests"][1]["data"]["listen"] = json!("6666");
    let encoded = support::drift::base64_encode(forged.to_string().as_bytes());
    f.tb.admin()
        .patch(
            &ns_path(&f, "Secret", "nexo-applied-orders"),
            nexo_manager::kube::client::MERGE_PATCH,
            &json!({"data": {"history": encoded}}),
        )
        .unwrap();
    let (_, c) = wait_progress(&f, &mut m, start, "orders", "d-2", "rollbackFailed");
    m.check(
        c["reason"].as_str().is_some_and(|r| {
            r.starts_with("its record's history is not the Manager's") && r.contains("proof")
        }),
        &format!("the forged history refused, named: {c}"),
    );
    m.check(
        listen(&f, "orders-config") == "27018",
        &format!("nothing restored: {}", listen(&f, "orders-config")),
    );
    told_once(
        &f,
        &mut m,
        "failed",
        "not rolled back: its record's history",
    );
    m.stop_expecting_exit_0();
}

#[test]
fn a_leader_stopped_past_its_lease_never_restores_after_its_successor_acted() {
    let f = Fixture::new("rollback-fence");
    f.tb.install_crds();
    let env = |pod: &str| {
        let mut e: BTreeMap<String, String> = f.env();
        e.insert("POD_UID".into(), pod.into());
        e.insert("POD_NAME".into(), pod.into());
        e.insert("NEXO_PROGRESS_DEADLINE".into(), "8s".into());
        e
    };
    let mut a = f.spawn(&env("pod-a"));
    send(
        &f,
        &mut a,
        "d-1",
        "deploy",
        deploy(&f, "orders", "27017", &[], "stay"),
    );
    send(
        &f,
        &mut a,
        "d-2",
        "deploy",
        deploy(&f, "orders", "27018", &[], "rollback"),
    );
    // Stopped before d-2's deadline, past its lease.
    a.signal("STOP");
    let mut b = f.spawn(&env("pod-b"));
    let heartbeat_of = |f: &Fixture, pod: &str, after: usize| {
        f.sim.requests().iter().skip(after).any(|r| {
            r.instance.as_deref() == Some(pod) && r.path.ends_with("/heartbeat") && r.status == 200
        })
    };
    b.wait_until(Duration::from_secs(30), "pod-b leading", || {
        heartbeat_of(&f, "pod-b", 0)
    });
    // The successor acts: a new change, which is not rolled back.
    send(
        &f,
        &mut b,
        "d-3",
        "deploy",
        deploy(&f, "orders", "27019", &[], "stay"),
    );
    b.stop_expecting_exit_0();
    // The old leader resumes, leads again, and finds d-2 failed: the
    // deployment is d-3's now, so it must not restore d-1 over it.
    let resumed = f.sim.requests().len();
    a.signal("CONT");
    a.wait_until(Duration::from_secs(30), "pod-a leading again", || {
        heartbeat_of(&f, "pod-a", resumed)
    });
    let start = f.sim.heartbeats().len();
    let (_, c) = wait_progress(&f, &mut a, start, "orders", "d-2", "rollbackFailed");
    a.check(
        c["reason"] == "the deployment was changed since, by command d-3",
        &format!("d-2 not rolled back, and why: {c}"),
    );
    a.check(
        listen(&f, "orders-config") == "27019",
        &format!(
            "the successor's change stands: {}",
            listen(&f, "orders-config")
        ),
    );
    a.check(
        history(&f, "orders")["command"] == "d-3",
        "the record is d-3's",
    );
    a.stop_expecting_exit_0();
}
