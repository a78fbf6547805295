//! Test support: the real Kubernetes test bed, shared by the tests of one
//! test binary.
//!
//! `testbed()` starts `tests/testbed/testbed.sh start` once per test binary,
//! or uses the one already running in `$NEXO_TESTBED_DIR`. The script's reaper
//! stops what it started as soon as this process is gone, however it ended.
//! A test that cannot get the test bed panics with the reason: it never passes
//! by skipping.

#![allow(dead_code)]

pub mod apiproxy;
pub mod audit;
pub mod chart;
pub mod commands;
pub mod drift;
pub mod fixture;
pub mod manager;
pub mod proxy;
pub mod registry;
pub mod secrets;
pub mod stallproxy;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nexo_manager::kube::{self, Client, KubeConfig};
use serde_json::{Value, json};

/// A running control plane.
#[derive(Debug)]
pub struct Testbed {
    /// The data folder: certificates, logs, `env`.
    pub dir: PathBuf,
    /// The admin kubeconfig (JSON, client certificate in `system:masters`).
    pub kubeconfig: PathBuf,
    /// `https://127.0.0.1:PORT`.
    pub server: String,
    /// The `kubectl` built with the test bed.
    pub kubectl: PathBuf,
    /// The `helm` built with the test bed (Helm 4).
    pub helm: PathBuf,
    /// Helm 3, built beside it.
    pub helm3: PathBuf,
    /// The CNCF distribution registry's `registry` command.
    pub registry: PathBuf,
    /// `helm-docs`.
    pub helm_docs: PathBuf,
    /// The folder of prometheus-operator's ServiceMonitor, PodMonitor and
    /// PrometheusRule CRDs.
    pub monitoring_crds: PathBuf,
    /// Prometheus' `promtool`.
    pub promtool: PathBuf,
    /// Sigstore's `cosign`.
    pub cosign: PathBuf,
    /// The Kubernetes version it runs, `v1.37.2`.
    pub version: String,
}

static TESTBED: OnceLock<Result<Testbed, String>> = OnceLock::new();
static COUNTER: AtomicU32 = AtomicU32::new(0);

/// The script that builds and runs the test bed.
pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/testbed/testbed.sh")
}

/// The test bed of this test binary; panics with the reason when there is none.
pub fn testbed() -> &'static Testbed {
    match TESTBED.get_or_init(start_or_attach) {
        Ok(tb) => tb,
        Err(why) => panic!("the Kubernetes test bed is not available: {why}"),
    }
}

fn start_or_attach() -> Result<Testbed, String> {
    if let Some(dir) = std::env::var_os("NEXO_TESTBED_DIR") {
        let dir = PathBuf::from(dir);
        return read_env(&dir).map_err(|e| format!("NEXO_TESTBED_DIR={}: {e}", dir.display()));
    }
    start_in("testbed", &[]).map(|(tb, _)| tb)
}

/// Starts a test bed under `CARGO_TARGET_TMPDIR/<name>-<pid>` with
/// `testbed.sh start`'s `options`; the test bed and its directory.
fn start_in(name: &str, options: &[&str]) -> Result<(Testbed, PathBuf), String> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new("bash")
        .arg(script())
        .arg("start")
        .arg(&dir)
        .args(options)
        .arg(std::process::id().to_string())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script().display()))?;
    if !out.status.success() {
        return Err(format!(
            "`testbed.sh start` failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    eprintln!("{}", String::from_utf8_lossy(&out.stderr).trim_end());
    let tb = read_env(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok((tb, dir))
}

/// A test bed of one test's own, for a test that changes what every test
/// on a shared one would see (a CRD) or that reads the API server's own
/// account (`--audit`); stopped on drop, and by the script's reaper when
/// this process is gone.
pub struct OwnBed {
    /// The test bed, leaked so that a [`fixture::Fixture`] can hold it.
    pub tb: &'static Testbed,
    /// Its directory.
    pub dir: PathBuf,
}

impl OwnBed {
    /// Starts a test bed under `CARGO_TARGET_TMPDIR/<name>-<pid>`, with
    /// `testbed.sh start`'s `options` (such as `--audit`).
    pub fn start(name: &str, options: &[&str]) -> OwnBed {
        let (tb, dir) = start_in(name, options)
            .unwrap_or_else(|why| panic!("a test bed of this test's own: {why}"));
        OwnBed {
            tb: Box::leak(Box::new(tb)),
            dir,
        }
    }
}

impl OwnBed {
    /// Stops its API server, waits `down`, and starts it again
    /// (`testbed.sh restart-apiserver`).
    pub fn restart_apiserver(&self, down: Duration) {
        let status = Command::new("bash")
            .arg(script())
            .arg("restart-apiserver")
            .arg(&self.dir)
            .arg(down.as_secs().to_string())
            .status()
            .expect("run testbed.sh restart-apiserver");
        assert!(status.success(), "testbed.sh restart-apiserver failed");
    }
}

impl Drop for OwnBed {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.dir)
            .status();
    }
}

/// The test bed described by `dir/env`.
pub fn read_env(dir: &Path) -> Result<Testbed, String> {
    let text =
        std::fs::read_to_string(dir.join("env")).map_err(|e| format!("cannot read env: {e}"))?;
    let get = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
            .map(str::to_owned)
            .ok_or_else(|| format!("env has no {key}"))
    };
    Ok(Testbed {
        dir: dir.to_owned(),
        kubeconfig: PathBuf::from(get("KUBECONFIG")?),
        server: get("APISERVER_URL")?,
        kubectl: PathBuf::from(get("KUBECTL")?),
        helm: PathBuf::from(get("HELM")?),
        helm3: PathBuf::from(get("HELM3")?),
        registry: PathBuf::from(get("REGISTRY")?),
        helm_docs: PathBuf::from(get("HELM_DOCS")?),
        monitoring_crds: PathBuf::from(get("MONITORING_CRDS")?),
        promtool: PathBuf::from(get("PROMTOOL")?),
        cosign: PathBuf::from(get("COSIGN")?),
        version: get("K8S_VERSION")?,
    })
}

