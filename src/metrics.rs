//! The counters the clients and the command handler feed, and the
//! process metrics Prometheus users expect of any process, for `/metrics`.
//!
//! The process has one thread, so the registry is a thread-local: the CP
//! and Kubernetes clients count their requests without being handed the
//! loop's `Status`. Label values are a closed set (endpoint names, verbs,
//! status codes, command classes, refusal reasons), so the registry's size
//! is bounded whatever the peers send.

use std::cell::RefCell;
use std::fmt::Write as _;
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

/// Writes one metric family: its help and type lines, then one line per
/// (labels, value).
pub fn family(out: &mut String, name: &str, kind: &str, help: &str, lines: &[(String, String)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, value) in lines {
        let _ = writeln!(out, "{name}{labels} {value}");
    }
}

/// Writes the registry's and the process's metrics in the text exposition:
/// one block per metric family, long and flat on purpose.
pub fn render(out: &mut String) {
    let one = |v: String| vec![(String::new(), v)];
    let p = process_stats();
    family(
        out,
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size in bytes.",
        &one(p.resident_bytes.to_string()),
    );
    family(
        out,
        "process_virtual_memory_bytes",
        "gauge",
        "Virtual memory size in bytes.",
        &one(p.virtual_bytes.to_string()),
    );
    family(
        out,
        "process_cpu_seconds_total",
        "counter",
        "Total user and system CPU time spent in seconds.",
        &one(decimal(p.cpu_ticks, 2)),
    );
    family(
        out,
        "process_open_fds",
        "gauge",
        "Number of open file descriptors.",
        &one(p.open_fds.to_string()),
    );
    let start = STARTED
        .with(|s| s.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(0));
    family(
        out,
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
        &one(decimal(start, 3)),
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
            let lines: Vec<(String, String)> = r
                .requests
                .iter()
                .filter(|((p, _, _), _)| *p == peer)
                .map(|((_, endpoint, code), n)| {
                    let label = if peer == "cp" { "endpoint" } else { "verb" };
                    let code = match code {
                        0 => "error".to_owned(),
                        c => c.to_string(),
                    };
                    (
                        format!("{{{label}=\"{endpoint}\",code=\"{code}\"}}"),
                        n.to_string(),
                    )
                })
                .collect();
            family(out, name, "counter", help, &lines);
        }
        family(
        out,
            "nexo_manager_retry_after_waits_total",
            "counter",
            "Waits decided by a Retry-After header (Control Plane or Kubernetes).",
            &one(r.retry_after_waits.to_string()),
        );
        family(
        out,
            "nexo_manager_retry_after_wait_seconds_total",
            "counter",
            "Time spent in those waits, seconds.",
            &one(decimal(r.retry_after_ms, 3)),
        );
        let _ = writeln!(
            out,
            "# HELP nexo_manager_command_duration_seconds Time from a command's arrival to its ack, by class.\n# TYPE nexo_manager_command_duration_seconds histogram"
        );
        for (class, h) in &r.durations {
            for (n, (_, bound)) in h.buckets.iter().zip(DURATION_BUCKETS) {
                let _ = writeln!(
                    out,
                    "nexo_manager_command_duration_seconds_bucket{{class=\"{class}\",le=\"{bound}\"}} {n}"
                );
            }
            let _ = writeln!(
                out,
                "nexo_manager_command_duration_seconds_bucket{{class=\"{class}\",le=\"+Inf\"}} {}\nnexo_manager_command_duration_seconds_sum{{class=\"{class}\"}} {}\nnexo_manager_command_duration_seconds_count{{class=\"{class}\"}} {}",
                h.count, decimal(h.sum_us, 6), h.count
            );
        }
        let refused: Vec<(String, String)> = r
            .refused
            .iter()
            .map(|(reason, n)| (format!("{{reason=\"{reason}\"}}"), n.to_string()))
            .collect();
        family(
        out,
            "nexo_manager_commands_refused_total",
            "counter",
            "Commands refused before they ran, by reason.",
            &refused,
        );
        family(
        out,
            "nexo_manager_commands_skipped_total",
            "counter",
            "Commands of an answer past the per-answer limit, skipped unacknowledged.",
            &[(String::new(), r.skipped_commands.to_string())],
        );
        family(
            out,
            "nexo_manager_state_writes_total",
            "counter",
            "State Secret writes the API server accepted (one per finished command, or fewer).",
            &[(String::new(), r.state_writes.to_string())],
        );
        family(
        out,
            "nexo_manager_state_write_failures_total",
            "counter",
            "State Secret writes that failed after their retries.",
            &[(String::new(), r.state_write_failures.to_string())],
        );
        family(
            out,
            "nexo_manager_events_written_total",
            "counter",
            "Kubernetes Events written (creations and series updates).",
            &[(String::new(), r.events_written.to_string())],
        );
        let dropped: Vec<(String, String)> = r
            .events_dropped
            .iter()
            .map(|(cause, n)| (format!("{{cause=\"{cause}\"}}"), n.to_string()))
            .collect();
        family(
            out,
            "nexo_manager_events_dropped_total",
            "counter",
            "Kubernetes Events not written, by cause (queue_full, denied, error).",
            &dropped,
        );
        let phases: Vec<(String, String)> = r
            .phases
            .iter()
            .map(|(phase, n)| (format!("{{phase=\"{phase}\"}}"), n.to_string()))
            .collect();
        family(
            out,
            "nexo_manager_deployments",
            "gauge",
            "Deployments the last heartbeat reported, by phase (status.v1).",
            &phases,
        );
        family(
            out,
            "nexo_manager_drift_checks_total",
            "counter",
            "Drift checks made (drift.v1).",
            &[(String::new(), r.drift_checks.to_string())],
        );
        family(
            out,
            "nexo_manager_drift_check_seconds_total",
            "counter",
            "Time spent in drift checks, seconds.",
            &[(String::new(), decimal(r.drift_check_us, 6))],
        );
        let drifted: Vec<(String, String)> = r
            .drifted
            .iter()
            .map(|((mode, action), n)| {
                (
                    format!("{{mode=\"{mode}\",action=\"{action}\"}}"),
                    n.to_string(),
                )
            })
            .collect();
        family(
            out,
            "nexo_manager_drifted_objects_total",
            "counter",
            "Drifted objects found by drift checks, by mode and action (reported, corrected, recreated, failed).",
            &drifted,
        );
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_parse() {
        let status = "Name:\tnexo\nVmSize:\t   12000 kB\nVmRSS:\t    3500 kB\n";
        let stat =
            "42 (nexo (a) b) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 1234 123 456";
        let p = parse_proc(status, stat);
        assert_eq!(p.resident_bytes, 3500 * 1024);
        assert_eq!(p.virtual_bytes, 12000 * 1024);
        assert_eq!(p.cpu_ticks, 300);
        assert_eq!(decimal(300, 2), "3.00");
        assert_eq!(decimal(1_764_000_123_456, 3), "1764000123.456");
        assert_eq!(parse_proc("", ""), ProcessStats::default());
    }

    #[test]
    fn the_registry_renders_every_family() {
        request("cp", "heartbeat", Some(503));
        request("cp", "heartbeat", Some(503));
        request("kubernetes", "GET", None);
        retry_after(Duration::from_secs(600));
        command_duration("deploy", Duration::from_millis(300));
        refused("too_large");
        let mut out = String::new();
        render(&mut out);
        for line in [
            "nexo_manager_cp_requests_total{endpoint=\"heartbeat\",code=\"503\"} 2\n",
            "nexo_manager_kubernetes_requests_total{verb=\"GET\",code=\"error\"} 1\n",
            "nexo_manager_retry_after_waits_total 1\n",
            "nexo_manager_retry_after_wait_seconds_total 600.000\n",
            "nexo_manager_command_duration_seconds_bucket{class=\"deploy\",le=\"0.25\"} 0\n",
            "nexo_manager_command_duration_seconds_bucket{class=\"deploy\",le=\"0.5\"} 1\n",
            "nexo_manager_command_duration_seconds_count{class=\"deploy\"} 1\n",
            "nexo_manager_commands_refused_total{reason=\"too_large\"} 1\n",
            "# TYPE process_cpu_seconds_total counter\n",
        ] {
            assert!(out.contains(line), "missing {line:?} in\n{out}");
        }
        let rss: u64 = out
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
            .and_then(|v| v.parse().ok())
            .unwrap();
        assert!(rss > 0, "read from /proc/self/status");
    }
}
