//! Leader election: two Managers for one environment in one namespace,
//! exactly one acts; a stopped leader is replaced, and once resumed it does
//! not act before it holds the lease again.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::fixture::Fixture;

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
    let mut a = f.spawn(&env("pod-a"));
    a.wait_until(Duration::from_secs(30), "pod-a leading", || {
        !f.sim.heartbeats().is_empty()
    });
    let mut b = f.spawn(&env("pod-b"));
    let b_log = b.log_reader();
    b.wait_until(Duration::from_secs(30), "pod-b following", || {
        b_log().contains("following: the lease nexo-manager is held by pod-a")
    });
    std::thread::sleep(Duration::from_secs(3));
    a.check(
        connects_from(&f, "pod-b") == 0,
        "the follower never connects",
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
