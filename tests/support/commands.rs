//! Commands as the Control Plane sends them, the objects they carry, and
//! their acks, for the end-to-end tests that send commands.

use std::time::Duration;

use serde_json::{Value, json};

use super::fixture::{Fixture, PROXY_IMAGE};
use super::manager::Manager;

/// How long a test waits for an ack.
pub const ACK_WAIT: Duration = Duration::from_secs(60);

/// A command of `class` with `payload`.
pub fn command(id: &str, class: &str, payload: Value) -> Value {
    json!({"id": id, "class": class, "issuedAt": "2026-12-02T00:00:00Z", "requires": [], "payload": payload})
}

/// A NexoProxy manifest of the configured Proxy image.
pub fn proxy(name: &str) -> Value {
    json!({"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy", "metadata": {"name": name},
           "spec": {"image": PROXY_IMAGE, "replicas": 2, "mongodb": {"secretRef": {"name": format!("{name}-db")}}}})
}

/// A ConfigMap manifest.
pub fn configmap(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"listen": "27017"}})
}

/// A Secret manifest.
pub fn secret(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": {"uri": "mongodb://db:27017"}})
}

/// The URL path of an object of `kind` in the test's namespace.
pub fn ns_path(f: &Fixture, kind: &str, name: &str) -> String {
    let ns = &f.ns.name;
    match kind {
        "NexoProxy" => format!("/apis/nexo.io/v1alpha1/namespaces/{ns}/nexoproxies/{name}"),
        "NexoPipeline" => format!("/apis/nexo.io/v1alpha1/namespaces/{ns}/nexopipelines/{name}"),
        "Deployment" => format!("/apis/apps/v1/namespaces/{ns}/deployments/{name}"),
        "ConfigMap" => format!("/api/v1/namespaces/{ns}/configmaps/{name}"),
        "Secret" => format!("/api/v1/namespaces/{ns}/secrets/{name}"),
        "Service" => format!("/api/v1/namespaces/{ns}/services/{name}"),
        other => panic!("{other}"),
    }
}

/// The ack the simulator accepted for `id`, if any.
pub fn ack_of(f: &Fixture, id: &str) -> Option<Value> {
    f.sim.acks().into_iter().find(|a| a["commandId"] == id)
}

/// Waits for the ack of `id` (failing with the Manager's report).
pub fn wait_ack(f: &Fixture, m: &mut Manager, id: &str) -> Value {
    m.wait_until(ACK_WAIT, &format!("the ack of {id}"), || {
        ack_of(f, id).is_some()
    });
    ack_of(f, id).unwrap()
}

/// Waits for a heartbeat after the `after`th from which `pick` takes
/// something; returns its position and what was taken.
pub fn wait_heartbeat<T>(
    f: &Fixture,
    m: &mut Manager,
    after: usize,
    what: &str,
    pick: impl Fn(&Value) -> Option<T>,
) -> (usize, T) {
    let mut found = None;
    m.wait_until(ACK_WAIT, what, || {
        found = f
            .sim
            .heartbeats()
            .iter()
            .enumerate()
            .skip(after)
            .find_map(|(i, hb)| pick(hb).map(|t| (i, t)));
        found.is_some()
    });
    found.unwrap()
}
