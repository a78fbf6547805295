//! Leader election: two Managers for one environment in one namespace,
//! exactly one acts; a stopped leader is replaced, and once resumed it does
//! not act before it holds the lease again.

mod support;

use std::time::Duration;

use serde_json::{Value, json};
use support::fixture::Fixture;
use support::manager::STOP_WAIT;
use support::{PROBES_ON_ANY_PORT, closed_addr, http_get, metric};

fn connects_from(f: &Fixture, uid: &str) -> usize {
    f.sim
        .requests()
        .iter()
        .filter(|r| {
            r.path.ends_with("/connect")
                && r.json.as_ref().is_some_and(|b| b["instance"]["id"] == uid)
        })
        .count()
}

/// How many requests the Manager of pod `uid` sent (the simulator knows the
/// sender of a heartbeat or an ack by its session token).
fn sent_by(f: &Fixture, uid: &str) -> usize {
    f.sim
        .requests()
        .iter()
        .filter(|r| r.instance.as_deref() == Some(uid))
        .count()
}

/// Whether the Manager probed at `addr` is a ready standby: it read the
/// lease (held by another) and made its TLS handshake with the CP. (As the
/// leader it would say `nexo_manager_leader 1`.)
fn ready_standby(addr: std::net::SocketAddr) -> bool {
    metric(addr, "nexo_manager_leader") == Some(0.0) && http_get(addr, "/readyz").0 == 200
}

fn read_lease(f: &Fixture) -> Value {
    let path = format!(
        "/apis/coordination.k8s.io/v1/namespaces/{}/leases/nexo-manager",
        f.ns.name
    );
    f.tb.admin().get(&path).unwrap()
}

#[test]
fn exactly_one_of_two_managers_acts_and_a_stopped_leader_is_replaced() {
    let f = Fixture::new("leader");
    let env = |uid: &str| f.pod_env(uid);
    let mut env_a = env("pod-a");
    env_a.insert("NEXO_LISTEN_ADDR".into(), PROBES_ON_ANY_PORT.into());
    let mut env_b = env("pod-b");
    env_b.insert("NEXO_LISTEN_ADDR".into(), PROBES_ON_ANY_PORT.into());
    let mut a = f.spawn(&env_a);
    a.wait_until(Duration::from_secs(30), "pod-a leading", || {
        !f.sim.heartbeats().is_empty()
    });
    let addr_a = a.probe_addr();
    let mut b = f.spawn(&env_b);
    let addr_b = b.probe_addr();
    b.wait_until(Duration::from_secs(30), "pod-b following, ready", || {
        ready_standby(addr_b)
    });
    let conns_before = f.sim.connections();
    // The window is the subject: three intervals in which the follower
    // must not connect, and must make its standby handshakes.
    std::thread::sleep(Duration::from_secs(3));
    a.check(
        connects_from(&f, "pod-b") == 0,
        "the follower never connects",
    );
    // Both are ready: the leader bound and heartbeating, the standby able
    // to take over (lease read, TLS handshake with the CP). A rolling
    // update needs the new pod Ready while the old one still leads.
    let (status, body) = http_get(addr_a, "/readyz");
    a.check(
        status == 200,
        &format!("the leader's /readyz: {status} {body}"),
    );
    let (status, body) = http_get(addr_b, "/readyz");
    b.check(
        status == 200,
        &format!("the standby's /readyz: {status} {body}"),
    );
    // The standby's checks are handshakes only: new connections, no request.
    b.check(
        f.sim.connections() > conns_before,
        "the standby made a TLS handshake with the CP in 3 intervals",
    );
    b.check(
        f.sim.requests().iter().all(|r| {
            r.path.ends_with("/connect")
                && r.json
                    .as_ref()
                    .is_some_and(|j| j["instance"]["id"] == "pod-a")
                || !r.path.ends_with("/connect")
        }),
        "no connect from the standby",
    );
    let lease = read_lease(&f);
    assert_eq!(lease["spec"]["holderIdentity"], "pod-a");
    assert_eq!(
        lease["spec"]["leaseDurationSeconds"], 5,
        "3 × the 1 s interval, at least 5 s"
    );

    // Stop the leader past the lease duration: the follower takes over.
    a.signal("STOP");
    b.wait_until(Duration::from_secs(30), "pod-b taking over", || {
        connects_from(&f, "pod-b") >= 1
            && f.sim.requests().iter().any(|r| {
                r.instance.as_deref() == Some("pod-b")
                    && r.path.ends_with("/heartbeat")
                    && r.status == 200
            })
    });
    // Stopped, pod-a sends nothing: everything it sent has arrived.
    let a_sent = sent_by(&f, "pod-a");
    a.signal("CONT");
    // Its probes are answered again once it runs (not before: a stopped
    // process would leave the request unanswered).
    a.wait_until(Duration::from_secs(30), "pod-a following again", || {
        metric(addr_a, "nexo_manager_leader") == Some(0.0)
    });
    // The window is the subject: three intervals in which it must not act.
    std::thread::sleep(Duration::from_secs(3));
    let after = sent_by(&f, "pod-a");
    a.check(
        after == a_sent,
        &format!("the resumed old leader sends nothing without the lease: {a_sent} requests before, {after} after"),
    );
    let lease = read_lease(&f);
    assert_eq!(lease["spec"]["holderIdentity"], "pod-b");
    assert_eq!(lease["spec"]["leaseTransitions"], 1);

    // A clean stop releases the lease: the other one takes over without waiting for it to expire.
    b.signal("TERM");
    b.wait_exit(STOP_WAIT);
    let holder = read_lease(&f)["spec"]["holderIdentity"].clone();
    b.check(
        holder != "pod-b",
        &format!("pod-b released the lease on its way out: held by {holder}"),
    );
    // A bound with a reason: pod-b renewed the 5 s lease at most one 1 s
    // interval before it stopped, and pod-a judges expiry from when it saw
    // that renewal, so waiting for expiry would take pod-a at least 4 s
    // from here; a released lease is taken at its next check.
    a.wait_until(
        Duration::from_secs(4),
        "pod-a leading again soon after the release",
        || read_lease(&f)["spec"]["holderIdentity"] == "pod-a",
    );
    // It acts (and says so) once it has read the state again in its new
    // term: a moment after the lease names it (a slow datastore's reads).
    a.wait_until(
        Duration::from_secs(3),
        "pod-a's metric saying it leads",
        || metric(addr_a, "nexo_manager_leader") == Some(1.0),
    );
}

