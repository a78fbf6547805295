//! Inventory deltas (`inventory.delta.v1`) against the real API server and
//! the simulator: a CP that never confirms gets the full form every time
//! (version 2); one that confirms gets deltas, which at rest name nothing
//! and after a change name that entry alone. Across random changes (scaled,
//! edited, created, deleted, status changed) and every way a CP answers
//! (at once, late, lost, bogus, asking for the full form), a restart and a
//! leader change, the inventory the simulator rebuilds from deltas equals
//! the full form of the same revision and the cluster's.

mod support;

use std::time::Duration;

use nexo_cpsim::inventory::Confirming;
use nexo_manager::kube::client::MERGE_PATCH;
use serde_json::{Value, json};
use support::commands::{command, ns_path, proxy, wait_ack, wait_heartbeat};
use support::fixture::Fixture;
use support::manager::Manager;

/// Deploys NexoProxy `name` through a command.
fn deploy(f: &Fixture, m: &mut Manager, name: &str) {
    let payload = json!({"deployment": {"name": name, "namespace": f.ns.name},
        "format": "crd", "manifests": [proxy(name)]});
    let id = format!("d-{name}");
    f.sim
        .enqueue_command(&f.env_id, command(&id, "deploy", payload));
    wait_ack(f, m, &id);
}

