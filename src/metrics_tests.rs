use super::*;

/// The seconds `nexo_manager_retry_after_wait_seconds_total` says (this
/// thread's registry), for the tests of those who count it.
pub(crate) fn retry_after_seconds() -> f64 {
    let mut text = Exposition::default();
    render(&mut text);
    text.into_string()
        .lines()
        .find_map(|l| l.strip_prefix("nexo_manager_retry_after_wait_seconds_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(-1.0)
}

#[test]
fn proc_files_parse() {
    let status = "Name:\tnexo\nVmSize:\t   12000 kB\nVmRSS:\t    3500 kB\n";
    let stat = "42 (nexo (a) b) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 1 0 1234 123 456";
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
    drifted("enforce", "corrected");
    let mut text = Exposition::default();
    render(&mut text);
    let out = text.into_string();
    for line in [
        "nexo_manager_cp_requests_total{endpoint=\"heartbeat\",code=\"503\"} 2\n",
        "nexo_manager_kubernetes_requests_total{verb=\"GET\",code=\"error\"} 1\n",
        "nexo_manager_retry_after_waits_total 1\n",
        "nexo_manager_retry_after_wait_seconds_total 600.000\n",
        "nexo_manager_command_duration_seconds_bucket{class=\"deploy\",le=\"0.25\"} 0\n",
        "nexo_manager_command_duration_seconds_bucket{class=\"deploy\",le=\"0.5\"} 1\n",
        "nexo_manager_command_duration_seconds_count{class=\"deploy\"} 1\n",
        "nexo_manager_commands_refused_total{reason=\"too_large\"} 1\n",
        // Every label value known, at zero before its first increment.
        "nexo_manager_commands_refused_total{reason=\"signature\"} 0\n",
        "nexo_manager_events_dropped_total{cause=\"denied\"} 0\n",
        "nexo_manager_drifted_objects_total{mode=\"report\",action=\"failed\"} 0\n",
        "nexo_manager_drifted_objects_total{mode=\"enforce\",action=\"corrected\"} 1\n",
        // The duration histogram too, for each known class.
        "nexo_manager_command_duration_seconds_bucket{class=\"uninstall\",le=\"+Inf\"} 0\n",
        "nexo_manager_command_duration_seconds_count{class=\"plan\"} 0\n",
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