#[test]
fn a_standby_that_cannot_reach_the_control_plane_is_not_ready() {
    let f = Fixture::new("leader-unready");
    let mut env_a = f.env();
    env_a.insert("POD_UID".into(), "pod-a".into());
    let mut a = f.spawn(&env_a);
    a.wait_until(Duration::from_secs(30), "pod-a leading", || {
        !f.sim.heartbeats().is_empty()
    });
    // pod-b's CP address has nothing listening: its handshakes fail.
    let closed = closed_addr();
    let mut env_b = f.env();
    env_b.insert("POD_UID".into(), "pod-b".into());
    env_b.insert("NEXO_LISTEN_ADDR".into(), PROBES_ON_ANY_PORT.into());
    env_b.insert("NEXO_CONTROL_PLANE_URL".into(), format!("https://{closed}"));
    let mut b = f.spawn(&env_b);
    let addr_b = b.probe_addr();
    // A standby (not starting, not leading) whose handshake never succeeds:
    // not ready, and it never can be.
    b.wait_until(Duration::from_secs(30), "pod-b a standby", || {
        let (status, body) = http_get(addr_b, "/readyz");
        status == 503 && body.contains("standby")
    });
    let leader = metric(addr_b, "nexo_manager_leader");
    b.check(
        leader == Some(0.0),
        &format!("pod-b does not lead: {leader:?}"),
    );
    let (status, _) = http_get(addr_b, "/healthz");
    b.check(status == 200, "alive all the same");
}

