//! The chart's PodDisruptionBudget under a drain (agent.md, "Probes,
//! readiness and the rolling update"): a Control Plane outage makes every
//! Manager pod unready, on purpose, and a node drain must still be able to
//! evict them. Installed with two replicas on a test bed without a node,
//! each pod is given the status a kubelet reports for a running container
//! that fails its readiness probe (phase Running, Ready false; a Pending
//! pod is evicted whatever the budget says). The Eviction API (what
//! `kubectl drain` calls) then allows an eviction under the chart's
//! `unhealthyPodEvictionPolicy: AlwaysAllow`, and refuses it (429) once the
//! budget is set back to Kubernetes' default, `IfHealthyBudget`: the
//! setting is what lets the drain through.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::chart::{CHART, helm};
use support::{run_ok_with_input as ok, testbed, wait_for};

const WAIT: Duration = Duration::from_secs(60);

#[test]
fn an_unready_manager_pod_may_be_evicted_with_two_replicas() {
    let tb = testbed();
    let ns = tb.namespace("chart-drain");
    let client = tb.admin();
    // A release of its own: the chart's ClusterRoles are named after it.
    let release = format!("dr{}", std::process::id());
    let _uninstall = Uninstall(tb, &release, &ns.name);
    ok(
        helm(tb)
            .args(["install", &release, CHART, "--namespace", &ns.name])
            .args(["--set", "connectToken.value=nexo_ct_drain"])
            .args(["--set", "crds.install=false", "--set", "replicaCount=2"]),
        None,
    );
    let pdb_path = format!(
        "/apis/policy/v1/namespaces/{}/poddisruptionbudgets/{release}-nexo-manager",
        ns.name
    );
    let pdb: Value = client.get(&pdb_path).unwrap();
    assert_eq!(
        pdb["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow",
        "the chart's default: {pdb}"
    );
    let pods = || -> Vec<String> {
        let list: Value = client
            .get(&format!(
                "/api/v1/namespaces/{}/pods?labelSelector=app.kubernetes.io/instance%3D{release}",
                ns.name
            ))
            .unwrap();
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
            .collect()
    };
    // Each pod running and unready, as its kubelet would report it.
    let unready = |pod: &str| {
        ok(
            tb.kubectl_cmd()
                .args(["patch", "pod", pod, "-n", &ns.name, "--subresource=status"])
                .args(["--type", "merge", "-p"])
                .arg(
                    r#"{"status":{"phase":"Running","conditions":[{"type":"Ready","status":"False"},{"type":"ContainersReady","status":"False"}]}}"#,
                ),
            None,
        );
    };
    // The disruption controller has counted both pods, neither healthy.
    let processed = |what: &str| {
        wait_for(WAIT, what, || {
            let now = pods();
            if now.len() != 2 {
                return None;
            }
            now.iter().for_each(|p| unready(p));
            let pdb: Value = client.get(&pdb_path).ok()?;
            let status = &pdb["status"];
            (status["observedGeneration"] == pdb["metadata"]["generation"]
                && status["expectedPods"] == 2
                && status["currentHealthy"] == 0
                && pods().len() == 2)
                .then_some(())
        })
    };
    processed("the budget to count two unready pods");
    let evict = |pod: &str| {
        client.create(
            &format!("/api/v1/namespaces/{}/pods/{pod}/eviction", ns.name),
            &json!({"apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": pod, "namespace": ns.name}}),
        )
    };
    let first = pods()[0].clone();
    if let Err(e) = evict(&first) {
        panic!("evicting the unready {first} under AlwaysAllow: {e}");
    }
    wait_for(WAIT, "the evicted pod gone", || {
        (!pods().contains(&first)).then_some(())
    });

    // Kubernetes' default policy blocks the same drain.
    ok(
        tb.kubectl_cmd()
            .args([
                "patch",
                "poddisruptionbudget",
                &format!("{release}-nexo-manager"),
            ])
            .args(["-n", &ns.name])
            .args(["--type", "merge", "-p"])
            .arg(r#"{"spec":{"unhealthyPodEvictionPolicy":"IfHealthyBudget"}}"#),
        None,
    );
    processed("the budget to count the replaced pod");
    let second = pods()[0].clone();
    match evict(&second) {
        Ok(v) => panic!("evicted {second} under IfHealthyBudget: {v}"),
        Err(e) => assert_eq!(
            e.status(),
            Some(429),
            "refused as a disruption budget refuses: {e}"
        ),
    }
}

/// Uninstalls the release when the test ends, however it ends: its
/// ClusterRoles outlive the namespace.
struct Uninstall<'a>(&'a support::Testbed, &'a str, &'a str);

impl Drop for Uninstall<'_> {
    fn drop(&mut self) {
        let _ = support::run_with_input(
            helm(self.0).args(["uninstall", self.1, "--namespace", self.2]),
            None,
        );
    }
}
