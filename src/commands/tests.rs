//! Validation of commands, as plain values: the bad-input corpus.

use super::*;
use crate::agent::CAPABILITIES;
use crate::text::clip;
use serde_json::json;

const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn managed() -> Vec<String> {
    vec!["shop".into()]
}

fn proxy(name: &str) -> Value {
    json!({"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy", "metadata": {"name": name},
           "spec": {"image": "proxy:1", "mongodb": {"secretRef": {"name": "db"}}}})
}

fn good_deploy() -> Value {
    json!({"id": "cmd-1", "class": "deploy", "issuedAt": "2026-12-02T00:00:00Z", "requires": ["command.deploy.crd"],
           "payload": {"deployment": {"name": "orders", "namespace": "shop"}, "format": "crd",
                       "manifests": [proxy("orders"), {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "orders-config"}, "data": {}}]}})
}

/// A refusal acknowledged `failed`: the id the batch reads, and the message.
fn failed(raw: &str) -> Result<(String, String), String> {
    match parse(raw, CAPABILITIES, &managed()) {
        Err(Refusal::NoId(why)) => Err(format!("no id: {why}")),
        Err(refusal) => Ok((command_id(raw).unwrap(), refusal.to_string())),
        Ok(cmd) => Err(format!("parsed: {cmd:?}")),
    }
}

fn parse_value(v: &Value) -> Result<Command, Refusal> {
    parse(&v.to_string(), CAPABILITIES, &managed())
}

