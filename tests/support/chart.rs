//! The Helm chart's test helpers: `helm` (4 or 3) against the test bed,
//! rendering, a chart copy at another version, and the Manager started as
//! an installed Deployment would run it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use nexo_cpsim::Simulator;
use serde_json::{Value, json};

use super::manager::Manager;
use super::{Testbed, run_ok_with_input as ok};

pub const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/nexo-manager");
pub const MANIFESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests");
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
pub const WAIT: Duration = Duration::from_secs(60);
/// The labels Helm's chart puts on every object and the kustomize base does not.
pub const HELM_LABELS: [&str; 2] = ["helm.sh/chart", "app.kubernetes.io/managed-by"];

/// `helm` against the test bed, with its caches in a folder of this test binary.
pub fn helm(tb: &Testbed) -> Command {
    helm_with(tb, &tb.helm)
}

/// `helm_bin` (Helm 4 or Helm 3) against the test bed, its caches in a
/// folder of this test binary and of that Helm.
pub fn helm_with(tb: &Testbed, helm_bin: &Path) -> Command {
    let major = if helm_bin == tb.helm3 {
        "helm3"
    } else {
        "helm4"
    };
    let home = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{major}-home"));
    let mut c = Command::new(helm_bin);
    c.arg("--kubeconfig").arg(&tb.kubeconfig);
    for (var, sub) in [
        ("HELM_CACHE_HOME", "cache"),
        ("HELM_CONFIG_HOME", "config"),
        ("HELM_DATA_HOME", "data"),
    ] {
        c.env(var, home.join(sub));
    }
    c
}

/// The objects of a YAML stream, as `kubectl` reads them (no server
/// defaults), keyed by kind, namespace and name.
pub fn objects(tb: &Testbed, yaml: &str) -> BTreeMap<String, Value> {
    let json = ok(
        tb.kubectl_cmd()
            .args(["create", "--dry-run=client", "-o", "json", "-f", "-"]),
        Some(yaml.as_bytes()),
    );
    let mut map = BTreeMap::new();
    for v in serde_json::Deserializer::from_str(&json).into_iter::<Value>() {
        let v = v.unwrap();
        let key = format!(
            "{} {}/{}",
            v["kind"].as_str().unwrap(),
            v["metadata"]["namespace"].as_str().unwrap_or("-"),
            v["metadata"]["name"].as_str().unwrap()
        );
        assert!(map.insert(key.clone(), v).is_none(), "{key} twice");
    }
    map
}

/// `helm template` of the chart with `args`, CRDs included.
pub fn template(tb: &Testbed, release: &str, namespace: &str, args: &[&str]) -> String {
    ok(
        helm(tb)
            .args([
                "template",
                release,
                CHART,
                "--namespace",
                namespace,
                "--include-crds",
            ])
            .args(args),
        None,
    )
}

/// prometheus-operator's ServiceMonitor, PodMonitor and PrometheusRule
/// CRDs, from its Go module (testbed.sh), applied to the test bed.
pub fn install_monitoring_crds(tb: &Testbed) {
    ok(
        tb.kubectl_cmd()
            .args(["apply", "--server-side", "--force-conflicts", "-f"])
            .arg(&tb.monitoring_crds),
        None,
    );
    for crd in ["servicemonitors", "podmonitors", "prometheusrules"] {
        tb.wait_established(&format!("{crd}.monitoring.coreos.com"));
    }
}

/// The next patch release of `version`: 0.3.0 → 0.3.1.
pub fn next_patch(version: &str) -> String {
    let (head, patch) = version.rsplit_once('.').expect("major.minor.patch");
    format!(
        "{head}.{}",
        patch.parse::<u32>().expect("a numeric patch") + 1
    )
}

