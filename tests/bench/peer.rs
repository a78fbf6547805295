//! The Manager beside a real peer: Open Cluster Management's work agent,
//! which applies the manifests a hub sends (ManifestWorks) and reports their
//! status, as the Manager does for the Control Plane. Both run on the same
//! test bed, one after the other (the peer first, one process through every
//! size and then its deploys; then the Manager, a process of its own at each
//! size, then its deploys), in their default configurations, doing the same
//! work:
//!
//! - idle with 0, 100 and 1,000 owned objects (NexoProxies: created owned
//!   for the Manager, applied through one ManifestWork each for the peer):
//!   resident memory, CPU per minute, threads, wake-ups, and the API
//!   server's bill (the peer's VmHWM is its peak since it started, which
//!   includes applying the ManifestWorks);
//! - three-object deploys one after the other: from the command (the
//!   heartbeat answer that carried it; the ManifestWork's creation) to the
//!   objects existing and to the acknowledgement (the ack; the
//!   ManifestWork's `Applied` condition).
//!
//! The API server's bill is the API server's own account, never the
//! agents': requests by verb and resource from its audit log (each agent
//! has a client certificate of its own, so each request is attributed
//! exactly), bytes from its `apiserver_response_sizes` and
//! `apiserver_watch_events_sizes` metrics over the verbs and resources the
//! agent used in the window; the audit log also says whether any other
//! client used those in the window (then the bytes are shared, and the
//! table says so).
//!
//! `cargo bench --bench peer` (run by `bash tests/bench.sh`) is the full
//! form: both agents, 10-minute idle windows, 50 deploys; it needs the peer
//! (`tests/testbed/testbed.sh build --peer`, which bench.sh runs) and writes
//! the table into BENCHMARKS.md. Under `cargo test` it runs a short form of
//! the Manager's side only (short windows, small sizes), so the harness
//! cannot rot; it checks that every figure was obtained, never how fast.
//! Both forms start a test bed of their own, with the audit log on.
//! `--sizes 0,100,1000`, `--idle-seconds N` and `--deploys N` change the
//! sizes, the idle windows and the deploys (`--deploys` in the full form).

#[path = "common.rs"]
mod common;
#[path = "../support/mod.rs"]
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use common::{machine, median, ticks_per_second};
use nexo_cpsim::SimConfig;
use serde_json::{Value, json};
use support::fixture::{Fixture, PROXY_IMAGE};
use support::manager::{Manager, STOP_WAIT, static_binary};
use support::{OwnBed, Testbed, run_ok, run_ok_with_input, wait_for};

const BEGIN: &str = "<!-- peer:begin (written by tests/bench/peer.rs) -->";
const END: &str = "<!-- peer:end -->";
/// The peer's hub namespace (the managed cluster's name) and the namespace
/// its works apply to.
const CLUSTER: &str = "cluster1";
const PEER_NS: &str = "bench-peer";
/// The peer's leader-election namespace (its default configuration elects).
const PEER_AGENT_NS: &str = "open-cluster-management-agent";
const MANAGER_USER: &str = "nexo-bench-manager";
const PEER_USER: &str = "ocm-bench-work-agent";
/// How long the work agent is left after its ManifestWorks are applied and
/// before its idle window: its leader election and status syncs settle.
const SETTLE: Duration = Duration::from_secs(60);

struct Plan {
    full: bool,
    peer: bool,
    sizes: Vec<usize>,
    idle: Duration,
    deploys: usize,
}

impl Plan {
    fn from_args() -> Plan {
        let args: Vec<String> = std::env::args().collect();
        let full = args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--short");
        let value = |flag: &str| {
            args.iter()
                .position(|a| a == flag)
                .and_then(|i| args.get(i + 1))
                .map(|v| {
                    v.parse::<u64>()
                        .unwrap_or_else(|_| panic!("{flag} {v}: not a number"))
                })
        };
        let idle_s = value("--idle-seconds");
        let sizes = common::sizes_arg();
        if full {
            Plan {
                full,
                peer: true,
                sizes: sizes.unwrap_or_else(|| vec![0, 100, 1_000]),
                idle: Duration::from_secs(idle_s.unwrap_or(600)),
                deploys: value("--deploys").map_or(50, |n| n as usize),
            }
        } else {
            Plan {
                full,
                peer: args.iter().any(|a| a == "--peer"),
                sizes: sizes.unwrap_or_else(|| vec![0, 10]),
                idle: Duration::from_secs(idle_s.unwrap_or(20)),
                deploys: 3,
            }
        }
    }
}

