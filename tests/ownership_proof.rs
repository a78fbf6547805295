//! Ownership is a proof, not a label (SECURITY.md, "Integrity the
//! namespace cannot forge"): every object the Manager writes carries a
//! proof bound to its uid; an object a tenant labels as the environment's,
//! or re-creates with a copied proof, is never listed, rolled out,
//! uninstalled, deployed over or enforced, and the heartbeat says so.
//! Objects written by 0.4 get their proof only through the gate
//! `NEXO_ADOPT_UNPROVEN`.

mod support;

use serde_json::{Value, json};
use support::commands::{command, configmap, ns_path, proxy, wait_ack, wait_heartbeat};
use support::drift::{WAIT, deploy, get, wait_drift};
use support::fixture::Fixture;
use support::manager::Manager;

/// The names the heartbeat's inventory lists.
fn listed(hb: &Value) -> Vec<String> {
    hb["deployments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_owned())
        .collect()
}

/// The heartbeat's `inventoryErrors`, as one text.
fn errors(hb: &Value) -> String {
    hb["inventoryErrors"].to_string()
}

/// Runs a command and returns its ack.
fn run(f: &Fixture, m: &mut Manager, id: &str, class: &str, payload: Value) -> Value {
    f.sim
        .enqueue_command(&f.env_id, command(id, class, payload));
    wait_ack(f, m, id)
}

/// Checks that `ack` refused `what` for want of a valid proof.
fn refused_unproven(m: &mut Manager, ack: &Value, what: &str) {
    let message = ack["message"].as_str().unwrap_or("");
    m.check(
        ack["result"] == "failed" && message.contains("no valid proof"),
        &format!("{what} is refused: {ack}"),
    );
}

/// A NexoProxy labelled as this environment's deployment `name`, without
/// a proof: as a tenant who may create NexoProxies makes one, or as 0.4
/// left one.
fn labelled_proxy(f: &Fixture, name: &str, image: &str) {
    let obj = json!({"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy",
        "metadata": {"name": name, "labels": f.owned_labels(name)},
        "spec": {"image": image, "replicas": 1, "mongodb": {"secretRef": {"name": "x"}}}});
    let collection = format!(
        "/apis/nexo.io/v1alpha1/namespaces/{}/nexoproxies",
        f.ns.name
    );
    f.tb.admin()
        .create(&collection, &obj)
        .unwrap_or_else(|e| panic!("create NexoProxy {name}: {e}"));
}

#[test]
fn a_forged_label_or_a_copied_proof_is_not_ownership() {
    let f = Fixture::new("proof-forged");
    let mut m = f.spawn_with_probes(&[("NEXO_DRIFT_INTERVAL", "1s")]);
    deploy(&f, &mut m, "pf-deploy", json!({"mode": "enforce"}));
    // What the Manager wrote carries its proof, bound to each object.
    for kind in ["NexoProxy", "ConfigMap", "Secret"] {
        let name = match kind {
            "NexoProxy" => "orders",
            "ConfigMap" => "orders-config",
            _ => "orders-db",
        };
        let o = get(&f, kind, name).unwrap_or_else(|| panic!("{kind} {name}"));
        let mut typed = o.clone();
        typed["kind"] = json!(kind);
        m.check(
            o["metadata"]["annotations"]["nexo.io/proof"] == json!(f.proof_of(&typed)),
            &format!("{kind} {name} carries its proof: {}", o["metadata"]),
        );
    }

    // A tenant labels a NexoProxy of their own as the environment's.
    labelled_proxy(&f, "forged", "registry.example.com/nexo/proxy:6.6.6");
    let now = f.sim.heartbeats().len();
    let (_, hb) = wait_heartbeat(&f, &mut m, now, "the forged NexoProxy reported", |hb| {
        errors(hb).contains("forged").then(|| hb.clone())
    });
    m.check(
        errors(&hb).contains("no valid proof (not this Manager's, not listed): forged"),
        &format!("inventoryErrors: {}", errors(&hb)),
    );
    m.check(
        listed(&hb) == ["orders"],
        &format!("only the Manager's own is listed: {:?}", listed(&hb)),
    );

    // No command acts on it.
    let target = json!({"name": "forged", "namespace": f.ns.name});
    let ack = run(
        &f,
        &mut m,
        "pf-rollout",
        "rollout",
        json!({"imageTag": "1.4.3", "targets": [target]}),
    );
    refused_unproven(&mut m, &ack, "a rollout of it");
    let ack = run(
        &f,
        &mut m,
        "pf-rollout-all",
        "rollout",
        json!({"imageTag": "1.4.3"}),
    );
    m.check(
        ack["result"] == "applied",
        &format!("a rollout of all: {ack}"),
    );
    let names: Vec<&Value> = ack["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["name"])
        .collect();
    m.check(
        names == [&json!("orders")],
        &format!("a rollout of all leaves it out: {ack}"),
    );
    let ack = run(
        &f,
        &mut m,
        "pf-uninstall",
        "uninstall",
        json!({"deployment": target}),
    );
    refused_unproven(&mut m, &ack, "an uninstall of it");
    let over = json!({"deployment": {"name": "forged", "namespace": f.ns.name}, "format": "crd",
        "manifests": [proxy("forged")]});
    let ack = run(&f, &mut m, "pf-deploy-over", "deploy", over);
    refused_unproven(&mut m, &ack, "a deploy over it");
    let forged = get(&f, "NexoProxy", "forged").expect("the forged NexoProxy is still there");
    m.check(
        forged["spec"]["image"] == "registry.example.com/nexo/proxy:6.6.6"
            && forged["metadata"]["annotations"]["nexo.io/proof"].is_null(),
        &format!("untouched: {}", forged),
    );

    // The tenant deletes the deployment's ConfigMap and re-creates it with
    // the labels and the proof copied: the proof is of another uid.
    let real = get(&f, "ConfigMap", "orders-config").unwrap();
    let mut copy = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "orders-config", "labels": real["metadata"]["labels"],
        "annotations": real["metadata"]["annotations"]}, "data": {"listen": "6666"}});
    copy["metadata"]["annotations"]["note"] = json!("the tenant's");
    let collection = format!("/api/v1/namespaces/{}/configmaps", f.ns.name);
    m.wait_until(WAIT, "the tenant's copy in place", || {
        let _ =
            f.tb.admin()
                .delete(&ns_path(&f, "ConfigMap", "orders-config"), "Background");
        f.tb.admin().create(&collection, &copy).is_ok()
    });
    let now = f.sim.heartbeats().len();
    let (_, d) = wait_drift(&f, &mut m, now, "orders", "the copy reported", |d| {
        d.is_some_and(|d| {
            d["objects"].as_array().unwrap().iter().any(|o| {
                o["name"] == "orders-config"
                    && o["action"] == "failed"
                    && o["message"]
                        .as_str()
                        .is_some_and(|s| s.contains("no valid proof"))
            })
        })
    });
    let later = f.sim.heartbeats().len() + 3;
    wait_heartbeat(&f, &mut m, later, "three heartbeats later", |_| Some(()));
    let cm = get(&f, "ConfigMap", "orders-config").unwrap();
    m.check(
        cm["data"]["listen"] == "6666" && cm["metadata"]["annotations"]["note"] == "the tenant's",
        &format!("the copy is never written to: {cm}; drift: {d:?}"),
    );
    m.stop_expecting_exit_0();
}

