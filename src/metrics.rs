//! The counters the clients and the command handler feed, and the
//! process metrics Prometheus users expect of any process, for `/metrics`.
//!
//! The process has one thread, so the registry is a thread-local: the CP
//! and Kubernetes clients count their requests without being handed the
//! loop's `Status`. Label values are a closed set (endpoint names, verbs,
//! status codes, command classes, refusal reasons), so the registry's size
//! is bounded whatever the peers send.

use std::cell::RefCell;
use std::fmt::{self, Write as _};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Upper bounds of the command duration histogram's buckets: milliseconds,
/// and the `le` label of each. Integers only: the binary carries no float
/// formatting for this.
pub const DURATION_BUCKETS: [(u64, &str); 10] = [
    (50, "0.05"),
    (100, "0.1"),
    (250, "0.25"),
    (500, "0.5"),
    (1_000, "1"),
    (2_500, "2.5"),
    (5_000, "5"),
    (10_000, "10"),
    (30_000, "30"),
    (60_000, "60"),
];

#[derive(Debug, Default)]
struct Histogram {
    buckets: [u64; DURATION_BUCKETS.len()],
    count: u64,
    sum_us: u64,
}

/// `n` thousandths (or millionths, `places` 6) as a decimal.
fn decimal(n: u64, places: u32) -> String {
    let unit = 10u64.pow(places);
    format!("{}.{:0width$}", n / unit, n % unit, width = places as usize)
}