/// Every entry: a command and the start of the message its failed ack carries.
pub fn corpus() -> Vec<(String, &'static str)> {
    let with_payload = |class: &str, payload: Value| {
        json!({"id": "bad", "class": class, "payload": payload}).to_string()
    };
    let deploy = |f: &dyn Fn(&mut Value)| {
        let mut c = good_deploy();
        c["id"] = json!("bad");
        f(&mut c["payload"]);
        c.to_string()
    };
    let deep = format!("{}{}", "[".repeat(300), "]".repeat(300));
    vec![
        (json!({"id": "bad", "class": "teleport", "payload": {}}).to_string(), "unsupported class: teleport"),
        (json!({"id": "bad", "class": 7, "payload": {}}).to_string(), "unsupported class: 7"),
        (json!({"id": "bad", "payload": {}}).to_string(), "unsupported class: (missing)"),
        (json!({"id": "bad", "class": "rollout", "requires": ["command.teleport"], "payload": {}}).to_string(), "unsupported capability: command.teleport"),
        (json!({"id": "bad", "class": "rollout", "requires": "command.rollout", "payload": {}}).to_string(), "invalid payload: requires is not a list"),
        (json!({"id": "bad", "class": "rollout"}).to_string(), "invalid payload: payload is missing"),
        (json!({"id": "bad", "class": "rollout", "payload": [1]}).to_string(), "invalid payload: payload is not an object"),
        (format!(r#"{{"id": "bad", "class": "deploy", "payload": {deep}}}"#), "invalid payload: recursion limit exceeded"),
        (r#"{"id": "bad", "class": "deploy", "payload": {"format": "\ud800"}}"#.to_string(), "invalid payload:"),
        (with_payload("deploy", json!({"format": "crd", "manifests": []})), "invalid payload: deployment is missing"),
        (with_payload("deploy", json!({"deployment": {"name": "orders"}, "format": "crd"})), "invalid payload: deployment.namespace is missing"),
        (with_payload("deploy", json!({"deployment": {"name": "Orders!", "namespace": "shop"}})), "invalid payload: deployment.name \"Orders!\" is not a valid name"),
        (with_payload("deploy", json!({"deployment": {"name": "orders", "namespace": "kube-system"}, "format": "crd"})), "invalid payload: namespace kube-system is not managed"),
        (deploy(&|p| p["format"] = json!("helm")), "invalid payload: format \"helm\" is neither crd nor legacy"),
        (deploy(&|p| p["manifests"] = json!({})), "invalid payload: manifests is missing or not a list"),
        (deploy(&|p| p["manifests"] = json!([])), "invalid payload: manifests is empty"),
        (deploy(&|p| p["manifests"] = json!(vec![proxy("orders"); 65])), "invalid payload: 65 manifests, more than 64"),
        (deploy(&|p| p["manifests"][1]["data"] = json!({"big": "x".repeat(300 * 1024)})), "invalid payload: manifests[1]: "),
        (deploy(&|p| p["manifests"][1] = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}})), "invalid payload: manifests[1]: Namespace is cluster-scoped"),
        (deploy(&|p| p["manifests"][1] = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "x"}})), "invalid payload: manifests[1]: ClusterRole is cluster-scoped"),
        (deploy(&|p| p["manifests"][1] = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}})), "invalid payload: manifests[1]: apps/v1 Deployment is not allowed in format crd"),
        (deploy(&|p| p["manifests"][1]["metadata"]["namespace"] = json!("billing")), "invalid payload: manifests[1]: namespace \"billing\" differs"),
        (deploy(&|p| p["manifests"][1]["metadata"] = json!("x")), "invalid payload: manifests[1]: metadata is missing or not an object"),
        (deploy(&|p| p["manifests"][1]["metadata"]["name"] = json!(12)), "invalid payload: manifests[1]: metadata.name is not a string"),
        (deploy(&|p| p["manifests"][1]["kind"] = json!(null)), "invalid payload: manifests[1]: kind is missing"),
        (deploy(&|p| p["manifests"][1] = proxy("other")), "invalid payload: more than one NexoProxy"),
        (deploy(&|p| p["manifests"][0]["metadata"]["name"] = json!("billing")), "invalid payload: the NexoProxy is named billing, not orders"),
        (deploy(&|p| { p["manifests"].as_array_mut().unwrap().remove(0); }), "invalid payload: no NexoProxy among the manifests"),
        (deploy(&|p| p["manifests"][1] = p["manifests"][0].clone()), "invalid payload: manifests[1]: NexoProxy orders appears twice"),
        (deploy(&|p| p["manifests"][1]["metadata"]["ownerReferences"] = json!([])), "invalid payload: manifests[1]: metadata.ownerReferences is set by the Manager"),
        (deploy(&|p| p["manifests"][1]["metadata"]["labels"] = json!(["a"])), "invalid payload: manifests[1]: metadata.labels is not an object"),
        (deploy(&|p| p["migration"] = json!({"adoptLegacy": "yes"})), "invalid payload: migration.adoptLegacy is not a boolean"),
        (deploy(&|p| p["drift"] = json!({"mode": "fix"})), "invalid payload: drift.mode \"fix\" is not report, enforce or off"),
        (deploy(&|p| p["drift"] = json!({"ignore": ["spec/replicas"]})), "invalid payload: drift.ignore[0]: \"spec/replicas\" is not a JSON pointer"),
        (with_payload("rollout", json!({"imageTag": "bad tag"})), "invalid payload: imageTag \"bad tag\" is neither a tag nor sha256"),
        (with_payload("rollout", json!({"imageTag": 14})), "invalid payload: imageTag is not a string"),
        (with_payload("rollout", json!({"targets": []})), "invalid payload: targets is empty"),
        (with_payload("rollout", json!({"targets": [{"name": "a", "namespace": "elsewhere"}]})), "invalid payload: namespace elsewhere is not managed"),
        (with_payload("upgrade", json!({"bundleVersion": "0.3.0", "managerImage": "registry.example.com/nexo/manager:0.3.0"})), "invalid payload: managerImage \"registry.example.com/nexo/manager:0.3.0\" is not pinned by digest"),
        (with_payload("upgrade", json!({"bundleVersion": "0.3.0", "managerImage": "registry.example.com/nexo/manager@sha256:abc"})), "invalid payload: managerImage: "),
        (with_payload("upgrade", json!({"managerImage": format!("m@{D}")})), "invalid payload: bundleVersion is missing"),
        (with_payload("uninstall", json!({"deployment": "orders"})), "invalid payload: deployment is missing or not an object"),
        (deploy(&|p| p["onFailure"] = json!("later")), "invalid payload: onFailure \"later\" is neither \"rollback\" nor \"stay\""),
        (deploy(&|p| p["onFailure"] = json!(true)), "invalid payload: onFailure is not a string"),
        (with_payload("rollout", json!({"onFailure": "retry"})), "invalid payload: onFailure \"retry\""),
        (with_payload("plan", json!({"class": "teleport", "payload": {}})), "invalid payload: class \"teleport\" cannot be planned"),
        (with_payload("plan", json!({"class": "plan", "payload": {}})), "invalid payload: class \"plan\" cannot be planned"),
        (with_payload("plan", json!({"payload": {}})), "invalid payload: class is missing"),
        (with_payload("plan", json!({"class": ["deploy"], "payload": {}})), "invalid payload: class is not a string"),
        (with_payload("plan", json!({"class": "uninstall"})), "invalid payload: payload is missing or not an object"),
        (with_payload("plan", json!({"class": "uninstall", "payload": {}})), "invalid payload: payload.payload: deployment is missing or not an object"),
        (with_payload("plan", json!({"class": "rollout", "payload": {"imageTag": "bad tag"}})), "invalid payload: payload.payload: imageTag"),
    ]
}

