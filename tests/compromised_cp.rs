//! A compromised Control Plane can do no more than the cluster allows
//! (SECURITY.md, the threat model): each attack of an attacker holding the
//! CP, tried with the real binary against the real API server and the CP
//! simulator, and refused. A refused command must write nothing: every
//! test reads the cluster back, not only the ack.

mod support;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use nexo_cpsim::signing::Signer;
use nexo_cpsim::{Endpoint, Fault, FaultAction};
use nexo_manager::kube::Client;
use serde_json::{Value, json};
use support::commands::{command, configmap, ns_path, proxy, secret, wait_ack};
use support::fixture::Fixture;
use support::manager::{Manager, STOP_WAIT};

const WAIT: Duration = Duration::from_secs(60);

/// The ack's message.
fn message(ack: &Value) -> &str {
    ack["message"].as_str().unwrap_or_default()
}

fn deploy(f: &Fixture, id: &str, name: &str, format: &str, manifests: Vec<Value>) -> Value {
    command(
        id,
        "deploy",
        json!({"deployment": {"name": name, "namespace": f.ns.name}, "format": format, "manifests": manifests}),
    )
}

/// A legacy Deployment that meets `baseline`, changed by `change`.
fn legacy(name: &str, change: impl Fn(&mut Value)) -> Value {
    let mut d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
      "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}},
          "spec": {"containers": [{"name": "proxy", "image": "registry.example.com/nexo/proxy:0.2.0",
            "ports": [{"containerPort": 27017}]}]}}}});
    change(&mut d);
    d
}

/// The state document as stored.
fn stored_state(c: &Client, f: &Fixture) -> (Value, Value) {
    let secret: Value = c.get(&ns_path(f, "Secret", "nexo-manager-state")).unwrap();
    let b64 = secret["data"]["state.json"].as_str().unwrap_or_default();
    let doc = STANDARD.decode(b64).unwrap_or_default();
    let doc: Value = serde_json::from_slice(&doc).unwrap_or(Value::Null);
    (secret, doc)
}

/// Waits until the Manager is bound (its state Secret holds the binding).
fn wait_bound(f: &Fixture, m: &mut Manager, c: &Client) {
    m.wait_until(WAIT, "the binding in the state Secret", || {
        c.get_opt::<Value>(&ns_path(f, "Secret", "nexo-manager-state"))
            .unwrap()
            .is_some()
            && stored_state(c, f).1["binding"]["environmentId"] == f.env_id.as_str()
    });
}

fn exists(c: &Client, f: &Fixture, kind: &str, name: &str) -> bool {
    c.get_opt::<Value>(&ns_path(f, kind, name))
        .unwrap()
        .is_some()
}

