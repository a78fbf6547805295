//! A slow peer never stalls the rest (protocol.md, "Hostile and buggy
//! values"): Kubernetes Events are best effort, so Event writes that time
//! out (through a proxy in front of the real API server that answers each
//! one 504 after 2.5 s) never delay a command by more than their budget
//! (250 ms a wake-up).

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;
use support::apiproxy::{ApiProxy, Faults};
use support::commands::{command, configmap, proxy, wait_ack};
use support::fixture::{Fixture, PROXY_IMAGE};

/// Owned NexoProxies, rolled out in one command (an Applied Event about
/// each).
const DEPLOYMENTS: usize = 30;

#[test]
fn event_writes_that_time_out_never_delay_a_command() {
    let f = Fixture::new("slow-events");
    let proxy_server = ApiProxy::with(
        f.tb,
        Faults {
            watches: BTreeMap::new(),
            slow_events: Some(Duration::from_millis(2500)),
        },
    );
    // Held heartbeats (a command arrives within about a second) and a
    // 10 s interval (a 30 s lease, whose fence does not stop Event
    // writes within seconds).
    f.sim.set_hold(true);
    let mut env = f.env();
    env.insert("NEXO_HEARTBEAT_INTERVAL".into(), "10s".into());
    env.insert(
        "KUBECONFIG".into(),
        proxy_server.kubeconfig(&f.dir).display().to_string(),
    );
    // Thirty owned NexoProxies, made as a deploy would have (labels and
    // proof), so that nothing before the rollout queues an Event.
    for i in 0..DEPLOYMENTS {
        let name = format!("p{i}");
        f.create_proxy(&name, f.owned_labels(&name), 2, PROXY_IMAGE);
    }
    let mut m = f.spawn(&env);
    m.wait_until(Duration::from_secs(30), "the inventory holds them", || {
        f.sim
            .last_heartbeat()
            .is_some_and(|hb| hb["deployments"].as_array().map(Vec::len) == Some(DEPLOYMENTS))
    });
    // One rollout of every NexoProxy: an Applied Event about each, queued
    // at once, 2.5 s a write.
    f.sim.enqueue_command(
        &f.env_id,
        command("se-rollout", "rollout", json!({"imageTag": "1.4.3"})),
    );
    let ack = wait_ack(&f, &mut m, "se-rollout");
    m.check(ack["result"] == "applied", &format!("the rollout: {ack}"));
    // A command queued right after: acked at the pace of commands, not of
    // 30 Event writes timing out.
    let started = Instant::now();
    let payload = json!({"deployment": {"name": "late", "namespace": f.ns.name},
        "format": "crd", "manifests": [proxy("late"), configmap("late-config")]});
    f.sim
        .enqueue_command(&f.env_id, command("se-late", "deploy", payload));
    let ack = wait_ack(&f, &mut m, "se-late");
    let latency = started.elapsed();
    eprintln!(
        "slow events: a command queued after a rollout of {DEPLOYMENTS} (an Applied Event each) was acked in {} ms; {} Event writes tried",
        latency.as_millis(),
        proxy_server.count(&f.ns.name, "event")
    );
    m.check(ack["result"] == "applied", &format!("{ack}"));
    m.check(
        proxy_server.count(&f.ns.name, "event") >= 1,
        "Events were written (and timed out) meanwhile",
    );
    m.check(
        latency < Duration::from_secs(3),
        &format!("acked {latency:?} after it was queued (at most 3 s)"),
    );
    m.stop_expecting_exit_0();
}