/// A copy of the chart at `version` (the next release, for `helm upgrade`).
pub fn chart_at(version: &str) -> PathBuf {
    // A folder of each call's own: tests running side by side may ask for
    // the same version.
    static COPIES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COPIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("chart-{version}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = ok(Command::new("cp").args(["-rL", CHART]).arg(&dir), None);
    assert_eq!(out, "");
    let path = dir.join("Chart.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    let bumped = text.replace(
        &format!("version: {VERSION}"),
        &format!("version: {version}"),
    );
    assert_ne!(text, bumped, "Chart.yaml has no `version: {VERSION}`");
    std::fs::write(&path, bumped).unwrap();
    dir
}

/// Starts the Manager as the installed Deployment `namespace/name` would run
/// it, with the chart's ServiceAccount token; only what points at the
/// simulator and the API server from outside a pod differs.
pub fn start_as_installed(
    tb: &Testbed,
    sim: &Arc<Simulator>,
    dir: &Path,
    namespace: &str,
    name: &str,
) -> Manager {
    let mut env = tb.deployment_env(namespace, name);
    assert_eq!(env["NEXO_CONTROL_PLANE_URL"], sim.url());
    let token: Value = tb
        .admin()
        .get(&format!(
            "/api/v1/namespaces/{namespace}/secrets/nexo-connect-token"
        ))
        .unwrap();
    let token = base64::engine::general_purpose::STANDARD
        .decode(token["data"]["connect-token"].as_str().unwrap())
        .unwrap();
    std::fs::write(dir.join("connect-token"), token).unwrap();
    for (k, v) in [
        (
            "NEXO_CONTROL_PLANE_CA_FILE",
            dir.join("cp-ca.pem").display().to_string(),
        ),
        (
            "NEXO_CONNECT_TOKEN_FILE",
            dir.join("connect-token").display().to_string(),
        ),
        (
            "NEXO_COMMAND_KEYS_FILE",
            dir.join("no-command-keys").display().to_string(),
        ),
        ("NEXO_LISTEN_ADDR", super::PROBES_ON_ANY_PORT.to_owned()),
        (
            "KUBECONFIG",
            tb.kubeconfig_for_token(&tb.token(namespace, name), name)
                .display()
                .to_string(),
        ),
        ("RUST_LOG", "trace".to_owned()),
    ] {
        env.insert(k.into(), v);
    }
    Manager::spawn(&env).with_sim(sim)
}

pub fn command(id: &str, class: &str, payload: Value) -> Value {
    json!({"id": format!("{id}-{}", std::process::id()), "class": class,
           "issuedAt": "2026-12-03T00:00:00Z", "payload": payload})
}

pub fn deploy(name: &str, namespace: &str) -> Value {
    command(
        &format!("deploy-{name}"),
        "deploy",
        json!({"deployment": {"name": name, "namespace": namespace}, "format": "crd",
               "manifests": [{"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy", "metadata": {"name": name},
                              "spec": {"image": "registry.example.com/nexo/proxy:1.4.2",
                                       "mongodb": {"secretRef": {"name": format!("{name}-db")}}}}]}),
    )
}

/// Sends `cmd` and returns its ack once it came.
pub fn send(m: &mut Manager, sim: &Simulator, env_id: &str, cmd: Value) -> Value {
    let id = cmd["id"].as_str().unwrap().to_owned();
    sim.enqueue_command(env_id, cmd);
    m.wait_until(WAIT, &format!("the ack of {id}"), || {
        sim.acks().iter().any(|a| a["commandId"] == id.as_str())
    });
    sim.acks()
        .into_iter()
        .find(|a| a["commandId"] == id.as_str())
        .unwrap()
}

/// Waits for a heartbeat of the current process (after `after` heartbeats)
/// and returns it.
pub fn heartbeat_after(m: &mut Manager, sim: &Simulator, after: usize) -> Value {
    m.wait_until(WAIT, "a heartbeat", || sim.heartbeat_count() > after);
    sim.last_heartbeat().unwrap()
}

pub fn exists(tb: &Testbed, path: &str) -> bool {
    tb.admin()
        .get_opt::<Value>(path)
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
        .is_some()
}

/// The value of `key: value` on the first line of `text` that has `key`.
pub fn yaml_scalar<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(key)?.strip_prefix(':'))
        .map(|v| v.trim().trim_matches('"'))
}