#[test]
fn the_managers_own_objects_are_never_a_target() {
    let f = Fixture::new("atk-own");
    let mut m = f.spawn_with_probes(&[]);
    let c = f.tb.admin();
    wait_bound(&f, &mut m, &c);
    let (state, _) = stored_state(&c, &f);
    m.check(
        state["metadata"]["labels"]["nexo.io/role"] == "manager-state",
        &format!("the state Secret is labelled nexo.io/role=manager-state: {state}"),
    );

    // 1. A legacy deploy that carries a Secret named like the state Secret.
    let forged = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "nexo-manager-state"},
        "stringData": {"state.json": "{\"version\":1,\"ledger\":[]}"}});
    let cmd = deploy(
        &f,
        "own-state",
        "swap",
        "legacy",
        vec![legacy("swap", |_| {}), forged],
    );
    f.sim.enqueue_command(&f.env_id, cmd);
    let ack = wait_ack(&f, &mut m, "own-state");
    m.check(
        ack["result"] == "failed"
            && message(&ack) == "refused: the Manager's own object Secret/nexo-manager-state",
        &format!("the state Secret is refused by name: {ack}"),
    );
    m.check(!exists(&c, &f, "Deployment", "swap"), "nothing applied");
    let (_, doc) = stored_state(&c, &f);
    m.check(
        doc["binding"]["environmentId"] == f.env_id.as_str()
            && doc["ledger"]
                .as_array()
                .is_some_and(|l| l.iter().any(|e| e["commandId"] == "own-state")),
        &format!("the binding and the ledger are intact: {doc}"),
    );

    // 2. A manifest that carries the Manager's own label.
    let mut labelled = configmap("install-config");
    labelled["metadata"]["labels"] = json!({"app.kubernetes.io/name": "nexo-manager"});
    let cmd = deploy(
        &f,
        "own-label-sent",
        "labelled",
        "crd",
        vec![proxy("labelled"), labelled],
    );
    f.sim.enqueue_command(&f.env_id, cmd);
    let ack = wait_ack(&f, &mut m, "own-label-sent");
    m.check(
        message(&ack) == "refused: the Manager's own object ConfigMap/install-config",
        &format!("a manifest labelled as the Manager's is refused: {ack}"),
    );
    m.check(!exists(&c, &f, "NexoProxy", "labelled"), "nothing applied");

    // 3. An existing object labelled as the Manager's, whatever else its
    //    labels say (here: owned by this environment and this deployment).
    let mut labels = f.owned_labels("victim");
    labels["app.kubernetes.io/name"] = json!("nexo-manager");
    c.create(
        &format!("/api/v1/namespaces/{}/secrets", f.ns.name),
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "install-secret", "labels": labels},
                "stringData": {"k": "original"}}),
    )
    .unwrap();
    let mut over = secret("install-secret");
    over["stringData"] = json!({"k": "overwritten"});
    let cmd = deploy(
        &f,
        "own-label-read",
        "victim",
        "crd",
        vec![proxy("victim"), over],
    );
    f.sim.enqueue_command(&f.env_id, cmd);
    let ack = wait_ack(&f, &mut m, "own-label-read");
    m.check(
        message(&ack) == "refused: the Manager's own object Secret/install-secret",
        &format!("an object labelled as the Manager's is refused: {ack}"),
    );
    let kept: Value = c.get(&ns_path(&f, "Secret", "install-secret")).unwrap();
    m.check(
        kept["data"]["k"] == STANDARD.encode("original"),
        "the object is unchanged",
    );

    // 4. An uninstall of the Manager's own Deployment, labelled as owned.
    f.create_deployment(
        "nexo-manager",
        f.owned_labels("nexo-manager"),
        0,
        "registry.example.com/nexo/manager:0.3.0",
    );
    let cmd = command(
        "own-uninstall",
        "uninstall",
        json!({"deployment": {"name": "nexo-manager", "namespace": f.ns.name}}),
    );
    f.sim.enqueue_command(&f.env_id, cmd);
    let ack = wait_ack(&f, &mut m, "own-uninstall");
    m.check(
        message(&ack) == "refused: the Manager's own object Deployment/nexo-manager",
        &format!("the Manager's Deployment is refused by name: {ack}"),
    );
    m.check(exists(&c, &f, "Deployment", "nexo-manager"), "still there");

    // 5. The uninstall of a deployment whose label the state Secret was
    //    given: it lists the state Secret, and refuses. (No state write
    //    comes in between to take the label away: delivery flags wait for
    //    the next command's write.)
    f.create_deployment(
        "victim2",
        f.owned_labels("victim2"),
        0,
        "registry.example.com/nexo/proxy:1.4.2",
    );
    c.patch(
        &ns_path(&f, "Secret", "nexo-manager-state"),
        nexo_manager::kube::client::MERGE_PATCH,
        &json!({"metadata": {"labels": {"nexo.io/deployment": "victim2"}}}),
    )
    .unwrap();
    let cmd = command(
        "own-by-label",
        "uninstall",
        json!({"deployment": {"name": "victim2", "namespace": f.ns.name}}),
    );
    f.sim.enqueue_command(&f.env_id, cmd);
    let ack = wait_ack(&f, &mut m, "own-by-label");
    m.check(
        message(&ack) == "refused: the Manager's own object Secret/nexo-manager-state",
        &format!("the state Secret listed by label is refused: {ack}"),
    );
    m.check(
        exists(&c, &f, "Secret", "nexo-manager-state") && exists(&c, &f, "Deployment", "victim2"),
        "nothing deleted",
    );

    // 6. A rollout to a NexoProxy labelled as the Manager's.
    let mut labels = f.owned_labels("ctl");
    labels["app.kubernetes.io/name"] = json!("nexo-manager");
    f.create_proxy("ctl", labels, 1, "registry.example.com/nexo/proxy:1.4.2");
    let cmd = command(
        "own-rollout",
        "rollout",
        json!({"imageTag": "9.9.9", "targets": [{"name": "ctl", "namespace": f.ns.name}]}),
    );
    f.sim.enqueue_command(&f.env_id, cmd);
    let ack = wait_ack(&f, &mut m, "own-rollout");
    m.check(
        message(&ack) == "refused: the Manager's own object NexoProxy/ctl",
        &format!("a labelled NexoProxy is refused: {ack}"),
    );
    let ctl: Value = c.get(&ns_path(&f, "NexoProxy", "ctl")).unwrap();
    m.check(
        ctl["spec"]["image"] == "registry.example.com/nexo/proxy:1.4.2",
        "unchanged",
    );

    // 7. A NexoProxy that names the connect token's Secret (the bundle's
    //    name for it) as its MongoDB credentials.
    let mut reader = proxy("reader");
    reader["spec"]["mongodb"] =
        json!({"secretRef": {"name": "nexo-connect-token", "key": "connect-token"}});
    let cmd = deploy(&f, "own-ref", "reader", "crd", vec![reader]);
    f.sim.enqueue_command(&f.env_id, cmd);
    let ack = wait_ack(&f, &mut m, "own-ref");
    m.check(
        message(&ack).starts_with("refused: the Manager's own object Secret/nexo-connect-token"),
        &format!("a NexoProxy may not name the Manager's Secrets: {ack}"),
    );
    m.check(!exists(&c, &f, "NexoProxy", "reader"), "nothing applied");
    let refused = m.metric("nexo_manager_commands_refused_total{reason=\"ownership\"}");
    m.check(
        refused == Some(7.0),
        &format!("each refusal counted once: {refused:?}"),
    );
    m.stop_expecting_exit_0();
}

