//! The agent core, end to end: the real binary against the CP simulator and
//! the real Kubernetes test bed.

mod support;

use std::time::{Duration, Instant, SystemTime};

use nexo_cpsim::{Endpoint, Fault, FaultAction, SimConfig};
use serde_json::{Value, json};
use support::fixture::{Fixture, PROXY_IMAGE};
use support::manager::STOP_WAIT;
use support::{PROBES_ON_ANY_PORT, http_get, sample};

const WAIT: Duration = Duration::from_secs(30);
/// The Manager under test: its `User-Agent` and `manager.version`.
const VERSION: &str = env!("CARGO_PKG_VERSION");

fn heartbeat_count(f: &Fixture) -> usize {
    f.sim.heartbeats().len()
}

fn requests_to<'a>(
    reqs: &'a [nexo_cpsim::LoggedRequest],
    suffix: &str,
) -> Vec<&'a nexo_cpsim::LoggedRequest> {
    reqs.iter().filter(|r| r.path.ends_with(suffix)).collect()
}

#[test]
fn connect_body_and_heartbeat_inventory_match_the_cluster() {
    let f = Fixture::new("core-inv");
    f.tb.install_crds();
    let other = json!({"app.kubernetes.io/managed-by": "nexo-manager", "nexo.io/owner-id": "env-someone-else"});
    f.create_proxy(
        "orders",
        f.owned_labels("orders"),
        3,
        "registry.example.com/nexo/proxy:1.4.2",
    );
    f.create_proxy(
        "alpha",
        f.owned_labels("alpha"),
        1,
        "registry.example.com/nexo/proxy:1.4.1",
    );
    f.create_proxy(
        "zeta",
        f.owned_labels("zeta"),
        2,
        "registry.example.com/nexo/proxy:1.4.2",
    );
    f.create_proxy("unowned", json!({"team": "db"}), 1, "proxy:1");
    f.create_proxy("foreign", other, 1, "proxy:1");
    f.create_proxy(
        "legacy-proxy",
        json!({"app.kubernetes.io/part-of": "nexo"}),
        1,
        "proxy:0.2",
    );
    f.create_deployment(
        "billing",
        f.owned_labels("billing"),
        1,
        "registry.example.com/nexo/proxy:1.3.0",
    );
    f.create_deployment(
        "legacy",
        json!({"app.kubernetes.io/part-of": "nexo"}),
        1,
        "proxy:0.2",
    );

    let mut env = f.env();
    env.insert("NEXO_CLUSTER_NAME".into(), "eu-1".into());
    let spawned = SystemTime::now();
    let mut m = f.spawn(&env);
    m.wait_until(WAIT, "three heartbeats", || heartbeat_count(&f) >= 3);
    m.signal("TERM");
    let status = m.wait_exit(STOP_WAIT);
    m.check(
        status.code() == Some(0),
        "SIGTERM must end the Manager with exit 0",
    );

    let reqs = f.sim.requests();
    let connect = requests_to(&reqs, "/api/v2/manager/connect")[0];
    let body = connect.json.as_ref().unwrap();
    m.check(
        connect.header("authorization") == Some(&format!("Bearer {}", f.token)),
        "connect carries the connect token",
    );
    m.check(
        connect.header("user-agent") == Some(&format!("nexo-manager/{VERSION}")),
        "User-Agent is nexo-manager/<version>",
    );
    m.check(
        connect.header("content-type") == Some("application/json"),
        "JSON content type",
    );
    assert_eq!(body["protocolVersion"], 2);
    assert_eq!(body["manager"]["version"], VERSION);
    assert!(body["manager"]["build"].is_string());
    assert_eq!(
        body["manager"]["capabilities"],
        json!(nexo_manager::agent::CAPABILITIES)
    );
    assert_eq!(
        body["instance"],
        json!({"id": format!("uid-{}", f.ns.name), "podName": "nexo-manager-test", "namespace": f.ns.name})
    );
    assert_eq!(
        body["cluster"],
        json!({"uid": f.cluster_uid(), "kubernetesVersion": f.tb.version})
    );
    assert_eq!(f.sim.bound_cluster(&f.env_id), Some(f.cluster_uid()));

    let beats = f.sim.heartbeats();
    let sequences: Vec<u64> = beats
        .iter()
        .map(|b| b["sequence"].as_u64().unwrap())
        .collect();
    assert_eq!(
        sequences[..3],
        [1, 2, 3],
        "sequence starts at 1 and increases by one"
    );
    let hb = &beats[0];
    assert_eq!(hb["managerId"], json!(f.sim.manager_id(&f.env_id)));
    assert_eq!(hb["proxyImage"], PROXY_IMAGE);
    assert_eq!(hb["manager"]["protocolVersion"], 2);
    assert_eq!(
        hb["manager"]["capabilities"],
        json!(nexo_manager::agent::CAPABILITIES)
    );
    let ns = f.ns.name.as_str();
    assert_eq!(
        support::without_status(&hb["deployments"]),
        json!([
            {"name": "alpha", "namespace": ns, "kind": "NexoProxy", "replicas": 1, "image": "registry.example.com/nexo/proxy:1.4.1"},
            {"name": "billing", "namespace": ns, "kind": "Deployment", "replicas": 1, "image": "registry.example.com/nexo/proxy:1.3.0"},
            {"name": "orders", "namespace": ns, "kind": "NexoProxy", "replicas": 3, "image": "registry.example.com/nexo/proxy:1.4.2"},
            {"name": "zeta", "namespace": ns, "kind": "NexoProxy", "replicas": 2, "image": "registry.example.com/nexo/proxy:1.4.2"},
        ]),
        "only owned objects, sorted by namespace then name"
    );
    // `status.v1`: no operator wrote the proxies' status, and the test
    // bed has no node to run the Deployment's pod.
    for e in hb["deployments"].as_array().unwrap() {
        assert_eq!(e["status"]["phase"], "progressing", "{e}");
        if e["kind"] == "NexoProxy" {
            assert_eq!(e["status"]["reason"], "NoStatus", "{e}");
        }
    }
    assert_eq!(hb["managedProxyCount"], 4);
    // The test bed has no nodes: region and zone are omitted, never guessed.
    assert_eq!(
        hb["cluster"],
        json!({"uid": f.cluster_uid(), "name": "eu-1", "kubernetesVersion": f.tb.version})
    );
    assert_eq!(hb["pendingAcks"], json!([]));
    assert!(hb.get("inventoryErrors").is_none(), "{hb}");
    let sent_at =
        humantime::parse_rfc3339(hb["sentAt"].as_str().unwrap()).expect("sentAt is RFC 3339 UTC");
    // The Manager's clock when it sent the heartbeat, in whole seconds (cut,
    // not rounded): after the spawn, before the simulator saw it arrive
    // (one clock, this machine's).
    let arrived = reqs
        .iter()
        .find(|r| r.path.ends_with("/heartbeat") && r.json.as_ref() == Some(hb))
        .expect("the first heartbeat's request")
        .at;
    assert!(
        sent_at + Duration::from_secs(1) > spawned && sent_at <= arrived,
        "sentAt {} outside [spawn {spawned:?}, arrival {arrived:?}]",
        hb["sentAt"]
    );

    // The binding is persisted in the state Secret.
    let secret: Value =
        f.tb.admin()
            .get(&format!(
                "/api/v1/namespaces/{ns}/secrets/nexo-manager-state"
            ))
            .unwrap();
    assert_eq!(
        secret["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "nexo-manager"
    );
    let doc = String::from_utf8(b64(secret["data"]["state.json"].as_str().unwrap())).unwrap();
    let state: Value = serde_json::from_str(&doc).unwrap();
    assert_eq!(
        state["binding"],
        json!({"environmentId": f.env_id, "managerId": f.sim.manager_id(&f.env_id), "clusterUid": f.cluster_uid()})
    );
    // Never a secret in the log (a log contract: what must not appear).
    let log = m.stderr();
    assert!(
        !log.contains(&f.token),
        "the connect token leaked into the log"
    );
}

fn b64(s: &str) -> Vec<u8> {
    let out = std::process::Command::new("base64")
        .arg("-d")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    out.stdin.as_ref().unwrap().write_all(s.as_bytes()).unwrap();
    out.wait_with_output().unwrap().stdout
}

#[test]
fn interval_override_from_the_control_plane_is_honoured() {
    let f = Fixture::with_config(
        "core-interval",
        SimConfig {
            heartbeat_interval_seconds: Some(5),
            ..SimConfig::default()
        },
    );
    let mut m = f.spawn(&f.env()); // configured 1 s, CP says 5 s
    // About 10 s at the CP's interval; the deadline only ends a hung test.
    m.wait_until(Duration::from_secs(60), "three heartbeats", || {
        heartbeat_count(&f) >= 3
    });
    let times: Vec<SystemTime> = requests_to(&f.sim.requests(), "/heartbeat")
        .iter()
        .filter(|r| r.status == 200)
        .map(|r| r.at)
        .collect();
    for pair in times.windows(2) {
        let gap = pair[1].duration_since(pair[0]).unwrap();
        m.check(
            gap >= Duration::from_millis(4500),
            &format!("heartbeats {gap:?} apart, the CP asked for 5 s"),
        );
    }
}

#[test]
fn expired_session_reconnects_once_and_resends_the_heartbeat() {
    let f = Fixture::new("core-401");
    let mut m = f.spawn(&f.env());
    m.wait_until(WAIT, "a first heartbeat", || heartbeat_count(&f) >= 1);
    f.sim.expire_sessions();
    m.wait_until(WAIT, "a heartbeat after the reconnect", || {
        requests_to(&f.sim.requests(), "/connect").len() >= 2 && heartbeat_count(&f) >= 2
    });
    let reqs = f.sim.requests();
    let rejected = reqs
        .iter()
        .position(|r| r.path.ends_with("/heartbeat") && r.status == 401);
    let Some(rejected) = rejected else {
        m.fail("no heartbeat got 401")
    };
    let seq = reqs[rejected].json.as_ref().unwrap()["sequence"].clone();
    let next: Vec<_> = reqs[rejected + 1..].iter().take(2).collect();
    m.check(
        next[0].path.ends_with("/connect") && next[0].status == 200,
        "401 is followed by a connect",
    );
    m.check(
        next[1].path.ends_with("/heartbeat")
            && next[1].status == 200
            && next[1].json.as_ref().unwrap()["sequence"] == seq,
        "then the same heartbeat is resent",
    );
}

#[test]
fn environment_bound_elsewhere_exits_3_with_an_actionable_message() {
    let f = Fixture::new("core-403");
    f.sim.bind(&f.env_id, "some-other-cluster-uid");
    let mut m = f.spawn(&f.env());
    let status = m.wait_exit(WAIT);
    m.check(status.code() == Some(3), "exit 3");
    // The message printed on exit is the contract here: it is what an
    // operator reads in the crash-looping pod's log.
    let log = m.stderr();
    m.check(
        log.contains("bound to another Kubernetes cluster"),
        "the message says what is wrong",
    );
    m.check(!log.contains(&f.token), "no token in the output");
}

#[test]
fn persisted_binding_from_another_cluster_exits_3() {
    let f = Fixture::new("core-copied");
    let doc = json!({"version": 1, "binding": {"environmentId": f.env_id, "managerId": "mgr-x", "clusterUid": "uid-of-elsewhere"}, "ledger": []});
    f.tb.admin()
        .create(
            &format!("/api/v1/namespaces/{}/secrets", f.ns.name),
            &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "nexo-manager-state",
                    "labels": {"app.kubernetes.io/managed-by": "nexo-manager"}}, "stringData": {"state.json": doc.to_string()}}),
        )
        .unwrap();
    let mut m = f.spawn(&f.env());
    let status = m.wait_exit(WAIT);
    m.check(status.code() == Some(3), "exit 3");
    // The exit message is the contract: what the operator reads.
    m.check(
        m.stderr().contains("copied from another cluster"),
        "the message names the cause",
    );
    m.check(f.sim.requests().is_empty(), "nothing is sent to the CP");
}

