//! Command trust end to end (docs/protocol.md, "Command trust"): the real
//! binary, the CP simulator and the real test bed. A refused command must
//! write nothing: every test reads the cluster back, not only the ack.

mod support;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use nexo_cpsim::signing::{Signer, envelope, stamp};
use nexo_manager::kube::Client;
use serde_json::{Value, json};
use support::commands::{command, configmap, ns_path, proxy, wait_ack};
use support::fixture::Fixture;
use support::manager::{Manager, STOP_WAIT};

/// A Deployment of the 0.2.0 line (it meets `baseline`), changed by `change`.
fn legacy(name: &str, change: impl Fn(&mut Value)) -> Value {
    let mut d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
      "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}},
          "spec": {"containers": [{"name": "proxy", "image": "registry.example.com/nexo/proxy:0.2.0",
            "ports": [{"containerPort": 27017}], "securityContext": {"readOnlyRootFilesystem": true}}]}}}});
    change(&mut d);
    d
}

fn service(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name}, "spec": spec})
}

fn legacy_deploy(f: &Fixture, id: &str, name: &str, manifests: Vec<Value>) -> Value {
    command(
        id,
        "deploy",
        json!({"deployment": {"name": name, "namespace": f.ns.name}, "format": "legacy", "manifests": manifests}),
    )
}

/// The path of every manifest a deploy carries.
fn paths(f: &Fixture, deploy: &Value) -> Vec<String> {
    deploy["payload"]["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let kind = m["kind"].as_str().unwrap();
            ns_path(f, kind, m["metadata"]["name"].as_str().unwrap())
        })
        .collect()
}

/// Asserts that none of a deploy's objects exists.
fn nothing_written(f: &Fixture, m: &Manager, c: &Client, deploy: &Value, why: &str) {
    for path in paths(f, deploy) {
        let found = c.get_opt::<Value>(&path).unwrap();
        m.check(found.is_none(), &format!("{why}: {path} was written"));
    }
}