/// The owned NexoProxies in the cluster, as (name, replicas, image).
fn in_cluster(f: &Fixture) -> Vec<(String, i64, String)> {
    let list: Value =
        f.tb.admin()
            .get(&format!(
                "/apis/nexo.io/v1alpha1/namespaces/{}/nexoproxies",
                f.ns.name
            ))
            .unwrap();
    let mut out: Vec<_> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["metadata"]["name"].as_str().unwrap().to_owned(),
                p["spec"]["replicas"].as_i64().unwrap(),
                p["spec"]["image"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    out.sort();
    out
}

/// The simulator's rebuilt inventory, as (name, replicas, image).
fn rebuilt(f: &Fixture) -> Vec<(String, i64, String)> {
    let (entries, _) = f.sim.rebuilt_inventory().unwrap_or_default();
    entries
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap_or_default().to_owned(),
                e["replicas"].as_i64().unwrap_or(-1),
                e["image"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// The (epoch, revision) of the last heartbeat.
fn last_revision(f: &Fixture) -> (String, u64) {
    let hb = f.sim.last_heartbeat().unwrap_or_default();
    let i = &hb["inventory"];
    (
        i["epoch"].as_str().unwrap_or_default().to_owned(),
        i["revision"].as_u64().unwrap_or(0),
    )
}

/// Asks for the full form until one arrives of a revision the simulator
/// rebuilt from deltas, so that the two are compared; then checks that
/// nothing ever differed and that the rebuilt inventory is the cluster's.
fn compare_with_full_form(f: &Fixture, m: &mut Manager, what: &str) {
    let (_, before, _) = f.sim.inventory_checks();
    m.wait_until(
        Duration::from_secs(60),
        &format!("{what}: a full form compared"),
        || {
            if f.sim.inventory_checks().1 > before {
                return true;
            }
            f.sim.ask_inventory_resync();
            std::thread::sleep(Duration::from_millis(300));
            false
        },
    );
    let (deltas, compared, mismatches) = f.sim.inventory_checks();
    m.check(
        mismatches.is_empty(),
        &format!("{what}: every revision rebuilt equals its full form ({deltas} deltas, {compared} compared): {mismatches:#?}"),
    );
    let cluster = in_cluster(f);
    m.wait_until(
        Duration::from_secs(30),
        &format!("{what}: the rebuilt inventory is the cluster's {cluster:?}"),
        || rebuilt(f) == in_cluster(f),
    );
}

/// Scales the NexoProxy at `path` to `replicas` and waits for a heartbeat
/// after the `at`th whose delta names a changed entry.
fn scale_and_see_a_delta(
    f: &Fixture,
    m: &mut Manager,
    path: &str,
    replicas: i64,
    at: usize,
    what: &str,
) {
    f.tb.admin()
        .patch(path, MERGE_PATCH, &json!({"spec": {"replicas": replicas}}))
        .unwrap();
    wait_heartbeat(f, m, at, what, |hb| {
        hb["inventory"]["changed"]
            .as_array()
            .filter(|c| !c.is_empty())
            .map(drop)
    });
}

/// A seeded sequence of choices (xorshift): the same run again from the
/// printed seed.
struct Choices(u64);

impl Choices {
    fn pick(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn a_confirming_cp_gets_deltas_and_rebuilds_the_inventory() {
    let f = Fixture::new("deltas");
    let mut m = f.spawn_with_probes(&[]);
    for name in ["a", "b", "c"] {
        deploy(&f, &mut m, name);
    }
    // Never confirmed: the full form (version 2's heartbeat), every time.
    let now = f.sim.heartbeats().len();
    let (_, hb) = wait_heartbeat(&f, &mut m, now, "a full heartbeat", |hb| {
        (hb["deployments"].as_array().map(Vec::len) == Some(3)).then(|| hb.clone())
    });
    m.check(
        hb["inventory"]["full"] == true
            && hb["inventory"]["epoch"].is_string()
            && hb["releaseContract"].is_object(),
        &format!(
            "the full form, named, with the release contract: {}",
            hb["inventory"]
        ),
    );
    f.sim.set_confirming(Confirming::Always);
    let now = f.sim.heartbeats().len();
    let (_, rest) = wait_heartbeat(&f, &mut m, now + 1, "a delta at rest", |hb| {
        hb["inventory"]["base"].is_u64().then(|| hb.clone())
    });
    m.check(
        rest.get("deployments").is_none()
            && rest.get("releaseContract").is_none()
            && rest["inventory"]["changed"] == json!([])
            && rest["inventory"]["removed"] == json!([])
            && rest["managedProxyCount"] == 3,
        &format!("at rest, nothing named, no release contract: {rest}"),
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
        changed["inventory"]["changed"][0]["replicas"] == 5
            && changed["inventory"]["removed"] == json!([]),
        &format!("the whole entry: {}", changed["inventory"]),
    );
    let names: Vec<(String, i64)> = rebuilt(&f).into_iter().map(|(n, r, _)| (n, r)).collect();
    m.check(
        names == [("a".into(), 2), ("b".into(), 5), ("c".into(), 2)],
        &format!("the CP's inventory rebuilt from deltas: {names:?}"),
    );
    compare_with_full_form(&f, &mut m, "after one change");
    m.stop_expecting_exit_0();
}

#[test]
fn random_changes_and_every_kind_of_answer_restarts_and_a_new_leader_never_lose_an_entry() {
    let seed = std::env::var("NEXO_DELTAS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x9e37_79b9_7f4a_7c15u64);
    eprintln!("deltas: seed {seed} (NEXO_DELTAS_SEED to run it again)");
    let mut choose = Choices(seed | 1);
    let f = Fixture::new("deltas-random");
    f.tb.install_crds();
    let env = |uid: &str| f.pod_env(uid);
    let mut m = f.spawn(&env("pod-a"));
    for name in ["p0", "p1", "p2", "p3"] {
        deploy(&f, &mut m, name);
    }
    f.sim.set_confirming(Confirming::Always);
    let mut next_name = 4;
    for step in 0..12 {
        let names: Vec<String> = in_cluster(&f).into_iter().map(|(n, ..)| n).collect();
        let any = |c: &mut Choices| names[c.pick(names.len() as u64) as usize].clone();
        let admin = f.tb.admin();
        let change = match choose.pick(5) {
            0 if !names.is_empty() => {
                let name = any(&mut choose);
                let replicas = 1 + choose.pick(6);
                admin
                    .patch(
                        &ns_path(&f, "NexoProxy", &name),
                        MERGE_PATCH,
                        &json!({"spec": {"replicas": replicas}}),
                    )
                    .unwrap();
                format!("scaled {name} to {replicas}")
            }
            1 if !names.is_empty() => {
                let name = any(&mut choose);
                let image = format!("{}-{step}", support::fixture::PROXY_IMAGE);
                admin
                    .patch(
                        &ns_path(&f, "NexoProxy", &name),
                        MERGE_PATCH,
                        &json!({"spec": {"image": image}}),
                    )
                    .unwrap();
                format!("edited {name}'s image")
            }
            2 if names.len() > 3 => {
                let name = any(&mut choose);
                admin
                    .delete(&ns_path(&f, "NexoProxy", &name), "Background")
                    .unwrap();
                format!("deleted {name}")
            }
            3 if !names.is_empty() => {
                let name = any(&mut choose);
                let ready = choose.pick(3);
                admin
                    .patch(
                        &format!("{}/status", ns_path(&f, "NexoProxy", &name)),
                        MERGE_PATCH,
                        &json!({"status": {"readyReplicas": ready, "observedGeneration": 1}}),
                    )
                    .unwrap();
                format!("{name}'s status: {ready} ready")
            }
            _ => {
                let name = format!("p{next_name}");
                next_name += 1;
                deploy(&f, &mut m, &name);
                format!("created {name}")
            }
        };
        // How the CP answers while the change is reported: each way in
        // turn, so that every run has each.
        let (epoch, revision) = last_revision(&f);
        let answers = match step % 5 {
            0 => {
                f.sim.set_confirming(Confirming::Always);
                "confirmed at once"
            }
            1 => {
                f.sim.set_confirming(Confirming::Late);
                "confirmed a heartbeat late"
            }
            2 => {
                f.sim.set_confirming(Confirming::Always);
                f.sim.lose_confirmations(3);
                "three confirmations lost"
            }
            3 => {
                f.sim.set_confirming(Confirming::Always);
                f.sim.answer_inventory_with(
                    json!({"epoch": "bogus-epoch-0000000", "revision": revision}),
                );
                f.sim
                    .answer_inventory_with(json!({"epoch": epoch, "revision": revision + 1000}));
                f.sim
                    .answer_inventory_with(json!({"epoch": epoch, "revision": "two"}));
                "bogus confirmations (another epoch, never sent, malformed)"
            }
            _ => {
                f.sim.set_confirming(Confirming::Always);
                f.sim.ask_inventory_resync();
                "a resync asked for"
            }
        };
        eprintln!("deltas: step {step}: {change}; {answers}");
        let at = f.sim.heartbeats().len();
        wait_heartbeat(&f, &mut m, at + 3, "three heartbeats", |_| Some(()));
        f.sim.set_confirming(Confirming::Always);
        compare_with_full_form(&f, &mut m, &format!("step {step} ({change}; {answers})"));
    }
    let (deltas, compared, _) = f.sim.inventory_checks();
    m.check(
        deltas >= 12 && compared >= 12,
        &format!("deltas were sent and compared ({deltas} deltas, {compared} compared)"),
    );
    let logged = m.stderr().matches("ignored (logged once an epoch)").count();
    m.check(
        logged == 1,
        &format!("bogus confirmations are logged once an epoch (logged {logged} times)"),
    );

    // A restart: a new epoch, the full form first, then deltas again.
    let (old_epoch, _) = last_revision(&f);
    m.stop_expecting_exit_0();
    let mut m = f.spawn(&env("pod-a"));
    let at = f.sim.heartbeats().len();
    let (_, first) = wait_heartbeat(&f, &mut m, at, "a heartbeat after the restart", |hb| {
        (hb["inventory"]["epoch"] != old_epoch.as_str()).then(|| hb["inventory"].clone())
    });
    m.check(
        first["full"] == true && first["revision"] == 1,
        &format!("a new epoch starts with the full form of revision 1: {first}"),
    );
    let p1 = ns_path(&f, "NexoProxy", &in_cluster(&f)[0].0);
    scale_and_see_a_delta(&f, &mut m, &p1, 7, at, "a delta after the restart");
    compare_with_full_form(&f, &mut m, "after a restart");

    // A new leader: pod-b takes over when pod-a stops, with its own epoch.
    let mut b = f.spawn(&env("pod-b"));
    std::thread::sleep(Duration::from_secs(2));
    let (a_epoch, _) = last_revision(&f);
    m.stop_expecting_exit_0();
    let at = f.sim.heartbeats().len();
    wait_heartbeat(&f, &mut b, at, "pod-b leading, in a new epoch", |hb| {
        (hb["inventory"]["epoch"].is_string() && hb["inventory"]["epoch"] != a_epoch.as_str())
            .then_some(())
    });
    scale_and_see_a_delta(&f, &mut b, &p1, 3, at, "a delta from the new leader");
    compare_with_full_form(&f, &mut b, "after a leader change");
    b.stop_expecting_exit_0();
}