#[test]
fn bad_configuration_exits_2_with_its_own_message_and_no_secret() {
    let f = Fixture::new("core-config");
    let secret = "abcdefghijklmnopqrstuvwxyz0123456789ABCD";
    // Name, variables to set (empty: unset), and a part of the expected message.
    type Case = (&'static str, Vec<(&'static str, String)>, &'static str);
    let cases: Vec<Case> = vec![
        (
            "malformed token",
            vec![("NEXO_CONNECT_TOKEN", format!("nexo_ct_{secret}"))],
            "NEXO_CONNECT_TOKEN: the connect token is malformed",
        ),
        (
            "short secret",
            vec![("NEXO_CONNECT_TOKEN", "nexo_ct_env-abc_short".into())],
            "at least 32 characters",
        ),
        (
            "token for another environment",
            vec![
                ("NEXO_CONNECT_TOKEN", format!("nexo_ct_env-other_{secret}")),
                ("NEXO_ENVIRONMENT_ID", "env-mine".into()),
            ],
            "the connect token is for environment env-other, but NEXO_ENVIRONMENT_ID is env-mine",
        ),
        (
            "malformed token file",
            vec![("NEXO_CONNECT_TOKEN_FILE", "{bad}".into())],
            "NEXO_CONNECT_TOKEN_FILE",
        ),
        (
            "http without the switch",
            vec![("NEXO_CONTROL_PLANE_URL", "http://127.0.0.1:1".into())],
            "plain http://",
        ),
        (
            "missing proxy image",
            vec![("NEXO_PROXY_IMAGE", String::new())],
            "NEXO_PROXY_IMAGE: is required",
        ),
        (
            "missing CP URL",
            vec![("NEXO_CONTROL_PLANE_URL", String::new())],
            "NEXO_CONTROL_PLANE_URL: is required",
        ),
        (
            "bad interval",
            vec![("NEXO_HEARTBEAT_INTERVAL", "often".into())],
            "NEXO_HEARTBEAT_INTERVAL",
        ),
    ];
    let bad_file = f.dir.join("bad-token");
    std::fs::write(&bad_file, format!("nexo_ct_BAD_{secret}")).unwrap();
    for (name, overrides, needle) in cases {
        let mut env = f.env();
        for (k, v) in overrides {
            let v = if v == "{bad}" {
                bad_file.display().to_string()
            } else {
                v
            };
            if v.is_empty() {
                env.remove(k);
            } else {
                env.insert(k.to_owned(), v);
            }
            if k == "NEXO_CONNECT_TOKEN" {
                env.remove("NEXO_CONNECT_TOKEN_FILE");
            }
        }
        let mut m = f.spawn(&env);
        let status = m.wait_exit(WAIT);
        // The exit message naming the variable is the contract (what the
        // operator reads), and so is the secret's absence from it.
        let out = format!("{}{}", m.stdout(), m.stderr());
        m.check(status.code() == Some(2), &format!("{name}: exit 2"));
        m.check(
            out.contains(needle),
            &format!("{name}: message contains {needle:?}"),
        );
        m.check(
            !out.contains(secret),
            &format!("{name}: the secret must never be printed"),
        );
    }
    assert!(
        f.sim.requests().is_empty(),
        "a refused configuration sends nothing"
    );
}

