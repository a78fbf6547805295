//! A Control Plane and a cluster that misbehave (docs/protocol.md, "Hostile and
//! buggy values", "State budget", "Ownership"): each trigger on the real test
//! bed, asserting the behaviour: the process alive, nothing written that the
//! checks refused, the ledger intact, the failure visible.

mod support;

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use nexo_cpsim::{Endpoint, Fault, FaultAction};
use nexo_manager::apply::{self as execute, Context};
use nexo_manager::commands::{self, Command};
use nexo_manager::image::ImageRef;
use nexo_manager::kube::Client;
use nexo_manager::kube::pause::{Pause, Wake};
use nexo_manager::state::{self, LedgerEntry, State, StateSecret};
use nexo_manager::words::{AckResult, ResourceAction};
use serde_json::{Value, json};
use support::commands::{command, configmap, ns_path, proxy, wait_ack};
use support::fixture::{Fixture, PROXY_IMAGE};
use support::manager::Manager;
use support::{PROBES_ON_ANY_PORT, http_get};

const WAIT: Duration = Duration::from_secs(60);

/// Starts the Manager with `env` and probes on (on a port of its own).
fn spawn_with_probes(f: &Fixture, mut env: std::collections::BTreeMap<String, String>) -> Manager {
    env.insert("NEXO_LISTEN_ADDR".into(), PROBES_ON_ANY_PORT.into());
    f.spawn(&env)
}

fn deploy(f: &Fixture, id: &str, name: &str, manifests: Vec<Value>) -> Value {
    command(
        id,
        "deploy",
        json!({"deployment": {"name": name, "namespace": f.ns.name}, "format": "crd", "manifests": manifests}),
    )
}

fn load_state(f: &Fixture) -> State {
    StateSecret::new(&f.ns.name, "nexo-manager-state", &f.env_id)
        .load(&f.tb.admin())
        .unwrap()
}

/// The size of the stored state document, bytes.
fn state_size(f: &Fixture) -> usize {
    let secret: Value =
        f.tb.admin()
            .get(&ns_path(f, "Secret", "nexo-manager-state"))
            .unwrap();
    let b64 = secret["data"]["state.json"].as_str().unwrap_or_default();
    b64.len() / 4 * 3
}

#[test]
fn beta_cannot_relabel_or_garbage_collect_alphas_objects() {
    let f = Fixture::new("hostile-owner");
    f.tb.install_crds();
    let mut m = f.spawn(&f.env());
    let c = f.tb.admin();
    f.sim.enqueue_command(
        &f.env_id,
        deploy(
            &f,
            "alpha-1",
            "alpha",
            vec![proxy("alpha"), configmap("alpha-config")],
        ),
    );
    let ack = wait_ack(&f, &mut m, "alpha-1");
    m.check(
        ack["result"] == "applied",
        &format!("alpha deployed: {ack}"),
    );
    let before: Value = c.get(&ns_path(&f, "ConfigMap", "alpha-config")).unwrap();
    // beta's deploy names alpha's ConfigMap.
    f.sim.enqueue_command(
        &f.env_id,
        deploy(
            &f,
            "beta-1",
            "beta",
            vec![proxy("beta"), configmap("alpha-config")],
        ),
    );
    let ack = wait_ack(&f, &mut m, "beta-1");
    m.check(
        ack["result"] == "failed"
            && ack["message"]
                .as_str()
                .is_some_and(|s| s.contains("belongs to deployment alpha")),
        &format!("beta's deploy is refused: {ack}"),
    );
    m.check(
        ack["resources"] == json!([{"apiVersion": "v1", "kind": "ConfigMap", "namespace": f.ns.name, "name": "alpha-config", "action": "refused"}]),
        &format!("the refused object is listed: {ack}"),
    );
    let after: Value = c.get(&ns_path(&f, "ConfigMap", "alpha-config")).unwrap();
    m.check(
        after["metadata"]["labels"] == before["metadata"]["labels"]
            && after["metadata"]["ownerReferences"] == before["metadata"]["ownerReferences"]
            && after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"],
        &format!("alpha's ConfigMap untouched:\nbefore {before}\nafter {after}"),
    );
    m.check(
        c.get_opt::<Value>(&ns_path(&f, "NexoProxy", "beta"))
            .unwrap()
            .is_none(),
        "nothing of beta applied",
    );
    // Uninstalling beta cannot take alpha's configuration with it.
    f.sim.enqueue_command(
        &f.env_id,
        command(
            "beta-2",
            "uninstall",
            json!({"deployment": {"name": "beta", "namespace": f.ns.name}}),
        ),
    );
    let ack = wait_ack(&f, &mut m, "beta-2");
    m.check(
        ack["result"] == "applied" && ack["resources"][0]["action"] == "absent",
        &format!("{ack}"),
    );
    // Nothing to wait for: the point is that nothing happens. Two seconds
    // give the garbage collector time to act, were alpha's ConfigMap beta's.
    std::thread::sleep(Duration::from_secs(2));
    m.check(
        c.get_opt::<Value>(&ns_path(&f, "ConfigMap", "alpha-config"))
            .unwrap()
            .is_some(),
        "alpha's ConfigMap survives beta's uninstall",
    );
}

