//! The benchmark suite: footprint and speed of the shipped static binary,
//! measured on the real test bed and the CP simulator, side by side with
//! the do-it-yourself loop a user would write instead (`diy-agent.sh`:
//! bash, kubectl, jq, curl) doing the same work in the same run.
//!
//! `cargo bench --bench footprint` (what `bash tests/bench.sh` runs) is the
//! full suite: it prints the table and writes it into `BENCHMARKS.md`.
//! Under `cargo test` (no `--bench` argument) the same code runs a short
//! form with small sizes, so it cannot rot; it checks that every figure was
//! obtained and that the work was done (acks applied, inventory complete),
//! never how fast.
//!
//! Every figure comes from the kernel or from the simulator's request log:
//! CPU from `/proc/PID/schedstat` (nanoseconds on the CPU) and
//! `/proc/PID/stat` (user and system ticks), memory from
//! `/proc/PID/status`, the DIY loop's peak from `wait4`'s rusage, times
//! from the simulator's arrival timestamps.

#[path = "common.rs"]
mod common;
#[path = "../support/mod.rs"]
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use common::{machine, median, read_proc, ticks_per_second};
use nexo_cpsim::inventory::Confirming;
use nexo_cpsim::{Brief, Endpoint, Fault, FaultAction};
use serde_json::{Value, json};
use support::fixture::{Fixture, PROXY_IMAGE};
use support::manager::{Manager, STOP_WAIT, static_binary};

/// What one run measures.
struct Plan {
    full: bool,
    /// `--only a,b`: just these parts (image, start, idle, deploy, sizes,
    /// greedy, soak).
    only: Option<Vec<String>>,
    /// Owned NexoProxies in the cluster, in increasing order.
    sizes: Vec<usize>,
    /// Heartbeats measured at each size (after the warm-up).
    cycles: usize,
    /// Heartbeats of the DIY loop measured at each size.
    diy_cycles: usize,
    /// Sequential three-object deploys timed.
    deploys: usize,
    /// Deploy commands in one heartbeat answer.
    batch: usize,
    /// Deploys through the DIY loop.
    diy_deploys: usize,
    /// Starts timed to the first heartbeat.
    starts: usize,
    /// Heartbeat interval of the idle measurement, and how many intervals.
    idle_interval: u64,
    idle_intervals: u64,
    /// The soak: how long, one cycle of work every `soak_cycle`, on
    /// `soak_proxies` owned NexoProxies.
    soak: Duration,
    soak_cycle: Duration,
    soak_proxies: usize,
    /// The soak's fill: cycles back to back (no pause) until the ledger
    /// holds its bound of entries or this much time has passed, so the
    /// memory measured after it is the steady state's.
    soak_fill: Duration,
    /// Commands timed from the CP having them to their ack, per CP kind,
    /// at a heartbeat interval of `latency_interval` seconds.
    latency_commands: usize,
    latency_interval: u64,
    /// How long the API server's bill at rest is read (audit log).
    rest: Duration,
    /// Owned deployments with a drift record, in increasing order, and
    /// the drift checks measured at each.
    drift_sizes: Vec<usize>,
    drift_checks: usize,
}

impl Plan {
    fn runs(&self, part: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|o| o.iter().any(|p| p == part))
    }

    fn from_args() -> Plan {
        let args: Vec<String> = std::env::args().collect();
        let full = args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--short");
        let only = common::only_parts();
        let sizes = common::sizes_arg();
        if full {
            Plan {
                full,
                only,
                sizes: sizes.unwrap_or_else(|| vec![0, 100, 1_000, 10_000]),
                cycles: 20,
                diy_cycles: 5,
                deploys: 50,
                batch: 100,
                diy_deploys: 10,
                starts: 5,
                idle_interval: 5,
                idle_intervals: 6,
                soak: Duration::from_secs(60 * 60),
                soak_cycle: Duration::from_secs(40),
                soak_proxies: 100,
                soak_fill: Duration::from_secs(10 * 60),
                latency_commands: 50,
                latency_interval: 15,
                rest: Duration::from_secs(5 * 60),
                drift_sizes: vec![100, 10_000],
                drift_checks: 5,
            }
        } else {
            Plan {
                full,
                only,
                sizes: vec![0, 10],
                cycles: 3,
                diy_cycles: 2,
                deploys: 3,
                batch: 5,
                diy_deploys: 2,
                starts: 1,
                idle_interval: 2,
                idle_intervals: 2,
                soak: Duration::from_secs(45),
                soak_cycle: Duration::from_secs(3),
                soak_proxies: 10,
                soak_fill: Duration::ZERO,
                latency_commands: 3,
                latency_interval: 2,
                rest: Duration::from_secs(20),
                drift_sizes: vec![10],
                drift_checks: 2,
            }
        }
    }
}

/// Socket inodes a process holds (a reused connection keeps its inode).
fn sockets(pid: u32) -> BTreeSet<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .map(|l| l.display().to_string())
                .filter(|l| l.starts_with("socket:"))
                .collect()
        })
        .unwrap_or_default()
}

// ------------------------------------------------------------ the world --

fn bench_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn proxy_object(env_id: &str, name: &str) -> Value {
    let labels = json!({"app.kubernetes.io/managed-by": "nexo-manager",
        "nexo.io/owner-id": env_id, "nexo.io/deployment": name});
    json!({"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy",
        "metadata": {"name": name, "labels": labels},
        "spec": {"image": PROXY_IMAGE, "replicas": 2, "mongodb": {"secretRef": {"name": format!("{name}-db")}}}})
}

/// Grows the fixture's namespace to `to` owned NexoProxies (from `from`),
/// four writers at a time.
fn grow(f: &Fixture, from: usize, to: usize) {
    if to <= from {
        return;
    }
    let started = Instant::now();
    let collection = format!(
        "/apis/nexo.io/v1alpha1/namespaces/{}/nexoproxies",
        f.ns.name
    );
    let writers = 4;
    let (tb, env_id) = (f.tb, f.env_id.as_str());
    let key = f.integrity_key();
    std::thread::scope(|s| {
        for w in 0..writers {
            let (collection, key) = (&collection, &key);
            s.spawn(move || {
                let client = tb.admin();
                for i in (from + w..to).step_by(writers) {
                    let name = format!("p{i:05}");
                    let created = client
                        .create(collection, &proxy_object(env_id, &name))
                        .unwrap_or_else(|e| panic!("create NexoProxy {name}: {e}"));
                    support::prove_with(&client, key, env_id, collection, &created);
                }
            });
        }
    });
    // Let etcd and the API server's caches settle before measuring.
    std::thread::sleep(Duration::from_secs(if to - from > 1_000 { 10 } else { 2 }));
    eprintln!(
        "bench: {} NexoProxies in {} ({} created in {:.1} s)",
        to,
        f.ns.name,
        to - from,
        started.elapsed().as_secs_f64()
    );
}

/// The Manager's environment for the benchmarks: the fixture's, with
/// `interval`, the probe listener on a port of its own, and info logs.
fn manager_env(f: &Fixture, interval: u64) -> BTreeMap<String, String> {
    let mut env = f.env();
    env.insert("NEXO_HEARTBEAT_INTERVAL".into(), format!("{interval}s"));
    env.insert(
        "NEXO_LISTEN_ADDR".into(),
        support::PROBES_ON_ANY_PORT.to_owned(),
    );
    env.insert("RUST_LOG".into(), "info".into());
    env
}

/// Fixtures live to the end of the run: deleting a namespace of hundreds
/// of objects keeps the API server and the garbage collector busy while
/// the next part measures.
fn keep_fixture<'a>(keep: &'a mut Vec<Fixture>, prefix: &str) -> &'a Fixture {
    keep_fixture_with(keep, prefix, nexo_cpsim::SimConfig::default())
}

/// A fixture (kept, see above) whose NexoProxy storage answers: a CRD just
/// installed can answer 429 "storage is (re)initializing" for a moment,
/// which would be measured as the Manager's start-up time.
fn keep_fixture_with<'a>(
    keep: &'a mut Vec<Fixture>,
    prefix: &str,
    config: nexo_cpsim::SimConfig,
) -> &'a Fixture {
    let f = Fixture::with_config(prefix, config);
    f.tb.install_crds();
    let client = f.tb.admin();
    let path = format!(
        "/apis/nexo.io/v1alpha1/namespaces/{}/nexoproxies?limit=1",
        f.ns.name
    );
    support::wait_for(Duration::from_secs(60), "NexoProxy storage ready", || {
        client.get::<Value>(&path).ok().map(drop)
    });
    keep.push(f);
    keep.last().expect("just pushed")
}

// ------------------------------------------------------- command latency --

/// Queue-to-ack times of `n` three-object deploys.
struct Latency {
    median_ms: f64,
    worst_ms: f64,
    n: usize,
}

