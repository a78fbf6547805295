//! Drift's end-to-end tests: heartbeats' drift entries, edits as
//! `kubectl edit` makes them, deploys with `drift` settings.

use std::time::Duration;

use nexo_manager::kube::client::{Body, MERGE_PATCH, Method};
use serde_json::{Value, json};

use super::commands::{command, configmap, ns_path, proxy, secret, wait_ack, wait_heartbeat};
use super::fixture::Fixture;
use super::manager::Manager;

/// How long a drift test waits for what it expects.
pub const WAIT: Duration = Duration::from_secs(60);

/// The drift entry of `name` in a heartbeat.
pub fn drift_of<'a>(hb: &'a Value, name: &str) -> Option<&'a Value> {
    hb["drift"].as_array()?.iter().find(|d| d["name"] == name)
}

/// Waits for a heartbeat after the `after`th whose drift entry of `name`
/// (`None` when it has none) satisfies `pred`; returns its position.
pub fn wait_drift(
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
pub fn edit(f: &Fixture, kind: &str, name: &str, patch: Value) {
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

pub fn get(f: &Fixture, kind: &str, name: &str) -> Option<Value> {
    f.tb.admin().get_opt(&ns_path(f, kind, name)).unwrap()
}

pub fn deploy(f: &Fixture, m: &mut Manager, id: &str, drift: Value) {
    let payload = json!({"deployment": {"name": "orders", "namespace": f.ns.name}, "format": "crd",
        "manifests": [proxy("orders"), configmap("orders-config"), secret("orders-db")],
        "drift": drift});
    f.sim
        .enqueue_command(&f.env_id, command(id, "deploy", payload));
    let ack = wait_ack(f, m, id);
    m.check(ack["result"] == "applied", &format!("{id}: {ack}"));
}

/// Replaces the owned `name` with a tenant's ConfigMap of the same name
/// (the Manager may recreate its own in between: then it is deleted again).
pub fn squat(f: &Fixture, m: &mut Manager, name: &str) {
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

pub fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}

pub fn base64_encode(b: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(b)
}