/// Runs `race` once, just before the Kubernetes request number `at` (from 1)
/// of the client it is given to: another writer acting between the
/// executor's read and its write.
struct Racer {
    at: usize,
    seen: Cell<usize>,
    race: Box<dyn Fn()>,
}

impl Pause for Racer {
    fn pause(&self, timeout: Duration) -> Wake {
        std::thread::sleep(timeout);
        Wake::Timeout
    }
    fn checkpoint(&self) {
        self.seen.set(self.seen.get() + 1);
        if self.seen.get() == self.at {
            (self.race)();
        }
    }
}

fn racing_client(f: &Fixture, at: usize, race: impl Fn() + 'static) -> (Client, Rc<Racer>) {
    let racer = Rc::new(Racer {
        at,
        seen: Cell::new(0),
        race: Box::new(race),
    });
    (f.tb.admin().with_pause(racer.clone()), racer)
}

fn parse(f: &Fixture, cmd: &Value) -> Command {
    commands::parse(
        &cmd.to_string(),
        nexo_manager::agent::CAPABILITIES,
        std::slice::from_ref(&f.ns.name),
    )
    .unwrap_or_else(|e| panic!("{e:?}"))
}

fn run(f: &Fixture, client: &Client, cmd: &Command) -> execute::Outcome {
    let image = ImageRef::parse(PROXY_IMAGE).unwrap();
    let namespaces = vec![f.ns.name.clone()];
    let policy = nexo_manager::policy::Policy::default();
    let key = f.integrity_key();
    let own = nexo_manager::ownership::OwnObjects::new(
        &f.ns.name,
        "nexo-manager-state",
        "nexo-manager",
        "nexo-manager",
    );
    let ctx = Context {
        kube: client,
        writer: client,
        environment_id: &f.env_id,
        allow_legacy_adoption: false,
        proxy_image: &image,
        namespaces: &namespaces,
        own_namespace: &f.ns.name,
        self_deployment: "nexo-manager",
        policy: &policy,
        own: &own,
        integrity: Some(&key),
        adopt_unproven: false,
        enforcing: false,
        planning: false,
    };
    let rules = nexo_manager::apply::Rules {
        policy: &policy,
        proxy_image: &image,
        own: &own,
        running_bundle: None,
    };
    // As the batch does it: permitted, then executed.
    match nexo_manager::apply::permit(cmd.clone(), &rules) {
        Ok(permitted) => execute::run(&ctx, &permitted),
        Err(refusal) => execute::Outcome::refused(refusal, Vec::new()),
    }
}

#[test]
fn a_deploy_does_not_write_over_an_object_that_appears_after_it_was_read() {
    let f = Fixture::new("hostile-race-create");
    f.tb.install_crds();
    let admin = f.tb.admin();
    let ns = f.ns.name.clone();
    // Requests: GET proxy, GET configmap, then the dry runs: the ConfigMap
    // appears, unrelated, between the reads and the dry runs.
    let (client, racer) = racing_client(&f, 3, move || {
        admin
            .create(
                &format!("/api/v1/namespaces/{ns}/configmaps"),
                &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "race-config"}, "data": {"theirs": "1"}}),
            )
            .unwrap();
    });
    let cmd = parse(
        &f,
        &deploy(
            &f,
            "race-1",
            "race",
            vec![proxy("race"), configmap("race-config")],
        ),
    );
    let outcome = run(&f, &client, &cmd);
    assert!(racer.seen.get() >= 3, "the race ran");
    assert!(
        outcome.result == AckResult::Failed
            && outcome.message.contains("not managed by nexo-manager"),
        "{outcome:?}"
    );
    let theirs: Value =
        f.tb.admin()
            .get(&ns_path(&f, "ConfigMap", "race-config"))
            .unwrap();
    assert_eq!(theirs["data"], json!({"theirs": "1"}), "{theirs}");
    assert!(
        theirs["metadata"]["labels"].is_null(),
        "not labelled as ours: {theirs}"
    );
    // What it did create is exactly what an apply makes: one Apply entry.
    let proxy: Value = f.tb.admin().get(&ns_path(&f, "NexoProxy", "race")).unwrap();
    let managers: Vec<(String, String)> = proxy["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["manager"].as_str().unwrap().to_owned(),
                m["operation"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        managers,
        [("nexo-manager".to_owned(), "Apply".to_owned())],
        "{proxy}"
    );
}

