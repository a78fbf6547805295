//! The Helm chart (`charts/nexo-manager/`) with the test bed's `helm`:
//! it lints; bad values fail at install and change nothing; it renders the
//! kustomize base's objects (the two must not drift); the API server takes
//! what it renders; and installed with `helm install`, the Manager runs under
//! the chart's RBAC, heartbeats, deploys and uninstalls, survives a
//! `helm upgrade` to the next chart version, and `helm uninstall` leaves the
//! CRDs and the NexoProxies it deployed.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;

use nexo_cpsim::{SimConfig, Simulator};
use serde_json::{Value, json};
use support::manager::Manager;
use support::{Testbed, run_ok_with_input as ok, run_with_input as run, testbed};

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/nexo-manager");
const MANIFESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests");
const VERSION: &str = env!("CARGO_PKG_VERSION");
const WAIT: Duration = Duration::from_secs(60);
/// The labels Helm's chart puts on every object and the kustomize base does not.
const HELM_LABELS: [&str; 2] = ["helm.sh/chart", "app.kubernetes.io/managed-by"];

/// `helm` against the test bed, with its caches in a folder of this test binary.
fn helm(tb: &Testbed) -> Command {
    let home = Path::new(env!("CARGO_TARGET_TMPDIR")).join("helm-home");
    let mut c = Command::new(&tb.helm);
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
fn objects(tb: &Testbed, yaml: &str) -> BTreeMap<String, Value> {
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
fn template(tb: &Testbed, release: &str, namespace: &str, args: &[&str]) -> String {
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

#[test]
fn helm_lint_passes_strictly() {
    let tb = testbed();
    let out = ok(
        helm(tb).args([
            "lint",
            "--strict",
            CHART,
            "--set",
            "connectToken.value=nexo_ct_lint",
        ]),
        None,
    );
    assert!(
        out.contains("1 chart(s) linted, 0 chart(s) failed"),
        "{out}"
    );
}

#[test]
fn bad_values_fail_at_install_naming_the_value_and_install_nothing() {
    let tb = testbed();
    let ns = tb.namespace("chart-bad");
    let cases: [(&[&str], &str); 9] = [
        (&[], "connectToken.value is required"),
        (&["--set", "image.digest=latest"], "/image/digest"),
        (
            &["--set", "controlPlane.url=http://cp.nexo.example"],
            "/controlPlane/url",
        ),
        (&["--set", "logFormat=xml"], "/logFormat"),
        (
            &["--set", "policy.podSecurity=privileged"],
            "/policy/podSecurity",
        ),
        (
            &["--set", "managedNamespaces={Shop_1}"],
            "/managedNamespaces/0",
        ),
        (&["--set", "heartbeatInterval=soon"], "/heartbeatInterval"),
        (&["--set", "proxyImage=proxy@md5:00"], "/proxyImage"),
        (&["--set", "replicas=2"], "replicas"),
    ];
    for (i, (args, named)) in cases.iter().enumerate() {
        let mut cmd = helm(tb);
        cmd.args([
            "install",
            &format!("bad-{i}"),
            CHART,
            "--namespace",
            &ns.name,
        ]);
        if !args.is_empty() {
            cmd.args(["--set", "connectToken.value=nexo_ct_bad"]);
        }
        cmd.args(*args);
        let shown = format!("{cmd:?}");
        let out = run(&mut cmd, None);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(named),
            "{shown}: expected a failure naming {named:?}, got {}:\n{}{stderr}",
            out.status,
            String::from_utf8_lossy(&out.stdout)
        );
    }
    // Nothing was installed: no release in any status (helm 4 lists all by
    // default), no object of the chart.
    let releases = ok(helm(tb).args(["list", "--namespace", &ns.name, "-q"]), None);
    assert_eq!(releases.trim(), "", "releases left by refused installs");
    let left = ok(
        tb.kubectl_cmd().args([
            "get",
            "serviceaccounts,secrets,deployments,roles,rolebindings",
            "--namespace",
            &ns.name,
            "-l",
            "app.kubernetes.io/name=nexo-manager",
            "-o",
            "name",
        ]),
        None,
    );
    assert_eq!(left.trim(), "", "objects left by refused installs");
}

#[test]
fn the_chart_renders_the_kustomize_base_objects() {
    let tb = testbed();
    let base = objects(
        tb,
        &ok(tb.kubectl_cmd().args(["kustomize", MANIFESTS]), None),
    );
    // The base's connect-token Secret is a template; the chart needs the value.
    let placeholder = base["Secret nexo-system/nexo-connect-token"]["stringData"]["connect-token"]
        .as_str()
        .expect("the base's connect-token placeholder")
        .to_owned();
    let chart = objects(
        tb,
        &template(
            tb,
            "nexo-manager",
            "nexo-system",
            &["--set", &format!("connectToken.value={placeholder}")],
        ),
    );

    let mut base = base;
    // The release namespace is Helm's (`helm install --create-namespace`); the
    // base creates it with the restricted Pod Security label, which the
    // chart's NOTES.txt asks for.
    let ns = base
        .remove("Namespace -/nexo-system")
        .expect("the base's Namespace");
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    let notes = std::fs::read_to_string(Path::new(CHART).join("templates/NOTES.txt")).unwrap();
    assert!(notes.contains("pod-security.kubernetes.io/enforce=restricted"));

    let mut chart = chart;
    for (key, object) in chart.iter_mut() {
        let labels = object["metadata"]["labels"]
            .as_object_mut()
            .unwrap_or_else(|| panic!("{key} has no labels"));
        if key.starts_with("CustomResourceDefinition ") {
            // crds/ is not templated: the base's files themselves.
            continue;
        }
        assert_eq!(
            labels.remove(HELM_LABELS[0]),
            Some(json!(format!("nexo-manager-{VERSION}"))),
            "{key}"
        );
        assert_eq!(labels.remove(HELM_LABELS[1]), Some(json!("Helm")), "{key}");
    }

    let base_keys: Vec<_> = base.keys().collect();
    let chart_keys: Vec<_> = chart.keys().collect();
    assert_eq!(base_keys, chart_keys, "the two render different objects");
    for (key, b) in &base {
        let c = &chart[key];
        assert!(
            b == c,
            "{key} differs:\nkustomize base:\n{}\nchart:\n{}",
            serde_json::to_string_pretty(b).unwrap(),
            serde_json::to_string_pretty(c).unwrap()
        );
    }
}

#[test]
fn the_api_server_takes_what_the_chart_renders_with_every_option() {
    let tb = testbed();
    let release_ns = tb.namespace("chart-dry");
    let shop = tb.namespace("chart-shop");
    let billing = tb.namespace("chart-billing");
    let ca =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chart-ca-{}.pem", std::process::id()));
    Simulator::start(SimConfig::default()).write_ca(&ca);
    let ca_arg = format!("controlPlane.caBundle={}", ca.display());
    let rendered = template(
        tb,
        "dry",
        &release_ns.name,
        &[
            "--set",
            "connectToken.existingSecret=my-token",
            "--set",
            &format!("managedNamespaces={{{},{}}}", shop.name, billing.name),
            "--set",
            "commandKeys.keys=cp-2026 AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
            "--set",
            "policy.allowedImageRepositories={mirror.example.com/nexo/proxy}",
            "--set",
            "policy.managerImageRepository=mirror.example.com/nexo/manager",
            "--set",
            "policy.allowExternalServices=true",
            "--set",
            "policy.podSecurity=restricted",
            "--set",
            "logFormat=json",
            "--set",
            "controlPlane.requestTimeout=20s",
            "--set-file",
            &ca_arg,
        ],
    );
    let objects = objects(tb, &rendered);
    // One RoleBinding per managed namespace, none in the release namespace.
    for ns in [&shop.name, &billing.name] {
        assert!(
            objects.contains_key(&format!("RoleBinding {ns}/dry-nexo-manager-managed")),
            "no RoleBinding in {ns}: {:?}",
            objects.keys()
        );
    }
    assert!(!objects.contains_key(&format!(
        "RoleBinding {}/dry-nexo-manager-managed",
        release_ns.name
    )));
    assert!(!objects.keys().any(|k| k.contains("nexo-connect-token")));
    let ca_map = &objects[&format!("ConfigMap {}/dry-nexo-manager-cp-ca", release_ns.name)];
    assert_eq!(
        ca_map["data"]["ca.crt"].as_str(),
        Some(std::fs::read_to_string(&ca).unwrap().as_str())
    );
    let env: BTreeMap<&str, &str> = objects[&format!(
        "Deployment {}/dry-nexo-manager",
        release_ns.name
    )]["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?, e["value"].as_str()?)))
        .collect();
    let names = format!("{},{}", shop.name, billing.name);
    for (var, want) in [
        ("NEXO_NAMESPACES", names.as_str()),
        (
            "NEXO_ALLOWED_IMAGE_REPOSITORIES",
            "mirror.example.com/nexo/proxy",
        ),
        (
            "NEXO_MANAGER_IMAGE_REPOSITORY",
            "mirror.example.com/nexo/manager",
        ),
        ("NEXO_ALLOW_EXTERNAL_SERVICES", "true"),
        ("NEXO_POD_SECURITY", "restricted"),
        ("NEXO_LOG_FORMAT", "json"),
        ("NEXO_CP_REQUEST_TIMEOUT", "20s"),
        ("NEXO_CONTROL_PLANE_CA_FILE", "/var/run/nexo-cp-ca/ca.crt"),
        ("NEXO_BUNDLE_VERSION", VERSION),
        ("NEXO_SELF_DEPLOYMENT", "dry-nexo-manager"),
        ("NEXO_STATE_SECRET", "dry-nexo-manager-state"),
    ] {
        assert_eq!(env.get(var).copied(), Some(want), "{var} in {env:?}");
    }
    let out = ok(
        tb.kubectl_cmd()
            .args(["apply", "--dry-run=server", "-f", "-"]),
        Some(rendered.as_bytes()),
    );
    let accepted = out
        .lines()
        .filter(|l| l.ends_with("(server dry run)"))
        .count();
    assert_eq!(
        accepted,
        objects.len(),
        "kubectl apply --dry-run=server:\n{out}"
    );
}

/// The next patch release of `version`: 0.3.0 → 0.3.1.
fn next_patch(version: &str) -> String {
    let (head, patch) = version.rsplit_once('.').expect("major.minor.patch");
    format!(
        "{head}.{}",
        patch.parse::<u32>().expect("a numeric patch") + 1
    )
}

/// A copy of the chart at `version` (the next release, for `helm upgrade`).
fn chart_at(version: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("chart-{version}-{}", std::process::id()));
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
fn start_as_installed(
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
        ("NEXO_LISTEN_ADDR", support::PROBES_ON_ANY_PORT.to_owned()),
        (
            "KUBECONFIG",
            tb.kubeconfig_for_token(&tb.token(namespace, name), name)
                .display()
                .to_string(),
        ),
        ("RUST_LOG", "debug".to_owned()),
    ] {
        env.insert(k.into(), v);
    }
    Manager::spawn(&env).with_sim(sim)
}

fn command(id: &str, class: &str, payload: Value) -> Value {
    json!({"id": format!("{id}-{}", std::process::id()), "class": class,
           "issuedAt": "2026-12-03T00:00:00Z", "payload": payload})
}

fn deploy(name: &str, namespace: &str) -> Value {
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
fn send(m: &mut Manager, sim: &Simulator, env_id: &str, cmd: Value) -> Value {
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
fn heartbeat_after(m: &mut Manager, sim: &Simulator, after: usize) -> Value {
    m.wait_until(WAIT, "a heartbeat", || sim.heartbeat_count() > after);
    sim.last_heartbeat().unwrap()
}

fn exists(tb: &Testbed, path: &str) -> bool {
    tb.admin()
        .get_opt::<Value>(path)
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
        .is_some()
}

#[test]
fn helm_install_upgrade_and_uninstall_with_the_manager_under_the_charts_rbac() {
    let tb = testbed();
    let sim = Arc::new(Simulator::start(SimConfig::default()));
    let env_id = format!("env-chart-{}", std::process::id());
    let token = sim.add_environment(&env_id);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    sim.write_ca(&dir.join("cp-ca.pem"));
    let rel = tb.namespace("chart-rel");
    let shop = tb.namespace("chart-shop");
    let name = "nm-nexo-manager";
    let values = [
        format!("connectToken.value={token}"),
        format!("controlPlane.url={}", sim.url()),
        format!("managedNamespaces={{{}}}", shop.name),
        "heartbeatInterval=1s".to_owned(),
    ];
    let set = |cmd: &mut Command| {
        for v in &values {
            cmd.args(["--set", v]);
        }
    };

    // The README's command, with the simulator's URL and token.
    let mut install = helm(tb);
    install.args(["install", "nm", CHART, "--namespace", &rel.name]);
    set(&mut install);
    ok(&mut install, None);

    let mut m = start_as_installed(tb, &sim, &dir, &rel.name, name);
    let hb = heartbeat_after(&mut m, &sim, 0);
    m.check(
        hb["manager"]["version"] == VERSION
            && hb["releaseContract"]["bundleVersion"] == VERSION
            && hb["releaseContract"]["errors"] == json!([])
            && hb["releaseContract"]["crdKinds"] == json!(["NexoPipeline", "NexoProxy"])
            && hb.get("inventoryErrors").is_none(),
        &format!("the first heartbeat under the chart's RBAC: {hb}"),
    );
    let proxy = |n: &str| {
        format!(
            "/apis/nexo.io/v1alpha1/namespaces/{}/nexoproxies/{n}",
            shop.name
        )
    };
    for (cmd, want) in [
        (deploy("orders", &shop.name), "applied"),
        (
            command(
                "uninstall-orders",
                "uninstall",
                json!({"deployment": {"name": "orders", "namespace": shop.name}}),
            ),
            "applied",
        ),
        (deploy("kept", &shop.name), "applied"),
        // Outside the managed namespaces (NEXO_NAMESPACES, set by the chart): refused.
        (deploy("stray", &rel.name), "failed"),
    ] {
        let ack = send(&mut m, &sim, &env_id, cmd);
        m.check(ack["result"] == want, &format!("expected {want}: {ack}"));
    }
    m.check(
        !exists(tb, &proxy("orders")) && exists(tb, &proxy("kept")),
        "orders deployed then uninstalled, kept deployed",
    );
    m.stop_expecting_exit_0();
    let state = format!("/api/v1/namespaces/{}/secrets/{name}-state", rel.name);
    let state_before: Value = tb.admin().get(&state).unwrap();

    // helm upgrade to the next chart version, with a new image.
    let next_version = next_patch(VERSION);
    let next = chart_at(&next_version);
    let digest = format!("sha256:{}", "1".repeat(64));
    let mut upgrade = helm(tb);
    upgrade.args(["upgrade", "nm"]).arg(&next).args([
        "--namespace",
        &rel.name,
        "--set",
        &format!("image.digest={digest}"),
    ]);
    set(&mut upgrade);
    ok(&mut upgrade, None);
    let d: Value = tb
        .admin()
        .get(&format!(
            "/apis/apps/v1/namespaces/{}/deployments/{name}",
            rel.name
        ))
        .unwrap();
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"][0]["image"],
        format!("registry.example.com/nexo/manager@{digest}")
    );
    let state_after: Value = tb.admin().get(&state).unwrap();
    assert_eq!(
        state_after["data"], state_before["data"],
        "the upgrade kept the Manager's state (binding and ledger)"
    );

    let seen = sim.heartbeat_count();
    let mut m = start_as_installed(tb, &sim, &dir, &rel.name, name);
    let hb = heartbeat_after(&mut m, &sim, seen);
    m.check(
        hb["releaseContract"]["bundleVersion"] == next_version.as_str()
            && hb["deployments"]
                .as_array()
                .is_some_and(|d| d.len() == 1 && d[0]["name"] == "kept"),
        &format!("after the upgrade, the same binding and inventory, the new bundle: {hb}"),
    );
    m.stop_expecting_exit_0();

    // helm uninstall: the chart's objects go; the CRDs (crds/) and the
    // NexoProxies the Manager deployed stay.
    ok(
        helm(tb).args(["uninstall", "nm", "--namespace", &rel.name]),
        None,
    );
    for gone in [
        format!("/apis/apps/v1/namespaces/{}/deployments/{name}", rel.name),
        format!("/api/v1/namespaces/{}/serviceaccounts/{name}", rel.name),
        format!(
            "/apis/rbac.authorization.k8s.io/v1/namespaces/{}/rolebindings/{name}-managed",
            shop.name
        ),
        format!("/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}-managed"),
        format!("/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}-cluster"),
    ] {
        assert!(!exists(tb, &gone), "{gone} is left after helm uninstall");
    }
    for kept in [
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/nexoproxies.nexo.io".to_owned(),
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/nexopipelines.nexo.io".to_owned(),
        proxy("kept"),
    ] {
        assert!(exists(tb, &kept), "{kept} is gone after helm uninstall");
    }
}

/// The value of `key: value` on the first line of `text` that has `key`.
fn yaml_scalar<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(key)?.strip_prefix(':'))
        .map(|v| v.trim().trim_matches('"'))
}

#[test]
fn one_version_number_everywhere() {
    // Cargo.toml's is the one; everything else is checked against it.
    let chart = std::fs::read_to_string(Path::new(CHART).join("Chart.yaml")).unwrap();
    assert_eq!(
        yaml_scalar(&chart, "version"),
        Some(VERSION),
        "Chart.yaml version (the bundle)"
    );
    assert_eq!(
        yaml_scalar(&chart, "appVersion"),
        Some(VERSION),
        "Chart.yaml appVersion"
    );

    let tb = testbed();
    let base = objects(
        tb,
        &ok(tb.kubectl_cmd().args(["kustomize", MANIFESTS]), None),
    );
    for (key, object) in &base {
        if let Some(v) = object["metadata"]["labels"].get("app.kubernetes.io/version") {
            assert_eq!(v, VERSION, "{key}: app.kubernetes.io/version");
        }
    }
    let deployment = &base["Deployment nexo-system/nexo-manager"];
    let bundle = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "NEXO_BUNDLE_VERSION")
        .expect("the base sets NEXO_BUNDLE_VERSION");
    assert_eq!(
        bundle["value"], VERSION,
        "manifests/deployment.yaml NEXO_BUNDLE_VERSION"
    );
    assert_eq!(
        deployment["metadata"]["labels"]["app.kubernetes.io/version"],
        VERSION
    );

    let out = ok(
        Command::new(support::manager::binary()).arg("--version"),
        None,
    );
    assert!(
        out.starts_with(&format!("nexo-manager {VERSION} ")),
        "--version: {out}"
    );

    // The newest release in CHANGELOG.md is this one.
    let changelog =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("CHANGELOG.md"))
            .unwrap();
    let newest = changelog
        .lines()
        .find_map(|l| l.strip_prefix("## ["))
        .and_then(|l| l.split(']').next());
    let newest = if newest == Some("Unreleased") {
        changelog
            .lines()
            .filter_map(|l| l.strip_prefix("## ["))
            .nth(1)
            .and_then(|l| l.split(']').next())
    } else {
        newest
    };
    assert_eq!(newest, Some(VERSION), "CHANGELOG.md's newest release");
}

