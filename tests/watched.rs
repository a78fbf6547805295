//! Nothing read at rest but the lease (agent.md, "Probes, readiness and the
//! rolling update", last point), on a test bed of its own with the API
//! server's audit log: the Manager's own Deployment and the release
//! contract's CRDs are read again as soon as their watch says they changed
//! (they were read every 5 minutes before), the nodes' region and zone
//! follow their labels with no list, and between changes the Manager's only
//! requests are its lease's.

mod support;

use std::time::Duration;

use nexo_manager::kube::client::MERGE_PATCH;
use serde_json::{Value, json};
use support::audit::{managers_requests, mark};
use support::fixture::Fixture;
use support::manager::Manager;

/// `verb resource/name` of each of the Manager's requests after `from`.
fn requests(bed: &std::path::Path, from: u64) -> Vec<String> {
    managers_requests(bed, from)
        .iter()
        .map(|e| {
            let r = &e["objectRef"];
            format!(
                "{} {}/{} {} at {}",
                e["verb"].as_str().unwrap_or("?"),
                r["resource"].as_str().unwrap_or("?"),
                r["name"].as_str().unwrap_or(""),
                e["requestURI"].as_str().unwrap_or(""),
                e["stageTimestamp"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// At rest for `how_long`: the Manager's only requests are its lease's.
fn only_the_lease(m: &mut Manager, bed: &std::path::Path, how_long: Duration, when: &str) {
    let from = mark(bed);
    std::thread::sleep(how_long);
    let others: Vec<String> = requests(bed, from)
        .into_iter()
        .filter(|r| !r.contains(" leases/"))
        .collect();
    m.check(
        others.is_empty(),
        &format!("{when}: at rest, nothing but the lease is requested; also: {others:#?}"),
    );
}

/// Waits until the Manager sent a request matching `what` after `from`.
fn wait_request(m: &mut Manager, bed: &std::path::Path, from: u64, what: &str) {
    m.wait_until(
        Duration::from_secs(20),
        &format!("a request {what}"),
        || requests(bed, from).iter().any(|r| r.contains(what)),
    );
}

#[test]
fn watches_replace_the_reads_at_rest_and_a_change_is_read_at_once() {
    let bed = support::OwnBed::start("watched-tb", &["--audit"]);
    let f = Fixture::on(bed.tb, "watched", nexo_cpsim::SimConfig::default());
    f.tb.install_crds();
    let admin = f.tb.admin();
    // The Manager's "own" Deployment, which no kubelet runs.
    let own = format!(
        "/apis/apps/v1/namespaces/{}/deployments/nexo-self",
        f.ns.name
    );
    admin
        .create(
            &format!("/apis/apps/v1/namespaces/{}/deployments", f.ns.name),
            &json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "nexo-self"},
                    "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "nexo-self"}},
                             "template": {"metadata": {"labels": {"app": "nexo-self"}},
                                          "spec": {"containers": [{"name": "manager", "image": "nexo/manager:1"}]}}}}),
        )
        .unwrap();
    let mut env = f.env();
    env.insert("NEXO_SELF_DEPLOYMENT".into(), "nexo-self".into());
    // A drift check every second: with no record in the namespace, the
    // first one lists the records, and the next ones list nothing.
    env.insert("NEXO_DRIFT_INTERVAL".into(), "1s".into());
    let mut m = f.spawn(&env);
    m.wait_until(Duration::from_secs(30), "three heartbeats", || {
        f.sim.heartbeats().len() >= 3
    });
    wait_request(&mut m, &bed.dir, 0, "list secrets");
    only_the_lease(&mut m, &bed.dir, Duration::from_secs(8), "after the start");

    // A release-contract CRD changes: read again at once.
    let from = mark(&bed.dir);
    admin
        .patch(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/nexopipelines.nexo.io",
            MERGE_PATCH,
            &json!({"metadata": {"labels": {"nexo-test/touched": "1"}}}),
        )
        .unwrap();
    wait_request(
        &mut m,
        &bed.dir,
        from,
        "get customresourcedefinitions/nexopipelines.nexo.io",
    );

    // Its own Deployment changes: read again at once.
    let from = mark(&bed.dir);
    admin
        .patch(
            &own,
            MERGE_PATCH,
            &json!({"metadata": {"annotations": {"nexo-test/touched": "1"}}}),
        )
        .unwrap();
    wait_request(&mut m, &bed.dir, from, "get deployments/nexo-self");

    // A node joins with region and zone labels: the heartbeat says them,
    // with no list of the nodes.
    let from = mark(&bed.dir);
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "watched-node-1",
        "labels": {"topology.kubernetes.io/region": "test-region", "topology.kubernetes.io/zone": "test-zone-a"}}});
    admin.create("/api/v1/nodes", &node).unwrap();
    m.wait_until(
        Duration::from_secs(20),
        "the node's region and zone in a heartbeat",
        || {
            f.sim.last_heartbeat().is_some_and(|hb: Value| {
                hb["cluster"]["region"] == "test-region" && hb["cluster"]["zone"] == "test-zone-a"
            })
        },
    );
    // A second node in another zone: the zone is no longer shared.
    let mut other = node.clone();
    other["metadata"]["name"] = json!("watched-node-2");
    other["metadata"]["labels"]["topology.kubernetes.io/zone"] = json!("test-zone-b");
    admin.create("/api/v1/nodes", &other).unwrap();
    m.wait_until(
        Duration::from_secs(20),
        "a zone no longer shared, left out",
        || {
            f.sim.last_heartbeat().is_some_and(|hb: Value| {
                hb["cluster"]["region"] == "test-region" && hb["cluster"].get("zone").is_none()
            })
        },
    );
    let listed: Vec<String> = requests(&bed.dir, from)
        .into_iter()
        .filter(|r| r.starts_with("list nodes"))
        .collect();
    m.check(
        listed.is_empty(),
        &format!("the nodes were not listed: {listed:?}"),
    );
    for name in ["watched-node-1", "watched-node-2"] {
        admin
            .delete(&format!("/api/v1/nodes/{name}"), "Background")
            .unwrap();
    }
    only_the_lease(
        &mut m,
        &bed.dir,
        Duration::from_secs(8),
        "after the changes",
    );

    // A deploy with drift writes a record: the next check lists the
    // records again, and each check after it.
    let from = mark(&bed.dir);
    support::drift::deploy(&f, &mut m, "watched-drift", json!({"mode": "report"}));
    wait_request(&mut m, &bed.dir, from, "list secrets");
    let from = mark(&bed.dir);
    wait_request(&mut m, &bed.dir, from, "list secrets");
    m.stop_expecting_exit_0();
}