#[test]
fn an_uninstall_does_not_delete_an_object_changed_after_it_was_read() {
    let f = Fixture::new("hostile-race-delete");
    f.tb.install_crds();
    f.create_proxy("gone", f.owned_labels("gone"), 1, PROXY_IMAGE);
    let admin = f.tb.admin();
    let path = ns_path(&f, "NexoProxy", "gone");
    // Requests: GET proxy, then DELETE: another environment takes it over
    // in between.
    let (client, _racer) = racing_client(&f, 2, move || {
        admin
            .patch(
                &path,
                "application/merge-patch+json",
                &json!({"metadata": {"labels": {"nexo.io/owner-id": "env-other"}}}),
            )
            .unwrap();
    });
    let cmd = parse(
        &f,
        &command(
            "gone-1",
            "uninstall",
            json!({"deployment": {"name": "gone", "namespace": f.ns.name}}),
        ),
    );
    let outcome = run(&f, &client, &cmd);
    assert!(
        outcome.result == AckResult::Failed
            && outcome.message.contains("belongs to environment env-other"),
        "{outcome:?}"
    );
    assert!(
        f.tb.admin()
            .get_opt::<Value>(&ns_path(&f, "NexoProxy", "gone"))
            .unwrap()
            .is_some(),
        "not deleted"
    );
}

/// A delivered ledger entry of a rollout that listed `n` absent targets.
fn seeded_entry(id: &str, n: usize) -> LedgerEntry {
    LedgerEntry {
        command_id: id.into(),
        result: AckResult::Failed,
        message: "m".repeat(5000),
        resources: (0..n)
            .map(|i| nexo_manager::cp::wire::AckResource {
                api_version: "nexo.io/v1alpha1".into(),
                kind: "NexoProxy".into(),
                namespace: "shop".into(),
                name: format!("seeded-proxy-{i:04}"),
                action: ResourceAction::Absent,
            })
            .collect(),
        completed_at: "2026-12-03T00:00:00Z".into(),
        delivered: true,
        attempts: 1,
        more_resources: Default::default(),
        keep_until: None,
        class: String::new(),
        plan: None,
    }
}