// ------------------------------------------------------------ test bed --

/// A test bed of this run's own, with the audit log on.
struct AuditedBed(OwnBed);

impl std::ops::Deref for AuditedBed {
    type Target = OwnBed;
    fn deref(&self) -> &OwnBed {
        &self.0
    }
}

impl AuditedBed {
    fn start() -> AuditedBed {
        AuditedBed(OwnBed::start("peer-tb", &["--audit"]))
    }

    /// A kubeconfig whose client certificate names `user`.
    fn user(&self, user: &str) -> PathBuf {
        let out = run_ok(
            Command::new("bash")
                .arg(support::script())
                .args(["user"])
                .arg(&self.dir)
                .arg(user),
        );
        PathBuf::from(out.trim())
    }

    fn audit_log(&self) -> PathBuf {
        self.dir.join("logs/audit.log")
    }

    /// Where the audit log ends now.
    fn mark(&self) -> u64 {
        std::fs::metadata(self.audit_log()).map_or(0, |m| m.len())
    }

    /// The audit events written since `mark`.
    fn events_since(&self, mark: u64) -> Vec<Value> {
        let mut f = std::fs::File::open(self.audit_log()).expect("the audit log");
        f.seek(SeekFrom::Start(mark)).unwrap();
        let mut text = String::new();
        f.read_to_string(&mut text).unwrap();
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn kubectl(&self, args: &[&str]) -> String {
        run_ok(self.tb.kubectl_cmd().args(args))
    }

    fn kubectl_stdin(&self, args: &[&str], input: &str) -> String {
        run_ok_with_input(self.tb.kubectl_cmd().args(args), Some(input.as_bytes()))
    }

    /// The API server's metrics, as text.
    fn metrics(&self) -> String {
        self.kubectl(&["get", "--raw", "/metrics"])
    }
}

// ------------------------------------------------------------ the bill --

/// `verb resource[/subresource]` of an audit event, or `verb path` for a
/// non-resource request.
fn request_key(e: &Value) -> String {
    let verb = e["verb"].as_str().unwrap_or("?");
    match e["objectRef"]["resource"].as_str() {
        Some(r) => match e["objectRef"]["subresource"].as_str() {
            Some(sub) => format!("{verb} {r}/{sub}"),
            None => format!("{verb} {r}"),
        },
        None => format!("{verb} {}", e["requestURI"].as_str().unwrap_or("?")),
    }
}

/// Sums of one metric by (VERB, resource[/subresource]) or by resource.
fn metric_sums(text: &str, name: &str, by_verb: bool) -> BTreeMap<String, f64> {
    let mut sums = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let Some(rest) = rest.strip_prefix('{') else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        let label = |key: &str| {
            labels
                .split("\",")
                .find_map(|kv| kv.strip_prefix(&format!("{key}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        let resource = match label("subresource").as_str() {
            "" => label("resource"),
            sub => format!("{}/{sub}", label("resource")),
        };
        let key = if by_verb {
            format!("{} {resource}", label("verb").to_lowercase())
        } else {
            resource
        };
        *sums.entry(key).or_insert(0.0) += value.trim().parse::<f64>().unwrap_or(0.0);
    }
    sums
}

/// What one agent cost the API server in one window.
#[derive(Default)]
struct Bill {
    minutes: f64,
    /// Requests by `verb resource`, this agent's only.
    requests: BTreeMap<String, u64>,
    /// Bytes of responses and watch events over what it used.
    bytes: f64,
    /// Requests of other clients to the same verbs and resources in the
    /// window (their bytes are in `bytes` too).
    shared: u64,
}

impl Bill {
    fn per_minute(&self) -> f64 {
        self.requests.values().sum::<u64>() as f64 / self.minutes
    }

    fn breakdown(&self) -> String {
        let mut v: Vec<_> = self.requests.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        v.iter()
            .take(5)
            .map(|(k, n)| format!("{k} {:.1}", **n as f64 / self.minutes))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The bill of `user` between two marks of the audit log and two metric
/// snapshots; `watched`: the resources the agent watches (from the audit
/// log since it started), whose watch events count as bytes read.
fn bill(
    bed: &AuditedBed,
    user: &str,
    mark: u64,
    m0: &str,
    m1: &str,
    minutes: f64,
    watched: &BTreeSet<String>,
) -> Bill {
    let events = bed.events_since(mark);
    let mut requests: BTreeMap<String, u64> = BTreeMap::new();
    let mut others: BTreeMap<String, u64> = BTreeMap::new();
    for e in &events {
        let key = request_key(e);
        if e["user"]["username"] == user {
            *requests.entry(key).or_insert(0) += 1;
        } else {
            *others.entry(key).or_insert(0) += 1;
        }
    }
    let (r0, r1) = (
        metric_sums(m0, "apiserver_response_sizes_sum", true),
        metric_sums(m1, "apiserver_response_sizes_sum", true),
    );
    let (w0, w1) = (
        metric_sums(m0, "apiserver_watch_events_sizes_sum", false),
        metric_sums(m1, "apiserver_watch_events_sizes_sum", false),
    );
    let delta = |a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>, k: &str| {
        b.get(k).copied().unwrap_or(0.0) - a.get(k).copied().unwrap_or(0.0)
    };
    let mut bytes = 0.0;
    let mut shared = 0;
    for key in requests.keys() {
        bytes += delta(&r0, &r1, key);
        shared += others.get(key).copied().unwrap_or(0);
    }
    for resource in watched {
        bytes += delta(&w0, &w1, resource);
    }
    Bill {
        minutes,
        requests,
        bytes,
        shared,
    }
}

/// The resources `user` opened watches on, since `mark`.
fn watched_by(bed: &AuditedBed, user: &str, mark: u64) -> BTreeSet<String> {
    bed.events_since(mark)
        .iter()
        .filter(|e| e["user"]["username"] == user && e["verb"] == "watch")
        .filter_map(|e| e["objectRef"]["resource"].as_str().map(str::to_owned))
        .collect()
}

// ------------------------------------------------------------- the host --

/// The whole process as the kernel sees it: every thread.
#[derive(Clone, Copy, Default)]
struct Whole {
    ticks: u64,
    switches: u64,
    rss_kb: u64,
    hwm_kb: u64,
    threads: u64,
}

fn whole(pid: u32) -> Whole {
    let p = common::read_proc(pid);
    let mut switches = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        for l in status.lines() {
            if let Some(v) = l
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                switches += v.trim().parse::<u64>().unwrap_or(0);
            }
        }
    }
    Whole {
        // utime + stime of /proc/PID/stat count every thread of the process.
        ticks: p.ticks,
        switches,
        rss_kb: p.rss_kb,
        hwm_kb: p.hwm_kb,
        threads: p.threads,
    }
}

struct IdleFigures {
    objects: usize,
    rss_kb: u64,
    hwm_kb: u64,
    cpu_ms_per_min: f64,
    threads: u64,
    wakeups_per_min: f64,
    bill: Bill,
}

/// Measures `pid` (of `user`) idle for `window`.
fn idle(
    bed: &AuditedBed,
    pid: u32,
    user: &str,
    since_start: u64,
    window: Duration,
    objects: usize,
) -> IdleFigures {
    let hz = ticks_per_second() as f64;
    let m0 = bed.metrics();
    let mark = bed.mark();
    let p0 = whole(pid);
    let started = Instant::now();
    std::thread::sleep(window);
    let p1 = whole(pid);
    let minutes = started.elapsed().as_secs_f64() / 60.0;
    let m1 = bed.metrics();
    let watched = watched_by(bed, user, since_start);
    IdleFigures {
        objects,
        rss_kb: p1.rss_kb,
        hwm_kb: p1.hwm_kb,
        cpu_ms_per_min: (p1.ticks - p0.ticks) as f64 * 1000.0 / hz / minutes,
        threads: p1.threads,
        wakeups_per_min: (p1.switches - p0.switches) as f64 / minutes,
        bill: bill(bed, user, mark, &m0, &m1, minutes, &watched),
    }
}

// ------------------------------------------------------------ the Manager --

fn owned_proxy(env_id: &str, name: &str) -> Value {
    json!({"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "nexo-manager",
            "nexo.io/owner-id": env_id, "nexo.io/deployment": name}},
        "spec": {"image": PROXY_IMAGE, "replicas": 2, "mongodb": {"secretRef": {"name": format!("{name}-db")}}}})
}

fn proxy(name: &str, namespace: Option<&str>) -> Value {
    let mut p = json!({"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy", "metadata": {"name": name},
        "spec": {"image": PROXY_IMAGE, "replicas": 1, "mongodb": {"secretRef": {"name": format!("{name}-db")}}}});
    if let Some(ns) = namespace {
        p["metadata"]["namespace"] = json!(ns);
    }
    p
}

/// The three objects of a deploy: NexoProxy, ConfigMap, Secret.
fn three(name: &str, namespace: Option<&str>) -> Vec<Value> {
    let mut objects = vec![
        proxy(name, namespace),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("{name}-config")},
            "data": {"listen": "27017"}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("{name}-db")},
            "stringData": {"uri": "mongodb://db:27017"}}),
    ];
    if let Some(ns) = namespace {
        for o in objects.iter_mut().skip(1) {
            o["metadata"]["namespace"] = json!(ns);
        }
    }
    objects
}