#[test]
fn a_new_leader_reads_the_ledger_again_and_executes_no_finished_command() {
    let f = Fixture::new("leader-ledger");
    f.tb.install_crds();
    let env = |uid: &str| {
        let mut e = f.env();
        e.insert("POD_UID".into(), uid.into());
        e.insert("NEXO_LISTEN_ADDR".into(), PROBES_ON_ANY_PORT.into());
        e
    };
    let mut a = f.spawn(&env("pod-a"));
    a.wait_until(Duration::from_secs(30), "pod-a leading", || {
        !f.sim.heartbeats().is_empty()
    });
    // pod-b reads the state now, while the ledger is empty: a ready
    // standby is past its start-up, where it read the state.
    let mut b = f.spawn(&env("pod-b"));
    let addr_b = b.probe_addr();
    b.wait_until(Duration::from_secs(30), "pod-b following, ready", || {
        ready_standby(addr_b)
    });
    let deploy = serde_json::json!({"id": "cmd-once", "class": "deploy", "issuedAt": "2026-12-03T00:00:00Z",
        "payload": {"deployment": {"name": "orders", "namespace": f.ns.name}, "format": "crd",
            "manifests": [{"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy", "metadata": {"name": "orders"},
                "spec": {"image": support::fixture::PROXY_IMAGE, "replicas": 1, "mongodb": {"secretRef": {"name": "orders-db"}}}}]}});
    f.sim.enqueue_command(&f.env_id, deploy.clone());
    a.wait_until(Duration::from_secs(30), "pod-a's ack", || {
        !f.sim.acks().is_empty()
    });
    let first = f.sim.acks()[0].clone();
    assert_eq!(first["resources"][0]["action"], "created", "{first}");
    // pod-a stops cleanly; pod-b leads; the CP sends the command again.
    a.signal("TERM");
    a.wait_exit(STOP_WAIT);
    b.wait_until(Duration::from_secs(30), "pod-b leading", || {
        connects_from(&f, "pod-b") >= 1
    });
    f.sim.enqueue_command(&f.env_id, deploy);
    let acks_of = || {
        f.sim
            .requests()
            .into_iter()
            .filter(|r| r.path.ends_with("/commands/cmd-once/ack"))
            .filter_map(|r| r.json)
            .collect::<Vec<Value>>()
    };
    b.wait_until(Duration::from_secs(30), "pod-b's ack", || {
        acks_of().len() >= 2
    });
    // A second execution would list the NexoProxy `unchanged`: pod-b
    // found the command in the ledger, delivered (pod-a's clean stop wrote
    // the flag), so its ack has the recorded result and message and no
    // resources.
    let again = acks_of()[1].clone();
    b.check(
        again["result"] == first["result"]
            && again["message"] == first["message"]
            && again["resources"] == serde_json::json!([]),
        &format!("pod-b acknowledged the recorded result, not a second execution: {again}"),
    );
}

/// A TCP relay between a Manager and the API server that holds every chunk
/// the Manager sends for `delay` (TLS passes through untouched), so that a
/// command's requests are slow enough to stop the process in the middle of
/// them. Runs until the test process ends.
fn slow_relay(server: &str, delay: Duration) -> String {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    let upstream = server
        .trim_start_matches("https://")
        .trim_end_matches('/')
        .to_owned();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(server) = TcpStream::connect(&upstream) else {
                continue;
            };
            let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let mut buf = [0u8; 16 * 1024];
                while let Ok(n) = c_in.read(&mut buf) {
                    if n == 0 || {
                        std::thread::sleep(delay);
                        s_out.write_all(&buf[..n]).is_err()
                    } {
                        break;
                    }
                }
                let _ = s_out.shutdown(std::net::Shutdown::Both);
            });
            let (mut s_in, mut c_out) = (server, client);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s_in, &mut c_out);
                let _ = c_out.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    format!("https://{addr}")
}

/// The admin kubeconfig pointed at `server`.
fn kubeconfig_via(f: &Fixture, server: &str, name: &str) -> std::path::PathBuf {
    let mut kc: Value = serde_json::from_slice(&std::fs::read(&f.tb.kubeconfig).unwrap()).unwrap();
    for c in kc["clusters"].as_array_mut().unwrap() {
        c["cluster"]["server"] = json!(server);
    }
    let path = f.dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&path, serde_json::to_vec(&kc).unwrap()).unwrap();
    path
}

/// The names of this deployment's ConfigMaps in the cluster.
fn config_maps_of(f: &Fixture, deployment: &str) -> usize {
    let mut n = 0;
    f.tb.admin()
        .list_each(
            &format!("/api/v1/namespaces/{}/configmaps", f.ns.name),
            Some(&format!("nexo.io/deployment={deployment}")),
            500,
            |_| n += 1,
        )
        .unwrap();
    n
}

/// A deploy of a NexoProxy and `n` ConfigMaps.
fn big_deploy(f: &Fixture, id: &str, name: &str, n: usize) -> Value {
    let mut manifests = vec![
        json!({"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy", "metadata": {"name": name},
        "spec": {"image": support::fixture::PROXY_IMAGE, "replicas": 1, "mongodb": {"secretRef": {"name": format!("{name}-db")}}}}),
    ];
    for i in 0..n {
        manifests.push(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": format!("{name}-c{i:02}")}, "data": {"i": i.to_string()}}));
    }
    json!({"id": id, "class": "deploy", "payload": {"deployment": {"name": name, "namespace": f.ns.name},
        "format": "crd", "manifests": manifests}})
}

/// The ack requests for `id`, with the pod that sent each.
fn acks_for(f: &Fixture, id: &str) -> Vec<(Option<String>, Value)> {
    let path = format!("/commands/{id}/ack");
    f.sim
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with(&path))
        .map(|r| (r.instance.clone(), r.json.unwrap_or_default()))
        .collect()
}