#[test]
fn cp_errors_and_timeouts_back_off_then_recover() {
    let f = Fixture::new("core-500");
    f.sim.inject(
        Fault::new(
            Endpoint::Heartbeat,
            FaultAction::Status {
                status: 500,
                code: "internal".into(),
                message: "boom".into(),
                retry_after: None,
            },
        )
        .times(3),
    );
    f.sim.inject(Fault::new(
        Endpoint::Heartbeat,
        FaultAction::Delay(Duration::from_secs(4)),
    ));
    f.sim
        .inject(Fault::new(Endpoint::Heartbeat, FaultAction::Reset));
    let mut env = f.env();
    env.insert("NEXO_CP_REQUEST_TIMEOUT".into(), "2s".into());
    env.insert("NEXO_LISTEN_ADDR".into(), PROBES_ON_ANY_PORT.into());
    let mut m = f.spawn(&env);
    let probe = m.probe_addr();
    // Accepted by the Manager: the simulator also counts the delayed
    // heartbeat, which it answers after the Manager gave up on it.
    m.wait_until(
        Duration::from_secs(60),
        "a heartbeat accepted after the faults",
        || support::metric(probe, "nexo_manager_heartbeats_total{outcome=\"ok\"}") >= Some(1.0),
    );
    // In the order they were sent (the simulator logs them on arrival).
    let beats: Vec<_> = requests_to(&f.sim.requests(), "/heartbeat")
        .into_iter()
        .cloned()
        .collect();
    let statuses: Vec<u16> = beats.iter().map(|r| r.status).collect();
    m.check(
        statuses.starts_with(&[500, 500, 500]),
        &format!("three 500s first: {statuses:?}"),
    );
    let metrics = m.metrics();
    let value = |series: &str| sample(&metrics, series).unwrap_or(0.0);
    m.check(
        value("nexo_manager_heartbeats_total{outcome=\"failed\"}") >= 4.0
            && value("nexo_manager_cp_requests_total{endpoint=\"heartbeat\",code=\"500\"}") == 3.0,
        &format!("the three 500s and the timeout are failed heartbeats:\n{metrics}"),
    );
    // No answer (code "error") within NEXO_CP_REQUEST_TIMEOUT, though the
    // simulator answered 200 after its 4 s delay.
    m.check(
        value("nexo_manager_cp_requests_total{endpoint=\"heartbeat\",code=\"error\"}") >= 1.0,
        &format!("the delayed heartbeat timed out:\n{metrics}"),
    );
    let alive = m.running();
    m.check(alive, "the Manager survives every fault");
    // Backoff, a contract (docs/protocol.md, "Error bodies": exponential with
    // full jitter, base 1 s): the waits after the first, second and third
    // consecutive failure are at most 1 s, 2 s and 4 s. Seen from the
    // simulator, a gap is that wait plus the Manager's own work between
    // two attempts (the answer, a lease renewal, the inventory read, the
    // next request): a second of slack for it on a loaded machine.
    let slack = 1.0;
    let t: Vec<SystemTime> = beats.iter().map(|r| r.at).collect();
    for (i, ceiling) in [(1usize, 1.0f64), (2, 2.0), (3, 4.0)] {
        let gap = t[i].duration_since(t[i - 1]).unwrap().as_secs_f64();
        m.check(
            gap <= ceiling + slack,
            &format!("gap {i} is {gap:.2}s, over the backoff ceiling {ceiling}s (+{slack}s)"),
        );
    }
}

