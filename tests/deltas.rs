//! Inventory deltas (`inventory.delta.v1`) against the real API server and
//! the simulator (work in progress, issue 42): a CP that never confirms
//! gets the full form every time; one that confirms gets deltas, which at
//! rest name nothing and after a change name that entry alone, and the
//! inventory it rebuilds equals the Manager's.

mod support;

use nexo_cpsim::inventory::Confirming;
use nexo_manager::kube::client::MERGE_PATCH;
use serde_json::{Value, json};
use support::commands::{command, ns_path, proxy, wait_ack, wait_heartbeat};
use support::fixture::Fixture;

#[test]
fn a_confirming_cp_gets_deltas_and_rebuilds_the_inventory() {
    let f = Fixture::new("deltas");
    let mut m = f.spawn_with_probes(&[]);
    for name in ["a", "b", "c"] {
        let payload = json!({"deployment": {"name": name, "namespace": f.ns.name},
            "format": "crd", "manifests": [proxy(name)]});
        f.sim
            .enqueue_command(&f.env_id, command(&format!("d-{name}"), "deploy", payload));
        wait_ack(&f, &mut m, &format!("d-{name}"));
    }
    // Never confirmed: the full form, every time.
    let now = f.sim.heartbeats().len();
    let (_, hb) = wait_heartbeat(&f, &mut m, now, "a full heartbeat", |hb| {
        (hb["deployments"].as_array().map(Vec::len) == Some(3)).then(|| hb.clone())
    });
    m.check(
        hb["inventory"]["full"] == true && hb["inventory"]["epoch"].is_string(),
        &format!("the full form, named: {}", hb["inventory"]),
    );
    f.sim.set_confirming(Confirming::Always);
    let now = f.sim.heartbeats().len();
    let (_, rest) = wait_heartbeat(&f, &mut m, now + 1, "a delta at rest", |hb| {
        hb["inventory"]["base"].is_u64().then(|| hb.clone())
    });
    m.check(
        rest.get("deployments").is_none()
            && rest["inventory"]["changed"] == json!([])
            && rest["inventory"]["removed"] == json!([])
            && rest["managedProxyCount"] == 3,
        &format!("at rest, nothing named: {}", rest["inventory"]),
    );
    // One deployment changes: that entry alone.
    f.tb.admin()
        .patch(
            &ns_path(&f, "NexoProxy", "b"),
            MERGE_PATCH,
            &json!({"spec": {"replicas": 5}}),
        )
        .unwrap();
    let now = f.sim.heartbeats().len();
    let (_, changed) = wait_heartbeat(&f, &mut m, now, "a delta naming b", |hb| {
        let c = hb["inventory"]["changed"].as_array()?;
        (c.len() == 1 && c[0]["name"] == "b").then(|| hb.clone())
    });
    m.check(
        changed["inventory"]["changed"][0]["replicas"] == 5,
        &format!("the whole entry: {}", changed["inventory"]),
    );
    let rebuilt = f.sim.rebuilt_inventory().unwrap_or_default();
    let names: Vec<(&str, i64)> = rebuilt
        .iter()
        .map(|e: &Value| (e["name"].as_str().unwrap(), e["replicas"].as_i64().unwrap()))
        .collect();
    m.check(
        names == [("a", 2), ("b", 5), ("c", 2)],
        &format!("the CP's inventory rebuilt from deltas: {names:?}"),
    );
    m.stop_expecting_exit_0();
}
