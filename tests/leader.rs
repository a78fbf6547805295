//! Leader election: two Managers for one environment in one namespace,
//! exactly one acts; a stopped leader is replaced, and once resumed it does
//! not act before it holds the lease again.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::fixture::Fixture;
use support::{free_addr, http_get};

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
    let addr_a = free_addr();
    let addr_b = free_addr();
    let mut env_a = env("pod-a");
    env_a.insert("NEXO_LISTEN_ADDR".into(), addr_a.clone());
    let mut env_b = env("pod-b");
    env_b.insert("NEXO_LISTEN_ADDR".into(), addr_b.clone());
    let mut a = f.spawn(&env_a);
    a.wait_until(Duration::from_secs(30), "pod-a leading", || {
        !f.sim.heartbeats().is_empty()
    });
    let mut b = f.spawn(&env_b);
    let b_log = b.log_reader();
    b.wait_until(Duration::from_secs(30), "pod-b following", || {
        b_log().contains("following: the lease nexo-manager is held by pod-a")
    });
    let conns_before = f.sim.connections();
    std::thread::sleep(Duration::from_secs(3));
    a.check(
        connects_from(&f, "pod-b") == 0,
        "the follower never connects",
    );
    // Both are ready: the leader bound and heartbeating, the standby able
    // to take over (lease read, TLS handshake with the CP). A rolling
    // update needs the new pod Ready while the old one still leads.
    let (status, body) = http_get(&addr_a, "/readyz");
    a.check(
        status == 200,
        &format!("the leader's /readyz: {status} {body}"),
    );
    let (status, body) = http_get(&addr_b, "/readyz");
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
        connects_from(&f, "pod-b") >= 1 && b_log().contains("heartbeat 1 accepted")
    });
    let a_log = a.log_reader();
    let a_beats = a_log().matches("accepted").count();
    a.signal("CONT");
    b.wait_until(Duration::from_secs(30), "pod-a following again", || {
        a_log().contains("following: the lease nexo-manager is held by pod-b")
    });
    std::thread::sleep(Duration::from_secs(3));
    a.check(
        a_log().matches("accepted").count() == a_beats,
        "the resumed old leader sends nothing without the lease",
    );
    let lease = read_lease(&f);
    assert_eq!(lease["spec"]["holderIdentity"], "pod-b");
    assert_eq!(lease["spec"]["leaseTransitions"], 1);

    // A clean stop releases the lease: the other one takes over without waiting for it to expire.
    b.signal("TERM");
    b.wait_exit(Duration::from_secs(10));
    a.wait_until(
        Duration::from_secs(4),
        "pod-a leading again soon after the release",
        || {
            a_log().contains("leading: holding the lease nexo-manager as pod-a")
                && a_log().matches("leading:").count() >= 2
        },
    );
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
    let closed = free_addr();
    let addr_b = free_addr();
    let mut env_b = f.env();
    env_b.insert("POD_UID".into(), "pod-b".into());
    env_b.insert("NEXO_LISTEN_ADDR".into(), addr_b.clone());
    env_b.insert("NEXO_CONTROL_PLANE_URL".into(), format!("https://{closed}"));
    let mut b = f.spawn(&env_b);
    let b_log = b.log_reader();
    b.wait_until(
        Duration::from_secs(30),
        "pod-b's failed standby check",
        || b_log().contains("standby check: no tls handshake with the control plane"),
    );
    let (status, body) = http_get(&addr_b, "/readyz");
    b.check(
        status == 503 && body.contains("standby"),
        &format!("the standby's /readyz: {status} {body}"),
    );
    let (status, _) = http_get(&addr_b, "/healthz");
    b.check(status == 200, "alive all the same");
}

#[test]
fn a_new_leader_reads_the_ledger_again_and_executes_no_finished_command() {
    let f = Fixture::new("leader-ledger");
    f.tb.install_crds();
    let env = |uid: &str| {
        let mut e = f.env();
        e.insert("POD_UID".into(), uid.into());
        e
    };
    let mut a = f.spawn(&env("pod-a"));
    a.wait_until(Duration::from_secs(30), "pod-a leading", || {
        !f.sim.heartbeats().is_empty()
    });
    // pod-b reads the state now, while the ledger is empty.
    let mut b = f.spawn(&env("pod-b"));
    let b_log = b.log_reader();
    b.wait_until(Duration::from_secs(30), "pod-b following", || {
        b_log().contains("following: the lease nexo-manager is held by pod-a")
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
    a.wait_exit(Duration::from_secs(10));
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
    let again = acks_of()[1].clone();
    b.check(
        again["resources"] == first["resources"],
        &format!("pod-b acknowledged the recorded result, not a second execution: {again}"),
    );
    b.check(
        b_log().contains("command cmd-once already finished"),
        "pod-b found the command in the ledger",
    );
}