impl Testbed {
    /// Its kubectl with the admin kubeconfig, to add arguments to.
    pub fn kubectl_cmd(&self) -> Command {
        let mut c = Command::new(&self.kubectl);
        c.arg("--kubeconfig").arg(&self.kubeconfig);
        c
    }

    /// A client with the admin credentials.
    pub fn admin(&self) -> Client {
        let cfg = KubeConfig::from_kubeconfig(&self.kubeconfig).expect("admin kubeconfig");
        Client::new(cfg).expect("admin client")
    }

    /// A fresh namespace, deleted when the guard drops.
    pub fn namespace(&self, prefix: &str) -> Namespace {
        let name = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let client = self.admin();
        client
            .create(
                "/api/v1/namespaces",
                &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
            )
            .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
        Namespace { name, client }
    }

    /// Mints a token for a ServiceAccount through the TokenRequest API.
    pub fn token(&self, namespace: &str, service_account: &str) -> String {
        let v = self
            .admin()
            .create(
                &format!("/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token"),
                &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                        "spec": {"expirationSeconds": 3600}}),
            )
            .unwrap_or_else(|e| panic!("TokenRequest for {namespace}/{service_account}: {e}"));
        v["status"]["token"]
            .as_str()
            .expect("TokenRequest status.token")
            .to_owned()
    }

    /// Writes a JSON kubeconfig that authenticates with `token`, returns its path.
    pub fn kubeconfig_for_token(&self, token: &str, name: &str) -> PathBuf {
        let path = self.dir.join(format!(
            "kubeconfig-{name}-{}.json",
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let kc = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "testbed", "cluster": {"server": self.server,
                          "certificate-authority": self.dir.join("ca.crt")}}],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": "testbed", "context": {"cluster": "testbed", "user": name}}],
            "current-context": "testbed"
        });
        std::fs::write(&path, serde_json::to_vec_pretty(&kc).unwrap()).unwrap();
        path
    }

    /// The environment of the Manager container of the Deployment
    /// `namespace/name`, as the kubelet would give it: plain values as they
    /// are, the downward-API fields filled with a made-up pod's.
    pub fn deployment_env(
        &self,
        namespace: &str,
        name: &str,
    ) -> std::collections::BTreeMap<String, String> {
        let d: Value = self
            .admin()
            .get(&format!(
                "/apis/apps/v1/namespaces/{namespace}/deployments/{name}"
            ))
            .unwrap_or_else(|e| panic!("read the Deployment {namespace}/{name}: {e}"));
        let mut env = std::collections::BTreeMap::new();
        for e in d["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap_or_else(|| panic!("{namespace}/{name} has no env: {d}"))
        {
            let key = e["name"].as_str().unwrap().to_owned();
            let value = match (
                &e["value"],
                e["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
            ) {
                // `$(VAR)` of a variable defined before, expanded as the
                // kubelet does (manifests/deployment.yaml names the lease
                // and state Secret after NEXO_SELF_DEPLOYMENT so).
                (Value::String(v), _) => expand_env(v, &env),
                (_, Some("metadata.name")) => format!("{name}-5d8f-e2e"),
                (_, Some("metadata.namespace")) => namespace.to_owned(),
                (_, Some("metadata.uid")) => "0b5e6d0e-e2e0-4c1e-9d1a-000000000001".into(),
                other => panic!("unexpected env source {other:?} in {namespace}/{name}"),
            };
            env.insert(key, value);
        }
        env
    }

    /// A client that authenticates with `token`.
    pub fn client_with_token(&self, token: &str) -> Client {
        let path = self.kubeconfig_for_token(token, "token");
        Client::new(KubeConfig::from_kubeconfig(&path).unwrap()).unwrap()
    }

    /// Server-side applies a YAML or JSON manifest file from the repository
    /// at `path` (the object's own URL path).
    pub fn apply_file(&self, object_path: &str, file: &str) -> Value {
        let text = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).expect(file);
        self.admin()
            .request(
                kube::client::Method::PATCH,
                &format!("{object_path}?fieldManager=nexo-tests&force=true"),
                Some(kube::client::Body {
                    content_type: kube::client::APPLY_PATCH,
                    bytes: &text,
                }),
            )
            .unwrap_or_else(|e| panic!("apply {file}: {e}"))
    }

    /// Installs the Nexo CRDs from `manifests/crds` and waits until established.
    pub fn install_crds(&self) {
        for plural in ["nexoproxies", "nexopipelines"] {
            let name = format!("{plural}.nexo.io");
            let path = format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}");
            self.apply_file(&path, &format!("manifests/crds/{name}.yaml"));
            self.wait_established(&name);
        }
    }

    /// Waits until the CRD `name` is established (at most 60 s). Through
    /// the API, not `kubectl wait --for=condition=Established`: kubectl
    /// 1.34 fails at once ("accessor error: <nil>") on a CRD created a
    /// moment before, which has no `status.conditions` yet.
    pub fn wait_established(&self, name: &str) {
        let path = format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}");
        let client = self.admin();
        wait_for(
            Duration::from_secs(60),
            &format!("CRD {name} established"),
            || {
                let crd: Value = client.get(&path).ok()?;
                let conditions = crd["status"]["conditions"].as_array()?;
                conditions
                    .iter()
                    .any(|c| c["type"] == "Established" && c["status"] == "True")
                    .then_some(())
            },
        );
    }
}