#[test]
fn every_policy_rule_refuses_and_writes_nothing() {
    let f = Fixture::new("trust-policy");
    let mut m = f.spawn_with_probes(&[]);
    let c = f.tb.admin();
    let pod = "/spec/template/spec";
    let c0 = "/spec/template/spec/containers/0";
    let cases: Vec<(&str, Vec<Value>, &str)> = vec![
        (
            "sa",
            vec![legacy("sa", |d| {
                d.pointer_mut(pod).unwrap()["serviceAccountName"] = json!("nexo-manager")
            })],
            "serviceAccountName: nexo-manager",
        ),
        (
            "priv",
            vec![legacy("priv", |d| {
                d.pointer_mut(c0).unwrap()["securityContext"]["privileged"] = json!(true)
            })],
            "privileged containers are not allowed",
        ),
        (
            "hostpath",
            vec![legacy("hostpath", |d| {
                d.pointer_mut(pod).unwrap()["volumes"] =
                    json!([{"name": "root", "hostPath": {"path": "/"}}])
            })],
            "field not allowed: spec.template.spec.volumes[0].hostPath",
        ),
        (
            "hostnet",
            vec![legacy("hostnet", |d| {
                d.pointer_mut(pod).unwrap()["hostNetwork"] = json!(true)
            })],
            "field not allowed: spec.template.spec.hostNetwork",
        ),
        (
            "caps",
            vec![legacy("caps", |d| {
                d.pointer_mut(c0).unwrap()["securityContext"]["capabilities"] =
                    json!({"add": ["SYS_ADMIN"]})
            })],
            "capability SYS_ADMIN may not be added",
        ),
        (
            "image",
            vec![legacy("image", |d| {
                d.pointer_mut(c0).unwrap()["image"] = json!("evil.example.com/miner:1")
            })],
            "image repository evil.example.com/miner is not allowed",
        ),
        (
            "token",
            vec![
                legacy("token", |_| {}),
                json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "token", "annotations": {"kubernetes.io/service-account.name": "nexo-manager"}}, "type": "kubernetes.io/service-account-token"}),
            ],
            "only Opaque and kubernetes.io/tls Secrets",
        ),
        (
            "lb",
            vec![
                legacy("lb", |_| {}),
                service(
                    "lb",
                    json!({"type": "LoadBalancer", "ports": [{"port": 27017}]}),
                ),
            ],
            "spec.type LoadBalancer needs NEXO_ALLOW_EXTERNAL_SERVICES=true",
        ),
        (
            "np",
            vec![
                legacy("np", |_| {}),
                service(
                    "np",
                    json!({"type": "NodePort", "ports": [{"port": 27017}]}),
                ),
            ],
            "spec.type NodePort needs",
        ),
        (
            "extname",
            vec![
                legacy("extname", |_| {}),
                service(
                    "extname",
                    json!({"type": "ExternalName", "externalName": "db.example.com"}),
                ),
            ],
            "ExternalName",
        ),
        (
            "extip",
            vec![
                legacy("extip", |_| {}),
                service(
                    "extip",
                    json!({"ports": [{"port": 27017}], "externalIPs": ["203.0.113.7"]}),
                ),
            ],
            "spec.externalIPs",
        ),
    ];
    for (name, manifests, rule) in &cases {
        let id = format!("pol-{name}");
        let deploy = legacy_deploy(&f, &id, name, manifests.clone());
        f.sim.enqueue_command(&f.env_id, deploy.clone());
        let ack = wait_ack(&f, &mut m, &id);
        let message = ack["message"].as_str().unwrap_or_default();
        m.check(
            ack["result"] == "failed" && message.starts_with("policy: ") && message.contains(rule),
            &format!("{name}: refused naming the rule {rule:?}: {ack}"),
        );
        nothing_written(&f, &m, &c, &deploy, name);
    }
    // A NexoProxy with an image from elsewhere, in a crd deploy.
    let mut foreign = proxy("foreign");
    foreign["spec"]["image"] = json!("ghcr.io/someone/proxy:1");
    let deploy = command(
        "pol-crd-image",
        "deploy",
        json!({"deployment": {"name": "foreign", "namespace": f.ns.name}, "format": "crd",
               "manifests": [foreign, configmap("foreign-config")]}),
    );
    f.sim.enqueue_command(&f.env_id, deploy.clone());
    let ack = wait_ack(&f, &mut m, "pol-crd-image");
    m.check(
        ack["result"] == "failed"
            && ack["message"]
                .as_str()
                .unwrap_or_default()
                .contains("NexoProxy"),
        &format!("a foreign proxy image is refused: {ack}"),
    );
    nothing_written(&f, &m, &c, &deploy, "crd image");
    let refused = m.metric("nexo_manager_commands_refused_total{reason=\"policy\"}");
    m.check(
        refused == Some(cases.len() as f64 + 1.0),
        &format!("every refusal counted: {refused:?}"),
    );
    // The 0.2.0 line's workload, with a ClusterIP Service, still deploys.
    let deploy = legacy_deploy(
        &f,
        "pol-ok",
        "billing",
        vec![
            legacy("billing", |_| {}),
            service(
                "billing",
                json!({"selector": {"app": "billing"}, "ports": [{"port": 27017}]}),
            ),
        ],
    );
    f.sim.enqueue_command(&f.env_id, deploy.clone());
    let ack = wait_ack(&f, &mut m, "pol-ok");
    m.check(
        ack["result"] == "applied",
        &format!("a baseline workload deploys: {ack}"),
    );
    for path in paths(&f, &deploy) {
        m.check(
            c.get_opt::<Value>(&path).unwrap().is_some(),
            &format!("{path} exists"),
        );
    }
    m.stop_expecting_exit_0();
}