#[test]
fn a_leader_frozen_mid_command_writes_and_acks_nothing_once_another_took_over() {
    let f = Fixture::new("leader-fence");
    f.tb.install_crds();
    let env = |uid: &str| {
        let mut e = f.pod_env(uid);
        // A 9 s lease: its renew deadline (6 s) is well past a command's time.
        e.insert("NEXO_HEARTBEAT_INTERVAL".into(), "3s".into());
        e.insert("NEXO_LISTEN_ADDR".into(), PROBES_ON_ANY_PORT.into());
        e
    };
    // pod-a talks to the API server through the slow relay.
    let relay = slow_relay(&f.tb.server, Duration::from_millis(15));
    let mut env_a = env("pod-a");
    env_a.insert(
        "KUBECONFIG".into(),
        kubeconfig_via(&f, &relay, "slow").display().to_string(),
    );
    let mut a = f.spawn(&env_a);
    a.wait_until(Duration::from_secs(60), "pod-a leading", || {
        !f.sim.heartbeats().is_empty()
    });
    let mut b = f.spawn(&env("pod-b"));
    let addr_b = b.probe_addr();
    b.wait_until(Duration::from_secs(60), "pod-b following, ready", || {
        ready_standby(addr_b)
    });
    // A 64-object deploy; pod-a is frozen once some of its objects exist.
    let deploy = big_deploy(&f, "big-1", "big", 63);
    f.sim.enqueue_command(&f.env_id, deploy.clone());
    a.wait_until(Duration::from_secs(60), "pod-a writing the deploy", || {
        config_maps_of(&f, "big") >= 3
    });
    a.signal("STOP");
    std::thread::sleep(Duration::from_millis(500));
    let frozen_at = config_maps_of(&f, "big");
    a.check(
        frozen_at < 63,
        &format!("pod-a frozen mid-command ({frozen_at} of 63 ConfigMaps written)"),
    );
    // pod-b takes over; the CP sends the unacknowledged command again.
    b.wait_until(Duration::from_secs(60), "pod-b leading", || {
        connects_from(&f, "pod-b") >= 1
    });
    f.sim.enqueue_command(&f.env_id, deploy);
    b.wait_until(Duration::from_secs(60), "pod-b's ack of the deploy", || {
        acks_for(&f, "big-1")
            .iter()
            .any(|(from, _)| from.as_deref() == Some("pod-b"))
    });
    b.check(config_maps_of(&f, "big") == 63, "pod-b applied all of it");
    // And uninstalls it; the garbage collector removes the ConfigMaps.
    f.sim.enqueue_command(
        &f.env_id,
        json!({"id": "big-gone", "class": "uninstall", "payload": {"deployment": {"name": "big", "namespace": f.ns.name}}}),
    );
    b.wait_until(
        Duration::from_secs(120),
        "the uninstall done and collected",
        || !acks_for(&f, "big-gone").is_empty() && config_maps_of(&f, "big") == 0,
    );
    // pod-a resumes in the middle of its deploy.
    a.signal("CONT");
    std::thread::sleep(Duration::from_secs(8));
    let back = config_maps_of(&f, "big");
    let proxy =
        f.tb.admin()
            .get_opt::<Value>(&format!(
                "/apis/nexo.io/v1alpha1/namespaces/{}/nexoproxies/big",
                f.ns.name
            ))
            .unwrap();
    a.check(
        back == 0 && proxy.is_none(),
        &format!("pod-a wrote nothing after it resumed: {back} ConfigMaps, proxy {proxy:?}"),
    );
    let acks = acks_for(&f, "big-1");
    a.check(
        acks.iter()
            .all(|(from, _)| from.as_deref() == Some("pod-b"))
            && acks.iter().all(|(_, ack)| ack["result"] == "applied"),
        &format!("one outcome, acknowledged by pod-b only: {acks:?}"),
    );
    let state = nexo_manager::state::StateSecret::new(&f.ns.name, "nexo-manager-state", &f.env_id)
        .load(&f.tb.admin())
        .unwrap();
    let entry = state.find("big-1").expect("the deploy recorded");
    a.check(
        entry.result == nexo_manager::cp::wire::AckResult::Applied
            && acks
                .iter()
                .all(|(_, ack)| ack["message"] == json!(entry.message)),
        &format!("the ledger entry is pod-b's: {entry:?}"),
    );
    a.check(
        a.stderr().contains("fenced") || a.stderr().contains("lease may have been lost"),
        "pod-a says why it stopped writing",
    );
    b.stop_expecting_exit_0();
}