/// Whether all three objects of `name` exist in `ns` (the NexoProxy,
/// written first, last).
fn all_three_exist(client: &nexo_manager::kube::Client, ns: &str, name: &str) -> bool {
    [
        format!("/api/v1/namespaces/{ns}/secrets/{name}-db"),
        format!("/api/v1/namespaces/{ns}/configmaps/{name}-config"),
        format!("/apis/nexo.io/v1alpha1/namespaces/{ns}/nexoproxies/{name}"),
    ]
    .iter()
    .all(|p| matches!(client.get_opt::<Value>(p), Ok(Some(_))))
}

fn manager_env(f: &Fixture, kubeconfig: &Path, interval: Option<u64>) -> BTreeMap<String, String> {
    let mut env = f.env();
    env.insert("KUBECONFIG".into(), kubeconfig.display().to_string());
    env.insert(
        "NEXO_LISTEN_ADDR".into(),
        support::PROBES_ON_ANY_PORT.into(),
    );
    env.insert("RUST_LOG".into(), "info".into());
    // The default interval (15 s), unless the deploys ask for a shorter one.
    env.remove("NEXO_HEARTBEAT_INTERVAL");
    if let Some(s) = interval {
        env.insert("NEXO_HEARTBEAT_INTERVAL".into(), format!("{s}s"));
    }
    env
}