/// The image the bundle pins is the one the release notes name: when the
/// newest release's section of CHANGELOG.md lists its image digests (`###
/// Image`, written by tests/image/stamp-release.sh with the chart's and
/// `manifests/`' pins), its index digest is the pinned one.
#[test]
fn the_pinned_image_is_the_one_the_release_notes_name() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    let values = read("charts/nexo-manager/values.yaml");
    let pinned = yaml_scalar(&values, "digest").expect("values.yaml image.digest");
    assert!(
        read("manifests/deployment.yaml")
            .contains(&format!("registry.example.com/nexo/manager@{pinned}")),
        "manifests/deployment.yaml pins another image than values.yaml ({pinned})"
    );
    let changelog = read("CHANGELOG.md");
    let release = changelog
        .split("\n## [")
        .skip(1)
        .find(|s| !s.starts_with("Unreleased"))
        .expect("a release section in CHANGELOG.md");
    if let Some(image) = release.split("\n### Image\n").nth(1) {
        let index = image
            .lines()
            .find_map(|l| l.strip_prefix("- index: `"))
            .and_then(|l| l.strip_suffix('`'))
            .expect("the ### Image list names the index");
        assert_eq!(
            index, pinned,
            "CHANGELOG.md's image index vs the pinned digest"
        );
        for platform in ["linux/amd64", "linux/arm64"] {
            assert!(
                image.contains(&format!("- {platform}: `sha256:")),
                "the ### Image list names the {platform} image"
            );
        }
    }
}