#[test]
fn the_pod_template_is_judged_by_an_allowlist_on_the_api_server() {
    let f = Fixture::new("atk-pod");
    let mut m = f.spawn_with_probes(&[]);
    let c = f.tb.admin();
    let ns = f.ns.name.clone();
    // What an attacker would like a pod to read: the connect token's
    // Secret, and an owned Secret of another deployment.
    c.create(
        &format!("/api/v1/namespaces/{ns}/secrets"),
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "nexo-connect-token"}, "stringData": {"token": "t"}}),
    )
    .unwrap();
    let secrets = format!("/api/v1/namespaces/{ns}/secrets");
    let orders_db = c
        .create(
            &secrets,
            &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "orders-db", "labels": f.owned_labels("orders")}, "stringData": {"uri": "u"}}),
        )
        .unwrap();
    f.prove(&secrets, &orders_db);
    // Another workload's pods.
    f.create_deployment(
        "other",
        json!({}),
        0,
        "registry.example.com/nexo/proxy:1.4.2",
    );
    let pod = "/spec/template/spec";
    let c0 = "/spec/template/spec/containers/0";
    let service = |name: &str, selector: Value| {
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
               "spec": {"selector": selector, "ports": [{"port": 27017}]}})
    };
    let cases: Vec<(&str, Vec<Value>, &str)> = vec![
        (
            "imgvol",
            vec![legacy(
                "imgvol",
                |d| {
                    d.pointer_mut(pod).unwrap()["volumes"] =
                        json!([{"name": "x", "image": {"reference": "evil.example.com/tools:1"}}])
                },
            )],
            "policy: field not allowed: spec.template.spec.volumes[0].image",
        ),
        (
            "token",
            vec![legacy("token", |d| {
                d.pointer_mut(pod).unwrap()["volumes"] = json!([{"name": "t", "projected": {"sources": [
                    {"serviceAccountToken": {"audience": "https://vault.example.com", "path": "t"}}]}}])
            })],
            "policy: field not allowed: spec.template.spec.volumes[0].projected",
        ),
        (
            "csi",
            vec![legacy(
                "csi",
                |d| {
                    d.pointer_mut(pod).unwrap()["volumes"] =
                        json!([{"name": "c", "csi": {"driver": "any.csi.example.com"}}])
                },
            )],
            "policy: field not allowed: spec.template.spec.volumes[0].csi",
        ),
        (
            "steal",
            vec![legacy("steal", |d| {
                d.pointer_mut(c0).unwrap()["env"] = json!([{"name": "T", "valueFrom":
                    {"secretKeyRef": {"name": "nexo-connect-token", "key": "token"}}}])
            })],
            "Secret nexo-connect-token is the Manager's own",
        ),
        (
            "borrow",
            vec![legacy("borrow", |d| {
                d.pointer_mut(c0).unwrap()["envFrom"] =
                    json!([{"secretRef": {"name": "orders-db"}}])
            })],
            "Secret orders-db belongs to deployment orders",
        ),
        (
            "statevol",
            vec![legacy(
                "statevol",
                |d| {
                    d.pointer_mut(pod).unwrap()["volumes"] =
                        json!([{"name": "s", "secret": {"secretName": "nexo-manager-state"}}])
                },
            )],
            "Secret nexo-manager-state is the Manager's own",
        ),
        (
            "hostport",
            vec![legacy("hostport", |d| {
                d.pointer_mut(c0).unwrap()["ports"][0]["hostPort"] = json!("27017")
            })],
            "hostPort is not allowed",
        ),
        (
            "wide",
            vec![
                legacy("wide", |_| {}),
                service("wide", json!({"app": "other"})),
            ],
            "app=other is not a label of the deployment's pod template",
        ),
    ];
    for (name, manifests, rule) in &cases {
        let id = format!("pod-{name}");
        let cmd = deploy(&f, &id, name, "legacy", manifests.clone());
        f.sim.enqueue_command(&f.env_id, cmd);
        let ack = wait_ack(&f, &mut m, &id);
        m.check(
            ack["result"] == "failed"
                && message(&ack).starts_with("policy: ")
                && message(&ack).contains(rule),
            &format!("{name}: refused naming {rule:?}: {ack}"),
        );
        for manifest in manifests {
            let kind = manifest["kind"].as_str().unwrap();
            let mname = manifest["metadata"]["name"].as_str().unwrap();
            m.check(
                !exists(&c, &f, kind, mname),
                &format!("{name}: {kind} {mname} was written"),
            );
        }
    }
    // Its own Secret, carried by the deploy, and a Service that selects
    // its own pods: applied.
    let cmd = deploy(
        &f,
        "pod-ok",
        "fine",
        "legacy",
        vec![
            legacy("fine", |d| {
                d.pointer_mut(c0).unwrap()["env"] = json!([{"name": "URI", "valueFrom":
                {"secretKeyRef": {"name": "fine-db", "key": "uri"}}}])
            }),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "fine-db"}, "stringData": {"uri": "u"}}),
            service("fine", json!({"app": "fine"})),
        ],
    );
    f.sim.enqueue_command(&f.env_id, cmd);
    let ack = wait_ack(&f, &mut m, "pod-ok");
    m.check(
        ack["result"] == "applied",
        &format!("a workload inside its deployment deploys: {ack}"),
    );
    // The same deployment again, naming the Secret it owns in the cluster now.
    let cmd = deploy(
        &f,
        "pod-ok-2",
        "fine",
        "legacy",
        vec![legacy("fine", |d| {
            d.pointer_mut(c0).unwrap()["env"] = json!([{"name": "URI", "valueFrom":
            {"secretKeyRef": {"name": "fine-db", "key": "uri"}}}])
        })],
    );
    f.sim.enqueue_command(&f.env_id, cmd);
    let ack = wait_ack(&f, &mut m, "pod-ok-2");
    m.check(
        ack["result"] == "applied",
        &format!("an owned Secret of the same deployment: {ack}"),
    );
    m.stop_expecting_exit_0();
}

