//! The wait costs nothing: one thread, and the loop's `poll(2)` wakes only
//! for a heartbeat's interval, the lease's renewal or the CP's answer,
//! seen with `strace`, with the probe listener open and not called.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use support::fixture::Fixture;

#[test]
fn one_thread_and_wake_ups_only_for_heartbeats_and_the_lease() {
    let f = Fixture::new("idle");
    let strace = Command::new("strace")
        .arg("-V")
        .stdout(Stdio::null())
        .status();
    assert!(
        strace.is_ok_and(|s| s.success()),
        "strace is required for this test (apt-get install strace)"
    );
    let trace = f.dir.join("strace.txt");
    let mut env = f.env();
    env.insert("NEXO_HEARTBEAT_INTERVAL".into(), "2s".into());
    // The scheduled lease renewals are logged at debug, to be counted.
    env.insert(
        "RUST_LOG".into(),
        "info,nexo_manager::agent::lead=debug".into(),
    );
    // Probes on (on a port of the Manager's choosing), and never called:
    // they must not wake the Manager.
    env.insert(
        "NEXO_LISTEN_ADDR".into(),
        support::PROBES_ON_ANY_PORT.to_owned(),
    );
    let mut cmd = Command::new("strace");
    cmd.args([
        "-f",
        "-qq",
        "-e",
        "trace=poll,ppoll,clone,clone3,fork,vfork,nanosleep,clock_nanosleep,epoll_wait,select",
        "-o",
    ])
    .arg(&trace)
    .arg(support::manager::binary())
    .env_clear()
    .env("PATH", std::env::var("PATH").unwrap_or_default())
    .envs(&env)
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(f.dir.join("manager.log")).unwrap());
    let mut child = cmd.spawn().expect("spawn strace");
    f.sim
        .wait_until(Duration::from_secs(30), "five heartbeats", |s| {
            s.heartbeats().len() >= 5
        });
    // Stop the Manager itself (strace's child); strace ends with it.
    let pgrep = Command::new("pgrep")
        .arg("-P")
        .arg(child.id().to_string())
        .output()
        .unwrap();
    let manager_pid = String::from_utf8_lossy(&pgrep.stdout).trim().to_owned();
    assert!(
        !manager_pid.is_empty(),
        "cannot find the Manager under strace"
    );
    let _ = Command::new("kill").arg("-TERM").arg(&manager_pid).status();
    let status = child.wait().unwrap();
    let exited_cleanly = status.success();
    let text = std::fs::read_to_string(&trace).unwrap();
    let log = std::fs::read_to_string(f.dir.join("manager.log")).unwrap_or_default();
    let report = format!(
        "exit {status:?}\nstrace:\n{text}\nmanager log:\n{log}\nsimulator:\n{}",
        f.sim.log_dump()
    );
    assert!(
        exited_cleanly,
        "SIGTERM must end the Manager with exit 0\n{report}"
    );
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.contains("+++") && !l.contains("---"))
        .collect();
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("clone") || l.contains("fork")),
        "the Manager started a thread or process\n{report}"
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.contains("sleep") || l.contains("epoll") || l.contains("select(")),
        "only poll waits\n{report}"
    );
    let support::Wakeups {
        timeouts,
        answers,
        watch_events,
        other,
    } = support::wakeups(&lines);
    let beats = f.sim.heartbeats().len();
    let renewals = log.matches("lease renewed on schedule").count();
    eprintln!(
        "wake-ups by cause: {timeouts} timers (heartbeat interval: {}, lease renewal: {renewals}), {answers} control plane answers, {watch_events} watch events or bookmarks, {other} other (SIGTERM)",
        beats.saturating_sub(1)
    );
    // Every timer that ended a poll was a heartbeat's interval or the
    // lease's renewal: nothing else wakes the Manager.
    assert!(
        timeouts <= beats + renewals && timeouts + 1 >= beats,
        "{timeouts} polls timed out for {beats} heartbeats and {renewals} lease renewals\n{report}"
    );
    assert!(
        other <= 1,
        "{other} polls woke for something else (only SIGTERM may wake one)\n{report}"
    );
    // Nothing changes in the cluster: the watches are quiet but for a
    // bookmark now and then.
    assert!(
        watch_events <= 2,
        "{watch_events} polls woke for the watches in a quiet cluster\n{report}"
    );
}
