//! What the benchmarks share: the kernel's account of a process, the
//! machine, a median, the `--only` argument.

#![allow(dead_code)]

use std::process::Command;

/// What the kernel says about one process at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Proc {
    /// Time on the CPU, nanoseconds (`schedstat`).
    pub cpu_ns: u64,
    /// User + system ticks of the process itself, and of its waited-for children.
    pub ticks: u64,
    pub child_ticks: u64,
    pub rss_kb: u64,
    pub hwm_kb: u64,
    pub voluntary: u64,
    pub involuntary: u64,
    pub threads: u64,
}

pub fn read_proc(pid: u32) -> Proc {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|r| r.trim_start_matches(':').split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("/proc/{pid}/status has no {name}"))
    };
    let schedstat = std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/schedstat: {e}"));
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/stat: {e}"));
    // Fields after the command name (which may hold spaces): state is field 3.
    let rest: Vec<u64> = stat[stat.rfind(')').expect("stat has a comm") + 2..]
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // utime, stime, cutime, cstime are fields 14..17, i.e. rest[11..15].
    Proc {
        cpu_ns: schedstat
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .expect("schedstat runtime"),
        ticks: rest[11] + rest[12],
        child_ticks: rest[13] + rest[14],
        rss_kb: field("VmRSS"),
        hwm_kb: field("VmHWM"),
        voluntary: field("voluntary_ctxt_switches"),
        involuntary: field("nonvoluntary_ctxt_switches"),
        threads: field("Threads"),
    }
}

/// Clock ticks per second of `/proc/PID/stat`.
pub fn ticks_per_second() -> u64 {
    let out = Command::new("getconf").arg("CLK_TCK").output();
    out.ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let mem_kb = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{} cores of {cpu}, {:.0} GiB, Linux {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        mem_kb as f64 / 1_048_576.0,
        kernel.trim()
    )
}

/// The parts `--only` can name: the footprint bench's, then the peer's.
pub const FOOTPRINT_PARTS: &[&str] = &[
    "image", "start", "idle", "deploy", "sizes", "greedy", "soak", "latency", "rest", "drift",
];
pub const PEER_PARTS: &[&str] = &["peer"];

/// `--sizes 100,10000` from the command line: `None` without it; a value
/// that is not a list of numbers panics, naming it.
pub fn sizes_arg() -> Option<Vec<usize>> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--sizes")
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.split(',')
                .map(|n| {
                    n.parse::<usize>()
                        .unwrap_or_else(|_| panic!("--sizes {v}: not a list of numbers"))
                })
                .collect()
        })
}

/// `--only a,b` from the command line: `None` without it. A name that is no
/// part of either bench ends the program with status 2, naming it, so a
/// typo does not run nothing quietly (`tests/bench.sh` passes the same
/// arguments to both benches).
pub fn only_parts() -> Option<Vec<String>> {
    let args: Vec<String> = std::env::args().collect();
    let i = args.iter().position(|a| a == "--only")?;
    let Some(value) = args.get(i + 1) else {
        eprintln!("bench: --only needs a comma-separated list of parts");
        std::process::exit(2);
    };
    let parts: Vec<String> = value.split(',').map(str::to_owned).collect();
    if let Some(bad) = parts
        .iter()
        .find(|p| !FOOTPRINT_PARTS.contains(&p.as_str()) && !PEER_PARTS.contains(&p.as_str()))
    {
        eprintln!(
            "bench: --only {value}: '{bad}' is not a part (footprint: {}; peer: {})",
            FOOTPRINT_PARTS.join(", "),
            PEER_PARTS.join(", ")
        );
        std::process::exit(2);
    }
    Some(parts)
}

/// Whether `--only` (as [`only_parts`] read it) leaves this bench anything
/// to run, given its parts.
pub fn names_any(only: &Option<Vec<String>>, parts: &[&str]) -> bool {
    only.as_ref()
        .is_none_or(|o| o.iter().any(|p| parts.contains(&p.as_str())))
}

pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Replaces the part of `path` between the markers `begin` and `end` with
/// `generated`, keeping everything around it; without the markers, appends
/// them with `generated` between.
pub fn write_section(path: &std::path::Path, begin: &str, end: &str, generated: &str) {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let block = format!("{begin}\n{generated}{end}");
    let new = match (old.find(begin), old.find(end)) {
        (Some(a), Some(b)) if a < b => {
            format!("{}{block}{}", &old[..a], &old[b + end.len()..])
        }
        _ => format!("{old}{block}\n"),
    };
    std::fs::write(path, new).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}