#[test]
fn the_good_deploy_validates_and_is_namespaced() {
    let cmd = parse_value(&good_deploy()).unwrap();
    let Action::Deploy(d) = cmd.action else {
        panic!("not a deploy")
    };
    assert_eq!(
        d.deployment,
        Target {
            name: "orders".into(),
            namespace: "shop".into()
        }
    );
    assert!(
        d.manifests
            .iter()
            .all(|m| m.object["metadata"]["namespace"] == "shop" && m.reference.namespace == "shop")
    );
    assert!(!d.adopt_legacy);
}

#[test]
fn every_bad_command_gets_its_own_message() {
    let corpus = corpus();
    assert!(corpus.len() >= 25);
    for (raw, want) in corpus {
        match failed(&raw) {
            Ok((id, message)) => {
                assert_eq!(id, "bad");
                assert!(
                    message.starts_with(want),
                    "{}:\n got {message:?}\nwant {want:?}",
                    clip(&raw, 200)
                );
                assert!(message.len() < 600, "messages stay short: {message}");
            }
            other => panic!("{}: {other:?}", clip(&raw, 200)),
        }
    }
}

#[test]
fn commands_without_a_usable_id_are_skipped() {
    for raw in [
        r#"{"class": "deploy"}"#,
        r#"{"id": 5}"#,
        r#"{"id": "a/b"}"#,
        r#"{"id": "\ud800"}"#,
        "[1]",
        "nonsense",
    ] {
        assert!(
            matches!(parse(raw, CAPABILITIES, &managed()), Err(Refusal::NoId(_))),
            "{raw}"
        );
    }
}

#[test]
fn the_other_classes_validate() {
    let rollout = json!({"id": "r", "class": "rollout", "payload": {"imageTag": D}});
    assert_eq!(
        parse_value(&rollout).unwrap().action,
        Action::Rollout(Rollout {
            image_tag: Some(D.into()),
            targets: None,
            on_failure: OnFailure::Stay,
        })
    );
    let upgrade = json!({"id": "u", "class": "upgrade", "payload": {"bundleVersion": "0.3.0", "managerImage": format!("r.io/m@{D}")}});
    assert!(matches!(
        parse_value(&upgrade).unwrap().action,
        Action::Upgrade(_)
    ));
    let uninstall = json!({"id": "x", "class": "uninstall", "payload": {"deployment": {"name": "orders", "namespace": "shop"}}});
    assert!(matches!(
        parse_value(&uninstall).unwrap().action,
        Action::Uninstall(_)
    ));
    let legacy = json!({"id": "l", "class": "deploy", "payload": {"deployment": {"name": "orders", "namespace": "shop"}, "format": "legacy",
        "migration": {"adoptLegacy": true},
        "manifests": [{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "orders", "namespace": "shop"}},
                      {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "orders"}}]}});
    let Action::Deploy(d) = parse_value(&legacy).unwrap().action else {
        panic!()
    };
    assert!(d.adopt_legacy && d.format == Format::Legacy);
}