#[test]
fn the_state_stays_under_budget_and_a_deleted_state_secret_is_created_again() {
    let f = Fixture::new("hostile-state");
    f.tb.install_crds();
    // A ledger near the budget, as a long run leaves it.
    let mut seeded = State::default();
    let mut n = 0;
    while serde_json::to_vec(&seeded).unwrap().len() < state::STATE_BUDGET - 20_000 {
        seeded.record(seeded_entry(&format!("old-{n}"), 100));
        n += 1;
    }
    StateSecret::new(&f.ns.name, "nexo-manager-state", &f.env_id)
        .update(&f.tb.admin(), &State::default(), |s| *s = seeded.clone())
        .unwrap();
    let mut m = spawn_with_probes(&f, f.env());
    // Rollouts of 100 absent targets: 100 resources and a long message each.
    let targets: Vec<Value> = (0..100)
        .map(|i| json!({"name": format!("missing-{i:03}"), "namespace": f.ns.name}))
        .collect();
    for i in 0..8 {
        let id = format!("roll-{i}");
        f.sim.enqueue_command(
            &f.env_id,
            command(
                &id,
                "rollout",
                json!({"imageTag": "1.4.3", "targets": targets}),
            ),
        );
        let ack = wait_ack(&f, &mut m, &id);
        m.check(
            ack["result"] == "failed" && ack["resources"].as_array().unwrap().len() == 100,
            "the first ack lists every target",
        );
        let size = state_size(&f);
        m.check(
            size <= state::STATE_BUDGET,
            &format!("after {id}: the state is {size} bytes"),
        );
    }
    let state = load_state(&f);
    m.check(
        state.find("old-0").is_none() && state.find("roll-7").is_some(),
        "the oldest delivered entries left first",
    );
    let entry = state.find("roll-7").unwrap();
    m.check(
        entry.resources.len() == state::RESOURCES_MAX
            && entry.message.len() <= state::MESSAGE_MAX
            && entry.more_resources.get(&ResourceAction::Absent) == Some(&36),
        &format!(
            "the entry is cut: {} resources, {:?}",
            entry.resources.len(),
            entry.more_resources
        ),
    );
    // A command sent again is acknowledged from the ledger, not run again.
    let ack_posts = |f: &Fixture| -> Vec<Value> {
        f.sim
            .requests()
            .iter()
            .filter(|r| r.path.ends_with("/commands/roll-7/ack"))
            .filter_map(|r| r.json.clone())
            .collect()
    };
    f.sim.enqueue_command(
        &f.env_id,
        command(
            "roll-7",
            "rollout",
            json!({"imageTag": "1.4.3", "targets": targets}),
        ),
    );
    m.wait_until(WAIT, "the ack of roll-7 again", || ack_posts(&f).len() >= 2);
    let again = ack_posts(&f).pop().unwrap();
    // Only the recorded entry, delivered, says this: its message cut to the
    // budget, no resources. A new run's first ack would list all 100
    // resources with the whole message. So: not executed again.
    m.check(
        again["message"] == json!(entry.message) && again["resources"] == json!([]),
        &format!(
            "the recorded result, without resources once delivered: {}",
            again
        ),
    );
    // The state Secret deleted under the Manager: created again.
    f.tb.admin()
        .delete(&ns_path(&f, "Secret", "nexo-manager-state"), "Background")
        .unwrap();
    f.sim.enqueue_command(
        &f.env_id,
        command(
            "after-delete",
            "uninstall",
            json!({"deployment": {"name": "none", "namespace": f.ns.name}}),
        ),
    );
    let ack = wait_ack(&f, &mut m, "after-delete");
    m.check(ack["result"] == "applied", &format!("{ack}"));
    m.wait_until(WAIT, "the state secret again", || {
        f.tb.admin()
            .get_opt::<Value>(&ns_path(&f, "Secret", "nexo-manager-state"))
            .unwrap()
            .is_some()
    });
    let state = load_state(&f);
    m.check(
        state.find("after-delete").is_some() && state.find("roll-7").is_some(),
        "the state in memory is written again, with the new entry",
    );
    let failures = m.metric("nexo_manager_state_write_failures_total");
    m.check(
        failures == Some(0.0),
        &format!("no state write failed on the way: {failures:?}"),
    );
}

#[test]
fn a_state_secret_that_is_not_this_managers_is_never_loaded() {
    for (prefix, labels, said) in [
        ("hostile-foreign-a", json!({}), "is not this Manager's"),
        (
            "hostile-foreign-b",
            json!({"app.kubernetes.io/managed-by": "nexo-manager", "nexo.io/owner-id": "env-other"}),
            // Another environment's state: a Manager never switches.
            "but this Manager is bound to environment env-other",
        ),
    ] {
        let f = Fixture::new(prefix);
        let doc = r#"{"version":1,"ledger":[{"commandId":"planted","result":"applied","message":"","completedAt":"x","delivered":false}]}"#;
        f.tb.admin()
            .create(
                &format!("/api/v1/namespaces/{}/secrets", f.ns.name),
                &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "nexo-manager-state", "labels": labels},
                        "stringData": {"state.json": doc}}),
            )
            .unwrap();
        let mut m = f.spawn(&f.env());
        let status = m.wait_exit(WAIT);
        // The exit message is the contract here: what the operator reads.
        m.check(
            status.code() == Some(2) && m.stderr().contains(said) && f.sim.heartbeat_count() == 0,
            "exit 2 (configuration), no heartbeat, the planted ack never sent",
        );
    }
}

