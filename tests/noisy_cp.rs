//! A noisy Control Plane does not set the pace (docs/protocol.md, "Held
//! heartbeat"): one that answers every held heartbeat at once with a
//! command already finished gets at most one heartbeat a second, and the
//! finished command is acknowledged from the ledger without a write of the
//! lease or the state. On a test bed of its own with an audit log, which
//! counts the Manager's writes.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use nexo_cpsim::{Endpoint, Fault, FaultAction, SimConfig};
use serde_json::json;
use support::commands::{command, configmap, proxy, wait_ack};
use support::fixture::Fixture;

/// How long the noise lasts.
const WINDOW: Duration = Duration::from_secs(10);

/// The Manager's writes of `resource` in the audit log from byte `from` on.
fn writes(bed: &Path, from: u64, resource: &str) -> usize {
    support::audit::managers_requests(bed, from)
        .iter()
        .filter(|e| {
            e["objectRef"]["resource"] == resource
                && !matches!(e["verb"].as_str(), Some("get" | "list" | "watch"))
        })
        .count()
}

#[test]
fn a_cp_that_answers_at_once_with_a_finished_command_gets_one_heartbeat_a_second() {
    let bed = support::OwnBed::start("noisy-tb", &["--audit"]);
    let f = Fixture::on(bed.tb, "noisy", SimConfig::default());
    f.sim.set_hold(true);
    // A 15 s lease: renewed every 5 to 7.5 s on its schedule.
    let mut m = f.spawn_with_probes(&[("NEXO_HEARTBEAT_INTERVAL", "5s")]);
    let payload = json!({"deployment": {"name": "orders", "namespace": f.ns.name}, "format": "crd",
        "manifests": [proxy("orders"), configmap("orders-config")]});
    let done = command("noisy-1", "deploy", payload);
    f.sim.enqueue_command(&f.env_id, done.clone());
    let ack = wait_ack(&f, &mut m, "noisy-1");
    m.check(ack["result"] == "applied", &format!("the deploy: {ack}"));
    // Let the delivery flag be written, as it is after any ack.
    std::thread::sleep(Duration::from_secs(3));

    // Every heartbeat answered at once, held, with the finished command.
    let body = json!({"held": true, "commands": [done]}).to_string();
    f.sim.inject(
        Fault::new(Endpoint::Heartbeat, FaultAction::Raw { status: 200, body }).times(10_000),
    );
    let from = std::fs::metadata(bed.dir.join("logs/audit.log")).map_or(0, |m| m.len());
    // Every request the simulator got, answered by the fault or not.
    let count = |suffix: &str| {
        f.sim
            .requests()
            .iter()
            .filter(|r| r.path.ends_with(suffix))
            .count()
    };
    let (beats, acks) = (count("/heartbeat"), count("/ack"));
    let started = Instant::now();
    std::thread::sleep(WINDOW);
    let seconds = started.elapsed().as_secs_f64();
    f.sim.clear_faults();
    let (beats, acks) = (count("/heartbeat") - beats, count("/ack") - acks);
    // The audit log is written as requests end.
    std::thread::sleep(Duration::from_secs(2));
    let leases = writes(&bed.dir, from, "leases");
    let secrets = writes(&bed.dir, from, "secrets");
    eprintln!(
        "noisy cp: {beats} heartbeats and {acks} acks in {seconds:.1} s; {leases} lease writes, {secrets} Secret writes"
    );
    m.check(
        beats as f64 <= seconds + 1.0,
        &format!("{beats} heartbeats in {seconds:.1} s: at most one a second"),
    );
    m.check(
        acks <= beats && acks > 0,
        &format!("the finished command acknowledged again from the ledger: {acks} acks"),
    );
    // The lease's own schedule renews it every 5 to 7.5 s; not per batch.
    m.check(
        leases <= 3,
        &format!("{leases} lease writes in {seconds:.1} s: its schedule, not one a batch"),
    );
    m.check(
        secrets == 0,
        &format!("{secrets} writes of the state: none for a finished command"),
    );
    m.stop_expecting_exit_0();
}