#[test]
fn json_values_counts_every_value_once_at_least() {
    for (raw, at_least) in [
        ("1", 1),
        ("[]", 1),
        ("{}", 1),
        ("[1,2,3]", 4),
        (r#"{"a":[{},{}],"b":"x,y{["}"#, 5),
        (r#"["\"[,", {"k": [ ]}]"#, 4),
    ] {
        let counted = json_values(raw);
        let exact = exact_values(&serde_json::from_str(raw).unwrap());
        assert_eq!(exact, at_least, "{raw}");
        assert!(counted >= exact, "{raw}: counted {counted} < {exact}");
        assert!(
            counted <= exact + 1,
            "{raw}: counted {counted}, a loose bound"
        );
    }
}

fn exact_values(v: &Value) -> usize {
    1 + match v {
        Value::Array(a) => a.iter().map(exact_values).sum(),
        Value::Object(o) => o.values().map(exact_values).sum(),
        _ => 0,
    }
}

#[test]
fn a_command_built_to_expand_is_refused_before_it_is_parsed() {
    // 256 KiB of empty objects: about 87,000 values in one manifest.
    let tiny = format!("[{}{{}}]", "{},".repeat(87_000));
    let raw = format!(
        r#"{{"id": "cmd-x", "class": "deploy", "payload": {{"deployment": {{"name": "x", "namespace": "shop"}}, "format": "legacy", "manifests": [{{"kind": "ConfigMap", "metadata": {{"name": "x"}}, "data": {{"k": {tiny}}}}}]}}}}"#
    );
    match failed(&raw) {
        Ok((id, message)) => {
            assert_eq!(id, "cmd-x");
            assert!(
                message.starts_with("invalid payload: too large: about"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    // Over 2 MiB of raw JSON, however few values.
    let big = format!(
        r#"{{"id": "cmd-y", "class": "deploy", "payload": {{"deployment": {{"name": "x", "namespace": "shop"}}, "format": "legacy", "manifests": [{{"kind": "ConfigMap", "metadata": {{"name": "x"}}, "data": {{"k": "{}"}}}}]}}}}"#,
        "x".repeat(MAX_COMMAND_BYTES)
    );
    match failed(&big) {
        Ok((_, message)) => {
            assert!(
                message.starts_with("invalid payload: too large:")
                    && message.contains("more than 2 MiB"),
                "{message}"
            )
        }
        other => panic!("{other:?}"),
    }
    // A real deploy is far below the budget.
    assert!(json_values(&good_deploy().to_string()) < 100);
    assert!(parse_value(&good_deploy()).is_ok());
}

#[test]
fn a_duplicate_key_in_the_payload_hides_nothing() {
    let raw = r#"{"id": "dup-1", "class": "deploy", "payload": {"deployment": {"name": "orders", "namespace": "shop"}, "format": "legacy",
        "manifests": [{"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "orders"},
          "spec": {"template": {"spec": {"containers": [{"name": "p", "image": "i",
            "securityContext": {"privileged": false, "privileged": true}}]}}}}]}}"#;
    let (_, message) = failed(raw).unwrap();
    assert!(
        message.starts_with("invalid payload: duplicate key \"privileged\""),
        "{message}"
    );
}

#[test]
fn an_upgrade_names_a_semantic_version() {
    let digest = format!(
        "registry.example.com/nexo/manager@sha256:{}",
        "a".repeat(64)
    );
    for (bundle, ok) in [
        ("0.3.0", true),
        ("1.0.0-rc.1+b", true),
        ("v0.3", false),
        ("latest", false),
    ] {
        let cmd = json!({"id": "u", "class": "upgrade", "payload": {"bundleVersion": bundle, "managerImage": digest}});
        assert_eq!(parse_value(&cmd).is_ok(), ok, "{bundle}");
    }
    let cmd = json!({"id": "u", "class": "upgrade", "payload": {"bundleVersion": "0.3.0", "managerImage": digest, "allowDowngrade": "yes"}});
    assert!(parse_value(&cmd).is_err(), "allowDowngrade is a boolean");
}

#[test]
fn a_field_given_twice_is_refused_with_an_ack() {
    let raw = r#"{"id": "dup-2", "class": "uninstall", "class": "deploy", "payload": {}}"#;
    match failed(raw) {
        Ok((id, message)) => {
            assert_eq!(id, "dup-2");
            assert!(
                message.starts_with("invalid payload: not a command object"),
                "{message}"
            );
        }
        other => panic!("{other:?}"),
    }
    // Two ids: which one would the ack name? Skipped, as without an id.
    let raw = r#"{"id": "a", "id": "b", "class": "uninstall", "payload": {}}"#;
    assert!(matches!(
        parse(raw, CAPABILITIES, &managed()),
        Err(Refusal::NoId(_))
    ));
}

#[test]
fn a_command_is_received_through_trust_from_one_reading_of_its_fields() {
    let raw = good_deploy().to_string();
    let trust = |required| Trust {
        keys: None,
        required,
        environment_id: "env-a",
        now: SystemTime::now(),
    };
    let received = receive(
        &raw,
        CommandFields::read(&raw),
        "cmd-1",
        &trust(false),
        CAPABILITIES,
        &managed(),
    )
    .unwrap();
    assert_eq!(Ok(received.command), parse(&raw, CAPABILITIES, &managed()));
    assert_eq!(
        received.keep_until, None,
        "an unsigned command is not kept past its turn"
    );
    // Signatures required and no keys: refused before the payload is read.
    let refused = receive(
        &raw,
        CommandFields::read(&raw),
        "cmd-1",
        &trust(true),
        CAPABILITIES,
        &managed(),
    );
    assert!(
        matches!(refused, Err(Refusal::Untrusted(Untrusted::NoKeys))),
        "{refused:?}"
    );
    // Not a command object: refused as trust refuses it, before verification.
    let garbled = r#"{"id": "cmd-1", "id": "cmd-1"}"#;
    let refused = receive(
        garbled,
        CommandFields::read(garbled),
        "cmd-1",
        &trust(false),
        CAPABILITIES,
        &managed(),
    )
    .unwrap_err();
    assert!(!refused.recorded(), "{refused:?}");
}

#[test]
fn a_plan_is_its_command_validated_as_that_command_and_marked_a_plan() {
    let mut plan = good_deploy();
    let inner = plan["payload"].take();
    plan["class"] = json!("plan");
    plan["requires"] = json!(["command.plan.v1"]);
    plan["payload"] = json!({"class": "deploy", "payload": inner});
    let command = parse_value(&plan).unwrap();
    assert!(command.plan);
    assert_eq!(command.class(), "plan");
    let deploy = parse_value(&good_deploy()).unwrap();
    assert!(!deploy.plan);
    assert_eq!(
        command.action, deploy.action,
        "planned exactly as the command"
    );
    // Without the capability, refused as its `requires` would be.
    let without: Vec<&str> = CAPABILITIES
        .iter()
        .copied()
        .filter(|c| *c != "command.plan.v1")
        .collect();
    plan["requires"] = json!([]);
    let refused = parse(&plan.to_string(), &without, &managed()).unwrap_err();
    assert_eq!(
        refused.to_string(),
        "unsupported capability: command.plan.v1"
    );
    // The planned class's own capability counts too.
    let no_upgrade: Vec<&str> = CAPABILITIES
        .iter()
        .copied()
        .filter(|c| *c != "command.upgrade")
        .collect();
    let upgrade = json!({"id": "p-1", "class": "plan", "payload": {"class": "upgrade",
        "payload": {"bundleVersion": "0.5.0", "managerImage": format!("registry.example.com/nexo/manager@{D}")}}});
    let refused = parse(&upgrade.to_string(), &no_upgrade, &managed()).unwrap_err();
    assert_eq!(
        refused.to_string(),
        "unsupported capability: command.upgrade"
    );
    assert!(parse_value(&upgrade).unwrap().plan);
}

#[test]
fn on_failure_defaults_to_stay_but_for_an_upgrade() {
    let Action::Deploy(d) = parse_value(&good_deploy()).unwrap().action else {
        panic!("a deploy")
    };
    assert_eq!(d.on_failure, OnFailure::Stay);
    let mut rollback = good_deploy();
    rollback["payload"]["onFailure"] = json!("rollback");
    let Action::Deploy(d) = parse_value(&rollback).unwrap().action else {
        panic!("a deploy")
    };
    assert_eq!(d.on_failure, OnFailure::Rollback);
    assert_eq!(d.record_payload()["onFailure"], "rollback");
    let upgrade = |extra: Value| {
        let mut payload = json!({"bundleVersion": "0.5.0", "managerImage": format!("r.io/m@{D}")});
        if let Value::Object(m) = extra {
            payload.as_object_mut().unwrap().extend(m);
        }
        match parse_value(&json!({"id": "u", "class": "upgrade", "payload": payload}))
            .unwrap()
            .action
        {
            Action::Upgrade(u) => u.on_failure,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(upgrade(json!({})), OnFailure::Rollback);
    assert_eq!(upgrade(json!({"onFailure": "stay"})), OnFailure::Stay);
}
