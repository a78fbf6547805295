//! Leader election: two Managers for one environment in one namespace,
//! exactly one acts; a stopped leader is replaced, and once resumed it does
//! not act before it holds the lease again.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::fixture::Fixture;
use support::manager::STOP_WAIT;
use support::{PROBES_ON_ANY_PORT, closed_addr, http_get, metric};

fn connects_from(f: &Fixture, uid: &str) -> usize {
    f.sim
        .requests()
        .iter()
        .filter(|r| {
            r.path.ends_with("/connect")
                && r.json.as_ref().is_some_and(|b| b["instance"]["id"] == uid)
        })
        .count()
}

/// How many requests the Manager of pod `uid` sent (the simulator knows the
/// sender of a heartbeat or an ack by its session token).
fn sent_by(f: &Fixture, uid: &str) -> usize {
    f.sim
        .requests()
        .iter()
        .filter(|r| r.instance.as_deref() == Some(uid))
        .count()
}

/// Whether the Manager probed at `addr` is a ready standby: it read the
/// lease (held by another) and made its TLS handshake with the CP. (As the
/// leader it would say `nexo_manager_leader 1`.)
fn ready_standby(addr: std::net::SocketAddr) -> bool {
    metric(addr, "nexo_manager_leader") == Some(0.0) && http_get(addr, "/readyz").0 == 200
}

fn read_lease(f: &Fixture) -> Value {
    let path = format!(
        "/apis/coordination.k8s.io/v1/namespaces/{}/leases/nexo-manager",
        f.ns.name
    );
    f.tb.admin().get(&path).unwrap()
}

#[test]
fn exactly_one_of_two_managers_acts_and_a_stopped_leader_is_replaced() {
    let f = Fixture::new("leader");
    let env = |uid: &str| {
        let mut e = f.env();
        e.insert("POD_UID".into(), uid.into());
        e.insert("POD_NAME".into(), uid.into());
        e
    };
    let mut env_a = env("pod-a");
    env_a.insert("NEXO_LISTEN_ADDR".into(), PROBES_ON_ANY_PORT.into());
    let mut env_b = env("pod-b");
    env_b.insert("NEXO_LISTEN_ADDR".into(), PROBES_ON_ANY_PORT.into());
    let mut a = f.spawn(&env_a);
    a.wait_until(Duration::from_secs(30), "pod-a leading", || {
        !f.sim.heartbeats().is_empty()
    });
    let addr_a = a.probe_addr();
    let mut b = f.spawn(&env_b);
    let addr_b = b.probe_addr();
    b.wait_until(Duration::from_secs(30), "pod-b following, ready", || {
        ready_standby(addr_b)
    });
    let conns_before = f.sim.connections();
    // The window is the subject: three intervals in which the follower
    // must not connect, and must make its standby handshakes.
    std::thread::sleep(Duration::from_secs(3));
    a.check(
        connects_from(&f, "pod-b") == 0,
        "the follower never connects",
    );
    // Both are ready: the leader bound and heartbeating, the standby able
    // to take over (lease read, TLS handshake with the CP). A rolling
    // update needs the new pod Ready while the old one still leads.
    let (status, body) = http_get(addr_a, "/readyz");
    a.check(
        status == 200,
        &format!("the leader's /readyz: {status} {body}"),
    );
    let (status, body) = http_get(addr_b, "/readyz");
    b.check(
        status == 200,
        &format!("the standby's /readyz: {status} {body}"),
    );
    // The standby's checks are handshakes only: new connections, no request.
    b.check(
        f.sim.connections() > conns_before,
        "the standby made a TLS handshake with the CP in 3 intervals",
    );
    b.check(
        f.sim.requests().iter().all(|r| {
            r.path.ends_with("/connect")
                && r.json
                    .as_ref()
                    .is_some_and(|j| j["instance"]["id"] == "pod-a")
                || !r.path.ends_with("/connect")
        }),
        "no connect from the standby",
    );
    let lease = read_lease(&f);
    assert_eq!(lease["spec"]["holderIdentity"], "pod-a");
    assert_eq!(
        lease["spec"]["leaseDurationSeconds"], 5,
        "3 × the 1 s interval, at least 5 s"
    );

    // Stop the leader past the lease duration: the follower takes over.
    a.signal("STOP");
    b.wait_until(Duration::from_secs(30), "pod-b taking over", || {
        connects_from(&f, "pod-b") >= 1
            && f.sim.requests().iter().any(|r| {
                r.instance.as_deref() == Some("pod-b")
                    && r.path.ends_with("/heartbeat")
                    && r.status == 200
            })
    });
    // Stopped, pod-a sends nothing: everything it sent has arrived.
    let a_sent = sent_by(&f, "pod-a");
    a.signal("CONT");
    // Its probes are answered again once it runs (not before: a stopped
    // process would leave the request unanswered).
    a.wait_until(Duration::from_secs(30), "pod-a following again", || {
        metric(addr_a, "nexo_manager_leader") == Some(0.0)
    });
    // The window is the subject: three intervals in which it must not act.
    std::thread::sleep(Duration::from_secs(3));
    let after = sent_by(&f, "pod-a");
    a.check(
        after == a_sent,
        &format!("the resumed old leader sends nothing without the lease: {a_sent} requests before, {after} after"),
    );
    let lease = read_lease(&f);
    assert_eq!(lease["spec"]["holderIdentity"], "pod-b");
    assert_eq!(lease["spec"]["leaseTransitions"], 1);

    // A clean stop releases the lease: the other one takes over without waiting for it to expire.
    b.signal("TERM");
    b.wait_exit(STOP_WAIT);
    let holder = read_lease(&f)["spec"]["holderIdentity"].clone();
    b.check(
        holder != "pod-b",
        &format!("pod-b released the lease on its way out: held by {holder}"),
    );
    // A bound with a reason: pod-b renewed the 5 s lease at most one 1 s
    // interval before it stopped, and pod-a judges expiry from when it saw
    // that renewal, so waiting for expiry would take pod-a at least 4 s
    // from here; a released lease is taken at its next check.
    a.wait_until(
        Duration::from_secs(4),
        "pod-a leading again soon after the release",
        || read_lease(&f)["spec"]["holderIdentity"] == "pod-a",
    );
    let leader = metric(addr_a, "nexo_manager_leader");
    a.check(leader == Some(1.0), &format!("pod-a leads: {leader:?}"));
}