#[test]
fn retry_after_is_honoured() {
    let f = Fixture::new("core-429");
    f.sim.inject(Fault::new(
        Endpoint::Heartbeat,
        FaultAction::Status {
            status: 429,
            code: "overloaded".into(),
            message: "slow down".into(),
            retry_after: Some("3".into()),
        },
    ));
    let mut m = f.spawn(&f.env());
    m.wait_until(WAIT, "a heartbeat after the 429", || {
        heartbeat_count(&f) >= 1
    });
    let beats = requests_to(&f.sim.requests(), "/heartbeat")
        .into_iter()
        .cloned()
        .collect::<Vec<_>>();
    m.check(beats[0].status == 429, "the first heartbeat got 429");
    let gap = beats[1].at.duration_since(beats[0].at).unwrap();
    m.check(
        gap >= Duration::from_millis(2900),
        &format!("nothing sent sooner than Retry-After: 3 (gap {gap:?})"),
    );
}

#[test]
fn oversized_and_malformed_bodies_are_refused_and_nothing_runs() {
    let f = Fixture::new("core-big");
    // A refused command: nothing in the cluster depends on it.
    f.sim.enqueue_command(&f.env_id, json!({"id": "cmd-kept", "class": "deploy", "issuedAt": "2026-12-02T00:00:00Z", "payload": {}}));
    f.sim.inject(Fault::new(
        Endpoint::Heartbeat,
        FaultAction::OversizedBody(9 * 1024 * 1024),
    ));
    f.sim
        .inject(Fault::new(Endpoint::Heartbeat, FaultAction::MalformedBody));
    f.sim.inject(Fault::new(
        Endpoint::Heartbeat,
        FaultAction::CommandsNotList,
    ));
    let mut env = f.env();
    env.insert("NEXO_LISTEN_ADDR".into(), PROBES_ON_ANY_PORT.into());
    let mut m = f.spawn(&env);
    m.wait_until(WAIT, "an accepted heartbeat after three bad bodies", || {
        heartbeat_count(&f) >= 1
    });
    m.wait_until(WAIT, "the queued command's ack", || {
        !f.sim.acks().is_empty()
    });
    // docs/protocol.md: a 200 over the size limit, not JSON, or whose commands
    // is not a list counts as a failed heartbeat.
    let metrics = m.metrics();
    let value = |series: &str| sample(&metrics, series).unwrap_or(0.0);
    m.check(
        value("nexo_manager_heartbeats_total{outcome=\"failed\"}") == 3.0
            && value("nexo_manager_cp_requests_total{endpoint=\"heartbeat\",code=\"200\"}") >= 4.0,
        &format!("the three bad 200s are failed heartbeats:\n{metrics}"),
    );
    let alive = m.running();
    m.check(alive, "the process stays alive");
    m.check(
        f.sim.acks().len() == 1,
        "only the real command is acknowledged",
    );
}

