//! Every write and dry run of a command is sent as the executor of its
//! namespace (`NEXO_EXECUTOR`, README "What a command may write"): the API
//! server decides it with that namespace's RBAC. On a test bed of its own
//! with an audit log: what the executor's Role forbids fails with the API
//! server's 403 and nothing is written, though the Manager itself (the
//! test bed's administrator here) could write it; and impersonation costs
//! no request: the same command asks the API server the same number of
//! times as the executor and as the Manager (`NEXO_EXECUTOR=off`).

mod support;

use std::collections::BTreeMap;
use std::path::Path;

use nexo_cpsim::SimConfig;
use serde_json::{Value, json};
use support::audit::mark;
use support::commands::{command, configmap, ns_path, proxy, secret, wait_ack};
use support::fixture::Fixture;
use support::manager::Manager;

/// The requests the Manager sent from `from` on about the objects of
/// deployment `name` (a create's audit event may not name its object), by
/// verb and resource, each as whom (the user, or the user it acted as).
fn requests(bed: &Path, from: u64, name: &str) -> BTreeMap<String, usize> {
    let mut by = BTreeMap::new();
    for e in support::audit::managers_requests(bed, from) {
        let object = &e["objectRef"];
        let about = ["nexoproxies", "configmaps", "secrets"]
            .contains(&object["resource"].as_str().unwrap_or_default())
            && match object["name"].as_str() {
                Some(n) => n.starts_with(name),
                None => e["verb"] == "create",
            };
        if !about {
            continue;
        }
        let who = if e["impersonatedUser"]["username"].is_string() {
            "executor"
        } else {
            "manager"
        };
        let key = format!(
            "{} {} as {who}",
            e["verb"].as_str().unwrap_or("?"),
            e["objectRef"]["resource"].as_str().unwrap_or("?"),
        );
        *by.entry(key).or_insert(0) += 1;
    }
    by
}

/// Deploys `name` (a NexoProxy, a ConfigMap, a Secret) and returns its ack
/// and the requests it cost.
fn deploy(
    f: &Fixture,
    m: &mut Manager,
    bed: &Path,
    id: &str,
    name: &str,
) -> (Value, BTreeMap<String, usize>) {
    let payload = json!({"deployment": {"name": name, "namespace": f.ns.name}, "format": "crd",
        "manifests": [proxy(name), configmap(&format!("{name}-config")), secret(&format!("{name}-db"))]});
    let from = mark(bed);
    f.sim
        .enqueue_command(&f.env_id, command(id, "deploy", payload));
    let ack = wait_ack(f, m, id);
    // The audit log is written as requests end: let it catch up.
    std::thread::sleep(std::time::Duration::from_secs(2));
    (ack, requests(bed, from, name))
}

fn total(by: &BTreeMap<String, usize>) -> usize {
    by.values().sum()
}

#[test]
fn the_executors_rbac_bounds_every_command_at_no_cost_in_requests() {
    let bed = support::OwnBed::start("executor-tb", &["--audit"]);
    let f = Fixture::on(bed.tb, "executor", SimConfig::default());
    f.tb.install_crds();

    // Its Role narrowed by the administrator: ConfigMaps only.
    let cm_only = json!([{"apiGroups": [""], "resources": ["configmaps"],
        "verbs": ["get", "list", "create", "patch", "delete"]}]);
    support::grant_executor(f.tb, &f.ns.name, &cm_only);
    let mut m = f.spawn_with_probes(&[]);
    let (ack, _) = deploy(&f, &mut m, &bed.dir, "x-narrow", "orders");
    let executor = format!("system:serviceaccount:{}:nexo-executor", f.ns.name);
    m.check(
        ack["result"] == "failed"
            && ack["message"]
                .as_str()
                .is_some_and(|s| s.contains("forbidden") && s.contains(&executor)),
        &format!("the API server's 403 for the executor: {ack}"),
    );
    for (kind, name) in [
        ("NexoProxy", "orders"),
        ("ConfigMap", "orders-config"),
        ("Secret", "orders-db"),
    ] {
        m.check(
            f.tb.admin()
                .get_opt::<Value>(&ns_path(&f, kind, name))
                .unwrap()
                .is_none(),
            &format!("nothing written: {kind} {name}"),
        );
    }

    // The executor's full rules: the same command is applied, every write
    // and dry run sent as the executor, every read as the Manager.
    support::grant_executor(f.tb, &f.ns.name, &support::executor_rules());
    let (ack, as_executor) = deploy(&f, &mut m, &bed.dir, "x-full", "orders");
    m.check(ack["result"] == "applied", &format!("applied: {ack}"));
    m.check(
        as_executor.keys().all(|k| {
            let write = !k.starts_with("get ") && !k.starts_with("list ");
            k.ends_with("as executor") == write
        }),
        &format!("writes as the executor, reads as the Manager: {as_executor:?}"),
    );
    m.stop_expecting_exit_0();

    // The same deploy of another deployment as the Manager itself.
    let mut m = f.spawn_with_probes(&[("NEXO_EXECUTOR", "off")]);
    let (ack, as_manager) = deploy(&f, &mut m, &bed.dir, "x-off", "billing");
    m.check(ack["result"] == "applied", &format!("applied: {ack}"));
    m.check(
        as_manager.keys().all(|k| k.ends_with("as manager")),
        &format!("NEXO_EXECUTOR=off: all as the Manager: {as_manager:?}"),
    );
    eprintln!(
        "executor: a deploy of 3 objects costs {} API requests as the executor ({as_executor:?}), {} as the Manager ({as_manager:?})",
        total(&as_executor),
        total(&as_manager)
    );
    m.check(
        total(&as_executor) == total(&as_manager),
        "impersonation is a header: no request more",
    );
    m.stop_expecting_exit_0();
}