#[test]
fn a_standby_that_cannot_reach_the_control_plane_is_not_ready() {
    let f = Fixture::new("leader-unready");
    let mut env_a = f.env();
    env_a.insert("POD_UID".into(), "pod-a".into());
    let mut a = f.spawn(&env_a);
    a.wait_until(Duration::from_secs(30), "pod-a leading", || {
        !f.sim.heartbeats().is_empty()
    });
    // pod-b's CP address has nothing listening: its handshakes fail.
    let closed = closed_addr();
    let mut env_b = f.env();
    env_b.insert("POD_UID".into(), "pod-b".into());
    env_b.insert("NEXO_LISTEN_ADDR".into(), PROBES_ON_ANY_PORT.into());
    env_b.insert("NEXO_CONTROL_PLANE_URL".into(), format!("https://{closed}"));
    let mut b = f.spawn(&env_b);
    let addr_b = b.probe_addr();
    // A standby (not starting, not leading) whose handshake never succeeds:
    // not ready, and it never can be.
    b.wait_until(Duration::from_secs(30), "pod-b a standby", || {
        let (status, body) = http_get(addr_b, "/readyz");
        status == 503 && body.contains("standby")
    });
    let leader = metric(addr_b, "nexo_manager_leader");
    b.check(
        leader == Some(0.0),
        &format!("pod-b does not lead: {leader:?}"),
    );
    let (status, _) = http_get(addr_b, "/healthz");
    b.check(status == 200, "alive all the same");
}

#[test]
fn a_new_leader_reads_the_ledger_again_and_executes_no_finished_command() {
    let f = Fixture::new("leader-ledger");
    f.tb.install_crds();
    let env = |uid: &str| {
        let mut e = f.env();
        e.insert("POD_UID".into(), uid.into());
        e.insert("NEXO_LISTEN_ADDR".into(), PROBES_ON_ANY_PORT.into());
        e
    };
    let mut a = f.spawn(&env("pod-a"));
    a.wait_until(Duration::from_secs(30), "pod-a leading", || {
        !f.sim.heartbeats().is_empty()
    });
    // pod-b reads the state now, while the ledger is empty: a ready
    // standby is past its start-up, where it read the state.
    let mut b = f.spawn(&env("pod-b"));
    let addr_b = b.probe_addr();
    b.wait_until(Duration::from_secs(30), "pod-b following, ready", || {
        ready_standby(addr_b)
    });
    let deploy = serde_json::json!({"id": "cmd-once", "class": "deploy", "issuedAt": "2026-12-03T00:00:00Z",
        "payload": {"deployment": {"name": "orders", "namespace": f.ns.name}, "format": "crd",
            "manifests": [{"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy", "metadata": {"name": "orders"},
                "spec": {"image": support::fixture::PROXY_IMAGE, "replicas": 1, "mongodb": {"secretRef": {"name": "orders-db"}}}}]}});
    f.sim.enqueue_command(&f.env_id, deploy.clone());
    a.wait_until(Duration::from_secs(30), "pod-a's ack", || {
        !f.sim.acks().is_empty()
    });
    let first = f.sim.acks()[0].clone();
    assert_eq!(first["resources"][0]["action"], "created", "{first}");
    // pod-a stops cleanly; pod-b leads; the CP sends the command again.
    a.signal("TERM");
    a.wait_exit(STOP_WAIT);
    b.wait_until(Duration::from_secs(30), "pod-b leading", || {
        connects_from(&f, "pod-b") >= 1
    });
    f.sim.enqueue_command(&f.env_id, deploy);
    let acks_of = || {
        f.sim
            .requests()
            .into_iter()
            .filter(|r| r.path.ends_with("/commands/cmd-once/ack"))
            .filter_map(|r| r.json)
            .collect::<Vec<Value>>()
    };
    b.wait_until(Duration::from_secs(30), "pod-b's ack", || {
        acks_of().len() >= 2
    });
    // A second execution would report the NexoProxy `unchanged`: the
    // recorded `created` is pod-b finding the command in the ledger.
    let again = acks_of()[1].clone();
    b.check(
        again["resources"] == first["resources"],
        &format!("pod-b acknowledged the recorded result, not a second execution: {again}"),
    );
}