#[test]
fn the_namespace_profile_is_the_floor() {
    let f = Fixture::new("atk-pss");
    let c = f.tb.admin();
    c.patch(
        &format!("/api/v1/namespaces/{}", f.ns.name),
        nexo_manager::kube::client::MERGE_PATCH,
        &json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}),
    )
    .unwrap();
    // NEXO_POD_SECURITY stays baseline: the namespace is stricter.
    let mut m = f.spawn_with_probes(&[]);
    let cmd = deploy(
        &f,
        "pss-1",
        "plain",
        "legacy",
        vec![legacy("plain", |_| {})],
    );
    f.sim.enqueue_command(&f.env_id, cmd);
    let ack = wait_ack(&f, &mut m, "pss-1");
    m.check(
        ack["result"] == "failed"
            && message(&ack).contains("(restricted)")
            && message(&ack).contains("enforces restricted"),
        &format!("a baseline-only template is refused where admission enforces restricted: {ack}"),
    );
    m.check(!exists(&c, &f, "Deployment", "plain"), "nothing applied");
    let hardened = legacy("hard", |d| {
        let pod = d.pointer_mut("/spec/template/spec").unwrap();
        pod["securityContext"] = json!({"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}});
        pod["containers"][0]["securityContext"] =
            json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}});
    });
    let cmd = deploy(&f, "pss-2", "hard", "legacy", vec![hardened]);
    f.sim.enqueue_command(&f.env_id, cmd);
    let ack = wait_ack(&f, &mut m, "pss-2");
    m.check(
        ack["result"] == "applied",
        &format!("a restricted template deploys: {ack}"),
    );
    m.stop_expecting_exit_0();
}