#[test]
fn a_failed_state_write_is_retried_then_reported_in_the_next_heartbeat() {
    let f = Fixture::new("hostile-state-write");
    // The inventory watches NexoProxies: without their CRD it reports an
    // error of its own, and the last check would see it.
    f.tb.install_crds();
    let mut m = spawn_with_probes(&f, f.env());
    m.wait_until(WAIT, "a heartbeat", || f.sim.heartbeat_count() >= 1);
    // An admission policy that refuses every write of this state Secret.
    let policy = format!("nexo-deny-state-{}", f.ns.name);
    let admin = f.tb.admin();
    admin
        .create(
            "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
            &json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
                    "metadata": {"name": policy},
                    "spec": {"failurePolicy": "Fail",
                             "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                 "operations": ["CREATE", "UPDATE"], "resources": ["secrets"]}]},
                             "validations": [{"expression": "object.metadata.name != 'nexo-manager-state'",
                                              "message": "state writes are refused by this test"}]}}),
        )
        .unwrap();
    admin
        .create(
            "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
            &json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
                    "metadata": {"name": policy},
                    "spec": {"policyName": policy, "validationActions": ["Deny"],
                             "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": f.ns.name}}}}}),
        )
        .unwrap();
    let remove = || {
        for kind in [
            "validatingadmissionpolicybindings",
            "validatingadmissionpolicies",
        ] {
            let _ = f.tb.admin().delete(
                &format!("/apis/admissionregistration.k8s.io/v1/{kind}/{policy}"),
                "Background",
            );
        }
    };
    // The policy takes effect once the API server has loaded it.
    let probe_path = format!("/api/v1/namespaces/{}/secrets?dryRun=All", f.ns.name);
    let deadline = Instant::now() + WAIT;
    // Only the policy's own refusal counts: the state Secret exists, so a
    // create the policy has not seen yet fails too (AlreadyExists).
    while !admin
        .create(
            &probe_path,
            &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "nexo-manager-state"}}),
        )
        .is_err_and(|e| e.to_string().contains("state writes are refused by this test"))
    {
        if Instant::now() > deadline {
            remove();
            m.fail("the admission policy never took effect");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    f.sim.enqueue_command(
        &f.env_id,
        command(
            "unrecorded",
            "uninstall",
            json!({"deployment": {"name": "none", "namespace": f.ns.name}}),
        ),
    );
    let ack = wait_ack(&f, &mut m, "unrecorded");
    let reported = |f: &Fixture| {
        f.sim.heartbeats().iter().any(|h| {
            h["inventoryErrors"].as_array().is_some_and(|e| {
                e.iter().any(|x| {
                    x.as_str()
                        .is_some_and(|s| s.contains("state secret") && s.contains("unrecorded"))
                })
            })
        })
    };
    let seen = Instant::now() + WAIT;
    while !reported(&f) && Instant::now() < seen {
        std::thread::sleep(Duration::from_millis(100));
    }
    remove();
    m.check(
        ack["result"] == "applied",
        &format!("acknowledged anyway: {ack}"),
    );
    m.check(
        reported(&f),
        "the next heartbeat reports the unrecorded result",
    );
    // Counted once a write has failed its second try, 1 s after the first.
    let failures = m.metric("nexo_manager_state_write_failures_total");
    m.check(
        failures >= Some(1.0),
        &format!("the write was tried again, and failed again: {failures:?}"),
    );
    // Once a write succeeds again, the report is gone.
    f.sim.enqueue_command(
        &f.env_id,
        command(
            "recorded",
            "uninstall",
            json!({"deployment": {"name": "none", "namespace": f.ns.name}}),
        ),
    );
    wait_ack(&f, &mut m, "recorded");
    let hb = f.sim.heartbeat_count();
    m.wait_until(WAIT, "two more heartbeats", || {
        f.sim.heartbeat_count() >= hb + 2
    });
    let last = f.sim.last_heartbeat().unwrap();
    m.check(
        last["inventoryErrors"]
            .as_array()
            .is_none_or(|e| e.is_empty()),
        &format!("cleared: {}", last["inventoryErrors"]),
    );
    m.check(load_state(&f).find("recorded").is_some(), "recorded");
}

#[test]
fn an_answer_of_1234_commands_takes_the_first_1000_and_skips_the_rest() {
    let f = Fixture::new("hostile-many");
    let mut env = f.env();
    env.insert("RUST_LOG".into(), "info".into());
    let commands: Vec<Value> = (0..1234)
        .map(|i| command(&format!("many-{i}"), "teleport", json!({})))
        .collect();
    f.sim.inject(Fault::new(
        Endpoint::Heartbeat,
        FaultAction::Raw {
            status: 200,
            body: json!({"commands": commands}).to_string(),
        },
    ));
    let mut m = spawn_with_probes(&f, env);
    // The simulator never issued these commands: it answers their acks 404
    // (forgotten), which the Manager counts as delivered.
    let ack_ids = |f: &Fixture| -> std::collections::BTreeSet<String> {
        f.sim
            .requests()
            .iter()
            .filter(|r| r.path.ends_with("/ack"))
            .filter_map(|r| r.json.as_ref()?["commandId"].as_str().map(str::to_owned))
            .collect()
    };
    m.wait_until(Duration::from_secs(300), "1000 acks", || {
        ack_ids(&f).len() >= 1000
    });
    let hb = f.sim.heartbeat_count();
    m.wait_until(WAIT, "the next heartbeat", || f.sim.heartbeat_count() > hb);
    let ids = ack_ids(&f);
    m.check(
        ids.len() == 1000 && ids.contains("many-999") && !ids.contains("many-1000"),
        &format!("{} acks, the first 1000 commands", ids.len()),
    );
    let metrics = m.metrics();
    for line in [
        "nexo_manager_commands_skipped_total 234\n",
        "nexo_manager_commands_refused_total{reason=\"unsupported_class\"} 1000\n",
        "nexo_manager_leader 1\n",
        "nexo_manager_cp_requests_total{endpoint=\"ack\",code=\"404\"} 1000\n",
        "nexo_manager_command_duration_seconds_count{class=\"invalid\"} 1000\n",
    ] {
        m.check(
            metrics.contains(line),
            &format!("/metrics lacks {line:?}:\n{metrics}"),
        );
    }
    for family in [
        "process_resident_memory_bytes ",
        "process_cpu_seconds_total ",
        "process_start_time_seconds ",
        "process_open_fds ",
        "nexo_manager_kubernetes_requests_total{verb=\"PUT\",code=\"200\"} ",
    ] {
        m.check(
            metrics.contains(family),
            &format!("/metrics lacks {family:?}"),
        );
    }
}

#[test]
fn values_cannot_forge_log_lines_and_command_text_is_never_logged() {
    let f = Fixture::new("hostile-logs");
    let forged = "evil\n2026-01-01T00:00:00.000Z INFO  nexo_manager::agent: forged";
    f.sim
        .enqueue_command(&f.env_id, command("log-1", forged, json!({})));
    f.sim.enqueue_command(
        &f.env_id,
        json!({"id": 7, "class": "deploy", "payload": {"stringData": {"password": "s3cr3t-value"}}}),
    );
    f.sim.enqueue_command(
        &f.env_id,
        json!({"id": "log-2", "class": "deploy", "payload": {"manifests": "s3cr3t-value"}}),
    );
    let mut m = f.spawn(&f.env());
    wait_ack(&f, &mut m, "log-2");
    let ack = wait_ack(&f, &mut m, "log-1");
    m.check(
        ack["message"] == format!("unsupported class: {forged}"),
        "the ack carries the value as it was",
    );
    // The log is the subject here: what a value can do to its lines, and
    // what never gets into it.
    let log = m.stderr();
    m.check(
        !log.lines()
            .any(|l| l.starts_with("2026-01-01T00:00:00.000Z")),
        "a newline in a value does not start a log line",
    );
    m.check(log.contains("evil\\n2026-01-01"), "it is escaped");
    m.check(!log.contains("s3cr3t-value"), "no command text in the logs");
    // JSON lines, the log format being the subject: klog's shape (`ts` in
    // seconds, `v`, a constant `msg`), the command's id, class, namespace
    // and deployment as fields, and a line's own values as fields.
    m.signal("TERM");
    m.wait_exit(WAIT);
    let f = Fixture::new("hostile-json");
    f.tb.install_crds();
    let mut env = f.env();
    env.insert("NEXO_LOG_FORMAT".into(), "json".into());
    f.sim.enqueue_command(
        &f.env_id,
        deploy(&f, "json-1", "orders", vec![proxy("orders")]),
    );
    let mut m = f.spawn(&env);
    wait_ack(&f, &mut m, "json-1");
    // Stopped first, so that no line is read half-written.
    m.signal("TERM");
    m.wait_exit(WAIT);
    let lines: Vec<Value> = m
        .stderr()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| m.fail(&format!("{e}: {l}"))))
        .collect();
    let of_command: Vec<&Value> = lines
        .iter()
        .filter(|l| l["commandId"] == "json-1")
        .collect();
    m.check(
        of_command.len() >= 2
            && of_command.iter().all(|l| {
                l["deployment"] == "orders" && l["namespace"] == f.ns.name && l["class"] == "deploy"
            }),
        &format!("lines of the command carry its fields: {of_command:?}"),
    );
    m.check(
        of_command
            .iter()
            .any(|l| l["msg"] == "command finished" && l["result"] == "applied"),
        &format!("the command's end: a constant message, its result a field: {of_command:?}"),
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    m.check(
        lines.iter().all(|l| {
            l["ts"]
                .as_f64()
                .is_some_and(|t| t > now - 600.0 && t <= now + 1.0)
                && l["v"].as_u64().is_some_and(|v| v <= 6)
                && l["logger"].as_str().is_some()
                && l["msg"].as_str().is_some_and(|m| !m.contains("json-1"))
        }),
        "every line: ts in seconds since the epoch, v, logger, and a message without values",
    );
    m.check(
        lines
            .iter()
            .any(|l| l["msg"] == "heartbeat accepted" && l["sequence"].as_u64().is_some()),
        "a number stays a number",
    );
    m.check(
        lines
            .iter()
            .filter(|l| l["commandId"].is_null())
            .any(|l| l["msg"].as_str().is_some_and(|s| s.contains("heartbeat"))),
        "other lines carry no command",
    );
}