#[test]
fn the_switches_widen_and_narrow_the_policy() {
    let f = Fixture::new("trust-switch");
    let mut m = f.spawn_with_probes(&[
        ("NEXO_ALLOW_EXTERNAL_SERVICES", "true"),
        ("NEXO_POD_SECURITY", "restricted"),
        (
            "NEXO_ALLOWED_IMAGE_REPOSITORIES",
            "mirror.example.com/nexo/proxy",
        ),
    ]);
    let c = f.tb.admin();
    // Baseline only: refused under restricted.
    let deploy = legacy_deploy(&f, "sw-baseline", "plain", vec![legacy("plain", |_| {})]);
    f.sim.enqueue_command(&f.env_id, deploy.clone());
    let ack = wait_ack(&f, &mut m, "sw-baseline");
    m.check(
        ack["result"] == "failed"
            && ack["message"]
                .as_str()
                .unwrap_or_default()
                .contains("(restricted)"),
        &format!("restricted refuses a baseline pod: {ack}"),
    );
    nothing_written(&f, &m, &c, &deploy, "restricted");
    // Hardened, from the allowed mirror, behind a LoadBalancer: applied.
    let hardened = legacy("hard", |d| {
        let pod = d.pointer_mut("/spec/template/spec").unwrap();
        pod["securityContext"] = json!({"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}});
        pod["containers"][0]["image"] = json!("mirror.example.com/nexo/proxy:0.2.0");
        pod["containers"][0]["securityContext"] =
            json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}});
    });
    let deploy = legacy_deploy(
        &f,
        "sw-hard",
        "hard",
        vec![
            hardened,
            service(
                "hard",
                json!({"type": "LoadBalancer", "selector": {"app": "hard"}, "ports": [{"port": 27017}]}),
            ),
        ],
    );
    f.sim.enqueue_command(&f.env_id, deploy.clone());
    let ack = wait_ack(&f, &mut m, "sw-hard");
    m.check(
        ack["result"] == "applied",
        &format!("allowed by the switches: {ack}"),
    );
    let svc = c.get_opt::<Value>(&ns_path(&f, "Service", "hard")).unwrap();
    m.check(
        svc.is_some_and(|s| s["spec"]["type"] == "LoadBalancer"),
        "the LoadBalancer Service exists",
    );
    m.stop_expecting_exit_0();
}

/// A uninstall of a deployment that is not there: applied when accepted,
/// and it writes nothing either way.
fn probe_command(id: &str, f: &Fixture) -> Value {
    command(
        id,
        "uninstall",
        json!({"deployment": {"name": "absent", "namespace": f.ns.name}}),
    )
}

#[test]
fn signed_commands_are_verified_and_every_bad_one_refused() {
    let f = Fixture::new("trust-signed");
    let signer = Arc::new(Signer::generate("k1"));
    f.sim.set_signer(&f.env_id, Arc::clone(&signer));
    let keys = f.dir.join("command-keys");
    std::fs::write(
        &keys,
        format!("# the simulator's key\n{}\n", signer.key_line()),
    )
    .unwrap();
    let mut m = f.spawn_with_probes(&[("NEXO_COMMAND_KEYS_FILE", keys.to_str().unwrap())]);
    let c = f.tb.admin();
    let env = f.env_id.clone();
    // A deploy whose objects are named after its id.
    let deploy = |id: &str| {
        command(
            id,
            "deploy",
            json!({"deployment": {"name": format!("d-{id}"), "namespace": f.ns.name}, "format": "crd",
                   "manifests": [proxy(&format!("d-{id}")), configmap(&format!("cm-{id}"))]}),
        )
    };
    let written = |id: &str| {
        [
            ("NexoProxy", format!("d-{id}")),
            ("ConfigMap", format!("cm-{id}")),
        ]
        .into_iter()
        .filter(|(kind, name)| {
            c.get_opt::<Value>(&ns_path(&f, kind, name))
                .unwrap()
                .is_some()
        })
        .map(|(kind, name)| format!("{kind} {name}"))
        .collect::<Vec<_>>()
    };
    // Signed by the simulator: applied, and written.
    f.sim.enqueue_command(&env, deploy("good"));
    let ack = wait_ack(&f, &mut m, "good");
    m.check(
        ack["result"] == "applied",
        &format!("a signed deploy is applied: {ack}"),
    );
    m.check(written("good").len() == 2, "its objects exist");

    // Every bad case: (outer id, what is queued as is, the reason, the id
    // whose objects would have been written).
    let stranger = Signer::generate("k1");
    let other_key = Signer::generate("k9");
    let tampered = {
        let mut e = signer.sign(&env, &deploy("bad-tamper"));
        let mut inner = deploy("bad-tamper");
        stamp(
            &mut inner,
            &env,
            SystemTime::now() + Duration::from_secs(300),
        );
        inner["payload"]["manifests"][1]["data"] = json!({"listen": "0.0.0.0:1"});
        let bytes = serde_json::to_vec(&inner).unwrap();
        e["signed"] = envelope(json!("bad-tamper"), "k1", &bytes, &[])["signed"].clone();
        e
    };
    let moved = {
        let mut e = signer.sign(&env, &deploy("bad-id-inner"));
        e["id"] = json!("bad-id");
        e
    };
    let other_env = {
        let mut inner = deploy("bad-env");
        inner["environmentId"] = json!("env-elsewhere");
        signer.sign(&env, &inner)
    };
    let late = {
        let mut inner = deploy("bad-late");
        inner["notAfter"] = json!("2026-01-01T00:00:00Z");
        signer.sign(&env, &inner)
    };
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        (
            "bad-unsigned",
            deploy("bad-unsigned"),
            "unsigned command",
            "bad-unsigned",
        ),
        (
            "bad-key",
            other_key.sign(&env, &deploy("bad-key")),
            "unknown keyId \"k9\"",
            "bad-key",
        ),
        (
            "bad-sig",
            stranger.sign(&env, &deploy("bad-sig")),
            "bad signature",
            "bad-sig",
        ),
        ("bad-tamper", tampered, "bad signature", "bad-tamper"),
        (
            "bad-id",
            moved,
            "signed id \"bad-id-inner\" differs",
            "bad-id-inner",
        ),
        (
            "bad-env",
            other_env,
            "signed for environment \"env-elsewhere\"",
            "bad-env",
        ),
        ("bad-late", late, "expired signed command", "bad-late"),
    ];
    for (id, queued, why, objects) in &cases {
        f.sim.enqueue_raw(&env, queued.clone());
        let ack = wait_ack(&f, &mut m, id);
        let message = ack["message"].as_str().unwrap_or_default();
        m.check(
            ack["result"] == "failed" && message.contains(why),
            &format!("{id}: refused with {why:?}: {ack}"),
        );
        let found = written(objects);
        m.check(found.is_empty(), &format!("{id}: written: {found:?}"));
    }
    let refused = m.metric("nexo_manager_commands_refused_total{reason=\"signature\"}");
    m.check(
        refused == Some(cases.len() as f64),
        &format!("every bad signature counted: {refused:?}"),
    );
    m.stop_expecting_exit_0();
}