/// Times `n` deploys (a NexoProxy, its ConfigMap and Secret) from the
/// moment the CP has each (queued in the simulator) to the moment the ack
/// arrives, one at a time. With a holding CP a command is queued while a
/// heartbeat is held; with one that never holds, at a spread of moments
/// across the interval, as commands come in life.
fn measure_latency(plan: &Plan, f: &Fixture, bin: &Path, tag: &str) -> Latency {
    let mut env = manager_env(f, plan.latency_interval);
    env.insert("NEXO_LISTEN_ADDR".into(), "off".into());
    let mut m = Manager::spawn_binary(bin, &env).with_sim(&f.sim);
    wait_heartbeats(f, &mut m, 1, Duration::from_secs(60));
    let holding = f.sim.heartbeats()[0].get("waitSeconds").is_some() && f.sim.holds();
    let interval = Duration::from_secs(plan.latency_interval);
    let mut times = Vec::new();
    for i in 0..plan.latency_commands {
        if holding {
            m.wait_until(Duration::from_secs(60), "a held heartbeat", || {
                f.sim.briefs().iter().any(|b| {
                    b.path == "/api/v2/manager/heartbeat"
                        && b.status == 0
                        && b.at
                            .elapsed()
                            .is_ok_and(|a| a >= Duration::from_millis(100))
                })
            });
        } else {
            // Spread over the interval: i × the golden ratio, modulo 1.
            let phase = (i as f64 * 0.618_034).fract();
            std::thread::sleep(interval.mul_f64(phase));
        }
        let id = format!("lat-{tag}-{i}");
        let name = format!("lat{i}");
        let ns = &f.ns.name;
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("{name}-config")}, "data": {"listen": "27017"}});
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("{name}-db")}, "stringData": {"uri": "mongodb://db:27017"}});
        let queued = SystemTime::now();
        f.sim.enqueue_command(
            &f.env_id,
            json!({"id": id, "class": "deploy", "issuedAt": "2026-12-05T00:00:00Z", "requires": [],
                   "payload": {"deployment": {"name": name, "namespace": ns}, "format": "crd",
                               "manifests": [proxy_object(&f.env_id, &name), cm, secret]}}),
        );
        let path = format!("/api/v2/manager/commands/{id}/ack");
        let acked = support::wait_for(Duration::from_secs(120), "the ack", || {
            f.sim
                .briefs()
                .into_iter()
                .find(|b| b.path == path && b.status == 200)
                .map(|b| b.at)
        });
        times.push(since(queued, acked));
    }
    stop(&mut m);
    let worst = times.iter().copied().fold(0.0, f64::max);
    let n = times.len();
    Latency {
        median_ms: median(&mut times),
        worst_ms: worst,
        n,
    }
}