/// A keys file holding `signer`'s key.
fn keys_file(f: &Fixture, signer: &Signer) -> std::path::PathBuf {
    let path = f.dir.join("command-keys");
    std::fs::write(&path, format!("{}\n", signer.key_line())).unwrap();
    path
}

#[test]
fn a_signature_counts_once_and_never_for_long() {
    let f = Fixture::new("atk-replay");
    let signer = Arc::new(Signer::generate("k1"));
    let keys = keys_file(&f, &signer);
    let mut m = f.spawn_with_probes(&[("NEXO_COMMAND_KEYS_FILE", keys.to_str().unwrap())]);
    let c = f.tb.admin();
    let env = f.env_id.clone();
    let crd = |id: &str| deploy(&f, id, "victim", "crd", vec![proxy("victim")]);
    let send = |m: &mut Manager, signed: &Value, id: &str| {
        f.sim.enqueue_raw(&env, signed.clone());
        wait_ack(&f, m, id)
    };
    let ack = send(&mut m, &signer.sign(&env, &crd("rp-deploy")), "rp-deploy");
    m.check(ack["result"] == "applied", &format!("signed deploy: {ack}"));
    let uninstall = signer.sign(
        &env,
        &command(
            "rp-uninstall",
            "uninstall",
            json!({"deployment": {"name": "victim", "namespace": f.ns.name}}),
        ),
    );
    let uninstalled = send(&mut m, &uninstall, "rp-uninstall");
    let ack = uninstalled.clone();
    m.check(
        ack["result"] == "applied" && !exists(&c, &f, "NexoProxy", "victim"),
        &format!("signed uninstall: {ack}"),
    );
    let ack = send(
        &mut m,
        &signer.sign(&env, &crd("rp-deploy-2")),
        "rp-deploy-2",
    );
    m.check(
        ack["result"] == "applied" && exists(&c, &f, "NexoProxy", "victim"),
        &format!("deployed again: {ack}"),
    );

    // A flood of junk, more than the ledger's 256 entries.
    for i in 0..300 {
        f.sim.enqueue_raw(
            &env,
            command(
                &format!("junk-{i}"),
                "uninstall",
                json!({"deployment": {"name": "nothing", "namespace": f.ns.name}}),
            ),
        );
    }
    let ack = wait_ack(&f, &mut m, "junk-299");
    m.check(
        message(&ack).starts_with("unsigned command"),
        &format!("junk refused: {ack}"),
    );
    let (_, doc) = stored_state(&c, &f);
    let ledger = doc["ledger"].as_array().cloned().unwrap_or_default();
    m.check(
        !ledger.iter().any(|e| {
            e["commandId"]
                .as_str()
                .is_some_and(|id| id.starts_with("junk-"))
        }),
        "nothing refused before verification is recorded",
    );
    let pinned = ledger.iter().find(|e| e["commandId"] == "rp-uninstall");
    m.check(
        pinned.is_some_and(|e| e["keepUntil"].is_string()),
        &format!("the signed uninstall is kept until its notAfter: {pinned:?}"),
    );

    // The same signed uninstall, sent again: its recorded result, not a second run.
    let ack_posts = || {
        f.sim
            .requests()
            .iter()
            .filter(|r| r.path.ends_with("/commands/rp-uninstall/ack"))
            .count()
    };
    let acks_before = ack_posts();
    f.sim.enqueue_raw(&env, uninstall.clone());
    m.wait_until(WAIT, "the replayed uninstall's ack", || {
        ack_posts() > acks_before
    });
    let replayed = f
        .sim
        .requests()
        .into_iter()
        .rev()
        .find(|r| r.path.ends_with("/commands/rp-uninstall/ack"))
        .and_then(|r| r.json)
        .unwrap_or_default();
    m.check(
        replayed["result"] == "applied" && replayed["message"] == uninstalled["message"],
        &format!("acknowledged again with its recorded result: {replayed}"),
    );
    m.check(
        exists(&c, &f, "NexoProxy", "victim"),
        "the replay deleted nothing",
    );

    // A standing order: a signature valid for ten years.
    let mut standing = crd("rp-standing");
    standing["payload"]["deployment"]["name"] = json!("standing");
    standing["payload"]["manifests"] = json!([proxy("standing")]);
    standing["notAfter"] = json!(
        humantime::format_rfc3339_seconds(
            SystemTime::now() + Duration::from_secs(10 * 365 * 86400)
        )
        .to_string()
    );
    let ack = send(&mut m, &signer.sign(&env, &standing), "rp-standing");
    m.check(
        ack["result"] == "failed" && message(&ack).starts_with("validity too long"),
        &format!("a ten-year signature is refused: {ack}"),
    );
    m.check(!exists(&c, &f, "NexoProxy", "standing"), "nothing applied");
    let trust = f.sim.last_heartbeat().map(|h| h["trust"].clone());
    m.check(
        trust == Some(json!({"signatures": "required", "keyIds": ["k1"]})),
        &format!("the heartbeat says where trust stands: {trust:?}"),
    );
    m.stop_expecting_exit_0();
}