/// A namespace of one test, deleted on drop.
pub struct Namespace {
    /// Its name.
    pub name: String,
    client: Client,
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = self
            .client
            .delete(&format!("/api/v1/namespaces/{}", self.name), "Background");
    }
}

/// Polls `check` until it returns `Some`, panicking after `timeout`.
/// A heartbeat's `deployments` without their `status` (`status.v1`), for
/// tests about the rest of an entry.
#[allow(dead_code)]
pub fn without_status(deployments: &Value) -> Value {
    let mut v = deployments.clone();
    if let Some(entries) = v.as_array_mut() {
        for e in entries {
            if let Some(o) = e.as_object_mut() {
                o.remove("status");
            }
        }
    }
    v
}

pub fn wait_for<T>(timeout: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `NEXO_LISTEN_ADDR` for a Manager whose probes a test calls: the Manager
/// binds a port of its own choosing and logs it
/// ([`manager::Manager::probe_addr`] reads it back), so no port is picked
/// free, released and raced for.
pub const PROBES_ON_ANY_PORT: &str = "127.0.0.1:0";

/// The message the Manager logs once its probe listener is bound, with the
/// address as the field `address` (text: `address=…`; JSON: `"address":"…"`).
pub const LISTENING: &str = "probes and metrics listening";

/// The probe address a Manager's log announces ([`LISTENING`]), if it has.
pub fn listening_addr(log: &str) -> Option<SocketAddr> {
    let line = log.lines().find(|l| l.contains(LISTENING))?;
    let (_, rest) = line
        .split_once("address=")
        .or_else(|| line.split_once("\"address\":\""))?;
    let addr: String = rest
        .chars()
        .take_while(|c| c.is_ascii_hexdigit() || matches!(c, '.' | ':' | '[' | ']'))
        .collect();
    addr.trim_end_matches(['.', ':']).parse().ok()
}

/// A loopback address where no server of this test listens: for a peer
/// that must be unreachable. (The port was free when picked; a server of
/// another test that binds it meanwhile cannot pass the TLS handshake with
/// this test's CA either.)
pub fn closed_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// `GET path` on `addr`: the status and the body. The read timeout only
/// keeps a test from hanging; tests of how fast probes answer measure that
/// themselves.
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr)
        .unwrap_or_else(|e| panic!("connect to the probe port {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out)
        .unwrap_or_else(|e| panic!("GET {path} on {addr}: {e}"));
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (
        status,
        out.split("\r\n\r\n").nth(1).unwrap_or("").to_owned(),
    )
}

/// The value of one series of a Prometheus text exposition: `series` is the
/// name with its labels as written (`nexo_manager_leader`,
/// `nexo_manager_heartbeats_total{outcome="ok"}`). `None` when absent (a
/// labelled series appears with its first count).
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// One series of the `/metrics` served at `addr` ([`sample`]).
pub fn metric(addr: SocketAddr, series: &str) -> Option<f64> {
    sample(&http_get(addr, "/metrics").1, series)
}

/// Runs `cmd` with `input` on its stdin (without: /dev/null) and returns
/// its output; the caller judges the status.
pub fn run_with_input(cmd: &mut Command, input: Option<&[u8]>) -> Output {
    use std::io::Write as _;
    let shown = format!("{cmd:?}");
    let mut child = cmd
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"));
    if let Some(input) = input {
        child.stdin.take().unwrap().write_all(input).unwrap();
    }
    child.wait_with_output().unwrap()
}

/// Runs `cmd` with `input` and returns its stdout; on failure, panics with
/// the command, its status, stdout and stderr.
pub fn run_ok_with_input(cmd: &mut Command, input: Option<&[u8]>) -> String {
    let shown = format!("{cmd:?}");
    let out = run_with_input(cmd, input);
    assert!(
        out.status.success(),
        "{shown} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// [`run_ok_with_input`] with nothing on stdin.
pub fn run_ok(cmd: &mut Command) -> String {
    run_ok_with_input(cmd, None)
}

/// What woke the loop's `poll(2)`, from `strace -f` lines
/// (`tests/idle.rs`, the idle benchmark).
#[allow(dead_code)]
#[derive(Debug, Default, Clone, Copy)]
pub struct Wakeups {
    /// Ended by their timeout: a heartbeat's interval, a lease renewal.
    pub timeouts: usize,
    /// Woken by the CP socket: an answer arrived.
    pub answers: usize,
    /// Woken by a watch: an event or a bookmark.
    pub watch_events: usize,
    /// Anything else: a signal, a probe.
    pub other: usize,
}

/// Counts [`Wakeups`]. The loop's poll watches at least three
/// descriptors: the signal pipe, the socket slot (the CP connection while
/// a call waits for its answer, -1 between heartbeats) and the probe
/// listener; then the inventory's open watches. A poll on one descriptor
/// is a call's own, not the loop's. Calls cut by the tracer are left out.
#[allow(dead_code)]
pub fn wakeups(lines: &[&str]) -> Wakeups {
    let fds_of = |l: &str| -> Vec<String> {
        l.split("{fd=")
            .skip(1)
            .map(|r| r.split(',').next().unwrap_or("").to_owned())
            .collect()
    };
    let mut w = Wakeups::default();
    for l in lines {
        let Some((call, result)) = l.split_once(") = ") else {
            continue;
        };
        let nfds = call
            .rsplit("], ")
            .next()
            .and_then(|r| r.split(',').next())
            .and_then(|n| n.trim().parse::<usize>().ok());
        if !call.contains("poll(") || nfds.is_none_or(|n| n < 3) {
            continue;
        }
        if result.starts_with("0 (Timeout)") {
            w.timeouts += 1;
            continue;
        }
        let asked = fds_of(call);
        let first = result
            .split("{fd=")
            .nth(1)
            .and_then(|r| r.split(',').next());
        match first.and_then(|fd| asked.iter().position(|a| a == fd)) {
            Some(1) => w.answers += 1,
            Some(i) if i >= 3 => w.watch_events += 1,
            _ => w.other += 1,
        }
    }
    w
}

/// `value` with each `$(NAME)` of a variable in `defined` replaced by its
/// value, as the kubelet expands a container's env (`$$` escapes, unknown
/// references stay as they are).
pub fn expand_env(value: &str, defined: &std::collections::BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some((name, tail)) = after
            .strip_prefix('(')
            .and_then(|a| a.split_once(')'))
            .filter(|(name, _)| defined.contains_key(*name))
        {
            out.push_str(&defined[name]);
            rest = tail;
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The proof a Manager of `environment_id` holding `key` writes on
/// `object` (as the API server answered its create: its kind, namespace,
/// name, uid and `nexo.io/deployment` label).
pub fn proof_of(
    key: &nexo_manager::integrity::Key,
    environment_id: &str,
    object: &Value,
) -> String {
    let meta = &object["metadata"];
    let text = |v: &Value| {
        v.as_str()
            .unwrap_or_else(|| panic!("a field missing from {object}"))
            .to_owned()
    };
    nexo_manager::ownership::Verifier {
        environment_id,
        key,
        adopt_unproven: false,
    }
    .proof(
        &text(&object["kind"]),
        &text(&meta["namespace"]),
        &text(&meta["name"]),
        &text(&meta["uid"]),
        &text(&meta["labels"]["nexo.io/deployment"]),
    )
}

/// Writes [`proof_of`] `object` of `collection` with `client`, as a
/// Manager writes it on what it creates; the object as written.
pub fn prove_with(
    client: &Client,
    key: &nexo_manager::integrity::Key,
    environment_id: &str,
    collection: &str,
    object: &Value,
) -> Value {
    let proof = proof_of(key, environment_id, object);
    let name = object["metadata"]["name"].as_str().expect("a name");
    client
        .patch(
            &format!("{collection}/{name}"),
            "application/merge-patch+json",
            &json!({"metadata": {"annotations": {"nexo.io/proof": proof}}}),
        )
        .unwrap_or_else(|e| panic!("prove {name}: {e}"))
}

/// The rules of the shipped executor (`manifests/rbac.yaml`, ClusterRole
/// `nexo-executor`; `tests/manifests.rs` holds them equal): what a command
/// may write in a managed namespace.
pub fn executor_rules() -> Value {
    let verbs = json!(["get", "list", "create", "patch", "delete"]);
    json!([
        {"apiGroups": ["nexo.io"], "resources": ["nexoproxies", "nexopipelines"], "verbs": verbs},
        {"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": verbs},
        {"apiGroups": [""], "resources": ["services"], "verbs": verbs},
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": verbs},
    ])
}

/// Gives namespace `ns` the executor commands write as
/// (`NEXO_EXECUTOR`'s default, `nexo-executor`): its ServiceAccount, a
/// Role with `rules` (replaced if there is one) and their RoleBinding, as
/// an administrator does for a managed namespace.
pub fn grant_executor(tb: &Testbed, ns: &str, rules: &Value) {
    grant_service_account(tb, ns, "nexo-executor", rules);
}

/// The ServiceAccount `sa` of namespace `ns`, a Role of its name with
/// `rules` (replaced if there is one) and their RoleBinding.
pub fn grant_service_account(tb: &Testbed, ns: &str, sa: &str, rules: &Value) {
    let labels = json!({"app.kubernetes.io/name": "nexo-manager"});
    let rbac = "/apis/rbac.authorization.k8s.io/v1";
    put_all(
        tb,
        [
            (
                format!("/api/v1/namespaces/{ns}/serviceaccounts"),
                json!({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": sa, "labels": labels}}),
            ),
            (
                format!("{rbac}/namespaces/{ns}/roles"),
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": sa, "labels": labels}, "rules": rules}),
            ),
            (
                format!("{rbac}/namespaces/{ns}/rolebindings"),
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": sa, "labels": labels},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
                "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]}),
            ),
        ],
    );
}

/// A ClusterRole `name` with `rules` (replaced if there is one) and its
/// ClusterRoleBinding to the ServiceAccount `ns`/`sa`.
pub fn grant_cluster(tb: &Testbed, name: &str, ns: &str, sa: &str, rules: &Value) {
    let rbac = "/apis/rbac.authorization.k8s.io/v1";
    put_all(
        tb,
        [
            (
                format!("{rbac}/clusterroles"),
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": name}, "rules": rules}),
            ),
            (
                format!("{rbac}/clusterrolebindings"),
                json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]}),
            ),
        ],
    );
}

/// Creates each (collection, object), or replaces it where it is.
fn put_all<const N: usize>(tb: &Testbed, objects: [(String, Value); N]) {
    let admin = tb.admin();
    for (collection, object) in objects {
        let name = object["metadata"]["name"].as_str().unwrap();
        let path = format!("{collection}/{name}");
        match admin.get_opt::<Value>(&path) {
            Ok(Some(_)) => {
                admin
                    .replace(&path, &object)
                    .unwrap_or_else(|e| panic!("replace {path}: {e}"));
            }
            Ok(None) => {
                admin
                    .create(&collection, &object)
                    .unwrap_or_else(|e| panic!("create {path}: {e}"));
            }
            Err(e) => panic!("read {path}: {e}"),
        }
    }
}
