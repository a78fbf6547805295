//! A slow peer never stalls the rest (docs/protocol.md, "Hostile and buggy
//! values"): Kubernetes Events are best effort, so Event writes that time
//! out (through a proxy in front of the real API server that answers each
//! one 504 after 2.5 s) never delay a command by more than their budget
//! (250 ms a wake-up); and a CP that stops reading a heartbeat (through a
//! relay that stops reading) leaves the probes answered, the lease
//! renewed and SIGTERM honoured within a second.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::json;
use support::apiproxy::{ApiProxy, Faults};
use support::commands::{command, configmap, proxy, wait_ack};
use support::fixture::{Fixture, PROXY_IMAGE};
use support::stallproxy::StallProxy;

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
            ..Faults::default()
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

/// Owned NexoProxies, so that a heartbeat is a few hundred KiB.
const PROXIES: usize = 800;

/// How long the CP stops reading.
const STALL: Duration = Duration::from_secs(40);

/// One `/healthz` request: how long it took, `None` when not answered
/// within 2 s.
fn probe_latency(addr: std::net::SocketAddr) -> Option<Duration> {
    use std::io::{Read, Write};
    let started = Instant::now();
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.starts_with("HTTP/1.1 200").then(|| started.elapsed())
}

/// How old the lease's `renewTime` is.
fn lease_age(f: &Fixture) -> Duration {
    let path = format!(
        "/apis/coordination.k8s.io/v1/namespaces/{}/leases/nexo-manager",
        f.ns.name
    );
    let lease: serde_json::Value = f.tb.admin().get(&path).expect("the lease");
    let renewed = lease["spec"]["renewTime"].as_str().expect("renewTime");
    let at = humantime::parse_rfc3339_weak(renewed.trim_end_matches('Z'))
        .or_else(|_| humantime::parse_rfc3339(renewed))
        .expect("a renewTime");
    std::time::SystemTime::now()
        .duration_since(at)
        .unwrap_or_default()
}

#[test]
fn a_cp_that_stops_reading_stalls_neither_probes_nor_the_lease_nor_a_stop() {
    let f = Fixture::new("slow-cp");
    for i in 0..PROXIES {
        // 63 characters: as long as a label value may be.
        let name = format!("proxy-{i:03}-with-a-name-long-enough-to-weigh-in-a-heartbeat-xxxx");
        f.create_proxy(&name, f.owned_labels(&name), 2, PROXY_IMAGE);
    }
    let relay = StallProxy::start(f.sim.addr());
    let mut env = f.env();
    env.insert(
        "NEXO_CONTROL_PLANE_URL".into(),
        format!("https://{}", relay.addr),
    );
    env.insert(
        "NEXO_LISTEN_ADDR".into(),
        support::PROBES_ON_ANY_PORT.into(),
    );
    let mut m = f.spawn(&env);
    let probes = m.probe_addr();
    m.wait_until(Duration::from_secs(60), "a heartbeat of them all", || {
        f.sim
            .last_heartbeat()
            .is_some_and(|hb| hb["deployments"].as_array().map(Vec::len) == Some(PROXIES))
    });
    let size = f.sim.last_heartbeat().unwrap().to_string().len();
    relay.stall();
    let beats = f.sim.heartbeat_count();
    let started = Instant::now();
    let (mut worst_probe, mut oldest_lease, mut unanswered) = (Duration::ZERO, Duration::ZERO, 0);
    while started.elapsed() < STALL {
        match probe_latency(probes) {
            Some(took) => worst_probe = worst_probe.max(took),
            None => unanswered += 1,
        }
        oldest_lease = oldest_lease.max(lease_age(&f));
        std::thread::sleep(Duration::from_millis(500));
    }
    let during = f.sim.heartbeat_count() - beats;
    eprintln!(
        "a CP that stops reading for {STALL:?} (heartbeats of {size} B): slowest probe {} ms, {unanswered} unanswered; oldest lease renewal {} ms; {during} heartbeats got through",
        worst_probe.as_millis(),
        oldest_lease.as_millis(),
    );
    let stop = Instant::now();
    m.signal("TERM");
    let status = m.wait_exit(Duration::from_secs(30));
    let exited = stop.elapsed();
    eprintln!(
        "SIGTERM while the CP stops reading: exited in {} ms",
        exited.as_millis()
    );
    m.check(during == 0, "the stall held every heartbeat meanwhile");
    m.check(
        unanswered == 0 && worst_probe < Duration::from_secs(1),
        &format!("probes answered throughout: slowest {worst_probe:?}, {unanswered} unanswered"),
    );
    m.check(
        oldest_lease < Duration::from_secs(4),
        &format!("the lease renewed on its schedule: at worst {oldest_lease:?} old"),
    );
    m.check(
        status.code() == Some(0) && exited < Duration::from_secs(1),
        &format!("SIGTERM: {status:?} after {exited:?}"),
    );
}