#[test]
fn signatures_fail_closed() {
    let f = Fixture::new("atk-closed");
    let signer = Arc::new(Signer::generate("k1"));
    let keys = keys_file(&f, &signer);
    let c = f.tb.admin();
    let env = f.env_id.clone();
    let probe = |id: &str, name: &str| deploy(&f, id, name, "crd", vec![proxy(name)]);
    let mut vars = f.env();
    vars.insert("NEXO_COMMAND_KEYS_FILE".into(), keys.display().to_string());
    let mut m = f.spawn(&vars);
    f.sim
        .enqueue_raw(&env, signer.sign(&env, &probe("fc-signed", "fc-signed")));
    let ack = wait_ack(&f, &mut m, "fc-signed");
    m.check(ack["result"] == "applied", &format!("signed: {ack}"));
    m.wait_until(WAIT, "the ratchet in the state", || {
        stored_state(&c, &f).1["signaturesRequired"] == true
    });

    // The key Secret is deleted: nothing unsigned gets in.
    std::fs::remove_file(&keys).unwrap();
    f.sim.enqueue_raw(&env, probe("fc-gone", "fc-gone"));
    let ack = wait_ack(&f, &mut m, "fc-gone");
    m.check(
        message(&ack).starts_with("no command keys"),
        &format!("refused without keys: {ack}"),
    );
    m.check(!exists(&c, &f, "NexoProxy", "fc-gone"), "nothing applied");
    m.stop_expecting_exit_0();

    // A restart without the keys file: still closed.
    let mut m = f.spawn(&vars);
    f.sim.enqueue_raw(&env, probe("fc-restart", "fc-restart"));
    let ack = wait_ack(&f, &mut m, "fc-restart");
    m.check(
        message(&ack).starts_with("no command keys"),
        &format!("refused after a restart: {ack}"),
    );
    m.check(
        !exists(&c, &f, "NexoProxy", "fc-restart"),
        "nothing applied",
    );
    let trust = f.sim.last_heartbeat().map(|h| h["trust"].clone());
    m.check(
        trust == Some(json!({"signatures": "required", "keyIds": []})),
        &format!("required, with no key: {trust:?}"),
    );
    m.stop_expecting_exit_0();

    // Only the operator opens it again.
    vars.insert("NEXO_COMMAND_SIGNATURES".into(), "off".into());
    let mut m = f.spawn(&vars);
    f.sim.enqueue_raw(&env, probe("fc-off", "fc-off"));
    let ack = wait_ack(&f, &mut m, "fc-off");
    m.check(
        ack["result"] == "applied",
        &format!("accepted once the operator says off: {ack}"),
    );
    m.check(
        m.stderr().contains("NEXO_COMMAND_SIGNATURES=off"),
        "off is logged at start",
    );
    let trust = f
        .sim
        .last_heartbeat()
        .map(|h| h["trust"]["signatures"].clone());
    m.check(
        trust == Some(json!("off")),
        &format!("the heartbeat says off: {trust:?}"),
    );
    m.stop_expecting_exit_0();

    // required, with no keys from the start.
    vars.insert("NEXO_COMMAND_SIGNATURES".into(), "required".into());
    let mut m = f.spawn(&vars);
    f.sim.enqueue_raw(&env, probe("fc-required", "fc-required"));
    let ack = wait_ack(&f, &mut m, "fc-required");
    m.check(
        message(&ack).starts_with("no command keys"),
        &format!("required without keys: {ack}"),
    );
    m.stop_expecting_exit_0();
}