#[test]
fn a_leader_that_regains_the_lease_mid_batch_reads_the_state_again() {
    let f = Fixture::new("leader-regain");
    f.tb.install_crds();
    let relay = slow_relay(&f.tb.server, Duration::from_millis(15));
    let mut env = f.env();
    env.insert("POD_UID".into(), "pod-a".into());
    env.insert("NEXO_HEARTBEAT_INTERVAL".into(), "3s".into());
    env.insert(
        "KUBECONFIG".into(),
        kubeconfig_via(&f, &relay, "slow").display().to_string(),
    );
    f.create_proxy(
        "keep",
        f.owned_labels("keep"),
        1,
        support::fixture::PROXY_IMAGE,
    );
    let mut a = f.spawn(&env);
    a.wait_until(Duration::from_secs(60), "pod-a leading", || {
        !f.sim.heartbeats().is_empty()
    });
    // One answer: a slow deploy, then the uninstall of `keep`.
    f.sim
        .enqueue_command(&f.env_id, big_deploy(&f, "slow-1", "slow", 40));
    f.sim.enqueue_command(
        &f.env_id,
        json!({"id": "keep-gone", "class": "uninstall", "payload": {"deployment": {"name": "keep", "namespace": f.ns.name}}}),
    );
    a.wait_until(Duration::from_secs(60), "pod-a writing the deploy", || {
        config_maps_of(&f, "slow") >= 3
    });
    a.signal("STOP");
    // While it is stopped, past its lease, another leader runs the
    // uninstall: the ledger records it (and `keep` stays, so a second run
    // would show).
    let admin = f.tb.admin();
    let mut store =
        nexo_manager::state::StateSecret::new(&f.ns.name, "nexo-manager-state", &f.env_id);
    let current = store.load(&admin).unwrap();
    store
        .update(&admin, &current, |s| {
            s.record(nexo_manager::state::LedgerEntry {
                command_id: "keep-gone".into(),
                class: "uninstall".into(),
                result: nexo_manager::cp::wire::AckResult::Applied,
                message: "uninstalled by the other leader".into(),
                completed_at: "2026-12-04T00:00:00Z".into(),
                delivered: true,
                ..Default::default()
            })
        })
        .unwrap();
    std::thread::sleep(Duration::from_secs(10));
    a.signal("CONT");
    a.wait_until(
        Duration::from_secs(60),
        "the uninstall acknowledged",
        || !acks_for(&f, "keep-gone").is_empty(),
    );
    let acks = acks_for(&f, "keep-gone");
    a.check(
        acks.iter()
            .all(|(_, ack)| ack["message"] == "uninstalled by the other leader"),
        &format!("the recorded result, read again after the lease was regained: {acks:?}"),
    );
    a.check(
        f.tb.admin()
            .get_opt::<Value>(&format!(
                "/apis/nexo.io/v1alpha1/namespaces/{}/nexoproxies/keep",
                f.ns.name
            ))
            .unwrap()
            .is_some(),
        "not uninstalled a second time",
    );
    let reads = a.stderr().matches("state read again").count();
    a.check(reads >= 2, &format!("the state read at each term: {reads}"));
    // The deploy the fence interrupted is taken up again once the lease
    // and the state are held again, before the uninstall: run (no one
    // recorded it), acknowledged once.
    let slow = acks_for(&f, "slow-1");
    a.check(
        slow.len() == 1 && slow[0].1["result"] == "applied",
        &format!("the interrupted deploy run again and acknowledged once: {slow:?}"),
    );
    let order: Vec<String> = f
        .sim
        .acks()
        .iter()
        .filter_map(|ack| ack["commandId"].as_str().map(str::to_owned))
        .collect();
    a.check(
        order.iter().position(|id| id == "slow-1") < order.iter().position(|id| id == "keep-gone"),
        &format!("in order: {order:?}"),
    );
    a.stop_expecting_exit_0();
}