#[test]
fn objects_of_0_4_get_their_proof_only_through_the_gate() {
    let f = Fixture::new("proof-gate");
    f.tb.install_crds();
    // As 0.4 left it: labelled, no proof; the state already holds a key.
    f.integrity_key();
    labelled_proxy(&f, "old", support::fixture::PROXY_IMAGE);
    let collection = format!("/api/v1/namespaces/{}/configmaps", f.ns.name);
    let mut cm = configmap("old-config");
    cm["metadata"]["labels"] = f.owned_labels("old");
    f.tb.admin().create(&collection, &cm).unwrap();

    // The gate closed: not listed, reported, and a deploy of it refused.
    let mut m = f.spawn_with_probes(&[]);
    let now = f.sim.heartbeats().len();
    let (_, hb) = wait_heartbeat(&f, &mut m, now, "the unproven NexoProxy reported", |hb| {
        errors(hb).contains("old").then(|| hb.clone())
    });
    m.check(listed(&hb).is_empty(), &format!("not listed: {hb}"));
    let payload = json!({"deployment": {"name": "old", "namespace": f.ns.name}, "format": "crd",
        "manifests": [proxy("old"), configmap("old-config")]});
    let ack = run(&f, &mut m, "pg-closed", "deploy", payload.clone());
    m.check(
        ack["result"] == "failed"
            && ack["message"]
                .as_str()
                .unwrap_or("")
                .contains("NEXO_ADOPT_UNPROVEN=true"),
        &format!("the deploy names the gate: {ack}"),
    );
    m.stop_expecting_exit_0();

    // The gate open: listed while unproven, and the next deploy gives
    // every object its proof.
    let mut m = f.spawn_with_probes(&[("NEXO_ADOPT_UNPROVEN", "true")]);
    let now = f.sim.heartbeats().len();
    let (_, hb) = wait_heartbeat(&f, &mut m, now, "listed through the gate", |hb| {
        (listed(hb) == ["old"]).then(|| hb.clone())
    });
    m.check(
        errors(&hb).contains("listed through NEXO_ADOPT_UNPROVEN"),
        &format!("still reported until proven: {}", errors(&hb)),
    );
    let ack = run(&f, &mut m, "pg-open", "deploy", payload);
    m.check(ack["result"] == "applied", &format!("adopted: {ack}"));
    for (kind, name) in [("NexoProxy", "old"), ("ConfigMap", "old-config")] {
        let mut o = get(&f, kind, name).unwrap();
        o["kind"] = json!(kind);
        m.check(
            o["metadata"]["annotations"]["nexo.io/proof"] == json!(f.proof_of(&o)),
            &format!("{kind} {name} proven: {}", o["metadata"]),
        );
    }
    let now = f.sim.heartbeats().len();
    wait_heartbeat(&f, &mut m, now, "no longer reported", |hb| {
        (!errors(hb).contains("no valid proof") && listed(hb) == ["old"]).then_some(())
    });
    m.stop_expecting_exit_0();

    // The gate closed again: the adopted NexoProxy is the Manager's.
    let mut m = f.spawn_with_probes(&[]);
    let now = f.sim.heartbeats().len();
    wait_heartbeat(&f, &mut m, now, "listed, proven", |hb| {
        (listed(hb) == ["old"] && !errors(hb).contains("no valid proof")).then_some(())
    });
    m.stop_expecting_exit_0();
}
