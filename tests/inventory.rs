//! How the heartbeat's inventory reads NexoProxies, against a real API
//! server: as a Table of the CRD's printer columns when the installed CRD's
//! columns are `.spec.image` and `.spec.replicas`, as the objects when they
//! are not; the same inventory either way, over more than one page.
//!
//! On a test bed of its own: it changes the NexoProxy CRD, which every
//! test on a shared test bed would see.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use nexo_cpsim::SimConfig;
use serde_json::{Value, json};
use support::fixture::Fixture;
use support::{OwnBed, run_ok, wait_for};

const WAIT: Duration = Duration::from_secs(60);

/// Items per page of the Manager's lists (`inventory::PAGE`).
const PAGE: usize = 500;

/// What the Manager logs when it reads NexoProxies as a Table, or as objects.
const AS_TABLE: &str = "NexoProxies are listed as a table of their printer columns";
const AS_OBJECTS: &str = "NexoProxies are listed as objects";
/// What it logs when a Table it asked for was not usable.
const FELL_BACK: &str = "listing the objects";

/// Runs the Manager to its second heartbeat; that heartbeat's
/// `deployments` and the Manager's log.
fn second_heartbeat(f: &Fixture, env: &BTreeMap<String, String>) -> (Value, String) {
    let before = f.sim.heartbeat_count();
    let mut m = f.spawn(env);
    m.wait_until(WAIT, "two heartbeats", || {
        f.sim.heartbeat_count() >= before + 2
    });
    let hb = f.sim.heartbeats().remove(before + 1);
    let log = m.stderr();
    m.check(
        hb.get("inventoryErrors").is_none(),
        &format!("no inventory errors: {}", hb["inventoryErrors"]),
    );
    m.stop_expecting_exit_0();
    (hb["deployments"].clone(), log)
}

/// Checks that the Manager read the NexoProxies as `how` says and that
/// its inventory is `expected`.
fn read_as(f: &Fixture, env: &BTreeMap<String, String>, how: &str, expected: &Value) {
    let (got, log) = second_heartbeat(f, env);
    assert!(log.contains(how), "the log does not say \"{how}\":\n{log}");
    if how == AS_TABLE {
        assert!(
            !log.contains(FELL_BACK),
            "the Table was not usable, the objects were read:\n{log}"
        );
    }
    assert!(
        got == *expected,
        "\"{how}\": the inventory is not the cluster's:\n{got}\nexpected:\n{expected}"
    );
}

fn kubectl(f: &Fixture, args: &[&str]) -> String {
    run_ok(f.tb.kubectl_cmd().args(args))
}

#[test]
fn the_inventory_is_the_same_from_a_table_or_from_the_objects() {
    let bed = OwnBed::start("inventory-tb", &[]);
    let f = Fixture::on(bed.tb, "inv", SimConfig::default());
    f.tb.install_crds();
    let ns = f.ns.name.clone();
    let mut expected = Vec::new();
    // More owned proxies than a page holds, so that the Table is paged too.
    let owned = PAGE + 20;
    for i in 0..owned {
        let name = format!("p{i:04}");
        let (replicas, image) = (
            i as i64 % 4,
            format!("registry.example.com/nexo/proxy:1.{}", i % 3),
        );
        f.create_proxy(&name, f.owned_labels(&name), replicas, &image);
        expected.push(json!({"name": name, "namespace": ns, "kind": "NexoProxy", "replicas": replicas, "image": image}));
    }
    // Not owned: another environment's, unlabelled, legacy.
    let other = json!({"app.kubernetes.io/managed-by": "nexo-manager", "nexo.io/owner-id": "env-someone-else"});
    f.create_proxy("foreign", other, 1, "proxy:1");
    f.create_proxy("unowned", json!({"team": "db"}), 1, "proxy:1");
    f.create_proxy(
        "legacy",
        json!({"app.kubernetes.io/part-of": "nexo"}),
        1,
        "proxy:0.2",
    );
    let expected = Value::Array(expected);
    let env = f.env();

    // The CRD's columns are the fields: a Table is read.
    read_as(&f, &env, AS_TABLE, &expected);

    // The Image column now shows the name: a Table would lie about images.
    kubectl(
        &f,
        &[
            "patch",
            "crd",
            "nexoproxies.nexo.io",
            "--type=json",
            "-p",
            r#"[{"op": "replace", "path": "/spec/versions/0/additionalPrinterColumns/0/jsonPath", "value": ".metadata.name"}]"#,
        ],
    );
    wait_for(
        WAIT,
        "the API server's Table to show the new column",
        || {
            let row = kubectl(
                &f,
                &["get", "nexoproxy", "p0001", "-n", &ns, "--no-headers"],
            );
            (row.split_whitespace().nth(1) == Some("p0001")).then_some(())
        },
    );
    // The Image column is not .spec.image: the objects are read.
    read_as(&f, &env, AS_OBJECTS, &expected);
}