#[test]
fn downgrades_are_refused_unless_allowed() {
    let f = Fixture::new("atk-downgrade");
    let c = f.tb.admin();
    f.create_deployment(
        "nexo-manager",
        json!({}),
        0,
        "registry.example.com/nexo/manager:0.3.0",
    );
    let mut m = f.spawn_with_probes(&[("NEXO_BUNDLE_VERSION", "0.3.0")]);
    let image = |d: char| {
        format!(
            "registry.example.com/nexo/manager@sha256:{}",
            d.to_string().repeat(64)
        )
    };
    let running = || -> Value {
        c.get::<Value>(&ns_path(&f, "Deployment", "nexo-manager"))
            .unwrap()["spec"]["template"]["spec"]["containers"][0]["image"]
            .clone()
    };
    f.sim.enqueue_command(
        &f.env_id,
        command(
            "dg-1",
            "upgrade",
            json!({"bundleVersion": "0.2.0", "managerImage": image('a')}),
        ),
    );
    let ack = wait_ack(&f, &mut m, "dg-1");
    m.check(
        ack["result"] == "failed" && message(&ack) == "downgrade: 0.3.0 to 0.2.0",
        &format!("an older bundle is refused: {ack}"),
    );
    m.check(
        running() == "registry.example.com/nexo/manager:0.3.0",
        "unchanged",
    );
    f.sim.enqueue_command(
        &f.env_id,
        command(
            "dg-2",
            "upgrade",
            json!({"bundleVersion": "0.3.0-rc.1", "managerImage": image('b')}),
        ),
    );
    let ack = wait_ack(&f, &mut m, "dg-2");
    m.check(
        message(&ack).starts_with("downgrade: 0.3.0 to 0.3.0-rc.1"),
        &format!("a pre-release is older: {ack}"),
    );
    f.sim.enqueue_command(
        &f.env_id,
        command(
            "dg-3",
            "upgrade",
            json!({"bundleVersion": "v0.4", "managerImage": image('c')}),
        ),
    );
    let ack = wait_ack(&f, &mut m, "dg-3");
    m.check(
        message(&ack).starts_with("invalid payload: bundleVersion"),
        &format!("not SemVer: {ack}"),
    );
    m.check(
        running() == "registry.example.com/nexo/manager:0.3.0",
        "still unchanged",
    );
    f.sim.enqueue_command(
        &f.env_id,
        command(
            "dg-4",
            "upgrade",
            json!({"bundleVersion": "0.2.0", "managerImage": image('d'), "allowDowngrade": true}),
        ),
    );
    let ack = wait_ack(&f, &mut m, "dg-4");
    m.check(
        ack["result"] == "applied",
        &format!("a deliberate downgrade: {ack}"),
    );
    m.check(running() == json!(image('d')), "patched");
    m.stop_expecting_exit_0();
}

