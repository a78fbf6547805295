//! The inventory from watches, against a real API server: listed once
//! (more than a page), then kept by watch events (an object added,
//! changed, deleted, or leaving ownership), and kept right through an API
//! server restart, which breaks the watches and (the restarted server's
//! watch cache starting at the current version) answers the old version
//! with 410 Gone, so the Manager lists again.
//!
//! On a test bed of its own: it restarts the API server.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use nexo_cpsim::SimConfig;
use serde_json::{Value, json};
use support::fixture::Fixture;
use support::manager::Manager;
use support::{OwnBed, run_ok};

const WAIT: Duration = Duration::from_secs(60);

/// Items per page of the Manager's lists (`inventory::PAGE`).
const PAGE: usize = 500;

fn kubectl(f: &Fixture, args: &[&str]) -> String {
    run_ok(f.tb.kubectl_cmd().args(args))
}

fn entry(ns: &str, name: &str, replicas: i64, image: &str) -> Value {
    json!({"name": name, "namespace": ns, "kind": "NexoProxy", "replicas": replicas, "image": image})
}

/// Waits for a heartbeat sent after `after` whose `deployments` are
/// `expected` and that reports no inventory error.
fn wait_for_inventory(
    f: &Fixture,
    m: &mut Manager,
    after: usize,
    expected: &BTreeMap<String, Value>,
    what: &str,
) {
    let want: Vec<Value> = expected.values().cloned().collect();
    let want = Value::Array(want);
    m.wait_until(WAIT, what, || {
        f.sim.heartbeats().iter().skip(after).any(|hb| {
            support::without_status(&hb["deployments"]) == want
                && hb.get("inventoryErrors").is_none()
        })
    });
}

#[test]
fn the_inventory_is_listed_once_then_watched_and_survives_an_api_server_restart() {
    let bed = OwnBed::start("inventory-tb", &[]);
    let f = Fixture::on(bed.tb, "inv", SimConfig::default());
    f.tb.install_crds();
    let ns = f.ns.name.clone();
    let mut expected = BTreeMap::new();
    // More owned proxies than a page holds, so that the list is paged.
    for i in 0..PAGE + 20 {
        let name = format!("p{i:04}");
        let (replicas, image) = (
            i as i64 % 4,
            format!("registry.example.com/nexo/proxy:1.{}", i % 3),
        );
        f.create_proxy(&name, f.owned_labels(&name), replicas, &image);
        expected.insert(name.clone(), entry(&ns, &name, replicas, &image));
    }
    // Not owned: another environment's, unlabelled, legacy.
    let other = json!({"app.kubernetes.io/managed-by": "nexo-manager", "nexo.io/owner-id": "env-someone-else"});
    f.create_proxy("foreign", other.clone(), 1, "proxy:1");
    f.create_proxy("unowned", json!({"team": "db"}), 1, "proxy:1");
    f.create_proxy(
        "legacy",
        json!({"app.kubernetes.io/part-of": "nexo"}),
        1,
        "proxy:0.2",
    );

    let mut env = f.env();
    env.insert("NEXO_HEARTBEAT_INTERVAL".into(), "3s".into());
    let mut m = f.spawn(&env);
    wait_for_inventory(
        &f,
        &mut m,
        0,
        &expected,
        "the listed inventory in a heartbeat",
    );

    // Changes arrive as watch events: one added, one changed, one deleted,
    // one given to another environment, one that was not owned taken.
    let before = f.sim.heartbeat_count();
    f.create_proxy(
        "p9999",
        f.owned_labels("p9999"),
        2,
        "registry.example.com/nexo/proxy:2.0",
    );
    expected.insert(
        "p9999".into(),
        entry(&ns, "p9999", 2, "registry.example.com/nexo/proxy:2.0"),
    );
    kubectl(
        &f,
        &[
            "patch",
            "nexoproxy",
            "p0001",
            "-n",
            &ns,
            "--type=merge",
            "-p",
            r#"{"spec": {"replicas": 7}}"#,
        ],
    );
    expected.insert(
        "p0001".into(),
        entry(&ns, "p0001", 7, "registry.example.com/nexo/proxy:1.1"),
    );
    kubectl(&f, &["delete", "nexoproxy", "p0002", "-n", &ns]);
    expected.remove("p0002");
    kubectl(
        &f,
        &[
            "label",
            "nexoproxy",
            "p0003",
            "-n",
            &ns,
            "--overwrite",
            "nexo.io/owner-id=env-someone-else",
        ],
    );
    expected.remove("p0003");
    wait_for_inventory(
        &f,
        &mut m,
        before,
        &expected,
        "the watched changes in a heartbeat",
    );
    let log = m.stderr();
    m.check(
        log.matches("listing again").count() == 0,
        "changes came by watch, no list again",
    );

    // The API server restarts: the watches break, and come back.
    bed.restart_apiserver(Duration::from_secs(2));
    let before = f.sim.heartbeat_count();
    f.create_proxy(
        "p8888",
        f.owned_labels("p8888"),
        1,
        "registry.example.com/nexo/proxy:2.1",
    );
    expected.insert(
        "p8888".into(),
        entry(&ns, "p8888", 1, "registry.example.com/nexo/proxy:2.1"),
    );
    kubectl(&f, &["delete", "nexoproxy", "p0004", "-n", &ns]);
    expected.remove("p0004");
    wait_for_inventory(
        &f,
        &mut m,
        before,
        &expected,
        "the inventory right after the API server restarted",
    );
    let log = m.stderr();
    eprintln!(
        "after the restart: watch broken {} times, expired (410) {} times, watched again {} times",
        log.matches("the watch failed; watching again").count(),
        log.matches("(410 Gone); listing again").count(),
        log.matches("inventory: watching").count()
    );
    m.check(
        log.contains("the watch failed; watching again") || log.contains("(410 Gone)"),
        "the restart broke the watches, and the Manager saw it",
    );
    m.check(
        log.contains("(410 Gone); listing again"),
        "the version the watches had was too old for the restarted server (410 Gone): listed again",
    );
    m.stop_expecting_exit_0();
}