#[derive(Debug, Default)]
struct Registry {
    /// (peer, endpoint or verb, status code; 0: no answer) → requests.
    requests: Vec<((&'static str, &'static str, u16), u64)>,
    retry_after_waits: u64,
    retry_after_ms: u64,
    durations: Vec<(&'static str, Histogram)>,
    refused: Vec<(&'static str, u64)>,
    skipped_commands: u64,
    state_write_failures: u64,
    state_writes: u64,
    events_written: u64,
    events_dropped: Vec<(&'static str, u64)>,
    /// Deployments reported, by phase (the last heartbeat's).
    phases: Vec<(&'static str, u64)>,
    drift_checks: u64,
    drift_check_us: u64,
    /// (mode, action) → drifted objects.
    drifted: Vec<((&'static str, &'static str), u64)>,
    /// Rollbacks by result ([`ROLLBACK_RESULTS`]).
    rollbacks: [u64; 3],
}

/// The results a rollback is counted by: restored, a restore that failed,
/// nothing recorded to restore.
pub const ROLLBACK_RESULTS: [&str; 3] = ["rolled_back", "failed", "nothing_to_restore"];

// The label values each labelled counter knows: their series are present
// at zero from the start (agent.md, "Operating it"), so that an alert on a
// rate has a series before the first increment. `Refusal::reason`,
// `Dropped` and drift's `Mode` and `Action` check their lists in their
// tests; the command classes are those `commands::validate` accepts.

/// `nexo_manager_commands_refused_total`'s reasons (`Refusal::reason`).
pub const REFUSAL_REASONS: [&str; 9] = [
    "no_id",
    "unsupported_class",
    "unsupported_capability",
    "too_large",
    "invalid_payload",
    "signature",
    "policy",
    "ownership",
    "downgrade",
];
/// `nexo_manager_events_dropped_total`'s causes (`events::Dropped`).
pub const EVENT_DROP_CAUSES: [&str; 3] = ["queue_full", "denied", "error"];
/// `nexo_manager_drifted_objects_total`'s modes (drift's `Mode`).
pub const DRIFT_MODES: [&str; 2] = ["report", "enforce"];
/// `nexo_manager_drifted_objects_total`'s actions (drift's `Action`).
pub const DRIFT_ACTIONS: [&str; 4] = ["reported", "corrected", "recreated", "failed"];
/// `nexo_manager_commands_total`'s classes (`Command::class`, and
/// `invalid` for a command refused before it had one).
pub const COMMAND_CLASSES: [&str; 6] = [
    "deploy",
    "rollout",
    "upgrade",
    "uninstall",
    "plan",
    "invalid",
];
/// `nexo_manager_commands_total`'s results.
pub const COMMAND_RESULTS: [&str; 2] = ["applied", "failed"];

/// `have`'s counts for every `known` key first (zero when not counted
/// yet), then what else `have` holds.
pub fn with_known<K: PartialEq + Copy>(
    known: impl IntoIterator<Item = K>,
    have: &[(K, u64)],
) -> Vec<(K, u64)> {
    let mut out: Vec<(K, u64)> = known
        .into_iter()
        .map(|k| (k, have.iter().find(|(h, _)| *h == k).map_or(0, |(_, n)| *n)))
        .collect();
    for (k, n) in have {
        if !out.iter().any(|(o, _)| o == k) {
            out.push((*k, *n));
        }
    }
    out
}

thread_local! {
    static REGISTRY: RefCell<Registry> = RefCell::new(Registry::default());
    static STARTED: SystemTime = SystemTime::now();
}

fn bump<K: PartialEq>(list: &mut Vec<(K, u64)>, key: K) {
    match list.iter_mut().find(|(k, _)| *k == key) {
        Some((_, n)) => *n += 1,
        None => list.push((key, 1)),
    }
}

/// Notes the process start (call once, early in `main`).
pub fn started() {
    STARTED.with(|_| ());
}

/// Counts one request to `peer` (`cp` or `kubernetes`): its endpoint or
/// verb, and the status code (`None`: no answer).
pub fn request(peer: &'static str, endpoint: &'static str, status: Option<u16>) {
    let code = status.unwrap_or(0);
    REGISTRY.with(|r| bump(&mut r.borrow_mut().requests, (peer, endpoint, code)));
}

/// Counts one wait that a `Retry-After` header decided.
pub fn retry_after(wait: Duration) {
    REGISTRY.with(|r| {
        let mut r = r.borrow_mut();
        r.retry_after_waits += 1;
        r.retry_after_ms += u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
    });
}

/// Records how long a command of `class` took, from parse to ack.
pub fn command_duration(class: &'static str, took: Duration) {
    let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
    REGISTRY.with(|r| {
        let mut r = r.borrow_mut();
        let h = match r.durations.iter().position(|(c, _)| *c == class) {
            Some(i) => &mut r.durations[i].1,
            None => {
                r.durations.push((class, Histogram::default()));
                let last = r.durations.len() - 1;
                &mut r.durations[last].1
            }
        };
        for (bucket, (bound_ms, _)) in h.buckets.iter_mut().zip(DURATION_BUCKETS) {
            if us <= bound_ms * 1000 {
                *bucket += 1;
            }
        }
        h.count += 1;
        h.sum_us = h.sum_us.saturating_add(us);
    });
}

/// Counts a command refused before it ran, by reason.
pub fn refused(reason: &'static str) {
    REGISTRY.with(|r| bump(&mut r.borrow_mut().refused, reason));
}

/// Counts commands of an answer skipped past the per-answer limit.
pub fn skipped_commands(n: usize) {
    REGISTRY.with(|r| r.borrow_mut().skipped_commands += n as u64);
}

/// Counts a state Secret write the API server accepted.
pub fn state_written() {
    REGISTRY.with(|r| r.borrow_mut().state_writes += 1);
}

/// Counts a state write that failed after its retries.
pub fn state_write_failed() {
    REGISTRY.with(|r| r.borrow_mut().state_write_failures += 1);
}

/// Counts an Event the API server took (a creation or a series update).
pub fn event_written() {
    REGISTRY.with(|r| r.borrow_mut().events_written += 1);
}

/// Counts an Event not written, by cause (`queue_full`, `denied`, `error`).
pub fn event_dropped(cause: &'static str) {
    REGISTRY.with(|r| bump(&mut r.borrow_mut().events_dropped, cause));
}

/// The deployments the last heartbeat reported, by phase (every phase
/// listed, zeros too).
pub fn deployments_by_phase(counts: &[(&'static str, u64)]) {
    REGISTRY.with(|r| r.borrow_mut().phases = counts.to_vec());
}

/// Counts a drift check and its duration.
pub fn drift_checked(took: Duration) {
    REGISTRY.with(|r| {
        let mut r = r.borrow_mut();
        r.drift_checks += 1;
        r.drift_check_us = r
            .drift_check_us
            .saturating_add(u64::try_from(took.as_micros()).unwrap_or(u64::MAX));
    });
}

/// Counts a drifted object a check found, by mode and action.
pub fn drifted(mode: &'static str, action: &'static str) {
    REGISTRY.with(|r| bump(&mut r.borrow_mut().drifted, (mode, action)));
}

/// Counts a rollback by its result, one of [`ROLLBACK_RESULTS`].
pub fn rolled_back(result: &'static str) {
    if let Some(i) = ROLLBACK_RESULTS.iter().position(|r| *r == result) {
        REGISTRY.with(|r| r.borrow_mut().rollbacks[i] += 1);
    }
}

/// What `/proc/self` says about this process.
#[derive(Debug, Default, PartialEq)]
pub struct ProcessStats {
    /// Resident set, bytes.
    pub resident_bytes: u64,
    /// Virtual memory, bytes.
    pub virtual_bytes: u64,
    /// User plus system CPU time, 1/100 s.
    pub cpu_ticks: u64,
    /// Open file descriptors.
    pub open_fds: u64,
}

/// Parses `/proc/self/status` (`VmRSS`, `VmSize`, kB) and the utime and
/// stime fields of `/proc/self/stat` (clock ticks of 1/100 s, Linux's
/// `USER_HZ` on every architecture it exports).
pub fn parse_proc(status: &str, stat: &str) -> ProcessStats {
    let kb = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |v| v * 1024)
    };
    // The command name (field 2) may hold spaces; fields count from after ")".
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // After ")": state is field 3, so utime (14) and stime (15) are at 11 and 12.
    ProcessStats {
        resident_bytes: kb("VmRSS:"),
        virtual_bytes: kb("VmSize:"),
        cpu_ticks: ticks(11) + ticks(12),
        open_fds: 0,
    }
}

fn process_stats() -> ProcessStats {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let mut stats = parse_proc(&status, &stat);
    stats.open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
    stats
}

/// A metric family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Type {
    Counter,
    Gauge,
    Histogram,
}

impl Type {
    fn as_str(self) -> &'static str {
        match self {
            Type::Counter => "counter",
            Type::Gauge => "gauge",
            Type::Histogram => "histogram",
        }
    }
}

/// The `/metrics` text (exposition format 0.0.4) as it is written: the one
/// writer of it, for the registry's families and the probes' alike. Label
/// values are escaped here (`\`, `"`, a newline), whatever their source.
#[derive(Debug, Default)]
pub struct Exposition(String);

impl Exposition {
    /// A family's `# HELP` and `# TYPE` lines.
    pub fn header(&mut self, name: &str, kind: Type, help: &str) {
        let _ = writeln!(
            self.0,
            "# HELP {name} {help}\n# TYPE {name} {}",
            kind.as_str()
        );
    }

    /// One sample: `name{k="v",…} value` (no braces without labels).
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl fmt::Display) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let _ = write!(self.0, "{k}=\"{}\"", escape(v));
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {value}");
    }