#[test]
fn unsupported_commands_are_acknowledged_failed_and_bad_ids_skipped() {
    let f = Fixture::new("core-cmd");
    f.sim
        .enqueue_command(&f.env_id, json!({"class": "deploy", "payload": {}}));
    f.sim
        .enqueue_command(&f.env_id, json!({"id": "bad/id", "class": "deploy"}));
    f.sim.enqueue_command(&f.env_id, json!({"id": "cmd-1", "class": "migrate", "issuedAt": "2026-12-02T00:00:00Z", "payload": {}}));
    f.sim.enqueue_command(
        &f.env_id,
        json!({"id": "cmd-2", "class": "teleport", "issuedAt": "2026-12-02T00:00:00Z"}),
    );
    let mut env = f.env();
    env.insert("NEXO_LISTEN_ADDR".into(), PROBES_ON_ANY_PORT.into());
    let mut m = f.spawn(&env);
    m.wait_until(WAIT, "two acks", || f.sim.acks().len() >= 2);
    let acks = f.sim.acks();
    for (ack, (id, class)) in acks
        .iter()
        .zip([("cmd-1", "migrate"), ("cmd-2", "teleport")])
    {
        assert_eq!(ack["commandId"], id);
        assert_eq!(ack["result"], "failed");
        assert_eq!(ack["message"], format!("unsupported class: {class}"));
        assert_eq!(ack["managerId"], json!(f.sim.manager_id(&f.env_id)));
        assert_eq!(ack["attempt"], 1);
    }
    let skipped = m.metric("nexo_manager_commands_refused_total{reason=\"no_id\"}");
    m.check(
        skipped == Some(2.0),
        &format!("both bad ids are skipped: {skipped:?}"),
    );
    m.check(
        f.sim
            .requests()
            .iter()
            .all(|r| !r.path.contains("/commands/") || r.path.contains("/commands/cmd-")),
        "and never acknowledged",
    );
    // docs/protocol.md makes this log line a contract: a command without a
    // valid id "is logged at error level and skipped".
    let errors = m
        .stderr()
        .lines()
        .filter(|l| l.contains(" ERROR ") && l.contains("without a valid id"))
        .count();
    m.check(errors == 2, &format!("{errors} error lines for 2 bad ids"));
}

#[test]
fn a_rotated_token_file_is_picked_up_without_restart() {
    let f = Fixture::new("core-rotate");
    let mut m = f.spawn(&f.env());
    m.wait_until(WAIT, "a first heartbeat", || heartbeat_count(&f) >= 1);
    let new_token = f.sim.rotate_token(&f.env_id);
    f.sim.expire_sessions();
    m.wait_until(WAIT, "a connect with the old token, refused", || {
        requests_to(&f.sim.requests(), "/connect")
            .iter()
            .any(|r| r.status == 401)
    });
    std::fs::write(f.token_file(), &new_token).unwrap();
    let before = heartbeat_count(&f);
    m.wait_until(
        Duration::from_secs(60),
        "heartbeats with the new token",
        || heartbeat_count(&f) > before,
    );
    let reqs = f.sim.requests();
    let connects = requests_to(&reqs, "/connect");
    m.check(
        connects.iter().any(|r| r.status == 401),
        "the old token was refused",
    );
    let last = connects.last().unwrap();
    m.check(
        last.status == 200 && last.header("authorization") == Some(&format!("Bearer {new_token}")),
        "the new token connected",
    );
    // A log contract: no token in it.
    m.check(
        !m.stderr().contains(&new_token) && !m.stderr().contains(&f.token),
        "no token in the log",
    );
}

#[test]
fn a_rotated_ca_bundle_is_picked_up_without_restart() {
    let f = Fixture::new("core-ca");
    // The bundle names another CA than the one that signed the CP's
    // certificate, as after the CP moved to a new CA before the bundle
    // (a ConfigMap) had it.
    let ca_file = f.dir.join("cp-ca.pem");
    let other = nexo_cpsim::Simulator::start(SimConfig::default());
    other.write_ca(&ca_file);
    let mut m = f.spawn(&f.env());
    let log = m.log_reader();
    m.wait_until(WAIT, "a connect refused by the TLS handshake", || {
        log().contains("control plane unreachable")
    });
    m.check(heartbeat_count(&f) == 0, "no heartbeat without trust");
    f.sim.write_ca(&ca_file);
    m.wait_until(
        Duration::from_secs(60),
        "a heartbeat with the new bundle",
        || heartbeat_count(&f) >= 1,
    );
    m.check(
        m.stderr()
            .contains("NEXO_CONTROL_PLANE_CA_FILE changed: now trusting its certificates besides the public roots certificates=1"),
        "the log says the bundle was taken",
    );
    // A broken bundle later keeps the last good one: the Manager goes on.
    std::fs::write(&ca_file, "not a certificate").unwrap();
    f.sim
        .inject(Fault::new(Endpoint::Heartbeat, FaultAction::Reset).times(1));
    let before = heartbeat_count(&f);
    m.wait_until(
        Duration::from_secs(60),
        "heartbeats after a broken bundle",
        || heartbeat_count(&f) > before + 1,
    );
    m.check(
        m.stderr().contains("NEXO_CONTROL_PLANE_CA_FILE not usable: the last bundle read stays trusted err=\"holds no PEM certificate"),
        "the log says the broken bundle was not taken",
    );
    // A FIFO at the path, which nothing writes: refused at once (an
    // open(2) of it would block the process), the Manager goes on.
    std::fs::remove_file(&ca_file).unwrap();
    mkfifo(&ca_file);
    f.sim
        .inject(Fault::new(Endpoint::Heartbeat, FaultAction::Reset).times(1));
    let before = heartbeat_count(&f);
    m.wait_until(
        Duration::from_secs(60),
        "heartbeats after a FIFO at the CA path",
        || heartbeat_count(&f) > before + 1,
    );
    m.check(
        m.stderr().contains(
            "NEXO_CONTROL_PLANE_CA_FILE not usable: the last bundle read stays trusted err=\"is not a regular file",
        ),
        "the log warns that the FIFO was not read",
    );
    m.stop_expecting_exit_0();
}

