//! Drift (`drift.v1`) against the real API server: what a deploy applied
//! is recorded in a Secret owned by the deployment (gone with it, by the
//! garbage collector); a `kubectl edit` is reported, then corrected under
//! `enforce`; a deleted object is recreated; `ignore`d fields are neither
//! reported nor restored; a rollout's image is kept, never rolled back;
//! an object of the same name that is another's is never touched; a
//! rewritten record is never enforced. What a tenant of the namespace can
//! do besides is `drift_tenant.rs`.

mod support;

use nexo_manager::kube::client::MERGE_PATCH;
use serde_json::{Value, json};
use support::commands::{command, ns_path, wait_ack};
use support::drift::{WAIT, base64_decode, base64_encode, deploy, edit, get, wait_drift};
use support::fixture::Fixture;

#[test]
fn an_edit_is_reported_until_undone_and_ignored_fields_never_are() {
    let f = Fixture::new("drift-report");
    let mut m = f.spawn_with_probes(&[("NEXO_DRIFT_INTERVAL", "1s")]);
    deploy(
        &f,
        &mut m,
        "dr-deploy",
        json!({"mode": "report", "ignore": ["/spec/replicas"]}),
    );
    // The record: a Secret owned by the NexoProxy, labelled the Manager's own.
    let proxy_uid = get(&f, "NexoProxy", "orders").unwrap()["metadata"]["uid"].clone();
    let record = get(&f, "Secret", "nexo-applied-orders").expect("the record Secret");
    m.check(
        record["metadata"]["ownerReferences"][0]["uid"] == proxy_uid
            && record["metadata"]["labels"]["nexo.io/role"] == "applied-record",
        &format!(
            "the record is owned by the deployment: {}",
            record["metadata"]
        ),
    );
    let start = f.sim.heartbeats().len();

    edit(
        &f,
        "ConfigMap",
        "orders-config",
        json!({"data": {"listen": "27018"}}),
    );
    edit(&f, "NexoProxy", "orders", json!({"spec": {"replicas": 5}}));
    let (i, d) = wait_drift(&f, &mut m, start, "orders", "the edit reported", |d| {
        d.is_some()
    });
    let d = d.unwrap();
    m.check(
        d["mode"] == "report"
            && d["objects"]
                == json!([{"kind": "ConfigMap", "name": "orders-config", "fields": ["/data/listen"],
                          "action": "reported", "detectedAt": d["objects"][0]["detectedAt"]}]),
        &format!("the ConfigMap, not the ignored replicas: {d}"),
    );
    // Reported while it lasts, nothing changed.
    let (_, later) = wait_drift(
        &f,
        &mut m,
        i + 3,
        "orders",
        "three heartbeats later",
        |_| true,
    );
    m.check(
        later
            .as_ref()
            .is_some_and(|l| l["objects"][0]["detectedAt"] == d["objects"][0]["detectedAt"]),
        &format!("still reported, detectedAt kept: {later:?}"),
    );
    m.check(
        get(&f, "ConfigMap", "orders-config").unwrap()["data"]["listen"] == "27018",
        "report changes nothing",
    );
    let events = f.events();
    let detected: Vec<&Value> = events
        .iter()
        .filter(|e| e["reason"] == "DriftDetected")
        .collect();
    m.check(
        detected.len() == 1
            && detected[0]["regarding"]["uid"] == proxy_uid
            && detected[0]["note"]
                .as_str()
                .unwrap()
                .contains("/data/listen"),
        &format!("one DriftDetected Event about the proxy: {detected:?}"),
    );

    // Put back by hand, the field is still another manager's: reported.
    edit(
        &f,
        "ConfigMap",
        "orders-config",
        json!({"data": {"listen": "27017"}}),
    );
    let now = f.sim.heartbeats().len();
    let (_, d) = wait_drift(&f, &mut m, now + 2, "orders", "a heartbeat", |_| true);
    m.check(
        d.is_some_and(|d| d["objects"][0]["fields"] == json!(["/data/listen"])),
        "a field taken by another field manager is drift at any value",
    );
    // Deployed again (the replicas put back too, or the deploy would
    // rightly conflict with their new manager): the Manager holds its
    // fields again, the entry leaves.
    edit(&f, "NexoProxy", "orders", json!({"spec": {"replicas": 2}}));
    deploy(
        &f,
        &mut m,
        "dr-deploy-2",
        json!({"mode": "report", "ignore": ["/spec/replicas"]}),
    );
    let now = f.sim.heartbeats().len();
    wait_drift(
        &f,
        &mut m,
        now,
        "orders",
        "the entry gone once deployed again",
        |d| d.is_none(),
    );
    let checks = m.metric("nexo_manager_drift_checks_total").unwrap_or(0.0);
    m.check(checks >= 2.0, &format!("drift checks counted: {checks}"));
    let reported = m
        .metric("nexo_manager_drifted_objects_total{mode=\"report\",action=\"reported\"}")
        .unwrap_or(0.0);
    m.check(
        reported >= 1.0,
        &format!("drifted objects counted: {reported}"),
    );

    // Uninstalled: the record goes with the deployment.
    let un = command(
        "dr-uninstall",
        "uninstall",
        json!({"deployment": {"name": "orders", "namespace": f.ns.name}}),
    );
    f.sim.enqueue_command(&f.env_id, un);
    let ack = wait_ack(&f, &mut m, "dr-uninstall");
    m.check(ack["result"] == "applied", &format!("{ack}"));
    m.wait_until(WAIT, "the record collected with its owner", || {
        get(&f, "Secret", "nexo-applied-orders").is_none()
    });
    m.stop_expecting_exit_0();
}

