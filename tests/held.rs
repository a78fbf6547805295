//! The held heartbeat (docs/protocol.md, "Held heartbeat", capability
//! `heartbeat.wait.v1`), end to end: the real binary, the CP simulator
//! holding (or not), the real API server.

mod support;

use std::time::{Duration, Instant, SystemTime};

use nexo_cpsim::{Endpoint, Fault, FaultAction, LoggedRequest, SimConfig};
use serde_json::{Value, json};
use support::commands::{command, proxy, wait_ack};
use support::fixture::Fixture;
use support::manager::Manager;
use support::{PROBES_ON_ANY_PORT, http_get};

const WAIT: Duration = Duration::from_secs(30);

fn holding() -> SimConfig {
    SimConfig {
        hold: true,
        ..SimConfig::default()
    }
}

fn heartbeats(f: &Fixture) -> Vec<LoggedRequest> {
    f.sim
        .requests()
        .into_iter()
        .filter(|r| r.path == "/api/v2/manager/heartbeat")
        .collect()
}

/// Waits until a heartbeat is being held: sent, not answered, for 300 ms.
fn wait_for_a_hold(f: &Fixture, m: &mut Manager) {
    m.wait_until(WAIT, "a heartbeat held by the simulator", || {
        heartbeats(f).iter().any(|r| {
            !r.done
                && r.at
                    .elapsed()
                    .is_ok_and(|age| age >= Duration::from_millis(300))
        })
    });
}

fn spawn(f: &Fixture, interval: &str, probes: bool) -> Manager {
    f.tb.install_crds();
    let mut env = f.env();
    env.insert("NEXO_HEARTBEAT_INTERVAL".into(), interval.into());
    if probes {
        env.insert("NEXO_LISTEN_ADDR".into(), PROBES_ON_ANY_PORT.into());
    }
    f.spawn(&env)
}

/// When the simulator received the ack of `id`.
fn ack_arrival(f: &Fixture, id: &str) -> SystemTime {
    let path = format!("/api/v2/manager/commands/{id}/ack");
    f.sim
        .requests()
        .into_iter()
        .find(|r| r.path == path && r.status == 200)
        .map(|r| r.at)
        .expect("an accepted ack")
}

#[test]
fn a_command_queued_during_a_held_heartbeat_is_acked_within_about_a_second() {
    let f = Fixture::with_config("held-cmd", holding());
    let mut m = spawn(&f, "20s", false);
    wait_for_a_hold(&f, &mut m);
    let first = heartbeats(&f)[0].json.clone().expect("a JSON heartbeat");
    m.check(
        first["waitSeconds"] == json!(20),
        &format!("waitSeconds is the interval: {}", first["waitSeconds"]),
    );
    m.check(
        first["manager"]["capabilities"]
            .as_array()
            .is_some_and(|c| c.contains(&json!("heartbeat.wait.v1"))),
        "heartbeat.wait.v1 is advertised",
    );
    let mut latencies = Vec::new();
    for i in 0..3 {
        wait_for_a_hold(&f, &mut m);
        let id = format!("held-{i}");
        let queued = SystemTime::now();
        f.sim.enqueue_command(
            &f.env_id,
            command(
                &id,
                "deploy",
                json!({"deployment": {"name": format!("app{i}"), "namespace": f.ns.name},
                       "format": "crd", "manifests": [proxy(&format!("app{i}"))]}),
            ),
        );
        let ack = wait_ack(&f, &mut m, &id);
        m.check(ack["result"] == "applied", &format!("{id} applied: {ack}"));
        let latency = ack_arrival(&f, &id).duration_since(queued).unwrap();
        latencies.push(latency);
    }
    eprintln!("queue-to-ack latencies with a holding CP: {latencies:?}");
    for l in &latencies {
        m.check(
            *l < Duration::from_millis(1500),
            &format!(
                "acked within about a second of being queued, not an interval later: {latencies:?}"
            ),
        );
    }
    m.stop_expecting_exit_0();
}

#[test]
fn probes_are_answered_and_sigterm_exits_0_within_a_second_while_held() {
    let f = Fixture::with_config("held-term", holding());
    let mut m = spawn(&f, "60s", true);
    let addr = m.probe_addr();
    wait_for_a_hold(&f, &mut m);
    for path in ["/healthz", "/readyz", "/metrics", "/healthz"] {
        let started = Instant::now();
        let (status, _) = http_get(addr, path);
        let took = started.elapsed();
        m.check(
            status == 200,
            &format!("{path} answered {status} while held"),
        );
        m.check(
            took < Duration::from_millis(250),
            &format!("{path} answered in {took:?} while held (at most 250 ms)"),
        );
    }
    let held = heartbeats(&f).into_iter().filter(|r| !r.done).count();
    m.check(held == 1, &format!("one heartbeat held ({held})"));
    let signalled = Instant::now();
    m.signal("TERM");
    let status = m.wait_exit(Duration::from_secs(5));
    let took = signalled.elapsed();
    m.check(status.code() == Some(0), &format!("exit 0, got {status}"));
    m.check(
        took < Duration::from_secs(1),
        &format!("exited {took:?} after SIGTERM during a 60 s hold (at most 1 s)"),
    );
}