#[test]
fn a_token_of_another_environment_is_fatal_and_never_sent() {
    let f = Fixture::new("atk-switch");
    let c = f.tb.admin();
    let mut m = f.spawn(&f.env());
    wait_bound(&f, &mut m, &c);
    m.wait_until(WAIT, "a heartbeat", || f.sim.heartbeat_count() > 0);
    // The token file rewritten with another environment's token, and this
    // environment's token revoked, so that the Manager reads the file again.
    let other = f.sim.add_environment("env-elsewhere");
    std::fs::write(f.token_file(), &other).unwrap();
    f.sim.rotate_token(&f.env_id);
    f.sim.expire_sessions();
    let status = m.wait_exit(WAIT);
    m.check(status.code() == Some(2), &format!("exit 2, got {status:?}"));
    let log = m.stderr();
    m.check(
        log.contains(&format!("the connect token is for environment env-elsewhere but this Manager is bound to environment {}", f.env_id)),
        "the message names both environments",
    );
    m.check(!log.contains(&other), "the token is not printed");
    let sent = f.sim.requests().iter().any(|r| {
        r.header("authorization")
            .is_some_and(|a| a.contains(&other))
    });
    m.check(!sent, "the other environment's token was never sent");

    // At start, too.
    let status = f.spawn(&f.env()).wait_exit(STOP_WAIT);
    m.check(
        status.code() == Some(2),
        &format!("exit 2 at start, got {status:?}"),
    );
    let sent = f.sim.requests().iter().any(|r| {
        r.header("authorization")
            .is_some_and(|a| a.contains(&other))
    });
    m.check(!sent, "never sent at start either");
}

#[test]
fn a_connect_403_of_another_code_is_retried() {
    let f = Fixture::new("atk-403");
    f.sim.inject(
        Fault::new(
            Endpoint::Connect,
            FaultAction::Status {
                status: 403,
                code: "maintenance".into(),
                message: "misrouted".into(),
                retry_after: None,
            },
        )
        .times(2),
    );
    let mut m = f.spawn(&f.env());
    m.wait_until(WAIT, "a heartbeat after two refused connects", || {
        f.sim.heartbeat_count() > 0
    });
    let alive = m.running();
    m.check(alive, "still running");
    m.stop_expecting_exit_0();
}