struct DeployFigures {
    to_objects_ms: Vec<f64>,
    to_ack_ms: Vec<f64>,
}

fn manager_deploys(f: &Fixture, kubeconfig: &Path, n: usize) -> DeployFigures {
    let env = manager_env(f, kubeconfig, Some(5));
    let mut m = Manager::spawn_binary(&static_binary(), &env).with_sim(&f.sim);
    m.wait_until(Duration::from_secs(60), "a heartbeat", || {
        f.sim.heartbeat_count() > 0
    });
    let mut figures = DeployFigures {
        to_objects_ms: Vec::new(),
        to_ack_ms: Vec::new(),
    };
    // One client for the polls: one TLS connection, kept alive.
    let poller = f.tb.admin();
    for i in 0..n {
        let name = format!("md{i:03}");
        let id = format!("deploy-{name}");
        f.sim.enqueue_command(
            &f.env_id,
            json!({"id": id, "class": "deploy", "issuedAt": "2026-12-03T00:00:00Z", "requires": [],
                "payload": {"deployment": {"name": name, "namespace": f.ns.name}, "format": "crd",
                    "manifests": three(&name, None)}}),
        );
        // Polled as tightly as the peer's deploys are (every 5 ms).
        let deadline = Instant::now() + Duration::from_secs(60);
        let exist_at = loop {
            if all_three_exist(&poller, &f.ns.name, &name) {
                break SystemTime::now();
            }
            assert!(Instant::now() < deadline, "the objects of {id} in 60 s");
            std::thread::sleep(Duration::from_millis(5));
        };
        let ack = wait_for(Duration::from_secs(60), "the ack", || {
            f.sim
                .briefs()
                .into_iter()
                .find(|b| b.path == format!("/api/v2/manager/commands/{id}/ack"))
        });
        // The heartbeat that carried the command: the last one before its ack.
        let briefs = f.sim.briefs();
        let answer = briefs
            .iter()
            .filter(|b| b.path == "/api/v2/manager/heartbeat" && b.status == 200 && b.at <= ack.at)
            .map(|b| b.at)
            .max()
            .expect("the heartbeat that carried the command");
        let acked = f
            .sim
            .acks()
            .into_iter()
            .find(|a| a["commandId"] == id.as_str())
            .unwrap();
        assert_eq!(acked["result"], "applied", "{acked}");
        figures.to_objects_ms.push(ms(answer, exist_at));
        figures.to_ack_ms.push(ms(answer, ack.at));
    }
    m.signal("TERM");
    let status = m.wait_exit(STOP_WAIT);
    m.check(status.success(), "a clean stop exits 0");
    figures
}