/// The RBAC of 0.4, which a self-upgrade keeps (the upgrade patches the
/// image, not the ClusterRole): nodes may be listed, not watched. Region
/// and zone still come from the list, made every few minutes, as before.
#[test]
fn nodes_that_may_be_listed_but_not_watched_are_listed() {
    let bed = support::OwnBed::start("watched-list-tb", &[]);
    let f = Fixture::on(bed.tb, "watched-list", nexo_cpsim::SimConfig::default());
    f.tb.install_crds();
    let ns = &f.ns.name;
    support::grant_service_account(
        f.tb,
        ns,
        "mgr",
        &json!([
            {"apiGroups": ["nexo.io"], "resources": ["nexoproxies"], "verbs": ["list", "watch"]},
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["list", "watch"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "create", "update"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}]),
    );
    support::grant_cluster(
        f.tb,
        "mgr-0-4",
        ns,
        "mgr",
        &json!([
            {"apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["kube-system"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]),
    );
    let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "listed-node-1",
        "labels": {"topology.kubernetes.io/region": "list-region", "topology.kubernetes.io/zone": "list-zone"}}});
    f.tb.admin().create("/api/v1/nodes", &node).unwrap();
    let token = f.tb.token(ns, "mgr");
    let mut env = f.env();
    let kubeconfig = f.tb.kubeconfig_for_token(&token, "mgr");
    env.insert("KUBECONFIG".into(), kubeconfig.display().to_string());
    let mut m = f.spawn(&env);
    m.wait_until(
        Duration::from_secs(30),
        "region and zone from the list",
        || {
            f.sim.last_heartbeat().is_some_and(|hb: Value| {
                hb["cluster"]["region"] == "list-region" && hb["cluster"]["zone"] == "list-zone"
            })
        },
    );
    let hb = f.sim.last_heartbeat().unwrap();
    m.check(
        hb.get("inventoryErrors")
            .is_none_or(|e| !e.to_string().contains("nodes")),
        &format!("no error about the nodes: {}", hb["inventoryErrors"]),
    );
    m.check(
        m.stderr()
            .lines()
            .any(|l| l.contains("may be listed but not watched") && l.contains("watch=nodes")),
        "it says the nodes are listed, not watched",
    );
    m.stop_expecting_exit_0();
}