/// Writes the Lease `nexo-manager` held by `holder`, renewed at `renew`
/// (RFC 3339), creating it or replacing it.
fn write_lease(f: &Fixture, holder: &str, renew: &str) {
    let c = f.tb.admin();
    let path = format!(
        "/apis/coordination.k8s.io/v1/namespaces/{}/leases/nexo-manager",
        f.ns.name
    );
    let mut lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "nexo-manager"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 5, "renewTime": renew, "acquireTime": renew}});
    match c.get_opt::<Value>(&path).unwrap() {
        None => {
            c.create(
                &format!(
                    "/apis/coordination.k8s.io/v1/namespaces/{}/leases",
                    f.ns.name
                ),
                &lease,
            )
            .unwrap();
        }
        Some(old) => {
            lease["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
            c.replace(&path, &lease).unwrap();
        }
    }
}

fn rfc3339(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_micros(t).to_string()
}

#[test]
fn lease_expiry_is_judged_by_the_local_clock_not_the_holders() {
    let f = Fixture::new("hostile-lease");
    let hour = Duration::from_secs(3600);
    // A holder whose clock is an hour behind, renewing every 500 ms: its
    // renewTime always looks an hour stale, yet it is alive. The 12 s are
    // the subject (more than twice the 5 s lease): nothing may happen.
    let start = Instant::now();
    write_lease(
        &f,
        "other-pod",
        &rfc3339(std::time::SystemTime::now() - hour),
    );
    let mut m = f.spawn(&f.env());
    while start.elapsed() < Duration::from_secs(12) {
        std::thread::sleep(Duration::from_millis(500));
        write_lease(
            &f,
            "other-pod",
            &rfc3339(std::time::SystemTime::now() - hour),
        );
        let alive = m.running();
        m.check(alive, "alive");
    }
    m.check(
        f.sim.heartbeat_count() == 0,
        "a live holder with a slow clock keeps the lease",
    );
    // The same holder, now an hour ahead and stopped: its renewTime looks
    // fresh for an hour, but the lease has not changed for 5 s.
    write_lease(
        &f,
        "other-pod",
        &rfc3339(std::time::SystemTime::now() + hour),
    );
    let stopped = Instant::now();
    // Judged by its renewTime the lease would be fresh for an hour: taking
    // over at all within the wait shows the local clock judged it.
    m.wait_until(WAIT, "taking over", || f.sim.heartbeat_count() >= 1);
    let took = stopped.elapsed();
    m.check(
        took >= Duration::from_secs(5),
        &format!("taken over {took:?} after the last change, before the 5 s lease ran out"),
    );
}