    /// A family of one unlabelled sample.
    pub fn single(&mut self, name: &str, kind: Type, help: &str, value: impl fmt::Display) {
        self.header(name, kind, help);
        self.sample(name, &[], value);
    }

    /// One histogram series of `name` with `labels`: a `_bucket` line per
    /// bound and `+Inf`, then `_sum` and `_count`.
    fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &Histogram) {
        let bucket = format!("{name}_bucket");
        let bounds = DURATION_BUCKETS.iter().map(|(_, le)| *le).chain(["+Inf"]);
        let counts = h.buckets.iter().copied().chain([h.count]);
        for (le, n) in bounds.zip(counts) {
            let mut with_le = labels.to_vec();
            with_le.push(("le", le));
            self.sample(&bucket, &with_le, n);
        }
        self.sample(&format!("{name}_sum"), labels, decimal(h.sum_us, 6));
        self.sample(&format!("{name}_count"), labels, h.count);
    }

    /// The text.
    pub fn into_string(self) -> String {
        self.0
    }
}

/// A label value as the exposition format quotes it.
fn escape(v: &str) -> std::borrow::Cow<'_, str> {
    if v.contains(['\\', '"', '\n']) {
        v.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
            .into()
    } else {
        v.into()
    }
}

/// Writes the registry's and the process's metrics: one block per metric
/// family, long and flat on purpose.
pub fn render(out: &mut Exposition) {
    let p = process_stats();
    out.single(
        "process_resident_memory_bytes",
        Type::Gauge,
        "Resident memory size in bytes.",
        p.resident_bytes,
    );
    out.single(
        "process_virtual_memory_bytes",
        Type::Gauge,
        "Virtual memory size in bytes.",
        p.virtual_bytes,
    );
    out.single(
        "process_cpu_seconds_total",
        Type::Counter,
        "Total user and system CPU time spent in seconds.",
        decimal(p.cpu_ticks, 2),
    );
    out.single(
        "process_open_fds",
        Type::Gauge,
        "Number of open file descriptors.",
        p.open_fds,
    );
    let start = STARTED
        .with(|s| s.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(0));
    out.single(
        "process_start_time_seconds",
        Type::Gauge,
        "Start time of the process since unix epoch in seconds.",
        decimal(start, 3),
    );
    REGISTRY.with(|r| {
        let r = r.borrow();
        for (peer, name, help) in [
            (
                "cp",
                "nexo_manager_cp_requests_total",
                "Control Plane requests, by endpoint and status code (error: no answer).",
            ),
            (
                "kubernetes",
                "nexo_manager_kubernetes_requests_total",
                "Kubernetes API requests, by verb and status code (error: no answer).",
            ),
        ] {
            out.header(name, Type::Counter, help);
            let label = if peer == "cp" { "endpoint" } else { "verb" };
            for ((_, endpoint, code), n) in r.requests.iter().filter(|((p, _, _), _)| *p == peer) {
                let code = match code {
                    0 => "error".to_owned(),
                    c => c.to_string(),
                };
                out.sample(name, &[(label, endpoint), ("code", &code)], n);
            }
        }
        out.single(
            "nexo_manager_retry_after_waits_total",
            Type::Counter,
            "Waits decided by a Retry-After header (Control Plane or Kubernetes).",
            r.retry_after_waits,
        );
        out.single(
            "nexo_manager_retry_after_wait_seconds_total",
            Type::Counter,
            "Time spent in those waits, seconds.",
            decimal(r.retry_after_ms, 3),
        );
        let duration = "nexo_manager_command_duration_seconds";
        out.header(
            duration,
            Type::Histogram,
            "Time from a command's arrival to its ack, by class.",
        );
        // Each known class at zero first (as the labelled counters), then
        // any other class a command was counted under.
        let zero = Histogram::default();
        for class in COMMAND_CLASSES {
            let h = r.durations.iter().find(|(c, _)| *c == class);
            out.histogram(duration, &[("class", class)], h.map_or(&zero, |(_, h)| h));
        }
        for (class, h) in r.durations.iter().filter(|(c, _)| !COMMAND_CLASSES.contains(c)) {
            out.histogram(duration, &[("class", class)], h);
        }
        let refused = "nexo_manager_commands_refused_total";
        out.header(
            refused,
            Type::Counter,
            "Commands refused before they ran, by reason.",
        );
        for (reason, n) in with_known(REFUSAL_REASONS, &r.refused) {
            out.sample(refused, &[("reason", reason)], n);
        }
        out.single(
            "nexo_manager_commands_skipped_total",
            Type::Counter,
            "Commands of an answer past the per-answer limit, skipped unacknowledged.",
            r.skipped_commands,
        );
        out.single(
            "nexo_manager_state_writes_total",
            Type::Counter,
            "State Secret writes the API server accepted (one per finished command, or fewer).",
            r.state_writes,
        );
        out.single(
            "nexo_manager_state_write_failures_total",
            Type::Counter,
            "State Secret writes that failed after their retries.",
            r.state_write_failures,
        );
        out.single(
            "nexo_manager_events_written_total",
            Type::Counter,
            "Kubernetes Events written (creations and series updates).",
            r.events_written,
        );
        let dropped = "nexo_manager_events_dropped_total";
        out.header(
            dropped,
            Type::Counter,
            "Kubernetes Events not written, by cause (queue_full, denied, error).",
        );
        for (cause, n) in with_known(EVENT_DROP_CAUSES, &r.events_dropped) {
            out.sample(dropped, &[("cause", cause)], n);
        }
        let deployments = "nexo_manager_deployments";
        out.header(
            deployments,
            Type::Gauge,
            "Deployments the last heartbeat reported, by phase (status.v1).",
        );
        for (phase, n) in &r.phases {
            out.sample(deployments, &[("phase", phase)], n);
        }
        out.single(
            "nexo_manager_drift_checks_total",
            Type::Counter,
            "Drift checks made (drift.v1).",
            r.drift_checks,
        );
        out.single(
            "nexo_manager_drift_check_seconds_total",
            Type::Counter,
            "Time spent in drift checks, seconds.",
            decimal(r.drift_check_us, 6),
        );
        let drifted = "nexo_manager_drifted_objects_total";
        out.header(
            drifted,
            Type::Counter,
            "Drifted objects found by drift checks, by mode and action (reported, corrected, recreated, failed).",
        );
        let known = DRIFT_MODES
            .iter()
            .flat_map(|m| DRIFT_ACTIONS.iter().map(move |a| (*m, *a)));
        for ((mode, action), n) in with_known(known, &r.drifted) {
            out.sample(drifted, &[("mode", mode), ("action", action)], n);
        }
        let rollbacks = "nexo_manager_rollbacks_total";
        out.header(
            rollbacks,
            Type::Counter,
            "Failed changes rolled back (rollback.v1), by result: rolled_back, failed, nothing_to_restore.",
        );
        for (result, n) in ROLLBACK_RESULTS.iter().zip(r.rollbacks) {
            out.sample(rollbacks, &[("result", result)], n);
        }
    });
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
pub(crate) mod tests;