#[test]
fn enforce_restores_edits_recreates_deletions_keeps_rollouts_and_never_touches_anothers() {
    let f = Fixture::new("drift-enforce");
    let mut m = f.spawn_with_probes(&[("NEXO_DRIFT_INTERVAL", "1s")]);
    deploy(
        &f,
        &mut m,
        "de-deploy",
        json!({"mode": "enforce", "ignore": ["/spec/replicas"]}),
    );
    // A rollout after the deploy: its image is what enforcement keeps.
    let roll = command(
        "de-roll",
        "rollout",
        json!({"imageTag": "1.4.3", "targets": [{"name": "orders", "namespace": f.ns.name}]}),
    );
    f.sim.enqueue_command(&f.env_id, roll);
    let ack = wait_ack(&f, &mut m, "de-roll");
    m.check(ack["result"] == "applied", &format!("{ack}"));
    let start = f.sim.heartbeats().len();

    edit(
        &f,
        "ConfigMap",
        "orders-config",
        json!({"data": {"listen": "1"}}),
    );
    edit(&f, "NexoProxy", "orders", json!({"spec": {"replicas": 7}}));
    let (i, d) = wait_drift(&f, &mut m, start, "orders", "the edit corrected", |d| {
        d.is_some_and(|d| d["objects"][0]["action"] == "corrected")
    });
    let d = d.unwrap();
    m.check(
        d["mode"] == "enforce"
            && d["objects"][0]["kind"] == "ConfigMap"
            && d["objects"][0]["fields"] == json!(["/data/listen"]),
        &format!("corrected: {d}"),
    );
    let cm = get(&f, "ConfigMap", "orders-config").unwrap();
    let p = get(&f, "NexoProxy", "orders").unwrap();
    m.check(
        cm["data"]["listen"] == "27017",
        &format!("the edit undone: {}", cm["data"]),
    );
    m.check(
        p["spec"]["replicas"] == 7 && p["spec"]["image"] == "registry.example.com/nexo/proxy:1.4.3",
        &format!("replicas ignored, the rollout's image kept: {}", p["spec"]),
    );
    // Shown once, then gone.
    wait_drift(
        &f,
        &mut m,
        i + 1,
        "orders",
        "the correction shown once",
        |d| d.is_none(),
    );

    // Deleted: recreated.
    f.tb.admin()
        .delete(&ns_path(&f, "ConfigMap", "orders-config"), "Background")
        .unwrap();
    let now = f.sim.heartbeats().len();
    let (_, d) = wait_drift(&f, &mut m, now, "orders", "the deletion recreated", |d| {
        d.is_some_and(|d| d["objects"][0]["action"] == "recreated")
    });
    let d = d.unwrap();
    m.check(
        d["objects"][0]["gone"] == true && d["objects"][0].get("fields").is_none(),
        &format!("gone, no fields: {d}"),
    );
    m.check(
        get(&f, "ConfigMap", "orders-config").is_some_and(|c| c["data"]["listen"] == "27017"),
        "recreated as applied",
    );

    // Deleted, and another's object of the same name created: never
    // touched, the drift failed with why.
    f.tb.admin()
        .delete(&ns_path(&f, "ConfigMap", "orders-config"), "Background")
        .unwrap();
    m.wait_until(WAIT, "the ConfigMap deleted", || {
        get(&f, "ConfigMap", "orders-config").is_none()
    });
    // The Manager may recreate it first; then it is deleted again.
    let theirs = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "orders-config", "labels": {"team": "theirs"}}, "data": {"listen": "9"}});
    let collection = format!("/api/v1/namespaces/{}/configmaps", f.ns.name);
    let mut made = false;
    m.wait_until(WAIT, "another's ConfigMap in place", || {
        match f.tb.admin().create(&collection, &theirs) {
            Ok(_) => made = true,
            Err(_) => {
                let _ =
                    f.tb.admin()
                        .delete(&ns_path(&f, "ConfigMap", "orders-config"), "Background");
            }
        }
        made
    });
    let now = f.sim.heartbeats().len();
    let (_, d) = wait_drift(&f, &mut m, now, "orders", "the enforcement failed", |d| {
        d.is_some_and(|d| d["objects"][0]["action"] == "failed")
    });
    let d = d.unwrap();
    m.check(
        d["objects"][0]["message"]
            .as_str()
            .is_some_and(|s| !s.is_empty()),
        &format!("the failure says why: {d}"),
    );
    let cm = get(&f, "ConfigMap", "orders-config").unwrap();
    m.check(
        cm["data"]["listen"] == "9" && cm["metadata"]["labels"] == json!({"team": "theirs"}),
        &format!("another's object untouched: {cm}"),
    );
    let corrected = m
        .metric("nexo_manager_drifted_objects_total{mode=\"enforce\",action=\"corrected\"}")
        .unwrap_or(0.0);
    m.check(
        corrected >= 1.0,
        &format!("corrections counted: {corrected}"),
    );

    // A record rewritten by someone who may write Secrets in the
    // namespace: its proof no longer holds, so it is never enforced.
    f.tb.admin()
        .delete(&ns_path(&f, "ConfigMap", "orders-config"), "Background")
        .unwrap();
    let record = get(&f, "Secret", "nexo-applied-orders").unwrap();
    let text = base64_decode(record["data"]["payload"].as_str().unwrap());
    let mut payload: Value = serde_json::from_slice(&text).unwrap();
    payload["manifests"][0]["spec"]["image"] = json!("evil.example.com/miner:1");
    let encoded = base64_encode(&serde_json::to_vec(&payload).unwrap());
    f.tb.admin()
        .patch(
            &ns_path(&f, "Secret", "nexo-applied-orders"),
            MERGE_PATCH,
            &json!({"data": {"payload": encoded}}),
        )
        .unwrap();
    let now = f.sim.heartbeats().len();
    let (_, d) = wait_drift(
        &f,
        &mut m,
        now,
        "orders",
        "the tampered record refused",
        |d| {
            d.is_some_and(|d| {
                d["objects"].as_array().unwrap().iter().any(|o| {
                    o["action"] == "failed"
                        && o["kind"] == "Secret"
                        && o["name"] == "nexo-applied-orders"
                        && o["message"]
                            .as_str()
                            .is_some_and(|s| s.contains("the record is not the Manager's"))
                })
            })
        },
    );
    m.check(d.is_some(), "refused: not the Manager's record");
    let p = get(&f, "NexoProxy", "orders").unwrap();
    m.check(
        p["spec"]["image"] == "registry.example.com/nexo/proxy:1.4.3",
        &format!("nothing applied: {}", p["spec"]),
    );
    m.check(
        get(&f, "ConfigMap", "orders-config").is_none(),
        "the deleted ConfigMap not recreated from a record that is not the Manager's",
    );
    m.stop_expecting_exit_0();
}