#[test]
fn dot_ids_are_skipped_and_a_command_built_to_expand_is_refused() {
    let f = Fixture::new("hostile-ids");
    for id in [".", "..", "./x", "-a"] {
        f.sim
            .enqueue_command(&f.env_id, command(id, "uninstall", json!({})));
    }
    // 256 KiB of `{}`: tiny on the wire, tens of MiB once parsed and planned.
    let tiny = vec![json!({}); 256 * 1024 / 3];
    f.sim.enqueue_command(
        &f.env_id,
        command(
            "expand-1",
            "deploy",
            json!({"deployment": {"name": "e", "namespace": f.ns.name}, "format": "crd",
                   "manifests": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "e"}, "data": {"k": tiny}}]}),
        ),
    );
    let mut m = spawn_with_probes(&f, f.env());
    let ack = wait_ack(&f, &mut m, "expand-1");
    m.check(
        ack["result"] == "failed"
            && ack["message"]
                .as_str()
                .is_some_and(|s| s.starts_with("invalid payload: too large")),
        &format!("{ack}"),
    );
    let odd: Vec<String> = f
        .sim
        .requests()
        .iter()
        .filter(|r| r.path.contains("/commands/") && !r.path.contains("/commands/expand-1/"))
        .map(|r| r.path.clone())
        .collect();
    m.check(odd.is_empty(), &format!("no ack for a bad id: {odd:?}"));
    let skipped = m.metric("nexo_manager_commands_refused_total{reason=\"no_id\"}");
    m.check(
        skipped >= Some(4.0),
        &format!("each bad id skipped: {skipped:?}"),
    );
}