/// The API server's requests a minute from an idle Manager, from the
/// audit log of a test bed of its own: what each user agent asked, by
/// verb and resource.
fn measure_rest(plan: &Plan, bin: &Path) -> (f64, String) {
    let bed = support::OwnBed::start("rest-tb", &["--audit"]);
    let f = Fixture::on(bed.tb, "bench-rest", nexo_cpsim::SimConfig::default());
    f.tb.install_crds();
    grow(&f, 0, 100);
    let mut env = manager_env(&f, 15);
    env.insert("NEXO_LISTEN_ADDR".into(), "off".into());
    // No operator runs here: the proxies would fail their progress
    // deadline (10 minutes) inside the window, each with an Event. At
    // rest, nothing turns.
    env.insert("NEXO_PROGRESS_DEADLINE".into(), "1h".into());
    if !plan.full {
        // The short form (inside the tests): the first drift check after
        // one heartbeat interval, not the default five minutes.
        env.insert("NEXO_DRIFT_INTERVAL".into(), "15s".into());
    }
    let mut m = Manager::spawn_binary(bin, &env).with_sim(&f.sim);
    wait_heartbeats(&f, &mut m, 2, Duration::from_secs(60));
    let audit = bed.dir.join("logs/audit.log");
    // The window opens after the first drift check (one
    // `NEXO_DRIFT_INTERVAL`, 5 minutes, after the start), which lists the
    // drift records once, as every new leader must.
    let first_check = Instant::now() + Duration::from_secs(420);
    while !String::from_utf8_lossy(&std::fs::read(&audit).unwrap_or_default())
        .lines()
        .any(|l| {
            l.contains("\"userAgent\":\"nexo-manager/")
                && l.contains("\"verb\":\"list\"")
                && l.contains("\"resource\":\"secrets\"")
        })
    {
        m.check(
            Instant::now() < first_check,
            "the first drift check's list of the records within 7 minutes",
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    std::thread::sleep(Duration::from_secs(2));
    let from = std::fs::metadata(&audit).map(|m| m.len()).unwrap_or(0);
    let started = Instant::now();
    std::thread::sleep(plan.rest);
    let minutes = started.elapsed().as_secs_f64() / 60.0;
    let text = std::fs::read(&audit).unwrap_or_default();
    stop(&mut m);
    let mut by: BTreeMap<String, usize> = BTreeMap::new();
    let mut total = 0;
    for line in text[from as usize..].split(|b| *b == b'\n') {
        let Ok(e) = serde_json::from_slice::<Value>(line) else {
            continue;
        };
        if !e["userAgent"]
            .as_str()
            .is_some_and(|ua| ua.starts_with("nexo-manager/"))
        {
            continue;
        }
        total += 1;
        let key = format!(
            "{} {}",
            e["verb"].as_str().unwrap_or("?"),
            e["objectRef"]["resource"].as_str().unwrap_or("?")
        );
        *by.entry(key).or_default() += 1;
    }
    let detail = by
        .iter()
        .map(|(k, n)| format!("{k} {:.2}", *n as f64 / minutes))
        .collect::<Vec<_>>()
        .join(", ");
    (total as f64 / minutes, detail)
}

/// Gives the fixture's first `to` NexoProxies (from `from`) the drift
/// record a deploy of each would have written (`drift.v1`, mode
/// `report`), owned by the proxy, four writers at a time.
fn record_drift(f: &Fixture, from: usize, to: usize) {
    if to <= from {
        return;
    }
    let ns = f.ns.name.as_str();
    let mut uids: BTreeMap<String, String> = BTreeMap::new();
    f.tb.admin()
        .list_each(
            &format!("/apis/nexo.io/v1alpha1/namespaces/{ns}/nexoproxies"),
            None,
            500,
            |p| {
                uids.insert(
                    p["metadata"]["name"].as_str().unwrap().to_owned(),
                    p["metadata"]["uid"].as_str().unwrap().to_owned(),
                );
            },
        )
        .expect("list the NexoProxies");
    let collection = format!("/api/v1/namespaces/{ns}/secrets");
    let key = f.integrity_key();
    let key = &key;
    let writers = 4;
    let (tb, env_id, uids) = (f.tb, f.env_id.as_str(), &uids);
    std::thread::scope(|s| {
        for w in 0..writers {
            let collection = &collection;
            s.spawn(move || {
                let client = tb.admin();
                for i in (from + w..to).step_by(writers) {
                    let name = format!("p{i:05}");
                    let mut manifest = proxy_object(env_id, &name);
                    manifest["metadata"] = json!({"name": name});
                    let payload = json!({"deployment": {"name": name, "namespace": ns}, "format": "crd",
                        "manifests": [manifest], "drift": {"mode": "report"}});
                    let uid = &uids[&name];
                    let secret = nexo_manager::drift::record_secret(
                        &payload,
                        &nexo_manager::drift::History::default(),
                        ns,
                        &name,
                        env_id,
                        (nexo_manager::resource::Kind::NexoProxy, uid),
                        key,
                    )
                    .unwrap();
                    client
                        .create(collection, &secret)
                        .unwrap_or_else(|e| panic!("create the record of {name}: {e}"));
                }
            });
        }
    });
}

struct DriftFigures {
    size: usize,
    /// CPU of a check: the cycle's with checks less the heartbeat's alone.
    cpu_ms: f64,
    /// Wall time of a check (`nexo_manager_drift_check_seconds_total`).
    wall_ms: f64,
    hwm_kb: u64,
    hwm_kb_without: u64,
    /// API server requests per check, from the audit log, and by verb and
    /// resource.
    requests: f64,
    bill: String,
}

/// A drift check at `size` deployments: CPU and peak memory against the
/// same Manager with drift checks off, the API server's bill from the
/// audit log of `bed`.
fn measure_drift(plan: &Plan, f: &Fixture, bed: &Path, size: usize) -> DriftFigures {
    let cycles = plan.drift_checks + 2;
    // Without checks: the heartbeats' cost.
    let mut env = manager_env(f, 2);
    env.insert("NEXO_DRIFT_INTERVAL".into(), "24h".into());
    let mut m = spawn_static(f, &env);
    let pid = m.pid();
    let warm = f.sim.heartbeat_count() + 3;
    wait_heartbeats(f, &mut m, warm, Duration::from_secs(180));
    let (p0, h0) = (read_proc(pid), f.sim.heartbeat_count());
    wait_heartbeats(f, &mut m, h0 + cycles, Duration::from_secs(300));
    let (p1, h1) = (read_proc(pid), f.sim.heartbeat_count());
    let per_heartbeat = (p1.cpu_ns - p0.cpu_ns) as f64 / (h1 - h0) as f64;
    let hwm_kb_without = p1.hwm_kb;
    stop(&mut m);

    // With a check every cycle.
    env.insert("NEXO_DRIFT_INTERVAL".into(), "2s".into());
    let mut m = spawn_static(f, &env);
    let pid = m.pid();
    let checks = |m: &mut Manager| m.metric("nexo_manager_drift_checks_total").unwrap_or(0.0);
    let deadline = Instant::now() + Duration::from_secs(300);
    while checks(&mut m) < 1.0 {
        m.check(
            Instant::now() < deadline,
            "a first drift check in 5 minutes",
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mark = audit_mark(bed);
    let (p0, h0, c0) = (read_proc(pid), f.sim.heartbeat_count(), checks(&mut m));
    let s0 = m
        .metric("nexo_manager_drift_check_seconds_total")
        .unwrap_or(0.0);
    while checks(&mut m) < c0 + plan.drift_checks as f64 {
        m.check(
            Instant::now() < deadline + Duration::from_secs(600),
            "the drift checks in time",
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (p1, h1, c1) = (read_proc(pid), f.sim.heartbeat_count(), checks(&mut m));
    let s1 = m
        .metric("nexo_manager_drift_check_seconds_total")
        .unwrap_or(0.0);
    // Its series are present at zero from the start: their sum counts.
    let text = m.metrics();
    let drifted: f64 = text
        .lines()
        .filter(|l| l.starts_with("nexo_manager_drifted_objects_total{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    m.check(
        drifted == 0.0 && text.contains("nexo_manager_drifted_objects_total{"),
        &format!("no drift where nothing was changed:\n{text}"),
    );
    // Every list the checks needed was made (none failed, none was found
    // out of name order): what was measured is the whole check.
    let errors = f.sim.last_heartbeat().unwrap_or_default()["inventoryErrors"].clone();
    m.check(
        !errors.to_string().contains("drift check"),
        &format!("every drift check whole: {errors}"),
    );
    let hwm_kb = read_proc(pid).hwm_kb;
    stop(&mut m);
    let n = c1 - c0;
    let cpu = (p1.cpu_ns - p0.cpu_ns) as f64 - per_heartbeat * (h1 - h0) as f64;
    // What the Manager asked of the API server meanwhile.
    use std::io::{Read, Seek, SeekFrom};
    let mut text = String::new();
    let mut log = std::fs::File::open(bed.join("logs/audit.log")).expect("the audit log");
    log.seek(SeekFrom::Start(mark)).unwrap();
    log.read_to_string(&mut text).unwrap();
    let mut by: BTreeMap<String, usize> = BTreeMap::new();
    let mut total = 0;
    for e in text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
    {
        if e["stage"] != "ResponseComplete"
            || !e["userAgent"]
                .as_str()
                .is_some_and(|ua| ua.starts_with("nexo-manager/"))
            || e["verb"] == "watch"
            || e["objectRef"]["resource"] == "leases"
        {
            continue;
        }
        total += 1;
        let key = format!(
            "{} {}",
            e["verb"].as_str().unwrap_or("?"),
            e["objectRef"]["resource"].as_str().unwrap_or("?")
        );
        *by.entry(key).or_default() += 1;
    }
    let bill = by
        .iter()
        .map(|(k, c)| format!("{k} {:.1}", *c as f64 / n))
        .collect::<Vec<_>>()
        .join(", ");
    DriftFigures {
        size,
        cpu_ms: cpu / 1e6 / n,
        wall_ms: (s1 - s0) * 1000.0 / n,
        hwm_kb,
        hwm_kb_without,
        requests: total as f64 / n,
        bill,
    }
}

/// Starts the static binary; under `$NEXO_BENCH_EMULATOR` (a user-mode
/// emulator, `qemu-aarch64-static` for the arm64 binary) when that is set,
/// so that the figures read off the process are the emulator's: its memory
/// holds the emulated program's and its own (measured alone by `--only
/// emulator`).
fn spawn_static(f: &Fixture, env: &BTreeMap<String, String>) -> Manager {
    match std::env::var_os("NEXO_BENCH_EMULATOR") {
        Some(emulator) => {
            Manager::spawn_emulated(Path::new(&emulator), &static_binary(), env).with_sim(&f.sim)
        }
        None => Manager::spawn_binary(&static_binary(), env).with_sim(&f.sim),
    }
}

fn heartbeats_of(briefs: &[Brief]) -> Vec<&Brief> {
    briefs
        .iter()
        .filter(|b| b.path == "/api/v2/manager/heartbeat" && b.status == 200)
        .collect()
}

fn wait_heartbeats(f: &Fixture, m: &mut Manager, n: usize, timeout: Duration) {
    m.wait_until(timeout, &format!("{n} heartbeats"), || {
        f.sim.heartbeat_count() >= n
    });
}

/// Stops a Manager with SIGTERM and checks the clean exit.
fn stop(m: &mut Manager) {
    m.signal("TERM");
    let status = m.wait_exit(STOP_WAIT);
    m.check(status.success(), "a clean stop exits 0");
}

fn since(a: SystemTime, b: SystemTime) -> f64 {
    b.duration_since(a).unwrap_or_default().as_secs_f64() * 1000.0
}

// ---------------------------------------------------------- the DIY loop --

struct Diy {
    child: std::process::Child,
    lines: BufReader<std::process::ChildStdout>,
    stderr: PathBuf,
}

/// Resource use of a finished DIY loop, from `wait4`.
struct DiyEnd {
    /// Largest resident set of any process of the loop (bash, kubectl, jq, curl).
    max_rss_kb: u64,
}

impl Diy {
    fn start(f: &Fixture, cycles: usize, interval: u64) -> Diy {
        let stderr = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("diy-{}-{}.err", f.ns.name, cycles));
        let mut child = Command::new("bash")
            .arg(bench_dir().join("tests/bench/diy-agent.sh"))
            .env("CP_URL", f.sim.url())
            .env("CP_CA", f.dir.join("cp-ca.pem"))
            .env("TOKEN_FILE", f.token_file())
            .env("OWNER_ID", &f.env_id)
            .env("NAMESPACE", &f.ns.name)
            .env("KUBECTL", &f.tb.kubectl)
            .env("KUBECONFIG", &f.tb.kubeconfig)
            .env("PROXY_IMAGE", PROXY_IMAGE)
            .env("INTERVAL", interval.to_string())
            .env("CYCLES", cycles.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("run bash tests/bench/diy-agent.sh");
        let lines = BufReader::new(child.stdout.take().expect("piped stdout"));
        Diy {
            child,
            lines,
            stderr,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn fail(&self, why: &str) -> ! {
        panic!(
            "diy-agent.sh: {why}\n--- stderr ---\n{}",
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        )
    }

    /// Blocks until the loop prints `cycle N`; returns N.
    fn next_cycle(&mut self) -> usize {
        let mut line = String::new();
        match self.lines.read_line(&mut line) {
            Ok(0) | Err(_) => self.fail("ended before its next cycle"),
            Ok(_) => line
                .trim()
                .strip_prefix("cycle ")
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| self.fail(&format!("unexpected output {line:?}"))),
        }
    }

    /// Reaps the finished loop with `wait4` for the peak RSS of its tree.
    fn finish(self) -> DiyEnd {
        let pid = self.child.id() as libc::pid_t;
        let mut status = 0;
        // SAFETY: an all-zero rusage is a valid value of the plain C struct.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `pid` is our own unreaped child (std's Child never waited
        // for it); both pointers point at live locals for the whole call.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r != pid || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
            self.fail(&format!(
                "did not exit cleanly (wait4 {r}, status {status})"
            ));
        }
        DiyEnd {
            max_rss_kb: usage.ru_maxrss as u64,
        }
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ----------------------------------------------------------- the report --

/// One line of the table.
struct Row {
    what: String,
    ours: String,
    diy: String,
    ratio: String,
    target: String,
    how: String,
}

fn row(what: &str, ours: String, diy: String, ratio: String, target: &str, how: &str) -> Row {
    Row {
        what: what.into(),
        ours,
        diy,
        ratio,
        target: target.into(),
        how: how.into(),
    }
}

fn ratio(diy: f64, ours: f64) -> String {
    if ours > 0.0 {
        format!("{:.0}×", diy / ours)
    } else {
        "n/a".into()
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.2} MiB ({bytes} B)", bytes as f64 / 1_048_576.0)
}

fn kib(kb: u64) -> String {
    format!("{:.2} MiB", kb as f64 / 1024.0)
}

fn render(rows: &[Row]) -> String {
    let mut s = String::from(
        "| measure | Nexo Manager | DIY loop | DIY / ours | target | how |\n|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} |",
            r.what, r.ours, r.diy, r.ratio, r.target, r.how
        );
    }
    s
}

// ------------------------------------------------------------ measures --

struct SizeFigures {
    size: usize,
    rss_kb: u64,
    hwm_kb: u64,
    /// Mean and median CPU of a heartbeat cycle (a CP that never
    /// confirms: the full form, version 2's heartbeat).
    cpu_ms: f64,
    cpu_median_ms: f64,
    tick_ms: f64,
    body: usize,
    /// The same with a CP that confirms (`inventory.delta.v1`): at rest,
    /// and the body after one deployment changed.
    delta: DeltaFigures,
    cp_handshakes: usize,
    sockets: usize,
    diy_rss_kb: u64,
    diy_cpu_ms: f64,
    diy_handshakes: f64,
}

struct DeltaFigures {
    cpu_ms: f64,
    cpu_median_ms: f64,
    rss_kb: u64,
    body_rest: usize,
    body_changed: usize,
}

/// What `cycles` heartbeat cycles of the Manager `pid` cost.
struct Cycles {
    p0: common::Proc,
    p1: common::Proc,
    n: f64,
    per_cycle: Vec<f64>,
    rss_max: u64,
}

fn measure_cycles(
    f: &Fixture,
    m: &mut Manager,
    cycles: usize,
    seen: &mut BTreeSet<String>,
) -> Cycles {
    let pid = m.pid();
    let p0 = read_proc(pid);
    let h0 = f.sim.heartbeat_count();
    let mut rss_max = 0;
    // CPU of each cycle: sampled when its heartbeat has arrived, the point
    // where the cycle's work is done and the Manager is about to wait.
    let mut per_cycle = Vec::new();
    let (mut last_count, mut last_ns) = (h0, p0.cpu_ns);
    let deadline = Instant::now() + Duration::from_secs(60 + 10 * cycles as u64);
    while f.sim.heartbeat_count() < h0 + cycles {
        std::thread::sleep(Duration::from_millis(20));
        let running = m.running();
        m.check(running, "the Manager is running");
        m.check(
            Instant::now() < deadline,
            &format!("{cycles} heartbeats in time"),
        );
        let count = f.sim.heartbeat_count();
        if count > last_count {
            // Let the answer be handled: the cycle ends in the wait. (A
            // probe would tell when it is, and be measured with the cycle;
            // this figure is not asserted on.)
            std::thread::sleep(Duration::from_millis(50));
            let now = read_proc(pid);
            per_cycle.push((now.cpu_ns - last_ns) as f64 / 1e6 / (count - last_count) as f64);
            (last_count, last_ns) = (count, now.cpu_ns);
            rss_max = rss_max.max(now.rss_kb);
            seen.extend(sockets(pid));
        }
    }
    let p1 = read_proc(pid);
    let n = (f.sim.heartbeat_count() - h0) as f64;
    Cycles {
        p0,
        p1,
        n,
        per_cycle,
        rss_max,
    }
}

/// The compact JSON length of a heartbeat body (what was sent: the
/// Manager writes compact JSON with serde_json too).
fn json_len(v: &Value) -> usize {
    serde_json::to_vec(v).map_or(0, |b| b.len())
}

fn measure_size(plan: &Plan, f: &Fixture, size: usize, hz: u64) -> SizeFigures {
    // Ours, with a CP that never confirms (the full form every time).
    f.sim.set_confirming(Confirming::Never);
    let env = manager_env(f, 1);
    let before = f.sim.heartbeat_count();
    let connections_before = f.sim.connections();
    let mut m = spawn_static(f, &env);
    let warm = before + 3;
    wait_heartbeats(f, &mut m, warm, Duration::from_secs(120));
    let mut seen = sockets(m.pid());
    let mut c = measure_cycles(f, &mut m, plan.cycles, &mut seen);
    let briefs = f.sim.briefs();
    let last = heartbeats_of(&briefs).last().map(|b| b.body_len).unwrap();
    let reported = f.sim.last_heartbeat().unwrap()["managedProxyCount"].as_u64();
    m.check(
        reported == Some(size as u64),
        &format!("the heartbeat reports all {size} proxies (got {reported:?})"),
    );
    let handshakes = f.sim.connections() - connections_before;

    // The same Manager once the CP confirms: deltas.
    f.sim.set_confirming(Confirming::Always);
    let at = f.sim.heartbeat_count();
    wait_heartbeats(f, &mut m, at + 2, Duration::from_secs(60));
    let mut d = measure_cycles(f, &mut m, plan.cycles, &mut seen);
    let rest = f.sim.last_heartbeat().unwrap();
    m.check(
        rest["inventory"]["base"].is_u64() && rest["inventory"]["changed"] == json!([]),
        &format!("at rest, an empty delta: {}", rest["inventory"]),
    );
    let body_rest = json_len(&rest);
    let body_changed = if size == 0 {
        0
    } else {
        // One deployment changes: its entry alone.
        let path = format!(
            "/apis/nexo.io/v1alpha1/namespaces/{}/nexoproxies/p00000",
            f.ns.name
        );
        let replicas = 3 + (f.sim.heartbeat_count() % 5) as i64;
        f.tb.admin()
            .patch(
                &path,
                nexo_manager::kube::client::MERGE_PATCH,
                &json!({"spec": {"replicas": replicas}}),
            )
            .unwrap();
        let mut changed = None;
        m.wait_until(Duration::from_secs(30), "a delta naming p00000", || {
            let hb = f.sim.last_heartbeat().unwrap_or_default();
            if hb["inventory"]["changed"][0]["replicas"] == replicas {
                changed = Some(json_len(&hb));
            }
            changed.is_some()
        });
        changed.unwrap_or(0)
    };
    f.sim.set_confirming(Confirming::Never);
    stop(&mut m);
    c.rss_max = c.rss_max.max(d.rss_max);
    let delta = DeltaFigures {
        cpu_ms: (d.p1.cpu_ns - d.p0.cpu_ns) as f64 / 1e6 / d.n,
        cpu_median_ms: median(&mut d.per_cycle),
        rss_kb: d.rss_max.max(d.p1.rss_kb),
        body_rest,
        body_changed,
    };
    let (p0, mut p1, n) = (c.p0, c.p1, c.n);
    // The peak of the whole run, both phases.
    p1.hwm_kb = d.p1.hwm_kb;
    let mut per_cycle = c.per_cycle;
    let rss_max = c.rss_max;

    // The DIY loop, on the same proxies.
    let connections_before = f.sim.connections();
    let mut diy = Diy::start(f, plan.diy_cycles + 1, 1);
    let dpid = diy.pid();
    assert_eq!(diy.next_cycle(), 1);
    let d0 = read_proc(dpid);
    let mut cycle = 1;
    let mut d1 = d0;
    while cycle < plan.diy_cycles + 1 {
        cycle = diy.next_cycle();
        d1 = read_proc(dpid);
    }
    let diy_handshakes = (f.sim.connections() - connections_before) as f64 / cycle as f64;
    let end = diy.finish();
    let reported = f.sim.last_heartbeat().unwrap()["managedProxyCount"].as_u64();
    assert_eq!(
        reported,
        Some(size as u64),
        "the DIY heartbeat reports all {size} proxies"
    );
    let tick_ms = 1000.0 / hz as f64;
    SizeFigures {
        size,
        rss_kb: p1.rss_kb.max(rss_max),
        hwm_kb: p1.hwm_kb,
        cpu_ms: (p1.cpu_ns - p0.cpu_ns) as f64 / 1e6 / n,
        cpu_median_ms: median(&mut per_cycle),
        tick_ms: (p1.ticks - p0.ticks) as f64 * tick_ms / n,
        body: last,
        delta,
        cp_handshakes: handshakes,
        sockets: seen.len(),
        diy_rss_kb: end.max_rss_kb,
        diy_cpu_ms: ((d1.ticks + d1.child_ticks) - (d0.ticks + d0.child_ticks)) as f64 * tick_ms
            / (cycle - 1) as f64,
        diy_handshakes,
    }
}

fn crd_deploy(f: &Fixture, id: &str, name: &str) -> Value {
    json!({"id": id, "class": "deploy", "issuedAt": "2026-12-03T00:00:00Z", "requires": [],
        "payload": {"deployment": {"name": name, "namespace": f.ns.name}, "format": "crd",
            "manifests": [
                {"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy", "metadata": {"name": name},
                 "spec": {"image": PROXY_IMAGE, "replicas": 1, "mongodb": {"secretRef": {"name": format!("{name}-db")}}}},
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("{name}-config")},
                 "data": {"listen": "27017"}},
                {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("{name}-db")},
                 "stringData": {"uri": "mongodb://db:27017"}}]}})
}

/// Arrival (the heartbeat whose answer carried it) to ack, in ms.
fn arrival_to_ack(briefs: &[Brief], id: &str) -> Option<f64> {
    let ack = briefs
        .iter()
        .find(|b| b.path == format!("/api/v2/manager/commands/{id}/ack"))?;
    let hb = heartbeats_of(briefs)
        .into_iter()
        .rfind(|b| b.at <= ack.at)?;
    Some(since(hb.at, ack.at))
}

/// Waits until every one of `ids` is acknowledged; their acks, in order.
fn wait_acked(f: &Fixture, what: &str, ids: &[String], timeout: Duration) -> Vec<Value> {
    support::wait_for(timeout, what, || {
        let acks = f.sim.acks();
        ids.iter()
            .map(|id| acks.iter().find(|a| a["commandId"] == id.as_str()).cloned())
            .collect::<Option<Vec<_>>>()
    })
}

struct DeployFigures {
    median_ms: f64,
    worst_ms: f64,
    batch_ms: f64,
    diy_median_ms: f64,
    diy_worst_ms: f64,
}

fn measure_deploys(plan: &Plan, f: &Fixture) -> DeployFigures {
    let env = manager_env(f, 1);
    let mut m = spawn_static(f, &env);
    wait_heartbeats(f, &mut m, 2, Duration::from_secs(60));
    let mut took = Vec::new();
    for i in 0..plan.deploys {
        let id = format!("seq-{i}");
        f.sim
            .enqueue_command(&f.env_id, crd_deploy(f, &id, &format!("d{i}")));
        let ack = wait_acked(f, &id, std::slice::from_ref(&id), Duration::from_secs(60)).remove(0);
        m.check(ack["result"] == "applied", &format!("{id} applied: {ack}"));
        took.push(arrival_to_ack(&f.sim.briefs(), &id).expect("ack and heartbeat logged"));
    }
    let worst = took.iter().cloned().fold(0.0, f64::max);
    let median_ms = median(&mut took);

    // A batch in one heartbeat answer: from that heartbeat to the last ack.
    let ids: Vec<String> = (0..plan.batch).map(|i| format!("batch-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        f.sim
            .enqueue_command(&f.env_id, crd_deploy(f, id, &format!("b{i}")));
    }
    let acks = wait_acked(f, "the batch's acks", &ids, Duration::from_secs(600));
    m.check(
        acks.iter().all(|a| a["result"] == "applied"),
        "every batch deploy applied",
    );
    let briefs = f.sim.briefs();
    let first = arrival_to_ack(&briefs, &ids[0]).unwrap();
    let first_ack = briefs
        .iter()
        .find(|b| b.path.ends_with(&format!("/commands/{}/ack", ids[0])))
        .unwrap()
        .at;
    let last_ack = ids
        .iter()
        .filter_map(|id| {
            briefs
                .iter()
                .find(|b| b.path.ends_with(&format!("/commands/{id}/ack")))
                .map(|b| b.at)
        })
        .max()
        .unwrap();
    let batch_ms = first + since(first_ack, last_ack);
    stop(&mut m);

    // The DIY loop, same commands.
    let mut diy = Diy::start(f, 0, 1);
    diy.next_cycle();
    let mut diy_took = Vec::new();
    for i in 0..plan.diy_deploys {
        let id = format!("diy-{i}");
        f.sim
            .enqueue_command(&f.env_id, crd_deploy(f, &id, &format!("x{i}")));
        let ack = wait_acked(f, &id, std::slice::from_ref(&id), Duration::from_secs(120)).remove(0);
        if ack["result"] != "applied" {
            diy.fail(&format!("{id} not applied: {ack}"));
        }
        diy_took.push(arrival_to_ack(&f.sim.briefs(), &id).unwrap());
    }
    diy.kill();
    let diy_worst = diy_took.iter().cloned().fold(0.0, f64::max);
    DeployFigures {
        median_ms,
        worst_ms: worst,
        batch_ms,
        diy_median_ms: median(&mut diy_took),
        diy_worst_ms: diy_worst,
    }
}

struct StartFigures {
    median_ms: f64,
    worst_ms: f64,
}

fn measure_starts(plan: &Plan, f: &Fixture) -> StartFigures {
    let env = manager_env(f, 15);
    let mut took = Vec::new();
    for _ in 0..plan.starts {
        let n = f.sim.heartbeat_count();
        let t0 = SystemTime::now();
        let mut m = spawn_static(f, &env);
        wait_heartbeats(f, &mut m, n + 1, Duration::from_secs(60));
        let first = heartbeats_of(&f.sim.briefs())[n].at;
        took.push(since(t0, first));
        stop(&mut m);
    }
    let worst = took.iter().cloned().fold(0.0, f64::max);
    StartFigures {
        median_ms: median(&mut took),
        worst_ms: worst,
    }
}

struct IdleFigures {
    voluntary: f64,
    involuntary: f64,
    /// Heartbeats during the traced window.
    traced: usize,
    /// What woke the loop's `poll` in it, and the scheduled lease
    /// renewals among its timeouts (from the log).
    wake: support::Wakeups,
    renewals: usize,
    /// Any other traced call (`connect`, `clone`) in it.
    others: usize,
    threads: u64,
}

fn measure_idle(plan: &Plan, f: &Fixture) -> IdleFigures {
    let mut env = manager_env(f, plan.idle_interval);
    env.insert(
        "RUST_LOG".into(),
        "info,nexo_manager::agent::lead=debug".into(),
    );
    let mut m = spawn_static(f, &env);
    let pid = m.pid();
    wait_heartbeats(f, &mut m, 2, Duration::from_secs(60));
    // The probe listener is open and answers, then is left alone.
    let probe = std::net::TcpStream::connect(m.probe_addr());
    m.check(probe.is_ok(), "the probe listener accepts connections");
    drop(probe);
    let window = Duration::from_secs(plan.idle_interval * plan.idle_intervals);

    // Context switches, without a tracer (a tracer adds its own).
    let h0 = f.sim.heartbeat_count();
    let p0 = read_proc(pid);
    std::thread::sleep(window);
    let p1 = read_proc(pid);
    let intervals = (f.sim.heartbeat_count() - h0).max(1) as f64;

    // System calls of the same kind of window, under strace.
    let trace = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("idle-{pid}.strace"));
    let mut strace = Command::new("strace")
        .args([
            "-f",
            "-qq",
            "-e",
            "trace=poll,ppoll,connect,clone,clone3",
            "-o",
        ])
        .arg(&trace)
        .arg("-p")
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run strace (install it: apt-get install strace)");
    support::wait_for(Duration::from_secs(30), "strace attached", || {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let tracer = status.lines().find_map(|l| l.strip_prefix("TracerPid:"))?;
        (tracer.trim() != "0").then_some(())
    });
    let h2 = f.sim.heartbeat_count();
    let r2 = m.stderr().matches("lease renewed on schedule").count();
    std::thread::sleep(window);
    let traced = f.sim.heartbeat_count() - h2;
    let renewals = m.stderr().matches("lease renewed on schedule").count() - r2;
    let _ = Command::new("kill")
        .args(["-INT", &strace.id().to_string()])
        .status();
    let _ = strace.wait();
    let text = std::fs::read_to_string(&trace).unwrap_or_default();
    m.check(
        !text.is_empty(),
        &format!("strace recorded nothing in {}", trace.display()),
    );
    // Completed calls only: the one in progress when strace detached is cut.
    let done: Vec<&str> = text.lines().filter(|l| l.contains(") = ")).collect();
    let polls = done.iter().filter(|l| l.contains("poll(")).count();
    let wake = support::wakeups(&done);
    stop(&mut m);
    IdleFigures {
        voluntary: (p1.voluntary - p0.voluntary) as f64 / intervals,
        involuntary: (p1.involuntary - p0.involuntary) as f64 / intervals,
        traced,
        wake,
        renewals,
        others: done.len() - polls,
        threads: p1.threads,
    }
}

struct ImageFigures {
    binary: u64,
    app_files: u64,
    base_files: u64,
    app_tar: u64,
    app_gz: u64,
    base_tar: u64,
    base_gz: u64,
}

fn measure_image() -> ImageFigures {
    let bin = static_binary();
    let out = Command::new("bash")
        .arg(bench_dir().join("tests/bench/image-size.sh"))
        .arg(&bin)
        .output()
        .expect("run tests/bench/image-size.sh");
    assert!(
        out.status.success(),
        "image-size.sh failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let get = |k: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("image-size.sh printed no {k}: {text}"))
    };
    ImageFigures {
        binary: std::fs::metadata(&bin).unwrap().len(),
        app_files: get("app_files"),
        base_files: get("base_files"),
        app_tar: get("app_tar"),
        app_gz: get("app_gz"),
        base_tar: get("base_tar"),
        base_gz: get("base_gz"),
    }
}

// ---------------------------------------------------------------- main --

// ----------------------------------------------------------------- greedy --

/// Acks posted for these ids (answered 404 when the simulator never issued
/// them, as with injected answers).
fn acks_posted(f: &Fixture, prefix: &str) -> usize {
    f.sim
        .briefs()
        .iter()
        .filter(|b| {
            b.path
                .starts_with(&format!("/api/v2/manager/commands/{prefix}"))
        })
        .count()
}

/// Peak resident memory under the greediest answers within the protocol's
/// limits, one after the other: 1,234 commands in one answer; three deploys
/// of 2 MiB each (eight ConfigMaps of 250 KB) in one answer of 6 MiB; eight
/// commands built to expand (a 256 KiB manifest of tiny objects).
fn measure_greedy(f: &Fixture) -> (u64, u64, usize) {
    let env = manager_env(f, 1);
    let mut m = spawn_static(f, &env);
    let pid = m.pid();
    wait_heartbeats(f, &mut m, 2, Duration::from_secs(60));
    let before = read_proc(pid).hwm_kb;
    let answer = |commands: Vec<Value>| FaultAction::Raw {
        status: 200,
        body: json!({"commands": commands}).to_string(),
    };
    let many: Vec<Value> = (0..1234)
        .map(|i| json!({"id": format!("g-many-{i}"), "class": "teleport", "payload": {}}))
        .collect();
    let big: Vec<Value> = (0..3)
        .map(|i| {
            let mut manifests = vec![json!({"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy",
                "metadata": {"name": format!("g{i}")},
                "spec": {"image": PROXY_IMAGE, "replicas": 1, "mongodb": {"secretRef": {"name": "db"}}}})];
            for c in 0..8 {
                manifests.push(json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": format!("g{i}-{c}")},
                    "data": {"blob": "x".repeat(250_000)}}));
            }
            json!({"id": format!("g-big-{i}"), "class": "deploy", "payload": {
                "deployment": {"name": format!("g{i}"), "namespace": f.ns.name},
                "format": "crd", "manifests": manifests}})
        })
        .collect();
    let tiny = vec![json!({}); 256 * 1024 / 3];
    let expand: Vec<Value> = (0..8)
        .map(|i| {
            json!({"id": format!("g-expand-{i}"), "class": "deploy", "payload": {
                "deployment": {"name": "e", "namespace": f.ns.name}, "format": "crd",
                "manifests": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "e"},
                               "data": {"k": tiny}}]}})
        })
        .collect();
    let answers = [
        ("g-many", many, 1000),
        ("g-big", big, 3),
        ("g-expand", expand, 8),
    ];
    let mut largest = 0;
    for (prefix, commands, acks) in answers {
        let fault = answer(commands);
        if let FaultAction::Raw { body, .. } = &fault {
            largest = largest.max(body.len());
        }
        f.sim.inject(Fault::new(Endpoint::Heartbeat, fault));
        m.wait_until(
            Duration::from_secs(600),
            &format!("{acks} acks of {prefix}"),
            || acks_posted(f, prefix) >= acks,
        );
    }
    let after = read_proc(pid);
    m.check(
        acks_posted(f, "g-many-") == 1000,
        "the first 1000 commands of the first answer, no more",
    );
    stop(&mut m);
    (before, after.hwm_kb, largest)
}