#[test]
fn keys_rotate_by_rewriting_the_file() {
    let f = Fixture::new("trust-rotate");
    let (old, new) = (Signer::generate("k-old"), Signer::generate("k-new"));
    let keys = f.dir.join("command-keys");
    std::fs::write(&keys, format!("{}\n", old.key_line())).unwrap();
    let mut m = f.spawn_with_probes(&[("NEXO_COMMAND_KEYS_FILE", keys.to_str().unwrap())]);
    let send = |m: &mut Manager, id: &str, signer: &Signer| -> Value {
        f.sim
            .enqueue_raw(&f.env_id, signer.sign(&f.env_id, &probe_command(id, &f)));
        wait_ack(&f, m, id)
    };
    let ack = send(&mut m, "rot-1", &old);
    m.check(
        ack["result"] == "applied",
        &format!("the old key is accepted: {ack}"),
    );
    // Both keys during the rotation, then the new one alone.
    std::fs::write(&keys, format!("{}\n{}\n", old.key_line(), new.key_line())).unwrap();
    let ack = send(&mut m, "rot-2", &new);
    m.check(
        ack["result"] == "applied",
        &format!("the new key is accepted: {ack}"),
    );
    std::fs::write(&keys, format!("{}\n", new.key_line())).unwrap();
    let ack = send(&mut m, "rot-3", &old);
    m.check(
        ack["result"] == "failed"
            && ack["message"]
                .as_str()
                .unwrap_or_default()
                .contains("unknown keyId"),
        &format!("the retired key is refused: {ack}"),
    );
    let ack = send(&mut m, "rot-4", &new);
    m.check(
        ack["result"] == "applied",
        &format!("the new key still is: {ack}"),
    );
    // A file that cannot be used keeps the last good keys.
    std::fs::write(&keys, "k-new not-a-key\n").unwrap();
    let ack = send(&mut m, "rot-5", &new);
    m.check(
        ack["result"] == "applied",
        &format!("the last good keys stay: {ack}"),
    );
    m.stop_expecting_exit_0();
}

#[test]
fn an_unusable_key_file_at_start_is_a_configuration_error() {
    let f = Fixture::new("trust-badkeys");
    let keys = f.dir.join("command-keys");
    std::fs::write(&keys, "k1 c2hvcnQ=\n").unwrap();
    let mut env = f.env();
    env.insert("NEXO_COMMAND_KEYS_FILE".into(), keys.display().to_string());
    let mut m = f.spawn(&env);
    let status = m.wait_exit(STOP_WAIT);
    m.check(status.code() == Some(2), &format!("exit 2, got {status:?}"));
    // The exit message is the contract: what the operator reads.
    m.check(
        m.stderr().contains("NEXO_COMMAND_KEYS_FILE: line 1"),
        "the message names the variable and the line",
    );
}