#[test]
fn clients_dribbling_into_the_probe_port_do_not_slow_the_heartbeat() {
    let f = Fixture::new("hostile-dribble");
    let mut m = spawn_with_probes(&f, f.env());
    let addr = m.probe_addr();
    m.wait_until(WAIT, "a heartbeat", || f.sim.heartbeat_count() >= 1);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dribblers: Vec<_> = (0..8)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                use std::io::Write;
                // One byte every 100 ms, reconnecting whenever the Manager
                // closes the connection.
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
                        continue;
                    };
                    for b in b"GET /metrics HTTP/1.1\r\nHost: x\r\n" {
                        if stop.load(std::sync::atomic::Ordering::Relaxed)
                            || s.write_all(&[*b]).is_err()
                        {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            })
        })
        .collect();
    let before = f.sim.heartbeat_count();
    // The window is the subject: heartbeats counted while the dribblers run.
    std::thread::sleep(Duration::from_secs(10));
    let during = f.sim.heartbeat_count() - before;
    let (status, _) = http_get(addr, "/healthz");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for d in dribblers {
        let _ = d.join();
    }
    // A 1 s interval: about 10 heartbeats, each wake-up spending at most
    // 250 ms on the dribblers (the probe budget). A loop held by a dribbler
    // until it gives up (3.4 s a client) would send one or two: 5 tells the
    // two apart and leaves a loaded machine room.
    m.check(
        during >= 5,
        &format!("{during} heartbeats in 10 s with 8 clients dribbling"),
    );
    m.check(status == 200, &format!("/healthz answered {status}"));
}

#[test]
fn a_rollout_conflict_rechecks_the_deployment_the_proxy_belongs_to() {
    let f = Fixture::new("hostile-race-rollout");
    f.tb.install_crds();
    f.create_proxy("shared", f.owned_labels("shared"), 1, PROXY_IMAGE);
    let admin = f.tb.admin();
    let path = ns_path(&f, "NexoProxy", "shared");
    let racer_path = path.clone();
    // Requests: GET the proxy, then its guarded PATCH: between the two, the
    // proxy is given to another deployment of the same environment. The
    // PATCH conflicts; the re-read must apply the per-deployment rule.
    let (client, racer) = racing_client(&f, 2, move || {
        admin
            .patch(
                &racer_path,
                nexo_manager::kube::client::MERGE_PATCH,
                &json!({"metadata": {"labels": {"nexo.io/deployment": "orders"}}}),
            )
            .unwrap();
    });
    let cmd = parse(
        &f,
        &command(
            "race-rollout",
            "rollout",
            json!({"imageTag": "9.9.9", "targets": [{"name": "shared", "namespace": f.ns.name}]}),
        ),
    );
    let outcome = run(&f, &client, &cmd);
    assert!(racer.seen.get() >= 2, "the race ran");
    assert!(
        outcome.result == AckResult::Failed
            && outcome.message.contains("NexoProxy")
            && outcome.message.contains("/shared")
            // Given to another deployment, its proof (of deployment
            // `shared`) no longer holds: it is no longer the Manager's.
            && outcome.message.contains("no valid proof"),
        "{outcome:?}"
    );
    let after: Value = f.tb.admin().get(&path).unwrap();
    assert_eq!(
        after["spec"]["image"], PROXY_IMAGE,
        "not rolled out: {after}"
    );
}
