//! `plan` (`command.plan.v1`) against the real API server, on a test bed of
//! its own with an audit log: a plan of a new deploy, of a changed one, of
//! one refused for an object that is not the deployment's, of a rollout
//! and of an uninstall names the action and the fields the command would
//! change, and writes nothing: no object, no drift record, no Event, and no
//! write of any object of the namespace in the audit log but the Manager's
//! own state and lease (its dry runs are there, `dryRun=All`). A plan sent
//! again is answered from the ledger, not planned again.

mod support;

use std::path::Path;

use nexo_cpsim::SimConfig;
use serde_json::{Value, json};
use support::audit::mark;
use support::commands::{command, configmap, ns_path, proxy, secret, wait_ack};
use support::fixture::{Fixture, PROXY_IMAGE};
use support::manager::Manager;

/// The Manager's requests from byte `from` on in namespace `ns` that
/// change something (`create`, `update`, `patch`, `delete`): the writes,
/// and the dry runs, each as `verb resource/name`; its lease and state
/// Secret left out.
fn changes(bed: &Path, from: u64, ns: &str) -> (Vec<String>, Vec<String>) {
    // The audit log is written as requests end: let it catch up.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let (mut writes, mut dry) = (Vec::new(), Vec::new());
    for e in support::audit::managers_requests(bed, from) {
        let verb = e["verb"].as_str().unwrap_or_default();
        let o = &e["objectRef"];
        let resource = o["resource"].as_str().unwrap_or_default();
        let name = o["name"].as_str().unwrap_or_default();
        if !matches!(verb, "create" | "update" | "patch" | "delete")
            || o["namespace"] != ns
            || resource == "leases"
            || name == "nexo-manager-state"
        {
            continue;
        }
        let line = format!("{verb} {resource}/{name}");
        if e["requestURI"]
            .as_str()
            .is_some_and(|u| u.contains("dryRun=All"))
        {
            dry.push(line);
        } else {
            writes.push(line);
        }
    }
    (writes, dry)
}

fn deploy_payload(f: &Fixture, listen: &str) -> Value {
    let mut config = configmap("orders-config");
    config["data"]["listen"] = json!(listen);
    json!({"deployment": {"name": "orders", "namespace": f.ns.name}, "format": "crd",
           "manifests": [proxy("orders"), config, secret("orders-db")]})
}

fn plan_of(class: &str, payload: Value) -> Value {
    json!({"class": class, "payload": payload})
}

/// Sends `cmd` and returns its ack, the writes and the dry runs it cost.
fn send(f: &Fixture, m: &mut Manager, bed: &Path, cmd: Value) -> (Value, Vec<String>, Vec<String>) {
    let id = cmd["id"].as_str().unwrap().to_owned();
    let from = mark(bed);
    f.sim.enqueue_command(&f.env_id, cmd);
    let ack = wait_ack(f, m, &id);
    let (writes, dry) = changes(bed, from, &f.ns.name);
    (ack, writes, dry)
}

/// The planned object of `kind`.
fn object<'a>(ack: &'a Value, kind: &str) -> &'a Value {
    ack["plan"]["objects"]
        .as_array()
        .and_then(|o| o.iter().find(|o| o["kind"] == kind))
        .unwrap_or(&Value::Null)
}