/// Makes a FIFO at `path`.
fn mkfifo(path: &std::path::Path) {
    let made = std::process::Command::new("mkfifo").arg(path).status();
    assert!(
        made.is_ok_and(|s| s.success()),
        "mkfifo {} failed (coreutils' mkfifo is needed)",
        path.display()
    );
}

#[test]
fn a_fifo_at_the_ca_path_at_start_exits_2_at_once() {
    let f = Fixture::new("core-fifo");
    let ca_file = f.dir.join("cp-ca.pem");
    let _ = std::fs::remove_file(&ca_file);
    mkfifo(&ca_file);
    let started = std::time::Instant::now();
    let mut m = f.spawn(&f.env());
    let status = m.wait_exit(WAIT);
    m.check(
        status.code() == Some(2) && started.elapsed() < Duration::from_secs(10),
        &format!("exit 2 at once: {status:?} after {:?}", started.elapsed()),
    );
    m.check(
        m.stderr()
            .contains("NEXO_CONTROL_PLANE_CA_FILE: cannot read")
            && m.stderr().contains("not a regular file (a FIFO)"),
        "the message names the variable and what is at the path",
    );
}

#[test]
fn sigterm_while_idle_ends_the_wait_and_exits_0() {
    let f = Fixture::new("core-term");
    let mut env = f.env();
    env.insert("NEXO_HEARTBEAT_INTERVAL".into(), "60s".into());
    env.insert("NEXO_LISTEN_ADDR".into(), PROBES_ON_ANY_PORT.into());
    let mut m = f.spawn(&env);
    m.wait_until(WAIT, "a first heartbeat", || heartbeat_count(&f) >= 1);
    // Probes are answered from the Manager's waits: once this one is, the
    // Manager has gone idle after its first heartbeat.
    let (status, _) = http_get(m.probe_addr(), "/healthz");
    m.check(status == 200, &format!("/healthz answered {status}"));
    m.signal("TERM");
    // STOP_WAIT (30 s) is half the wait in hand: an exit within it is the
    // signal ending the wait, not the wait running out.
    let status = m.wait_exit(STOP_WAIT);
    m.check(status.code() == Some(0), "exit 0");
}