fn ms(a: SystemTime, b: SystemTime) -> f64 {
    b.duration_since(a).unwrap_or_default().as_secs_f64() * 1000.0
}

// --------------------------------------------------------------- the peer --

struct Peer {
    dir: PathBuf,
    versions: String,
}

impl Peer {
    fn find() -> Peer {
        let out = run_ok(
            Command::new("bash")
                .arg(support::script())
                .args(["bin", "--peer"]),
        );
        let dir = PathBuf::from(out.trim());
        let versions = std::fs::read_to_string(dir.join("VERSIONS")).unwrap_or_else(|e| {
            panic!(
                "the peer (OCM's work agent) is not built in {}: {e}; run `bash tests/testbed/testbed.sh build --peer` (tests/bench.sh does)",
                dir.display()
            )
        });
        Peer { dir, versions }
    }

    fn install(&self, bed: &AuditedBed) {
        for crd in std::fs::read_dir(self.dir.join("crds")).unwrap().flatten() {
            bed.kubectl(&["apply", "--server-side", "-f", crd.path().to_str().unwrap()]);
        }
        bed.kubectl(&[
            "wait",
            "--for=condition=Established",
            "crd/manifestworks.work.open-cluster-management.io",
            "crd/appliedmanifestworks.work.open-cluster-management.io",
            "--timeout=60s",
        ]);
        for ns in [CLUSTER, PEER_NS, PEER_AGENT_NS] {
            bed.kubectl_stdin(
                &["apply", "-f", "-"],
                &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
                    .to_string(),
            );
        }
    }

    /// Starts the work agent in its default configuration, with what it
    /// cannot default: the spoke and hub (the same test bed, as its own
    /// user), the cluster's name, an agent id, its namespace, and a port
    /// of its own for its metrics and health endpoint.
    fn start(&self, kubeconfig: &Path, log: &Path) -> Running {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Command::new(self.dir.join("bin/work"))
            .arg("agent")
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--workload-source-config={}", kubeconfig.display()))
            .arg(format!("--spoke-cluster-name={CLUSTER}"))
            .arg("--agent-id=bench-peer")
            .arg(format!("--namespace={PEER_AGENT_NS}"))
            .arg(format!("--listen=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(log).unwrap())
            .stderr(std::fs::File::create(log.with_extension("err")).unwrap())
            .spawn()
            .map(Running)
            .expect("start the OCM work agent")
    }
}

/// The running work agent: killed when dropped, so that a run that fails
/// half-way leaves no agent behind (its test bed is stopped on drop too).
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn manifest_work(name: &str, manifests: Vec<Value>) -> Value {
    json!({"apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork",
        "metadata": {"name": name, "namespace": CLUSTER},
        "spec": {"workload": {"manifests": manifests}}})
}

fn works_path() -> String {
    format!("/apis/work.open-cluster-management.io/v1/namespaces/{CLUSTER}/manifestworks")
}

fn applied(work: &Value) -> bool {
    work["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Applied" && c["status"] == "True")
    })
}