#[test]
fn a_plan_names_actions_and_fields_and_writes_nothing() {
    let bed = support::OwnBed::start("plan-tb", &["--audit"]);
    let f = Fixture::on(bed.tb, "plan", SimConfig::default());
    let mut m = f.spawn_with_probes(&[]);
    let events_before = f.events().len();

    // A new deploy: everything created, nothing written.
    let cmd = command(
        "p-new",
        "plan",
        plan_of("deploy", deploy_payload(&f, "27017")),
    );
    let (ack, writes, dry) = send(&f, &mut m, &bed.dir, cmd.clone());
    m.check(
        ack["result"] == "applied"
            && ack["plan"]["wouldSucceed"] == true
            && ack["message"] == "plan: would apply 3 objects (3 created)",
        &format!("a plan of a new deploy, made: {ack}"),
    );
    for kind in ["NexoProxy", "ConfigMap", "Secret"] {
        let o = object(&ack, kind);
        m.check(
            o["action"] == "created" && o["fields"].as_array().is_some_and(|f| !f.is_empty()),
            &format!("{kind} would be created, its fields named: {o}"),
        );
    }
    m.check(
        object(&ack, "ConfigMap")["fields"]
            .as_array()
            .unwrap()
            .contains(&json!("/data")),
        &format!("the ConfigMap's data named: {ack}"),
    );
    m.check(
        writes.is_empty(),
        &format!("a plan writes nothing: {writes:?}"),
    );
    m.check(
        dry.len() == 3 && dry.iter().all(|d| d.starts_with("patch ")),
        &format!("each object's apply sent as a dry run: {dry:?}"),
    );
    for (kind, name) in [
        ("NexoProxy", "orders"),
        ("ConfigMap", "orders-config"),
        ("Secret", "orders-db"),
        ("Secret", "nexo-applied-orders"),
    ] {
        m.check(
            f.tb.admin()
                .get_opt::<Value>(&ns_path(&f, kind, name))
                .unwrap()
                .is_none(),
            &format!("nothing written: {kind} {name}"),
        );
    }

    // Sent again: answered from the ledger, not planned again.
    let from = mark(&bed.dir);
    f.sim.enqueue_command(&f.env_id, cmd);
    let log = m.log_reader();
    m.wait_until(
        std::time::Duration::from_secs(30),
        "the plan acknowledged again",
        || {
            log().lines().any(|l| {
                l.contains("command already finished")
                    && l.contains("commandId=p-new ")
                    && l.contains("result=applied")
            })
        },
    );
    let (writes, dry) = changes(&bed.dir, from, &f.ns.name);
    m.check(
        writes.is_empty() && dry.is_empty(),
        &format!("a plan sent again costs no request: {writes:?} {dry:?}"),
    );

    // Deployed, then a changed deploy planned: the ConfigMap's one field.
    let (ack, _, _) = send(
        &f,
        &mut m,
        &bed.dir,
        command("d-1", "deploy", deploy_payload(&f, "27017")),
    );
    m.check(ack["result"] == "applied", &format!("deployed: {ack}"));
    let events_deployed = f.events().len();
    let cmd = command(
        "p-changed",
        "plan",
        plan_of("deploy", deploy_payload(&f, "27018")),
    );
    let (ack, writes, dry) = send(&f, &mut m, &bed.dir, cmd);
    let config = object(&ack, "ConfigMap");
    m.check(
        ack["plan"]["wouldSucceed"] == true
            && config["action"] == "configured"
            && config["fields"] == json!(["/data/listen"])
            && object(&ack, "NexoProxy")["action"] == "unchanged"
            && object(&ack, "Secret")["action"] == "unchanged",
        &format!("only the ConfigMap's listen would change: {ack}"),
    );
    m.check(
        writes.is_empty() && dry.len() == 3,
        &format!("dry runs only: {writes:?} {dry:?}"),
    );
    let live: Value =
        f.tb.admin()
            .get(&ns_path(&f, "ConfigMap", "orders-config"))
            .unwrap();
    m.check(
        live["data"]["listen"] == "27017",
        &format!("the ConfigMap unchanged: {live}"),
    );

    // A rollout planned: the image, and only it.
    let cmd = command(
        "p-rollout",
        "plan",
        plan_of(
            "rollout",
            json!({"imageTag": "9.9.9", "targets": [{"name": "orders", "namespace": f.ns.name}]}),
        ),
    );
    let (ack, writes, dry) = send(&f, &mut m, &bed.dir, cmd);
    let p = object(&ack, "NexoProxy");
    m.check(
        ack["plan"]["wouldSucceed"] == true
            && p["action"] == "configured"
            && p["fields"] == json!(["/spec/image"]),
        &format!("a rollout would change the image: {ack}"),
    );
    m.check(
        writes.is_empty() && dry == ["patch nexoproxies/orders"],
        &format!("its patch as a dry run: {writes:?} {dry:?}"),
    );
    let proxy_now: Value =
        f.tb.admin()
            .get(&ns_path(&f, "NexoProxy", "orders"))
            .unwrap();
    m.check(
        proxy_now["spec"]["image"] == PROXY_IMAGE,
        &format!("the image unchanged: {}", proxy_now["spec"]),
    );

    // Refused: a ConfigMap of that name that is not the deployment's.
    f.tb.admin()
        .create(
            &format!("/api/v1/namespaces/{}/configmaps", f.ns.name),
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "theirs"}, "data": {}}),
        )
        .unwrap();
    let mut payload = deploy_payload(&f, "27017");
    payload["manifests"]
        .as_array_mut()
        .unwrap()
        .push(configmap("theirs"));
    let cmd = command("p-refused", "plan", plan_of("deploy", payload));
    let (ack, writes, _) = send(&f, &mut m, &bed.dir, cmd);
    let theirs = ack["plan"]["objects"]
        .as_array()
        .and_then(|o| o.iter().find(|o| o["name"] == "theirs"))
        .cloned()
        .unwrap_or_default();
    m.check(
        ack["result"] == "applied"
            && ack["plan"]["wouldSucceed"] == false
            && theirs["action"] == "refused"
            && theirs["message"]
                .as_str()
                .is_some_and(|s| s.contains("theirs")),
        &format!("the plan made, saying the deploy would be refused, and why: {ack}"),
    );
    m.check(writes.is_empty(), &format!("nothing written: {writes:?}"));

    // An uninstall planned: the NexoProxy would be deleted; it stays.
    let cmd = command(
        "p-uninstall",
        "plan",
        plan_of(
            "uninstall",
            json!({"deployment": {"name": "orders", "namespace": f.ns.name}}),
        ),
    );
    let (ack, writes, dry) = send(&f, &mut m, &bed.dir, cmd);
    m.check(
        ack["plan"]["wouldSucceed"] == true
            && object(&ack, "NexoProxy")["action"] == "deleted"
            && ack["message"] == "plan: would delete 1 objects (1 deleted)",
        &format!("an uninstall would delete the NexoProxy: {ack}"),
    );
    m.check(
        writes.is_empty() && dry == ["delete nexoproxies/orders"],
        &format!("its delete as a dry run: {writes:?} {dry:?}"),
    );
    m.check(
        f.tb.admin()
            .get_opt::<Value>(&ns_path(&f, "NexoProxy", "orders"))
            .unwrap()
            .is_some(),
        "the NexoProxy is still there",
    );

    // A plan that cannot be planned as a valid command: failed.
    let cmd = command("p-bad", "plan", plan_of("uninstall", json!({})));
    let (ack, _, _) = send(&f, &mut m, &bed.dir, cmd);
    m.check(
        ack["result"] == "failed"
            && ack["message"]
                == "invalid payload: payload.payload: deployment is missing or not an object"
            && ack.get("plan").is_none(),
        &format!("an invalid plan fails: {ack}"),
    );

    // No Event for any plan: only the deploy's.
    let events = f.events();
    let deploy_events = events_deployed - events_before;
    m.check(
        events.len() == events_deployed && deploy_events > 0,
        &format!(
            "Events only for the deploy ({deploy_events}), none for the plans: {}",
            serde_json::to_string(&events[events_deployed.min(events.len())..]).unwrap()
        ),
    );
    let metrics = m.metrics();
    m.check(
        metrics.contains("nexo_manager_command_duration_seconds_count{class=\"plan\"} 5\n"),
        &format!("the five plans made, counted as plans: {metrics}"),
    );
    m.stop_expecting_exit_0();
}