// ------------------------------------------------------------------- soak --

/// One sample of the soak.
struct Sample {
    at_min: f64,
    rss_kb: u64,
    hwm_kb: u64,
    state_bytes: u64,
}

struct SoakFigures {
    minutes: f64,
    cycles: usize,
    commands: usize,
    samples: Vec<Sample>,
    /// Least-squares slopes after the first ten minutes (the full form;
    /// the second half in the short one), KiB per hour.
    rss_slope: f64,
    hwm_slope: f64,
    state_slope: f64,
    /// Writes of the state Secret the API server accepted during the soak,
    /// from its audit log: its creation (the binding), the updates while
    /// commands came, and those of the clean stop.
    state_writes: usize,
    command_writes: usize,
    stop_writes: usize,
    /// When the ledger first held its bound of entries, minutes in.
    ledger_full_at: Option<f64>,
}

/// When the API server received each update of the state Secret in
/// `namespace` that the audit log of `bed` records from byte `mark` on (its
/// creation is counted apart: a create's audit event need not name the
/// object at the Metadata level).
fn state_updates(bed: &Path, namespace: &str, mark: u64) -> Vec<SystemTime> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(bed.join("logs/audit.log")).expect("the audit log");
    f.seek(SeekFrom::Start(mark)).expect("seek the audit log");
    let mut text = String::new();
    f.read_to_string(&mut text).expect("read the audit log");
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| {
            let r = &e["objectRef"];
            let uri = e["requestURI"].as_str().unwrap_or("");
            e["stage"] == "ResponseComplete"
                && e["responseStatus"]["code"]
                    .as_u64()
                    .is_some_and(|c| c < 300)
                && r["resource"] == "secrets"
                && r["namespace"] == namespace
                && r["subresource"].is_null()
                && !uri.contains("dryRun")
                && e["verb"] == "update"
                && r["name"] == "nexo-manager-state"
        })
        .map(|e| {
            let at = e["requestReceivedTimestamp"].as_str().unwrap_or("");
            humantime::parse_rfc3339_weak(at.trim_end_matches('Z'))
                .unwrap_or_else(|err| panic!("an audit event's time {at:?}: {err}"))
        })
        .collect()
}