/// The Lease's `renewTime`, parsed.
fn renew_time(f: &Fixture) -> Option<SystemTime> {
    let lease: Value =
        f.tb.admin()
            .get(&format!(
                "/apis/coordination.k8s.io/v1/namespaces/{}/leases/nexo-manager",
                f.ns.name
            ))
            .ok()?;
    humantime::parse_rfc3339_weak(lease["spec"]["renewTime"].as_str()?).ok()
}

#[test]
fn the_lease_is_renewed_on_schedule_through_long_holds() {
    // Interval 10 s: a 30 s lease, renewed every 15 s, whatever the
    // heartbeats do. One heartbeat is held past its wait (a 25 s delay
    // before the 10 s hold): the lease must be renewed inside it.
    let f = Fixture::with_config("held-lease", holding());
    let mut m = spawn(&f, "10s", false);
    wait_for_a_hold(&f, &mut m);
    f.sim.inject(Fault {
        endpoint: Endpoint::Heartbeat,
        times: 1,
        action: FaultAction::Delay(Duration::from_secs(25)),
    });
    let mut renewals: Vec<SystemTime> = Vec::new();
    let until = Instant::now() + Duration::from_secs(70);
    while Instant::now() < until {
        if let Some(t) = renew_time(&f)
            && renewals.last() != Some(&t)
        {
            renewals.push(t);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let gaps: Vec<Duration> = renewals
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).unwrap_or_default())
        .collect();
    eprintln!("lease renewal gaps: {gaps:?}");
    m.check(
        gaps.len() >= 3,
        &format!("renewed at least 3 times in 70 s: {gaps:?}"),
    );
    for g in &gaps {
        // Due at 15 s; a third of the 30 s lease to spare means by 20 s.
        m.check(
            *g <= Duration::from_secs(17),
            &format!("renewed every 15 s, with at least a third of the lease to spare: {gaps:?}"),
        );
    }
    let long = heartbeats(&f)
        .windows(2)
        .any(|w| w[1].at.duration_since(w[0].at).unwrap_or_default() >= Duration::from_secs(30));
    m.check(long, "one heartbeat was held for over 30 s");
    let heartbeats_sent = heartbeats(&f).len();
    m.check(
        heartbeats_sent <= 9,
        &format!("the heartbeats were held ({heartbeats_sent} in about 75 s at a 10 s wait)"),
    );
    m.stop_expecting_exit_0();
}

#[test]
fn a_control_plane_that_never_holds_gets_one_heartbeat_an_interval() {
    let f = Fixture::new("held-never");
    let mut m = spawn(&f, "2s", false);
    m.wait_until(WAIT, "six heartbeats", || heartbeats(&f).len() >= 6);
    let beats = heartbeats(&f);
    let gaps: Vec<Duration> = beats
        .windows(2)
        .map(|w| w[1].at.duration_since(w[0].at).unwrap_or_default())
        .collect();
    for g in &gaps {
        m.check(
            *g >= Duration::from_millis(1900) && *g < Duration::from_secs(4),
            &format!("one heartbeat every 2 s: {gaps:?}"),
        );
    }
    for b in &beats {
        m.check(
            b.json
                .as_ref()
                .is_some_and(|j| j["waitSeconds"] == json!(2)),
            "each heartbeat offers the CP its wait",
        );
    }
    m.stop_expecting_exit_0();
}

#[test]
fn a_cp_that_says_held_without_holding_gets_at_most_one_heartbeat_a_second() {
    let f = Fixture::new("held-liar");
    f.sim.inject(Fault {
        endpoint: Endpoint::Heartbeat,
        times: 1000,
        action: FaultAction::Raw {
            status: 200,
            body: r#"{"commands": [], "held": true}"#.into(),
        },
    });
    let mut m = spawn(&f, "30s", false);
    m.wait_until(WAIT, "three heartbeats", || heartbeats(&f).len() >= 3);
    let started = Instant::now();
    let before = heartbeats(&f).len();
    std::thread::sleep(Duration::from_secs(5));
    let sent = heartbeats(&f).len() - before;
    let secs = started.elapsed().as_secs_f64();
    m.check(
        (sent as f64) <= secs + 1.0 && sent >= 3,
        &format!("{sent} heartbeats in {secs:.1} s: held answers are followed at once, but at most one a second"),
    );
    m.stop_expecting_exit_0();
}
