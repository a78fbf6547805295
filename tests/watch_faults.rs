//! Watches that end at once, or answer 410 Gone, are opened again with a
//! backoff (docs/protocol.md, "Hostile and buggy values"): through a proxy in
//! front of the real API server that does that to every watch of two
//! managed namespaces, the Manager asks at most 10 watches (and lists) a
//! minute per watch, and goes on heartbeating.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use support::apiproxy::{ApiProxy, WatchFault};
use support::fixture::Fixture;

/// How long the requests are counted.
const WINDOW: Duration = Duration::from_secs(60);

#[test]
fn watches_that_end_at_once_or_answer_410_are_opened_again_after_a_backoff() {
    let f = Fixture::new("watch-end");
    f.tb.install_crds();
    let gone = f.tb.namespace("watch-gone");
    let faults = BTreeMap::from([
        (f.ns.name.clone(), WatchFault::End),
        (gone.name.clone(), WatchFault::Gone),
    ]);
    let proxy = ApiProxy::start(f.tb, faults);
    let mut env = f.env();
    env.insert(
        "KUBECONFIG".into(),
        proxy.kubeconfig(&f.dir).display().to_string(),
    );
    env.insert(
        "NEXO_NAMESPACES".into(),
        format!("{},{}", f.ns.name, gone.name),
    );
    let mut m = f.spawn(&env);
    m.wait_until(Duration::from_secs(60), "a first heartbeat", || {
        f.sim.heartbeat_count() >= 1
    });
    let counts = |p: &ApiProxy| {
        [
            p.count(&f.ns.name, "watch"),
            p.count(&gone.name, "watch"),
            p.count(&gone.name, "list"),
        ]
    };
    let before = counts(&proxy);
    let beats = f.sim.heartbeat_count();
    let started = Instant::now();
    std::thread::sleep(WINDOW);
    let after = counts(&proxy);
    let minutes = started.elapsed().as_secs_f64() / 60.0;
    // Two watches a namespace: its NexoProxies and its Deployments.
    let per_watch = |i: usize| (after[i] - before[i]) as f64 / 2.0 / minutes;
    let (ended, expired, relisted) = (per_watch(0), per_watch(1), per_watch(2));
    eprintln!(
        "watch faults: {ended:.1} watches a minute per watch that ends at once, {expired:.1} per watch that answers 410 (and {relisted:.1} lists)"
    );
    for (what, rate) in [
        ("watches that end at once", ended),
        ("watches that answer 410", expired),
        ("lists after a 410", relisted),
    ] {
        m.check(
            rate <= 10.0,
            &format!("{what}: {rate:.1} a minute per watch (at most 10)"),
        );
    }
    m.check(
        f.sim.heartbeat_count() >= beats + 30,
        "heartbeats went on meanwhile (one a second)",
    );
    m.stop_expecting_exit_0();
}