fn audit_mark(bed: &Path) -> u64 {
    std::fs::metadata(bed.join("logs/audit.log")).map_or(0, |m| m.len())
}

/// The least-squares slope of `y` over `x`.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let (num, den) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| {
        (a + (x - mx) * (y - my), b + (x - mx) * (x - mx))
    });
    if den == 0.0 { 0.0 } else { num / den }
}

fn state_bytes(f: &Fixture) -> u64 {
    let secret: Value =
        f.tb.admin()
            .get(&format!(
                "/api/v1/namespaces/{}/secrets/nexo-manager-state",
                f.ns.name
            ))
            .expect("the state secret");
    secret["data"]["state.json"]
        .as_str()
        .map_or(0, |b| b.len() as u64 / 4 * 3)
}

/// Ordinary work for `plan.soak` on a test bed of its own with the audit
/// log on (`bed`), from an empty state: every cycle a deploy, a rollout of
/// every owned NexoProxy and the uninstall of the previous cycle's deploy;
/// now and then a 503 with Retry-After, failing acks and an expired
/// session. The first cycles run back to back until the ledger is full
/// (`plan.soak_fill`), the rest one every `plan.soak_cycle`. Memory and the
/// state's size are sampled every cycle; the state's writes are counted in
/// the API server's audit log.
fn measure_soak(plan: &Plan, f: &Fixture, bed: &Path) -> SoakFigures {
    grow(f, 0, plan.soak_proxies);
    let mark = audit_mark(bed);
    let env = manager_env(f, 1);
    let mut m = spawn_static(f, &env);
    let pid = m.pid();
    wait_heartbeats(f, &mut m, 2, Duration::from_secs(60));
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut cycle = 0;
    let mut ids = Vec::new();
    let mut ledger_full_at = None;
    while started.elapsed() < plan.soak {
        let cycle_start = Instant::now();
        let ns = &f.ns.name;
        let mut batch = vec![
            crd_deploy(f, &format!("soak-d{cycle}"), &format!("s{cycle}")),
            json!({"id": format!("soak-r{cycle}"), "class": "rollout", "payload": {"imageTag": format!("1.4.{}", 3 + cycle % 2)}}),
        ];
        if cycle > 0 {
            batch.push(json!({"id": format!("soak-u{cycle}"), "class": "uninstall",
                "payload": {"deployment": {"name": format!("s{}", cycle - 1), "namespace": ns}}}));
        }
        if cycle % 7 == 3 {
            f.sim.inject(Fault::new(
                Endpoint::Heartbeat,
                FaultAction::Status {
                    status: 503,
                    code: "unavailable".into(),
                    message: "maintenance".into(),
                    retry_after: Some("1".into()),
                },
            ));
        }
        if cycle % 11 == 5 {
            f.sim.inject(
                Fault::new(
                    Endpoint::Ack,
                    FaultAction::Status {
                        status: 500,
                        code: "internal".into(),
                        message: "boom".into(),
                        retry_after: None,
                    },
                )
                .times(2),
            );
        }
        if cycle % 13 == 7 {
            f.sim.expire_sessions();
        }
        let these: Vec<String> = batch
            .iter()
            .map(|c| c["id"].as_str().expect("an id").to_owned())
            .collect();
        for c in batch {
            f.sim.enqueue_command(&f.env_id, c);
        }
        let acks = wait_acked(f, "the soak's acks", &these, Duration::from_secs(300));
        for ack in &acks {
            m.check(ack["result"] == "applied", &format!("applied: {ack}"));
        }
        ids.extend(these);
        let p = read_proc(pid);
        samples.push(Sample {
            at_min: started.elapsed().as_secs_f64() / 60.0,
            rss_kb: p.rss_kb,
            hwm_kb: p.hwm_kb,
            state_bytes: state_bytes(f),
        });
        cycle += 1;
        let filling = ids.len() < nexo_manager::state::LEDGER_MIN;
        if !filling && ledger_full_at.is_none() {
            ledger_full_at = Some(started.elapsed().as_secs_f64() / 60.0);
        }
        if filling && started.elapsed() < plan.soak_fill {
            continue;
        }
        if let Some(rest) = plan.soak_cycle.checked_sub(cycle_start.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    // Nothing leaked: the proxies grown, plus the last deploy's.
    let listed: Value =
        f.tb.admin()
            .get(&format!(
                "/apis/nexo.io/v1alpha1/namespaces/{}/nexoproxies",
                f.ns.name
            ))
            .expect("list");
    let proxies = listed["items"].as_array().map_or(0, Vec::len);
    m.check(
        proxies == plan.soak_proxies + 1,
        &format!(
            "{proxies} NexoProxies left, {} expected",
            plan.soak_proxies + 1
        ),
    );
    let stopping = SystemTime::now();
    stop(&mut m);
    let updates = state_updates(bed, &f.ns.name, mark);
    let command_writes = updates.iter().filter(|&&at| at < stopping).count();
    let stop_writes = updates.len() - command_writes;
    // The soak starts from no state Secret: the Manager created it once.
    let state_writes = updates.len() + 1;
    // Flat after the first ten minutes (the short form: its second half).
    let half: Vec<&Sample> = if plan.full {
        samples.iter().filter(|s| s.at_min >= 10.0).collect()
    } else {
        samples.iter().skip(samples.len() / 2).collect()
    };
    let per_hour = |y: &dyn Fn(&Sample) -> f64| {
        slope(&half.iter().map(|s| (s.at_min, y(s))).collect::<Vec<_>>()) * 60.0
    };
    SoakFigures {
        minutes: started.elapsed().as_secs_f64() / 60.0,
        cycles: cycle,
        commands: ids.len(),
        rss_slope: per_hour(&|s| s.rss_kb as f64),
        hwm_slope: per_hour(&|s| s.hwm_kb as f64),
        state_slope: per_hour(&|s| s.state_bytes as f64 / 1024.0),
        samples,
        state_writes,
        command_writes,
        stop_writes,
        ledger_full_at,
    }
}

fn main() {
    let plan = Plan::from_args();
    if !common::names_any(&plan.only, common::FOOTPRINT_PARTS) {
        eprintln!("bench: footprint not run (--only names none of its parts)");
        return;
    }
    let started = Instant::now();
    let hz = ticks_per_second();
    let bin = static_binary();
    eprintln!(
        "bench: {} form, binary {}",
        if plan.full { "full" } else { "short" },
        bin.display()
    );
    let mut rows = Vec::new();
    let mut keep = Vec::new();

    if plan.runs("image") {
        let img = measure_image();
        rows.push(row(
            "binary, stripped static",
            mib(img.binary),
            "—".into(),
            "".into(),
            "≤ 3 MiB",
            "`stat -c %s` of the binary",
        ));
        rows.push(row(
            "image on distroless static, unpacked",
            format!(
                "{} (base {} + app {})",
                mib(img.base_files + img.app_files),
                mib(img.base_files),
                mib(img.app_files)
            ),
            "—".into(),
            "".into(),
            "≤ 5 MiB",
            "`tests/bench/image-size.sh`: sum of file sizes; base rebuilt from Debian 12 packages",
        ));
        rows.push(row(
            "image, layers as uncompressed tar",
            format!(
                "{} (base {} + app {})",
                mib(img.base_tar + img.app_tar),
                mib(img.base_tar),
                mib(img.app_tar)
            ),
            "—".into(),
            "".into(),
            "",
            "`tar` of each layer (512-byte blocks)",
        ));
        rows.push(row(
            "image, gzip-compressed (pulled bytes)",
            format!(
                "{} (base {} + app {})",
                mib(img.base_gz + img.app_gz),
                mib(img.base_gz),
                mib(img.app_gz)
            ),
            "—".into(),
            "".into(),
            "",
            "`gzip -9` of each layer",
        ));
    }
    if plan.runs("sizes") {
        let f = keep_fixture(&mut keep, "bench-size");
        let mut have = 0;
        let mut sizes = Vec::new();
        for &size in &plan.sizes {
            grow(f, have, size);
            have = size;
            let s = measure_size(&plan, f, size, hz);
            eprintln!(
                "bench: {size} proxies: ours RSS {} kB, HWM {} kB, CPU/heartbeat median {:.3} ms, mean {:.3} ms, body {} B; DIY {} kB, {:.1} ms/cycle",
                s.rss_kb, s.hwm_kb, s.cpu_median_ms, s.cpu_ms, s.body, s.diy_rss_kb, s.diy_cpu_ms
            );
            eprintln!(
                "bench: {size} proxies, CP confirming: CPU/heartbeat median {:.3} ms, mean {:.3} ms, RSS {} kB; body at rest {} B, after one change {} B",
                s.delta.cpu_median_ms,
                s.delta.cpu_ms,
                s.delta.rss_kb,
                s.delta.body_rest,
                s.delta.body_changed
            );
            sizes.push(s);
        }
        for s in &sizes {
            rows.push(row(
                &format!("{} proxies: resident memory", s.size),
                format!("{} steady, {} peak", kib(s.rss_kb), kib(s.hwm_kb)),
                format!("{} (largest process)", kib(s.diy_rss_kb)),
                ratio(s.diy_rss_kb as f64, s.hwm_kb as f64),
                match s.size {
                    100 => "≤ 4 MiB",
                    10_000 => "≤ 8 MiB",
                    _ => "",
                },
                "VmRSS, VmHWM; DIY: `wait4` ru_maxrss",
            ));
            rows.push(row(
                &format!("{} proxies: CPU per heartbeat cycle", s.size),
                format!(
                "median {:.3} ms, mean {:.3} ms ({:.1} ms in ticks)",
                s.cpu_median_ms, s.cpu_ms, s.tick_ms
            ),
                format!("{:.0} ms", s.diy_cpu_ms),
                ratio(s.diy_cpu_ms, s.cpu_median_ms),
                if s.size == 100 { "≤ 2 ms" } else { "" },
                &format!(
                    "`/proc/PID/schedstat` at each of {} heartbeats; DIY: utime+stime+cutime+cstime over {}",
                    plan.cycles, plan.diy_cycles
                ),
            ));
            rows.push(row(
                &format!("{} proxies: heartbeat request body", s.size),
                format!("{} B", s.body),
                "".into(),
                "".into(),
                "",
                "simulator request log; a CP that never confirms (version 2)",
            ));
            let d = &s.delta;
            rows.push(row(
                &format!("{} proxies, CP confirming: CPU per heartbeat at rest", s.size),
                format!("median {:.3} ms, mean {:.3} ms; {} resident", d.cpu_median_ms, d.cpu_ms, kib(d.rss_kb)),
                "".into(),
                "".into(),
                match s.size {
                    100 => "≤ 0.3 ms",
                    10_000 => "≤ 1 ms",
                    _ => "",
                },
                "`/proc/PID/schedstat`, the same Manager after the simulator confirms (`inventory.delta.v1`)",
            ));
            rows.push(row(
                &format!(
                    "{} proxies, CP confirming: heartbeat body at rest / after one change",
                    s.size
                ),
                format!("{} B / {} B", d.body_rest, d.body_changed),
                "".into(),
                "".into(),
                "≤ 2 KiB / ≤ 4 KiB",
                "compact JSON of the heartbeat the simulator received",
            ));
            rows.push(row(
                &format!("{} proxies: TLS handshakes with the CP", s.size),
                format!(
                    "{} for {} heartbeats; {} sockets held",
                    s.cp_handshakes,
                    plan.cycles + 3,
                    s.sockets
                ),
                format!("{:.1} per cycle", s.diy_handshakes),
                "".into(),
                "reused",
                "simulator accepted connections; `/proc/PID/fd` socket inodes",
            ));
        }
    }
    if plan.runs("start") {
        let starts = measure_starts(&plan, keep_fixture(&mut keep, "bench-start"));
        rows.push(row(
            "start to first heartbeat",
            format!(
                "median {:.1} ms, worst {:.1} ms of {}",
                starts.median_ms, starts.worst_ms, plan.starts
            ),
            "—".into(),
            "".into(),
            "",
            "spawn to the simulator's arrival time",
        ));
    }
    if plan.runs("idle") {
        let holding = nexo_cpsim::SimConfig {
            hold: true,
            ..nexo_cpsim::SimConfig::default()
        };
        let idle = measure_idle(&plan, keep_fixture_with(&mut keep, "bench-idle", holding));
        let w = idle.wake;
        rows.push(row(
            "idle: wake-ups of the loop, by cause",
            format!(
                "{} heartbeats: {} held answers returning, {} timers ({} lease renewals), {} watch events or bookmarks, {} other",
                idle.traced,
                w.answers,
                w.timeouts,
                idle.renewals,
                w.watch_events,
                w.other
            ),
            "—".into(),
            "".into(),
            "only these",
            &format!(
                "`strace -f -e poll,ppoll` of the loop's poll over {} intervals of {} s, a holding CP, probes on and not called",
                plan.idle_intervals, plan.idle_interval
            ),
        ));
        rows.push(row(
            "idle: context switches per interval",
            format!(
                "{:.1} voluntary + {:.1} involuntary",
                idle.voluntary, idle.involuntary
            ),
            "—".into(),
            "".into(),
            "",
            "`/proc/PID/status`; includes the heartbeat's own socket reads",
        ));
        rows.push(row(
            "idle: new connections or threads; threads",
            format!(
                "{} `connect`/`clone` calls in {} heartbeats; {} thread",
                idle.others, idle.traced, idle.threads
            ),
            "—".into(),
            "".into(),
            "0; 1",
            "`strace -e connect,clone`; `/proc/PID/status` Threads",
        ));
    }
    if plan.runs("deploy") {
        let deploys = measure_deploys(&plan, keep_fixture(&mut keep, "bench-deploy"));
        rows.push(row(
            "command arrival to ack, three-object deploy",
            format!(
                "median {:.1} ms, worst {:.1} ms of {}",
                deploys.median_ms, deploys.worst_ms, plan.deploys
            ),
            format!(
                "median {:.1} ms, worst {:.1} ms of {}",
                deploys.diy_median_ms, deploys.diy_worst_ms, plan.diy_deploys
            ),
            ratio(deploys.diy_median_ms, deploys.median_ms),
            "",
            "simulator arrival times: heartbeat answered → ack",
        ));
        rows.push(row(
            &format!("{} deploys in one heartbeat answer", plan.batch),
            format!(
                "{:.2} s ({:.1} ms each)",
                deploys.batch_ms / 1000.0,
                deploys.batch_ms / plan.batch as f64
            ),
            "—".into(),
            "".into(),
            "",
            "heartbeat answered → last ack",
        ));
    }
    if plan.runs("greedy") {
        let (before, peak, largest) = measure_greedy(keep_fixture(&mut keep, "bench-greedy"));
        rows.push(row(
            "greediest answers: peak resident memory",
            format!(
                "{} peak (VmHWM {} before them)",
                kib(peak),
                kib(before)
            ),
            "—".into(),
            "".into(),
            "≤ 24 MiB",
            &format!(
                "VmHWM after, in turn: 1,234 commands in one answer; three 2 MiB deploys (eight 250 KB ConfigMaps each) in one answer of {:.1} MiB; eight commands built to expand (256 KiB of `{{}}`)",
                largest as f64 / (1 << 20) as f64
            ),
        ));
    }
    if plan.runs("latency") {
        let holding = nexo_cpsim::SimConfig {
            hold: true,
            ..nexo_cpsim::SimConfig::default()
        };
        let mut runs = Vec::new();
        if let Some(before) = std::env::var_os("NEXO_BEFORE_BINARY") {
            let before = PathBuf::from(before);
            let f = keep_fixture(&mut keep, "bench-lat-before");
            runs.push((
                "before (0.3.0, no held heartbeat), any CP",
                measure_latency(&plan, f, &before, "before"),
            ));
        }
        let f = keep_fixture(&mut keep, "bench-lat-never");
        runs.push((
            "a CP that never holds",
            measure_latency(&plan, f, &bin, "never"),
        ));
        let f = keep_fixture_with(&mut keep, "bench-lat-hold", holding);
        runs.push(("a holding CP", measure_latency(&plan, f, &bin, "hold")));
        for (what, l) in runs {
            eprintln!(
                "bench: latency, {what}: median {:.0} ms, worst {:.0} ms of {}",
                l.median_ms, l.worst_ms, l.n
            );
            rows.push(row(
                &format!("command latency, {what}"),
                format!("median {:.0} ms, worst {:.0} ms of {}", l.median_ms, l.worst_ms, l.n),
                "—".into(),
                "".into(),
                if what.starts_with("a holding") { "median ≤ 250 ms" } else { "" },
                &format!(
                    "a three-object deploy queued in the simulator to its ack's arrival, one at a time; interval {} s",
                    plan.latency_interval
                ),
            ));
        }
    }
    if plan.runs("rest") {
        let mut runs = Vec::new();
        // NEXO_BEFORE_LABEL names the binary NEXO_BEFORE_BINARY is (a
        // commit, a release).
        let label =
            std::env::var("NEXO_BEFORE_LABEL").unwrap_or_else(|_| "the other binary".into());
        if let Some(before) = std::env::var_os("NEXO_BEFORE_BINARY") {
            runs.push((
                format!("before ({label})"),
                measure_rest(&plan, &PathBuf::from(before)),
            ));
        }
        runs.push(("now".to_owned(), measure_rest(&plan, &bin)));
        for (what, (per_minute, detail)) in runs {
            eprintln!("bench: at rest, {what}: {per_minute:.2} requests a minute ({detail})");
            rows.push(row(
                &format!("API server requests a minute at rest, {what}"),
                format!("{per_minute:.2} ({detail})"),
                "—".into(),
                "".into(),
                "≤ 4",
                &format!(
                    "audit log of a test bed of its own over {:.0} min after the first drift check, 100 owned NexoProxies, interval 15 s, requests whose User-Agent is the Manager's",
                    plan.rest.as_secs_f64() / 60.0
                ),
            ));
        }
    }
    if plan.runs("drift") {
        // A test bed of its own, with the audit log: the checks' bill.
        let bed = support::OwnBed::start("drift-tb", &["--audit"]);
        let f = Fixture::on(bed.tb, "bench-drift", nexo_cpsim::SimConfig::default());
        f.tb.install_crds();
        let mut have = 0;
        for &size in &plan.drift_sizes {
            grow(&f, have, size);
            record_drift(&f, have, size);
            have = size;
            let d = measure_drift(&plan, &f, &bed.dir, size);
            eprintln!(
                "bench: drift check at {size}: CPU {:.1} ms, wall {:.1} ms, HWM {} kB (without checks {} kB), {:.1} requests ({})",
                d.cpu_ms, d.wall_ms, d.hwm_kb, d.hwm_kb_without, d.requests, d.bill
            );
            rows.push(row(
                &format!("drift check at {} deployments: CPU, wall", d.size),
                format!("{:.1} ms CPU, {:.1} ms wall", d.cpu_ms, d.wall_ms),
                "—".into(),
                "".into(),
                "",
                &format!(
                    "one NexoProxy and its record each, mode report, nothing drifted; CPU of a cycle with a check less one without (heartbeat interval 2 s), mean of {} checks; wall from `nexo_manager_drift_check_seconds_total`",
                    plan.drift_checks
                ),
            ));
            rows.push(row(
                &format!("drift check at {} deployments: peak memory", d.size),
                format!("{} (without checks {})", kib(d.hwm_kb), kib(d.hwm_kb_without)),
                "—".into(),
                "".into(),
                "",
                "VmHWM of the process after the checks, and of the same run with NEXO_DRIFT_INTERVAL=24h",
            ));
            rows.push(row(
                &format!("drift check at {} deployments: API server requests", d.size),
                format!("{:.1} a check ({})", d.requests, d.bill),
                "—".into(),
                "".into(),
                "one list per kind and namespace",
                "audit log of a test bed of its own, the Manager's requests during the checks (watches and lease renewals left out), per check; lists are paged by 500",
            ));
        }
    }
    if plan.runs("soak") {
        // A test bed of its own, with the audit log: the state's writes.
        let bed = support::OwnBed::start("soak-tb", &["--audit"]);
        let f = Fixture::on(bed.tb, "bench-soak", nexo_cpsim::SimConfig::default());
        f.tb.install_crds();
        let soak = measure_soak(&plan, &f, &bed.dir);
        let (first, last) = (&soak.samples[0], &soak.samples[soak.samples.len() - 1]);
        let max_state = soak
            .samples
            .iter()
            .map(|s| s.state_bytes)
            .max()
            .unwrap_or(0);
        let how = format!(
            "{} cycles, one every {} s once the ledger is full ({}): a deploy, a rollout of all {}+ owned NexoProxies, an uninstall; 503 + Retry-After every 7th, two failed acks every 11th, an expired session every 13th; from an empty state, on a test bed of its own (audit log on); slope: least squares {}",
            soak.cycles,
            plan.soak_cycle.as_secs(),
            match soak.ledger_full_at {
                Some(at) if plan.full =>
                    format!("the first cycles back to back, full at minute {at:.1}"),
                Some(at) => format!("full at minute {at:.1}"),
                None => "never full in this run".to_owned(),
            },
            plan.soak_proxies,
            if plan.full {
                "after the first 10 minutes"
            } else {
                "over the second half"
            }
        );
        rows.push(row(
            &format!(
                "soak, {:.0} min, {} commands: resident memory",
                soak.minutes, soak.commands
            ),
            format!(
                "{} → {}, slope {:+.0} KiB/h",
                kib(first.rss_kb),
                kib(last.rss_kb),
                soak.rss_slope
            ),
            "—".into(),
            "".into(),
            "flat",
            &how,
        ));
        rows.push(row(
            "soak: peak resident memory",
            format!(
                "{} → {}, slope {:+.0} KiB/h",
                kib(first.hwm_kb),
                kib(last.hwm_kb),
                soak.hwm_slope
            ),
            "—".into(),
            "".into(),
            "flat",
            "VmHWM at each cycle",
        ));
        rows.push(row(
            "soak: state Secret",
            format!(
                "{:.0} KiB → {:.0} KiB (largest {:.0} KiB), slope {:+.1} KiB/h",
                first.state_bytes as f64 / 1024.0,
                last.state_bytes as f64 / 1024.0,
                max_state as f64 / 1024.0,
                soak.state_slope
            ),
            "—".into(),
            "".into(),
            "< 64 KiB",
            "size of `state.json` at each cycle",
        ));
        rows.push(row(
            "soak: state writes per command",
            format!(
                "{:.2} ({} writes for {} commands; besides, {} at the binding and {} at the clean stop)",
                soak.command_writes as f64 / soak.commands.max(1) as f64,
                soak.command_writes,
                soak.commands,
                soak.state_writes - soak.command_writes - soak.stop_writes,
                soak.stop_writes,
            ),
            "—".into(),
            "".into(),
            "≤ 1",
            "updates of the state Secret from the API server's audit log while commands came; its creation (the binding) and the clean stop's flush of delivery flags counted apart",
        ));
        assert!(
            max_state as usize <= nexo_manager::state::STATE_BUDGET,
            "the state passed its budget: {max_state} bytes"
        );
    }
    let table = render(&rows);
    let version = &support::testbed().version;
    let date = humantime::format_rfc3339_seconds(SystemTime::now());
    let header = format!(
        "Run of {date} on {}; Kubernetes {version} (the test bed); binary {}; {} form, {:.0} s.\n",
        machine(),
        bin.file_name().unwrap().to_string_lossy(),
        if plan.full { "full" } else { "short" },
        started.elapsed().as_secs_f64()
    );
    println!("\n{header}\n{table}");
    let out = if plan.full && plan.only.is_none() {
        bench_dir().join("BENCHMARKS.md")
    } else {
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("BENCHMARKS-short.md")
    };
    write_report(&out, &format!("{header}\n{table}"));
    eprintln!("bench: wrote {}", out.display());
}

const BEGIN: &str = "<!-- bench:begin (written by tests/bench/footprint.rs) -->";
const END: &str = "<!-- bench:end -->";

/// Replaces the generated part of `path` (between the markers), keeping
/// the analysis around it; a new file gets the markers alone.
fn write_report(path: &Path, generated: &str) {
    common::write_section(path, BEGIN, END, generated);
}