/// Grows the peer's works to `to` (one NexoProxy each), four writers at a time.
fn grow_works(tb: &'static Testbed, from: usize, to: usize) {
    std::thread::scope(|s| {
        for w in 0..4 {
            s.spawn(move || {
                let client = tb.admin();
                for i in (from + w..to).step_by(4) {
                    let name = format!("pw{i:05}");
                    client
                        .create(
                            &works_path(),
                            &manifest_work(&name, vec![proxy(&name, Some(PEER_NS))]),
                        )
                        .unwrap_or_else(|e| panic!("create ManifestWork {name}: {e}"));
                }
            });
        }
    });
}

fn wait_all_applied(tb: &Testbed, n: usize, peer: &mut Child, log: &Path) {
    let client = tb.admin();
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let list: Value = client.get(&works_path()).unwrap();
        let done = list["items"]
            .as_array()
            .map_or(0, |i| i.iter().filter(|w| applied(w)).count());
        if done >= n {
            return;
        }
        if let Ok(Some(status)) = peer.try_wait() {
            panic!(
                "the work agent exited ({status}); its log: {}",
                log.display()
            );
        }
        assert!(
            Instant::now() < deadline,
            "{done} of {n} ManifestWorks applied in 10 minutes; log: {}",
            log.display()
        );
        std::thread::sleep(Duration::from_secs(2));
    }
}

