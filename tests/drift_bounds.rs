//! Drift at its bounds, against the real API server: a deploy too big for
//! its record is applied, and its ack and the heartbeat's drift entry say
//! that its drift is not watched (naming the bound), and the record of an
//! earlier deploy is never enforced over it; 10 MiB of owned Secrets in
//! a namespace (more than one read may hold) leave the drift check
//! working, listed in pages the read limit allows.

mod support;

use serde_json::{Value, json};
use support::commands::{command, configmap, proxy, secret, wait_ack};
use support::drift::{deploy, drift_of, get, wait_drift};
use support::fixture::Fixture;

/// The drift record's bound (`drift::MAX_RECORD_BYTES`).
const BOUND: usize = 512 * 1024;

#[test]
fn a_deploy_too_big_for_its_record_says_so_and_is_never_rolled_back() {
    let f = Fixture::new("drift-bound");
    let mut m = f.spawn_with_probes(&[("NEXO_DRIFT_INTERVAL", "1s")]);
    deploy(&f, &mut m, "db-small", json!({"mode": "enforce"}));
    m.check(
        get(&f, "Secret", "nexo-applied-orders").is_some(),
        "the small deploy is recorded",
    );

    // The same deployment again, changed, with 600 KiB more: applied, but
    // too big to record.
    let mut config = configmap("orders-config");
    config["data"]["listen"] = json!("27019");
    // Three ConfigMaps of 200 KiB (a manifest may have 256 KiB).
    let blobs = (1..=3).map(|i| {
        let mut blob = configmap(&format!("orders-blob-{i}"));
        blob["data"] = json!({"blob": "x".repeat(200 * 1024)});
        blob
    });
    let mut manifests = vec![proxy("orders"), config, secret("orders-db")];
    manifests.extend(blobs);
    let payload = json!({"deployment": {"name": "orders", "namespace": f.ns.name}, "format": "crd",
        "manifests": manifests,
        "drift": {"mode": "enforce"}});
    let start = f.sim.heartbeats().len();
    f.sim
        .enqueue_command(&f.env_id, command("db-big", "deploy", payload));
    let ack = wait_ack(&f, &mut m, "db-big");
    let message = ack["message"].as_str().unwrap_or_default();
    m.check(
        ack["result"] == "applied"
            && message.contains("drift not watched")
            && message.contains(&format!("bound of {BOUND} bytes")),
        &format!("the ack says that its drift is not watched, naming the bound: {ack}"),
    );
    let (_, d) = wait_drift(&f, &mut m, start, "orders", "the drift entry", |d| {
        d.is_some()
    });
    let d = d.unwrap();
    let object = &d["objects"][0];
    m.check(
        d["mode"] == "enforce"
            && d["objects"].as_array().map(Vec::len) == Some(1)
            && object["kind"] == "NexoProxy"
            && object["name"] == "orders"
            && object["action"] == "failed"
            && object["message"]
                .as_str()
                .is_some_and(|s| s.contains("drift not watched") && s.contains(&BOUND.to_string())),
        &format!("the heartbeat's drift entry says so: {d}"),
    );
    // The earlier record is gone, and several checks later the change
    // stands: nothing rolled it back to the small deploy.
    m.check(
        get(&f, "Secret", "nexo-applied-orders").is_none(),
        "the earlier record is deleted",
    );
    let seen = f.sim.heartbeats().len();
    let (_, later) = wait_drift(&f, &mut m, seen + 3, "orders", "three checks later", |_| {
        true
    });
    let listen = get(&f, "ConfigMap", "orders-config").unwrap()["data"]["listen"].clone();
    m.check(
        listen == "27019",
        &format!("the big deploy's change stands, not enforced back: listen {listen}"),
    );
    m.check(
        later.is_some_and(|l| l["objects"][0]["action"] == "failed"),
        "the entry stays while drift is not watched",
    );

    // A deploy that fits is recorded again, and the entry leaves.
    deploy(&f, &mut m, "db-fits", json!({"mode": "enforce"}));
    let seen = f.sim.heartbeats().len();
    wait_drift(&f, &mut m, seen, "orders", "the entry gone", |d| {
        d.is_none()
    });
    let last: Value = f.sim.last_heartbeat().unwrap();
    m.check(
        drift_of(&last, "orders").is_none() && get(&f, "Secret", "nexo-applied-orders").is_some(),
        "recorded again, watched again",
    );
    m.stop_expecting_exit_0();
}

/// The Manager's peak resident memory (`VmHWM`), in KiB.
fn peak_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmHWM for pid {pid}"))
}

#[test]
fn ten_mib_of_secrets_in_a_namespace_leave_the_drift_check_working() {
    let f = Fixture::new("drift-bulk");
    let mut m = f.spawn_with_probes(&[("NEXO_DRIFT_INTERVAL", "1s")]);
    deploy(&f, &mut m, "dk-deploy", json!({"mode": "enforce"}));
    // 42 Secrets of 256 KiB with this environment's labels (another
    // deployment's, as its deploys would have left them): 10.5 MiB in the
    // one list the check makes of the namespace's Secrets, read at most
    // 8 MiB at a time.
    let before = peak_kib(m.pid());
    let collection = format!("/api/v1/namespaces/{}/secrets", f.ns.name);
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    for i in 0..42 {
        let bytes: Vec<u8> = (0..192 * 1024)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        let bulk = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("bulk-{i:02}"), "labels": f.owned_labels("bulk")},
            "data": {"blob": support::drift::base64_encode(&bytes)}});
        f.tb.admin()
            .create(&collection, &bulk)
            .unwrap_or_else(|e| panic!("create bulk-{i:02}: {e}"));
    }
    let start = f.sim.heartbeats().len();
    support::drift::edit(
        &f,
        "ConfigMap",
        "orders-config",
        json!({"data": {"listen": "27099"}}),
    );
    let (i, d) = wait_drift(&f, &mut m, start, "orders", "the edit corrected", |d| {
        d.is_some_and(|d| d["objects"][0]["action"] == "corrected")
    });
    let listen = get(&f, "ConfigMap", "orders-config").unwrap()["data"]["listen"].clone();
    m.check(
        listen == "27017",
        &format!("the edit is undone: listen {listen}, entry {d:?}"),
    );
    let errors: Vec<Value> = f.sim.heartbeats()[start..=i]
        .iter()
        .flat_map(|hb| {
            hb["inventoryErrors"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    m.check(
        errors.is_empty(),
        &format!("no part of the inventory or the check is stale: {errors:?}"),
    );
    println!(
        "drift check over 10.5 MiB of Secrets: peak resident {} KiB ({before} KiB before them)",
        peak_kib(m.pid())
    );
    m.stop_expecting_exit_0();
}
