//! A command the lease fence stops is not dropped (SECURITY.md, "A fenced
//! command is dropped"): the API server of a test bed of this test's own
//! freezes for 15 s (SIGSTOP) in the middle of a batch of six deploys (as
//! the second starts); the
//! fence stops the command in hand; the same process holds the lease again,
//! reads the state again and runs that command before the next. Every
//! command is applied and acknowledged exactly once, with a simulator that
//! never sends a command again (so only the Manager can have run it).

mod support;

use std::process::Command;
use std::time::Duration;

use nexo_cpsim::SimConfig;
use serde_json::json;
use support::OwnBed;
use support::commands::{ACK_WAIT, command, configmap, proxy};
use support::fixture::Fixture;

const COMMANDS: usize = 6;
const OBJECTS: usize = 16;

fn signal(pid: &str, name: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid)
        .status()
        .expect("kill");
    assert!(ok.success(), "kill -{name} {pid}");
}

/// The API server stopped (SIGSTOP) while it lives, continued when it
/// goes, a failed test's unwinding included (a stopped process would
/// outlive the test bed's reaper's SIGTERM).
struct Frozen<'a>(&'a str);

impl<'a> Frozen<'a> {
    fn new(pid: &'a str) -> Frozen<'a> {
        signal(pid, "STOP");
        Frozen(pid)
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        // No assertion here: a panic while unwinding would abort.
        let _ = Command::new("kill").arg("-CONT").arg(self.0).status();
    }
}

#[test]
fn a_command_the_fence_stopped_runs_once_the_lease_and_state_are_held_again() {
    let bed = OwnBed::start("fence-tb", &[]);
    let f = Fixture::on(bed.tb, "fence", SimConfig::default());
    f.tb.install_crds();
    let pid = std::fs::read_to_string(bed.dir.join("apiserver.pid"))
        .expect("the test bed's apiserver.pid")
        .trim()
        .to_owned();
    let ids: Vec<String> = (0..COMMANDS).map(|i| format!("fence-{i}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let name = format!("p{i}");
        // Enough objects that the command's reads, dry runs and writes
        // take a while: the freeze lands among them.
        let mut manifests = vec![proxy(&name)];
        manifests.extend((0..OBJECTS).map(|j| configmap(&format!("{name}-config-{j}"))));
        f.sim.enqueue_command(
            &f.env_id,
            command(
                id,
                "deploy",
                json!({"deployment": {"name": name, "namespace": f.ns.name}, "format": "crd",
                       "manifests": manifests}),
            ),
        );
    }
    let mut m = f.spawn(&f.env());
    // Frozen as soon as the second command starts (the log read as it
    // grows, every millisecond).
    let log = m.log_reader();
    let started = std::time::Instant::now();
    while !log().contains("executing the command commandId=fence-1 ") {
        assert!(
            started.elapsed() < ACK_WAIT,
            "the second command never started:\n{}",
            m.report()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    {
        let _frozen = Frozen::new(&pid);
        std::thread::sleep(Duration::from_secs(15));
    }

    let acked = |id: &str| {
        f.sim
            .acks()
            .iter()
            .filter(|a| a["commandId"] == id)
            .cloned()
            .collect::<Vec<_>>()
    };
    m.wait_until(
        Duration::from_secs(120),
        "every command acknowledged",
        || ids.iter().all(|id| !acked(id).is_empty()),
    );
    let log = m.stderr();
    let fenced = log.find("the lease may have been lost while it ran");
    m.check(
        fenced.is_some(),
        "the freeze tripped the fence (else this test proves nothing)",
    );
    m.check(
        fenced.is_some_and(|at| log[at..].contains("state read again")),
        "the state read again after the fence, before the command was taken up again",
    );
    for id in &ids {
        let acks = acked(id);
        m.check(
            acks.len() == 1 && acks[0]["result"] == "applied",
            &format!("{id} acknowledged once, applied: {acks:?}"),
        );
    }
    // In order: each ack's first attempt after the previous one's.
    let order: Vec<String> = f
        .sim
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/ack"))
        .filter_map(|r| r.json.as_ref()?["commandId"].as_str().map(str::to_owned))
        .fold(Vec::new(), |mut seen, id| {
            if !seen.contains(&id) {
                seen.push(id);
            }
            seen
        });
    m.check(order == ids, &format!("acknowledged in order: {order:?}"));
    for i in 0..COMMANDS {
        let path = format!(
            "/apis/nexo.io/v1alpha1/namespaces/{}/nexoproxies/p{i}",
            f.ns.name
        );
        m.check(
            f.tb.admin()
                .get_opt::<serde_json::Value>(&path)
                .unwrap()
                .is_some(),
            &format!("p{i} applied"),
        );
    }
    m.stop_expecting_exit_0();
}