/// Records come in name order, and so does each kind's list: a check
/// reads them side by side. Objects not named after their deployment come
/// before an earlier deployment's in their list; they are compared in a
/// second pass, found or gone as any other.
#[test]
fn objects_not_named_after_their_deployment_are_checked_all_the_same() {
    use support::commands::{configmap, proxy, secret};
    let f = Fixture::new("drift-order");
    let mut m = f.spawn_with_probes(&[("NEXO_DRIFT_INTERVAL", "1s")]);
    // The ConfigMaps' list: aa-beta-config, ac-beta-extra, zz-alpha-config;
    // the records': alpha's, then beta's. Reading alpha's ConfigMap passes
    // beta's two.
    for (id, name, configmaps) in [
        ("do-alpha", "alpha", &["zz-alpha-config"][..]),
        ("do-beta", "beta", &["aa-beta-config", "ac-beta-extra"][..]),
    ] {
        let mut manifests = vec![proxy(name), secret(&format!("{name}-db"))];
        manifests.extend(configmaps.iter().map(|c| configmap(c)));
        let payload = json!({"deployment": {"name": name, "namespace": f.ns.name},
            "format": "crd", "manifests": manifests, "drift": {"mode": "report"}});
        f.sim
            .enqueue_command(&f.env_id, command(id, "deploy", payload));
        let ack = wait_ack(&f, &mut m, id);
        m.check(ack["result"] == "applied", &format!("{id}: {ack}"));
    }
    let start = f.sim.heartbeats().len();
    edit(
        &f,
        "ConfigMap",
        "ac-beta-extra",
        json!({"data": {"listen": "1"}}),
    );
    f.tb.admin()
        .delete(&ns_path(&f, "ConfigMap", "aa-beta-config"), "Background")
        .unwrap();
    let (i, d) = wait_drift(&f, &mut m, start, "beta", "beta's drift reported", |d| {
        d.is_some_and(|d| d["objects"].as_array().is_some_and(|o| o.len() == 2))
    });
    let d = d.unwrap();
    let objects: Vec<(String, String)> = d["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            let what = if o["gone"] == true {
                "gone".to_owned()
            } else {
                o["fields"].to_string()
            };
            (o["name"].as_str().unwrap().to_owned(), what)
        })
        .collect();
    m.check(
        objects
            == [
                ("aa-beta-config".to_owned(), "gone".to_owned()),
                ("ac-beta-extra".to_owned(), r#"["/data/listen"]"#.to_owned()),
            ],
        &format!("beta's ConfigMaps, one gone, one edited: {d}"),
    );
    let hb = &f.sim.heartbeats()[i];
    m.check(
        support::drift::drift_of(hb, "alpha").is_none(),
        &format!("alpha has not drifted: {}", hb["drift"]),
    );
    // Alpha's own, read beside its record, is seen too.
    edit(
        &f,
        "ConfigMap",
        "zz-alpha-config",
        json!({"data": {"listen": "2"}}),
    );
    let now = f.sim.heartbeats().len();
    let (_, a) = wait_drift(&f, &mut m, now, "alpha", "alpha's drift reported", |d| {
        d.is_some()
    });
    let a = a.unwrap();
    m.check(
        a["objects"][0]["name"] == "zz-alpha-config"
            && a["objects"][0]["fields"] == json!(["/data/listen"]),
        &format!("alpha's ConfigMap edited: {a}"),
    );
    m.check(
        !m.stderr().contains("not in name order")
            && !m.stderr().contains("cannot list the objects"),
        "every list read in order",
    );
    m.stop_expecting_exit_0();
}
