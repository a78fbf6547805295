//! The heartbeat's pure parts: pacing, the topology cache, the body.
use super::*;
use crate::agent::shared::Pace;
use crate::backoff::Backoff;

#[test]
fn a_held_answer_is_the_wait_but_never_less_than_a_second_a_cycle() {
    let interval = Duration::from_secs(15);
    let ms = Duration::from_millis;
    assert_eq!(wait_after(false, ms(10), interval), interval);
    assert_eq!(wait_after(false, ms(14_000), interval), interval);
    assert_eq!(wait_after(true, ms(14_000), interval), Duration::ZERO);
    assert_eq!(
        wait_after(true, ms(200), interval),
        ms(800),
        "a CP saying held without holding gets one heartbeat a second"
    );
    // Whatever the answer carried: a cycle of a heartbeat and its commands
    // that took 20 ms waits out the second too.
    assert_eq!(wait_after(true, ms(20), interval), ms(980));
    assert_eq!(wait_after(true, ms(1_500), interval), Duration::ZERO);
    assert_eq!(wait_after(true, ms(200), ms(500)), ms(500));
}

#[test]
fn region_and_zone_are_kept_from_what_the_nodes_watch_last_said() {
    let mut t = TopologyCache::default();
    let mut said = Inventory {
        region: Some("eu".into()),
        zone: Some("eu-1a".into()),
        topology_read: true,
        ..Inventory::default()
    };
    t.update(&mut said);
    let mut next = Inventory::default();
    t.update(&mut next);
    assert_eq!(next.region.as_deref(), Some("eu"), "kept");
    assert_eq!(next.zone.as_deref(), Some("eu-1a"));
    assert!(next.errors.is_empty());
}

#[test]
fn nodes_not_readable_are_reported_at_every_heartbeat_until_they_are() {
    let mut t = TopologyCache::default();
    t.failed("nodes are not readable".into());
    for _ in 0..3 {
        let mut inv = Inventory::default();
        t.update(&mut inv);
        assert_eq!(inv.errors, ["nodes are not readable"]);
        assert_eq!(inv.region, None, "never guessed");
    }
    t.readable();
    let mut inv = Inventory::default();
    t.update(&mut inv);
    assert!(inv.errors.is_empty(), "readable again: {:?}", inv.errors);
    t.failed("watch nodes: reset".into());
    let mut said = Inventory {
        region: Some("eu".into()),
        topology_read: true,
        ..Inventory::default()
    };
    t.update(&mut said);
    let mut inv = Inventory::default();
    t.update(&mut inv);
    assert!(inv.errors.is_empty(), "said again: {:?}", inv.errors);
}

#[test]
fn interval_override_is_clamped() {
    assert_eq!(clamp_interval(1), Duration::from_secs(5));
    assert_eq!(clamp_interval(30), Duration::from_secs(30));
    assert_eq!(clamp_interval(100_000), Duration::from_secs(600));
    let mut pace = Pace {
        interval: Duration::from_secs(15),
        backoff: Backoff::control_plane(),
    };
    assert_eq!(pace.set_interval(15), None, "unchanged");
    assert_eq!(pace.set_interval(2), Some(INTERVAL_MIN));
    assert_eq!(pace.interval, INTERVAL_MIN);
}

#[test]
fn the_body_reports_configured_topology_over_listed_and_counts_proxies() {
    let cfg = Config::from_lookup(|k| match k {
        "NEXO_CONTROL_PLANE_URL" => Some("https://cp.example".into()),
        "NEXO_CONNECT_TOKEN" => Some(format!("nexo_ct_env-a_{}", "a".repeat(32))),
        "NEXO_PROXY_IMAGE" => Some("r.example/nexo/proxy:1.0.0".into()),
        "NEXO_CLUSTER_REGION" => Some("configured".into()),
        _ => None,
    })
    .unwrap();
    let inv = Inventory {
        region: Some("listed".into()),
        zone: Some("zone-listed".into()),
        errors: vec!["list nodes: forbidden".into()],
        ..Inventory::default()
    };
    let cluster = ClusterRef {
        uid: "uid-1".into(),
        kubernetes_version: "v1.34.0".into(),
    };
    let b = body(inv, &cfg, &cluster, ("m-1", 7), Vec::new());
    assert_eq!((b.manager_id.as_str(), b.sequence), ("m-1", 7));
    assert_eq!(b.cluster.region.as_deref(), Some("configured"));
    assert_eq!(b.cluster.zone.as_deref(), Some("zone-listed"));
    assert_eq!(b.managed_proxy_count, 0);
    assert_eq!(b.inventory_errors, ["list nodes: forbidden"]);
    assert_eq!(b.manager.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(b.proxy_image, "r.example/nexo/proxy:1.0.0");
}