#[test]
fn unreadable_namespaces_are_reported_in_inventory_errors() {
    let f = Fixture::new("core-rbac");
    f.tb.install_crds();
    f.create_proxy("orders", f.owned_labels("orders"), 2, PROXY_IMAGE);
    let admin = f.tb.admin();
    let ns = &f.ns.name;
    // A ServiceAccount that may read the inventory of its own namespace only.
    support::grant_service_account(
        f.tb,
        ns,
        "mgr",
        &json!([
            {"apiGroups": ["nexo.io"], "resources": ["nexoproxies"], "verbs": ["list", "watch"]},
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["list", "watch"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "update"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}]),
    );
    let cr = format!("nexo-test-{ns}");
    support::grant_cluster(
        f.tb,
        &cr,
        ns,
        "mgr",
        &json!([{"apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["kube-system"], "verbs": ["get"]}]),
    );
    let token = f.tb.token(ns, "mgr");
    let mut env = f.env();
    env.insert(
        "KUBECONFIG".into(),
        f.tb.kubeconfig_for_token(&token, "mgr")
            .display()
            .to_string(),
    );
    env.insert("NEXO_NAMESPACES".into(), format!("{ns},kube-public"));
    let mut m = f.spawn(&env);
    m.wait_until(WAIT, "a heartbeat", || heartbeat_count(&f) >= 1);
    let hb = &f.sim.heartbeats()[0];
    assert_eq!(hb["managedProxyCount"], 1, "{hb}");
    assert_eq!(hb["deployments"][0]["name"], "orders");
    let errors: Vec<&str> = hb["inventoryErrors"]
        .as_array()
        .expect("inventoryErrors")
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    // The two collections of kube-public, and the nodes it may not list
    // (region and zone unavailable, never guessed).
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert!(
        errors[..2]
            .iter()
            .all(|e| e.contains("kube-public") && e.contains("403")),
        "{errors:?}"
    );
    assert!(
        errors[2].starts_with("nodes are not readable") && errors[2].contains("403"),
        "{errors:?}"
    );
    admin
        .delete(
            &format!("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{cr}"),
            "Background",
        )
        .unwrap();
    admin
        .delete(
            &format!("/apis/rbac.authorization.k8s.io/v1/clusterroles/{cr}"),
            "Background",
        )
        .unwrap();
    drop(m);
}

#[test]
fn https_proxy_is_used_unless_no_proxy_excludes_the_control_plane() {
    let proxy = support::proxy::ConnectProxy::start();
    let f = Fixture::new("core-proxy");
    let mut env = f.env();
    env.insert("HTTPS_PROXY".into(), proxy.url());
    let mut m = f.spawn(&env);
    m.wait_until(WAIT, "heartbeats through the proxy", || {
        heartbeat_count(&f) >= 2
    });
    drop(m);
    let through = proxy.tunnels();
    assert!(through >= 1, "the CP connection went through HTTPS_PROXY");

    // NO_PROXY as users write it: a bare address, among other entries.
    let g = Fixture::new("core-noproxy");
    let mut env = g.env();
    env.insert("HTTPS_PROXY".into(), proxy.url());
    env.insert(
        "NO_PROXY".into(),
        "localhost, .svc.cluster.local,127.0.0.0/8".into(),
    );
    let mut m = g.spawn(&env);
    m.wait_until(WAIT, "heartbeats without the proxy", || {
        heartbeat_count(&g) >= 2
    });
    m.check(
        proxy.tunnels() == through,
        "NO_PROXY kept the CP connection direct",
    );
    // The Kubernetes API never goes through the CP proxy either (the test bed is on 127.0.0.1 too,
    // so the count above would have grown for it as well).
}

#[test]
fn the_tls_connection_is_reused_across_heartbeats() {
    let f = Fixture::new("core-reuse");
    let mut m = f.spawn(&f.env());
    m.wait_until(WAIT, "four heartbeats", || heartbeat_count(&f) >= 4);
    let conns = f.sim.connections();
    m.check(
        conns == 1,
        &format!("{conns} TLS connections for connect + 4 heartbeats"),
    );
}

#[test]
fn probes_and_metrics_are_served_from_the_wait() {
    let f = Fixture::new("core-probe");
    let mut env = f.env();
    env.insert("NEXO_LISTEN_ADDR".into(), PROBES_ON_ANY_PORT.into());
    env.insert("NEXO_HEARTBEAT_INTERVAL".into(), "1s".into());
    f.sim.inject(
        Fault::new(
            Endpoint::Heartbeat,
            FaultAction::Status {
                status: 500,
                code: "internal".into(),
                message: "boom".into(),
                retry_after: None,
            },
        )
        .times(1000),
    );
    let mut m = f.spawn(&env);
    let addr = m.probe_addr();
    // Heartbeats fail for 3 intervals: alive, but not ready.
    m.wait_until(
        WAIT,
        "/readyz 503 after 3 intervals of failing heartbeats",
        || {
            let (status, body) = http_get(addr, "/readyz");
            status == 503 && body.contains("heartbeats have been failing for 3 intervals")
        },
    );
    assert_eq!(http_get(addr, "/healthz").0, 200);
    f.sim.clear_faults();
    m.wait_until(WAIT, "/readyz 200 after a heartbeat succeeds", || {
        http_get(addr, "/readyz").0 == 200
    });
    m.check(heartbeat_count(&f) >= 1, "ready again after a heartbeat");
    // A silent client does not stall the loop: the next request is still answered.
    let _silent = std::net::TcpStream::connect(addr).unwrap();
    assert_eq!(http_get(addr, "/readyz").0, 200);
    let (status, text) = http_get(addr, "/metrics");
    assert_eq!(status, 200);
    let value = |series: &str| sample(&text, series);
    m.check(
        value("nexo_manager_heartbeats_total{outcome=\"ok\"}") >= Some(1.0)
            && value("nexo_manager_heartbeats_total{outcome=\"failed\"}") >= Some(1.0)
            && value("nexo_manager_pending_acks") == Some(0.0)
            && value("nexo_manager_managed_proxies") == Some(0.0),
        &format!("/metrics:\n{text}"),
    );
    let build_info = format!("nexo_manager_build_info{{version=\"{VERSION}\"");
    m.check(
        text.contains(&build_info),
        &format!("/metrics lacks {build_info}:\n{text}"),
    );
    assert_eq!(http_get(addr, "/nope").0, 404);
    m.stop_expecting_exit_0();
}

#[test]
fn probes_are_answered_while_acks_are_retried() {
    let f = Fixture::new("core-probe-ack");
    let mut env = f.env();
    env.insert("NEXO_LISTEN_ADDR".into(), PROBES_ON_ANY_PORT.into());
    // Every ack attempt fails: the Manager spends about 7.5 s in the waits
    // between its five attempts (0.5, 1, 2 and 4 s).
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
        .times(5),
    );
    f.sim.enqueue_command(
        &f.env_id,
        json!({"id": "cmd-refused", "class": "teleport", "issuedAt": "2026-12-02T00:00:00Z"}),
    );
    let mut m = f.spawn(&env);
    let addr = m.probe_addr();
    let attempts = || {
        f.sim
            .requests()
            .iter()
            .filter(|r| r.path.ends_with("/ack"))
            .count()
    };
    m.wait_until(WAIT, "the first failed ack attempt", || attempts() >= 1);
    let deadline = Instant::now() + WAIT;
    let mut slowest = Duration::ZERO;
    // The ack attempts made when each probe was sent.
    let mut during = Vec::new();
    loop {
        let made = attempts();
        if made >= 5 {
            break;
        }
        m.check(
            Instant::now() < deadline,
            &format!("five ack attempts within {WAIT:?}"),
        );
        let start = Instant::now();
        let (status, _) = http_get(addr, "/healthz");
        slowest = slowest.max(start.elapsed());
        during.push(made);
        m.check(
            status == 200,
            &format!("/healthz answered {status} during the ack retries"),
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // A contract of the design (its probes section): /healthz is answered
    // within 1 s whatever the loop is doing; the liveness probe counts on it.
    m.check(
        slowest < Duration::from_secs(1),
        &format!(
            "the slowest of {} /healthz answers during the ack retries took {slowest:?}",
            during.len()
        ),
    );
    // Probes were sent during the two longest waits, after the third and
    // the fourth attempt (2 s and 4 s, ±25 %: at least 1.5 s, more than one
    // probe's 1 s limit and the 100 ms pause).
    m.check(
        during.contains(&3) && during.contains(&4),
        &format!("probes sent after these many ack attempts: {during:?}"),
    );
}

#[test]
fn a_retry_after_past_any_clock_waits_ten_minutes_and_a_stop_still_ends_it() {
    let f = Fixture::new("core-retry-after");
    f.sim.inject(Fault::new(
        Endpoint::Heartbeat,
        FaultAction::Status {
            status: 429,
            code: "overloaded".into(),
            message: "later".into(),
            retry_after: Some("18446744073709551615".into()),
        },
    ));
    let mut env = f.env();
    env.insert("NEXO_LISTEN_ADDR".into(), PROBES_ON_ANY_PORT.into());
    let mut m = f.spawn(&env);
    let probe = m.probe_addr();
    // Counted when the wait is decided, and answered from a wait: seen, the
    // Manager is in its 10-minute wait.
    m.wait_until(WAIT, "the 429's wait clamped to 10 minutes", || {
        support::metric(probe, "nexo_manager_retry_after_wait_seconds_total") == Some(600.0)
    });
    let waits = m.metric("nexo_manager_retry_after_waits_total");
    m.check(
        waits == Some(1.0),
        &format!("one Retry-After wait: {waits:?}"),
    );
    m.signal("TERM");
    // STOP_WAIT (30 s) against a 10-minute wait: an exit within it is the
    // stop ending the wait.
    let status = m.wait_exit(STOP_WAIT);
    m.check(
        status.success(),
        &format!("exit 0 on SIGTERM during the 10-minute wait: {status}"),
    );
}

#[test]
fn a_session_token_that_cannot_be_a_header_is_a_failed_connect_not_an_abort() {
    let f = Fixture::new("core-session-token");
    let body = json!({"environmentId": f.env_id, "managerId": "mgr-x",
        "sessionToken": "abc\r\nX-Injected: 1", "sessionExpiresAt": "2099-01-01T00:00:00Z"});
    f.sim.inject(Fault::new(
        Endpoint::Connect,
        FaultAction::Raw {
            status: 200,
            body: body.to_string(),
        },
    ));
    let mut m = f.spawn(&f.env());
    m.wait_until(WAIT, "a heartbeat after the retried connect", || {
        heartbeat_count(&f) >= 1
    });
    let reqs = f.sim.requests();
    m.check(
        reqs.iter().all(|r| {
            r.header("x-injected").is_none() && r.header("authorization") != Some("Bearer abc")
        }),
        "the bad token was refused: never sent as a header",
    );
    // A log contract, as for secrets: the token's text is not logged.
    m.check(
        !m.stderr().contains("X-Injected"),
        "the token's text is not logged",
    );
    let connects = requests_to(&reqs, "/connect").len();
    m.check(connects >= 2, &format!("{connects} connects"));
}

#[test]
fn sixty_four_silent_probe_clients_delay_neither_heartbeats_nor_healthz() {
    let f = Fixture::new("core-silent");
    let mut m = f.spawn_with_probes(&[]);
    let addr = m.probe_addr();
    m.wait_until(WAIT, "a first heartbeat", || heartbeat_count(&f) >= 1);
    // 64 connections that send nothing, held open for the whole test.
    let silent: Vec<std::net::TcpStream> = (0..64)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    let window_start = SystemTime::now();
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    // The kubelet's probe, every 200 ms for 5 s, each within 1 s.
    while started.elapsed() < Duration::from_secs(5) {
        let asked = Instant::now();
        let (status, body) = http_get(addr, "/healthz");
        slowest = slowest.max(asked.elapsed());
        m.check(
            status == 200 && body == "ok\n",
            &format!("/healthz: {status} {body}"),
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    m.check(
        slowest < Duration::from_secs(1),
        &format!("/healthz answered within 1 s under 64 silent clients: slowest {slowest:?}"),
    );
    // The interval is 1 s: no gap between two heartbeats much longer.
    let times: Vec<SystemTime> = f
        .sim
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/heartbeat") && r.at >= window_start)
        .map(|r| r.at)
        .collect();
    let widest = times
        .windows(2)
        .filter_map(|w| w[1].duration_since(w[0]).ok())
        .max()
        .unwrap_or(Duration::MAX);
    println!(
        "slowest /healthz under 64 silent clients: {slowest:?}; {} heartbeats in 5 s, widest gap {widest:?}",
        times.len()
    );
    m.check(
        times.len() >= 3 && widest < Duration::from_millis(2500),
        &format!(
            "heartbeats on time: {} in 5 s, widest gap {widest:?}",
            times.len()
        ),
    );
    drop(silent);
    m.stop_expecting_exit_0();
}
