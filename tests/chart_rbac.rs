//! The chart's RBAC as the bound of every command (README, "What a command
//! may write" and "A namespace-scoped install"), on the real test bed: a
//! namespace-scoped install (no ClusterRole, no ClusterRoleBinding) runs
//! commands in its managed namespaces, and an executor whose rules an
//! administrator narrowed makes the API server refuse what they leave out,
//! nothing written.

mod support;

use std::path::Path;
use std::sync::Arc;

use nexo_cpsim::{SimConfig, Simulator};
use serde_json::{Value, json};
use support::chart::{CHART, deploy, exists, heartbeat_after, helm, send, start_as_installed};
use support::{run_ok_with_input as ok, testbed};

#[test]
fn a_namespace_scoped_install_runs_commands_within_its_roles() {
    let tb = testbed();
    tb.install_crds();
    let sim = Arc::new(Simulator::start(SimConfig::default()));
    let env_id = format!("env-chart-rbac-{}", std::process::id());
    let token = sim.add_environment(&env_id);
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chart-rbac-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    sim.write_ca(&dir.join("cp-ca.pem"));
    let rel = tb.namespace("rbac-rel");
    let shop = tb.namespace("rbac-shop");
    let narrow = tb.namespace("rbac-narrow");
    let name = "ns-nexo-manager";
    let mut install = helm(tb);
    install.args(["install", "ns", CHART, "--namespace", &rel.name]);
    for v in [
        format!("connectToken.value={token}"),
        format!("controlPlane.url={}", sim.url()),
        format!("managedNamespaces={{{},{}}}", shop.name, narrow.name),
        "heartbeatInterval=1s".to_owned(),
        "crds.install=false".to_owned(),
        "rbac.clusterScoped=false".to_owned(),
        // The administrator's narrower rules for one namespace: ConfigMaps only.
        format!("executor.rulesByNamespace.{}[0].apiGroups[0]=", narrow.name),
        format!(
            "executor.rulesByNamespace.{}[0].resources[0]=configmaps",
            narrow.name
        ),
        format!(
            "executor.rulesByNamespace.{}[0].verbs={{get,list,create,patch,delete}}",
            narrow.name
        ),
    ] {
        install.args(["--set", &v]);
    }
    ok(&mut install, None);

    // Nothing cluster-wide.
    for kind in ["clusterroles", "clusterrolebindings"] {
        let list: Value = tb
            .admin()
            .get(&format!("/apis/rbac.authorization.k8s.io/v1/{kind}"))
            .unwrap();
        let ours: Vec<&Value> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|o| o["metadata"]["labels"]["app.kubernetes.io/instance"] == "ns")
            .collect();
        assert!(
            ours.is_empty(),
            "a namespace-scoped install made {kind}: {ours:?}"
        );
    }

    let mut m = start_as_installed(tb, &sim, &dir, &rel.name, name);
    let hb = heartbeat_after(&mut m, &sim, 0);
    // What needs a ClusterRole is reported unavailable, not guessed: the
    // CRDs, the nodes (region and zone).
    let errors = hb["inventoryErrors"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    m.check(
        errors.len() == 1
            && errors[0]
                .as_str()
                .is_some_and(|e| e.starts_with("nodes are not readable"))
            && hb["cluster"].get("region").is_none()
            && hb["releaseContract"]["errors"]
                .to_string()
                .contains("forbidden"),
        &format!("the inventory read, the CRDs and nodes reported unreadable: {hb}"),
    );
    let proxy =
        |ns: &str, n: &str| format!("/apis/nexo.io/v1alpha1/namespaces/{ns}/nexoproxies/{n}");
    let ack = send(&mut m, &sim, &env_id, deploy("orders", &shop.name));
    m.check(
        ack["result"] == "applied",
        &format!("a deploy in {}: {ack}", shop.name),
    );
    m.check(exists(tb, &proxy(&shop.name, "orders")), "orders deployed");

    // The narrowed executor: the API server's 403, nothing written.
    let ack = send(&mut m, &sim, &env_id, deploy("blocked", &narrow.name));
    let executor = format!("system:serviceaccount:{}:nexo-executor", narrow.name);
    m.check(
        ack["result"] == "failed"
            && ack["message"]
                .as_str()
                .is_some_and(|s| s.contains("forbidden") && s.contains(&executor)),
        &format!("refused by the API server for the narrowed executor: {ack}"),
    );
    m.check(
        !exists(tb, &proxy(&narrow.name, "blocked")),
        "nothing written where the executor may not write",
    );
    let ack = send(
        &mut m,
        &sim,
        &env_id,
        support::chart::command(
            "uninstall-orders",
            "uninstall",
            json!({"deployment": {"name": "orders", "namespace": shop.name}}),
        ),
    );
    m.check(ack["result"] == "applied", &format!("an uninstall: {ack}"));
    m.check(
        !exists(tb, &proxy(&shop.name, "orders")),
        "orders uninstalled",
    );
    m.stop_expecting_exit_0();
    ok(
        helm(tb).args(["uninstall", "ns", "--namespace", &rel.name]),
        None,
    );
    assert!(
        !exists(
            tb,
            &format!(
                "/apis/rbac.authorization.k8s.io/v1/namespaces/kube-system/roles/{name}-cluster-identity"
            )
        ),
        "the kube-system Role goes with the release"
    );
}