fn peer_deploys(bed: &AuditedBed, n: usize, peer: &mut Child, log: &Path) -> DeployFigures {
    let client = bed.tb.admin();
    let mut figures = DeployFigures {
        to_objects_ms: Vec::new(),
        to_ack_ms: Vec::new(),
    };
    for i in 0..n {
        let name = format!("pd{i:03}");
        let path = format!("{}/{name}", works_path());
        client
            .create(
                &works_path(),
                &manifest_work(&name, three(&name, Some(PEER_NS))),
            )
            .unwrap_or_else(|e| panic!("create ManifestWork {name}: {e}"));
        let created = SystemTime::now();
        let (mut exist_at, mut applied_at) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(180);
        while exist_at.is_none() || applied_at.is_none() {
            assert!(
                Instant::now() < deadline,
                "ManifestWork {name} not applied in 180 s; the work agent's log: {}",
                log.display()
            );
            if let Ok(Some(status)) = peer.try_wait() {
                panic!(
                    "the work agent exited ({status}); its log: {}",
                    log.display()
                );
            }
            if exist_at.is_none() && all_three_exist(&client, PEER_NS, &name) {
                exist_at = Some(SystemTime::now());
            }
            if applied_at.is_none() && client.get::<Value>(&path).is_ok_and(|w| applied(&w)) {
                applied_at = Some(SystemTime::now());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        figures.to_objects_ms.push(ms(created, exist_at.unwrap()));
        figures.to_ack_ms.push(ms(created, applied_at.unwrap()));
    }
    figures
}

// ------------------------------------------------------------ the report --

fn mib(kb: u64) -> String {
    format!("{:.1} MiB", kb as f64 / 1024.0)
}

fn ratio(peer: f64, ours: f64) -> String {
    if ours > 0.0 {
        format!("{:.1}×", peer / ours)
    } else if peer > 0.0 {
        "ours 0".into()
    } else {
        "both 0".into()
    }
}

fn bytes(b: f64) -> String {
    if b >= 1_048_576.0 {
        format!("{:.2} MiB", b / 1_048_576.0)
    } else {
        format!("{:.1} KiB", b / 1024.0)
    }
}

fn shared_note(b: &Bill) -> String {
    if b.shared > 0 {
        format!(" (shared with {} requests of others)", b.shared)
    } else {
        String::new()
    }
}

/// The table of what has been measured so far.
fn render(
    ours: &[IdleFigures],
    peer: &[IdleFigures],
    od: Option<&DeployFigures>,
    pd: Option<&DeployFigures>,
) -> String {
    let mut s = String::from(
        "| measure | Nexo Manager | OCM work agent | agent / ours |\n|---|---|---|---|\n",
    );
    // Each measure: its name, and its value and text for one agent.
    type Measure = (&'static str, fn(&IdleFigures) -> (f64, String));
    let measures: [Measure; 7] = [
        ("VmRSS", |f| (f.rss_kb as f64, mib(f.rss_kb))),
        ("VmHWM", |f| (f.hwm_kb as f64, mib(f.hwm_kb))),
        ("CPU per minute idle", |f| {
            (f.cpu_ms_per_min, format!("{:.0} ms", f.cpu_ms_per_min))
        }),
        ("threads", |f| (f.threads as f64, f.threads.to_string())),
        ("wake-ups per minute (context switches)", |f| {
            (f.wakeups_per_min, format!("{:.0}", f.wakeups_per_min))
        }),
        ("API requests per minute", |f| {
            let n = f.bill.per_minute();
            (n, format!("{n:.1}: {}", f.bill.breakdown()))
        }),
        ("API bytes read per minute", |f| {
            let b = f.bill.bytes / f.bill.minutes;
            (b, format!("{}{}", bytes(b), shared_note(&f.bill)))
        }),
    ];
    // Rows for every size either agent was measured at (the peer runs first).
    for i in 0..ours.len().max(peer.len()) {
        let (o, p) = (ours.get(i), peer.get(i));
        let n = o.or(p).map_or(0, |f| f.objects);
        for (what, measure) in &measures {
            let (o, p) = (o.map(measure), p.map(measure));
            let r = match (&o, &p) {
                (Some((ov, _)), Some((pv, _))) => ratio(*pv, *ov),
                _ => "not run".to_owned(),
            };
            let text = |m: Option<(f64, String)>| m.map_or("not run".to_owned(), |(_, t)| t);
            let (ostr, pstr) = (text(o), text(p));
            let _ = writeln!(s, "| {what}, {n} objects | {ostr} | {pstr} | {r} |");
        }
    }
    let stat = |v: &[f64]| {
        let mut v = v.to_vec();
        let worst = v.iter().copied().fold(0.0, f64::max);
        (median(&mut v), worst)
    };
    // Each deploy measure: its name, and its median and worst for one agent.
    type Deploys = (&'static str, fn(&DeployFigures) -> &[f64]);
    let deploys: [Deploys; 2] = [
        ("command to objects", |d| &d.to_objects_ms),
        ("command to acknowledgement", |d| &d.to_ack_ms),
    ];
    for (what, series) in deploys {
        let cell = |d: Option<&DeployFigures>| match d {
            Some(d) => {
                let (m, w) = stat(series(d));
                (Some(m), format!("{m:.0} ms ({w:.0})"))
            }
            None => (None, "not run".to_owned()),
        };
        let Some(n) = od.or(pd).map(|d| series(d).len()) else {
            continue;
        };
        let ((o, ostr), (p, pstr)) = (cell(od), cell(pd));
        let r = match (o, p) {
            (Some(o), Some(p)) => ratio(p, o),
            _ => "not run".to_owned(),
        };
        let _ = writeln!(
            s,
            "| three-object deploy ×{n}: {what}, median (worst) | {ostr} | {pstr} | {r} |"
        );
    }
    s
}

// ----------------------------------------------------------------- main --

fn main() {
    if !common::names_any(&common::only_parts(), common::PEER_PARTS) {
        eprintln!("peer bench: not run (--only does not name it)");
        return;
    }
    let plan = Plan::from_args();
    let started = Instant::now();
    let peer = plan.peer.then(Peer::find);
    let bed = AuditedBed::start();
    let manager_kc = bed.user(MANAGER_USER);
    let f = Fixture::on(bed.tb, "bench-ours", SimConfig::default());
    f.tb.install_crds();
    if let Some(p) = &peer {
        p.install(&bed);
    }

    // The peer first, alone: one process through every size (started once,
    // so that no window holds a restart's pass over every ManifestWork),
    // then its deploys, on the settled process.
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let mut pd = None;
    if let Some(p) = &peer {
        let kc = bed.user(PEER_USER);
        let log = bed.dir.join("work-agent.log");
        let since = bed.mark();
        let mut child = p.start(&kc, &log);
        let mut works = 0;
        for &size in &plan.sizes {
            grow_works(bed.tb, works, size);
            works = size;
            wait_all_applied(bed.tb, size, &mut child.0, &log);
            // Its leader election and the new works' status syncs settle.
            std::thread::sleep(SETTLE);
            eprintln!(
                "peer bench: the work agent idle with {size} ManifestWorks for {:?}",
                plan.idle
            );
            let figures = idle(&bed, child.0.id(), PEER_USER, since, plan.idle, size);
            assert!(
                child.0.try_wait().unwrap().is_none(),
                "the work agent exited; log: {}",
                log.display()
            );
            theirs.push(figures);
            eprintln!("{}", render(&ours, &theirs, None, None));
        }
        eprintln!(
            "peer bench: {} deploys through the work agent",
            plan.deploys
        );
        pd = Some(peer_deploys(&bed, plan.deploys, &mut child.0, &log));
        drop(child);
    }

    // Then the Manager, alone: a process of its own at each size.
    let mut proxies = 0;
    for &size in &plan.sizes {
        {
            let client = f.tb.admin();
            let collection = format!(
                "/apis/nexo.io/v1alpha1/namespaces/{}/nexoproxies",
                f.ns.name
            );
            let key = f.integrity_key();
            for i in proxies..size {
                let created = client
                    .create(&collection, &owned_proxy(&f.env_id, &format!("p{i:05}")))
                    .unwrap();
                support::prove_with(&client, &key, &f.env_id, &collection, &created);
            }
            proxies = size;
        }
        let env = manager_env(&f, &manager_kc, None);
        let since = bed.mark();
        let mut m = Manager::spawn_binary(&static_binary(), &env).with_sim(&f.sim);
        let before = f.sim.heartbeat_count();
        m.wait_until(Duration::from_secs(120), "two heartbeats", || {
            f.sim.heartbeat_count() >= before + 2
        });
        let reported = f.sim.last_heartbeat().unwrap()["managedProxyCount"].as_u64();
        m.check(
            reported == Some(size as u64),
            &format!("the heartbeat reports {size} proxies: {reported:?}"),
        );
        eprintln!(
            "peer bench: the Manager idle with {size} NexoProxies for {:?}",
            plan.idle
        );
        let figures = idle(&bed, m.pid(), MANAGER_USER, since, plan.idle, size);
        m.check(
            figures.bill.per_minute() > 0.0,
            "the audit log saw the Manager's requests",
        );
        m.signal("TERM");
        let status = m.wait_exit(STOP_WAIT);
        m.check(status.success(), "a clean stop exits 0");
        ours.push(figures);
        eprintln!("{}", render(&ours, &theirs, None, pd.as_ref()));
    }

    eprintln!("peer bench: {} deploys through the Manager", plan.deploys);
    let od = manager_deploys(&f, &manager_kc, plan.deploys);
    assert_eq!(od.to_ack_ms.len(), plan.deploys);

    let table = render(&ours, &theirs, Some(&od), pd.as_ref());
    let date = humantime::format_rfc3339_seconds(SystemTime::now());
    let peer_line = peer.as_ref().map_or(
        "the peer not run (short form: `--peer` runs it)".to_owned(),
        |p| format!("the peer: {}", p.versions.trim().replace('\n', ", ")),
    );
    let header = format!(
        "Run of {date} on {}; Kubernetes {} (the test bed, audit log on); {peer_line}; idle windows of {} s; {} form, {:.0} s.\n",
        machine(),
        bed.tb.version,
        plan.idle.as_secs(),
        if plan.full { "full" } else { "short" },
        started.elapsed().as_secs_f64()
    );
    println!("\n{header}\n{table}");
    let out = if plan.full {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("BENCHMARKS.md")
    } else {
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("BENCHMARKS-peer-short.md")
    };
    common::write_section(&out, BEGIN, END, &format!("{header}\n{table}"));
    eprintln!("peer bench: wrote {}", out.display());
}
