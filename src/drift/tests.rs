use super::diff::quantity;
use super::*;
use crate::ownership;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

fn ignore(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[test]
fn settings_default_to_report_and_refuse_what_is_not_known() {
    assert_eq!(Settings::parse(&Value::Null).unwrap(), Settings::default());
    let s = Settings::parse(
        &json!({"mode": "enforce", "ignore": ["/spec/replicas", "/metadata/annotations/a~1b"]}),
    )
    .unwrap();
    assert_eq!(s.mode, Mode::Enforce);
    assert_eq!(s.ignore.len(), 2);
    for (bad, why) in [
        (json!({"mode": "fix"}), "drift.mode \"fix\""),
        (json!({"mode": 1}), "drift.mode is not a string"),
        (json!({"ignore": "/spec"}), "drift.ignore is not a list"),
        (json!({"ignore": ["spec"]}), "drift.ignore[0]"),
        (json!({"ignore": ["/a~2"]}), "~ is only ~0 or ~1"),
        (
            json!({"ignore": [format!("/{}", "a".repeat(300))]}),
            "longer than 256",
        ),
        (json!({"ignore": vec!["/a"; 33]}), "more than 32"),
        (
            json!({"mode": "report", "prune": true}),
            "drift.prune is not a field",
        ),
        (json!("enforce"), "drift is not an object"),
    ] {
        let e = Settings::parse(&bad).unwrap_err().to_string();
        assert!(e.contains(why), "{bad}: {e}");
    }
}

#[test]
fn only_the_fields_applied_count_and_defaults_do_not() {
    let applied = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "labels": {"app": "orders"}},
        "data": {"mode": "fast", "listen": "27017"}});
    let mut live = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "c", "uid": "u", "resourceVersion": "7", "labels": {"app": "orders", "nexo.io/owner-id": "e", "extra": "theirs"}},
        "data": {"mode": "fast", "listen": "27017", "other": "x"}});
    assert!(differences(&applied, &live, &[]).is_empty());
    live["data"]["mode"] = json!("slow");
    live["metadata"]["labels"]["app"] = json!("shop");
    assert_eq!(
        differences(&applied, &live, &[]),
        ["/data/mode", "/metadata/labels/app"]
    );
    assert_eq!(
        differences(&applied, &live, &ignore(&["/metadata/labels"])),
        ["/data/mode"]
    );
    live["data"].as_object_mut().unwrap().remove("listen");
    assert_eq!(
        differences(&applied, &live, &ignore(&["/metadata"])),
        ["/data/listen", "/data/mode"]
    );
}

#[test]
fn lists_compare_by_element_and_quantities_by_value() {
    let applied = json!({"spec": {"replicas": 2, "template": {"spec": {"containers": [
        {"name": "proxy", "image": "p:1", "resources": {"limits": {"cpu": "0.5", "memory": "1Gi"}}}]}}}});
    let live = json!({"spec": {"replicas": 2, "progressDeadlineSeconds": 600, "template": {"spec": {"containers": [
        {"name": "proxy", "image": "p:1", "imagePullPolicy": "IfNotPresent",
         "resources": {"limits": {"cpu": "500m", "memory": "1Gi"}}}]}}}});
    assert!(differences(&applied, &live, &[]).is_empty());
    let mut changed = live.clone();
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = json!("evil:1");
    changed["spec"]["replicas"] = json!(5);
    assert_eq!(
        differences(&applied, &changed, &[]),
        ["/spec/replicas", "/spec/template/spec/containers/0/image"]
    );
    assert_eq!(
        differences(&applied, &changed, &ignore(&["/spec/replicas"])),
        ["/spec/template/spec/containers/0/image"]
    );
    let mut sidecar = live.clone();
    sidecar["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "miner"}));
    assert_eq!(
        differences(&applied, &sidecar, &[]),
        ["/spec/template/spec/containers"]
    );
    assert_eq!(quantity("1e3"), Some(1000.0));
    assert_eq!(quantity("2Ki"), Some(2048.0));
    assert_eq!(quantity("lots"), None);
}

#[test]
fn string_data_is_compared_as_the_data_it_became() {
    let applied = json!({"kind": "Secret", "stringData": {"uri": "mongodb://db"}});
    let live = json!({"kind": "Secret", "data": {"uri": STANDARD.encode("mongodb://db")}});
    assert!(differences(&applied, &live, &[]).is_empty());
    let live = json!({"kind": "Secret", "data": {"uri": STANDARD.encode("mongodb://evil")}});
    assert_eq!(differences(&applied, &live, &[]), ["/data/uri"]);
}

#[test]
fn a_field_another_manager_took_is_drift_even_at_the_same_value() {
    let applied = json!({"data": {"mode": "fast"}, "metadata": {"labels": {"a": "1"}}});
    let live = json!({"data": {"mode": "fast", "x": "1"}, "metadata": {"labels": {"a": "1"}, "managedFields": [
        {"manager": "nexo-manager", "operation": "Apply", "fieldsV1": {"f:data": {"f:mode": {}}}},
        {"manager": "kube-controller-manager", "operation": "Update", "subresource": "status", "fieldsV1": {"f:data": {"f:mode": {}}}},
        {"manager": "someone", "operation": "Update", "fieldsV1": {"f:data": {".": {}, "f:x": {}}}}]}});
    assert!(
        differences(&applied, &live, &[]).is_empty(),
        "a neighbour's field is not ours"
    );
    let mut shared = live.clone();
    shared["metadata"]["managedFields"][2]["fieldsV1"] = json!({"f:data": {"f:mode": {}}});
    assert!(
        differences(&applied, &shared, &[]).is_empty(),
        "shared at the same value"
    );
    let mut taken = shared.clone();
    taken["metadata"]["managedFields"][0]["fieldsV1"] =
        json!({"f:metadata": {"f:labels": {"f:a": {}}}});
    assert_eq!(differences(&applied, &taken, &[]), ["/data/mode"]);
    assert!(differences(&applied, &taken, &ignore(&["/data/mode"])).is_empty());
}

#[test]
fn enforcing_keeps_what_drift_ignores() {
    let manifest =
        json!({"spec": {"replicas": 2, "image": "p:1"}, "metadata": {"annotations": {"a": "1"}}});
    let live = json!({"spec": {"replicas": 7, "image": "evil:1"}});
    let again = keeping_ignored(
        &manifest,
        Some(&live),
        &ignore(&["/spec/replicas", "/metadata/annotations"]),
    );
    assert_eq!(
        again,
        json!({"spec": {"replicas": 7, "image": "p:1"}, "metadata": {}})
    );
    assert_eq!(keeping_ignored(&manifest, None, &[]), manifest);
}

/// A key, the payload of an empty deploy of `orders` in `shop`, and its
/// record Secret (environment `env-1`, owned by the NexoProxy `u-1`).
fn orders_record() -> (crate::integrity::Key, Value, Value) {
    let (key, _) = crate::integrity::Key::generate().unwrap();
    let payload = json!({"deployment": {"name": "orders", "namespace": "shop"}, "format": "crd", "manifests": []});
    let s = record_secret(
        &payload,
        &History {
            command: Some("cmd-2".into()),
            rollback: true,
            previous: Some(Previous {
                command: Some("cmd-1".into()),
                payload: json!({"deployment": {"name": "orders", "namespace": "shop"}, "format": "crd", "manifests": [1]}),
            }),
            ..History::default()
        },
        "shop",
        "orders",
        "env-1",
        (crate::resource::Kind::NexoProxy, "u-1"),
        &key,
    )
    .unwrap();
    (key, payload, s)
}

#[test]
fn the_record_is_a_bounded_secret_owned_by_the_deployment() {
    let (key, payload, s) = orders_record();
    assert_eq!(s["metadata"]["name"], "nexo-applied-orders");
    assert_eq!(s["metadata"]["ownerReferences"][0]["uid"], "u-1");
    assert_eq!(
        s["metadata"]["ownerReferences"][0]["apiVersion"],
        "nexo.io/v1alpha1"
    );
    assert!(is_record(&s, "env-1"));
    assert!(
        s["metadata"]["labels"].get(ownership::DEPLOYMENT).is_none(),
        "an uninstall listing the deployment's objects never meets it"
    );
    assert!(!is_record(&s, "env-2"));
    assert_eq!(proven_payload(&s, "env-1", "shop", &key).unwrap(), payload);
    let huge = json!({"manifests": ["x".repeat(MAX_RECORD_BYTES)]});
    let over = record_secret(
        &huge,
        &History::default(),
        "shop",
        "orders",
        "env-1",
        (crate::resource::Kind::Deployment, "u"),
        &key,
    )
    .unwrap_err();
    assert_eq!(over.bytes, huge.to_string().len());
    assert_eq!(
        over.to_string(),
        format!(
            "what it applied is {} bytes, over the drift record's bound of 524288 bytes",
            over.bytes
        )
    );
    let mut bad = s.clone();
    bad["data"]["payload"] = json!("%%%");
    assert!(
        proven_payload(&bad, "env-1", "shop", &key)
            .unwrap_err()
            .to_string()
            .contains("not base64")
    );
}

#[test]
fn a_record_is_trusted_only_with_the_managers_proof_of_it() {
    let (key, payload, s) = orders_record();
    let why = |s: &Value, ns: &str| {
        proven_payload(s, "env-1", ns, &key)
            .unwrap_err()
            .to_string()
    };
    // Rewritten: another payload under the same proof.
    let mut rewritten = s.clone();
    let other = json!({"deployment": {"name": "orders", "namespace": "shop"}, "format": "crd", "manifests": [{"kind": "ConfigMap"}]});
    rewritten["data"]["payload"] = json!(STANDARD.encode(other.to_string()));
    assert!(why(&rewritten, "shop").contains("not valid"));
    // Forged: no proof, or another key's.
    let mut forged = s.clone();
    forged["metadata"]["annotations"] = json!({});
    assert!(why(&forged, "shop").contains("no proof"));
    let (other_key, _) = crate::integrity::Key::generate().unwrap();
    let theirs = record_secret(
        &payload,
        &History::default(),
        "shop",
        "orders",
        "env-1",
        (crate::resource::Kind::NexoProxy, "u-1"),
        &other_key,
    )
    .unwrap();
    assert!(why(&theirs, "shop").contains("not valid"));
    // Moved to another namespace, another owner, or another name.
    assert!(why(&s, "other").contains("not valid"));
    let mut owner = s.clone();
    owner["metadata"]["ownerReferences"][0]["uid"] = json!("u-2");
    assert!(why(&owner, "shop").contains("not valid"));
    let mut renamed = s.clone();
    renamed["metadata"]["name"] = json!("nexo-applied-billing");
    assert!(why(&renamed, "shop").contains("not named after"));
    assert_eq!(claimed_deployment(&renamed), Some("billing"));
    // Not even the bytes' spelling may change.
    let mut respelled = s.clone();
    respelled["data"]["payload"] =
        json!(STANDARD.encode(serde_json::to_string_pretty(&payload).unwrap()));
    assert!(why(&respelled, "shop").contains("not valid"));
}

fn found(name: &str, action: Action, at: &str) -> Found {
    Found {
        kind: "ConfigMap",
        name: name.into(),
        fields: vec!["/data/mode".into()],
        gone: false,
        action,
        message: None,
        detected_at: at.into(),
    }
}

#[test]
fn the_report_keeps_reported_drift_while_it_lasts_and_corrections_until_delivered() {
    let mut r = Report::default();
    let new = r.checked(
        "shop",
        "orders",
        Mode::Report,
        vec![found("c", Action::Reported, "t1")],
    );
    assert_eq!(new.len(), 1);
    let new = r.checked(
        "shop",
        "orders",
        Mode::Report,
        vec![found("c", Action::Reported, "t2")],
    );
    assert!(new.is_empty(), "still the same drift");
    let (_, d) = r.deployments().next().unwrap();
    assert_eq!(d.objects[0].detected_at, "t1", "detectedAt kept");
    r.delivered();
    assert_eq!(r.deployments().count(), 1, "reported stays while it lasts");
    r.checked("shop", "orders", Mode::Report, vec![]);
    assert_eq!(r.deployments().count(), 0, "gone when it matches again");

    r.checked(
        "shop",
        "orders",
        Mode::Enforce,
        vec![found("c", Action::Corrected, "t3")],
    );
    r.checked("shop", "orders", Mode::Enforce, vec![]);
    assert_eq!(
        r.deployments().count(),
        1,
        "a correction waits for its heartbeat"
    );
    r.delivered();
    assert_eq!(r.deployments().count(), 0);
}

#[test]
fn a_kept_record_holds_its_manifests_as_text_and_gives_its_payload_back() {
    let payload = json!({"deployment": {"name": "orders", "namespace": "shop"}, "format": "crd",
        "manifests": [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "1"}}],
        "drift": {"mode": "enforce", "ignore": ["/data/a"]}});
    let kept = Kept::read(&payload, "shop").unwrap();
    assert!(
        Kept::read(&payload, "elsewhere")
            .unwrap_err()
            .to_string()
            .contains("not elsewhere")
    );
    assert_eq!(kept.manifests[0].kind, crate::resource::Kind::ConfigMap);
    assert_eq!(kept.manifests[0].name, "c");
    assert_eq!(kept.payload("shop", |_, m| m), payload);
    let mut bad = payload.clone();
    bad["manifests"][0]["kind"] = json!("ClusterRole");
    assert!(
        Kept::read(&bad, "shop")
            .unwrap_err()
            .to_string()
            .contains("manifests[0]: v1 ClusterRole is not a kind")
    );
    bad["drift"] = json!({"mode": "x"});
    assert!(
        Kept::read(&bad, "shop")
            .unwrap_err()
            .to_string()
            .contains("drift.mode")
    );
}

#[test]
fn a_record_holds_no_more_objects_than_a_deploy() {
    assert_eq!(MAX_OBJECTS, crate::commands::MAX_MANIFESTS);
    let many: Vec<Value> = (0..=MAX_OBJECTS)
        .map(|i| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("c{i}")}}))
        .collect();
    let payload = json!({"deployment": {"name": "o", "namespace": "shop"}, "format": "crd", "manifests": many});
    assert!(
        Kept::read(&payload, "shop")
            .unwrap_err()
            .to_string()
            .contains("more than 64")
    );
}

#[test]
fn a_records_history_is_read_only_with_its_proof_beside_its_payload() {
    let (key, _, s) = orders_record();
    let history = proven_record(&s, "env-1", "shop", &key)
        .unwrap()
        .history
        .unwrap()
        .unwrap();
    assert_eq!(history.command.as_deref(), Some("cmd-2"));
    assert!(history.rollback);
    let previous = history.previous.unwrap();
    assert_eq!(previous.command.as_deref(), Some("cmd-1"));
    assert_eq!(previous.payload["manifests"], json!([1]));
    // Rewritten: another previous change under the same proof.
    let mut rewritten = s.clone();
    let forged = json!({"command": "cmd-2", "rollback": true,
        "previous": {"command": "cmd-1", "payload": {"manifests": ["a shell"]}}});
    rewritten["data"]["history"] = json!(STANDARD.encode(forged.to_string()));
    assert!(matches!(
        proven_record(&rewritten, "env-1", "shop", &key)
            .unwrap()
            .history,
        Err(RecordError::BadProof)
    ));
    // Moved: a history and its proof beside another payload of the Manager's.
    let (_, _, mut other) = orders_record();
    let other_payload = json!({"deployment": {"name": "orders", "namespace": "shop"}, "format": "crd", "manifests": [2]});
    let fresh = record_secret(
        &other_payload,
        &History::default(),
        "shop",
        "orders",
        "env-1",
        (crate::resource::Kind::NexoProxy, "u-1"),
        &key,
    )
    .unwrap();
    other["data"]["payload"] = fresh["data"]["payload"].clone();
    other["metadata"]["annotations"][crate::integrity::ANNOTATION] =
        fresh["metadata"]["annotations"][crate::integrity::ANNOTATION].clone();
    other["data"]["history"] = s["data"]["history"].clone();
    other["metadata"]["annotations"][crate::integrity::HISTORY_ANNOTATION] =
        s["metadata"]["annotations"][crate::integrity::HISTORY_ANNOTATION].clone();
    assert!(proven_payload(&other, "env-1", "shop", &key).is_ok());
    assert!(matches!(
        proven_record(&other, "env-1", "shop", &key)
            .unwrap()
            .history,
        Err(RecordError::BadProof)
    ));
    // A record written before histories: none.
    let mut old = s.clone();
    old["data"].as_object_mut().unwrap().remove("history");
    assert_eq!(
        proven_record(&old, "env-1", "shop", &key)
            .unwrap()
            .history
            .unwrap(),
        None
    );
}

#[test]
fn a_previous_change_too_big_to_keep_beside_the_last_is_dropped_and_sized() {
    let history = History {
        command: Some("c".into()),
        previous: Some(Previous {
            command: None,
            payload: json!({"manifests": ["x".repeat(MAX_RECORD_BYTES / 2)]}),
        }),
        ..History::default()
    };
    let kept: History = serde_json::from_str(&history.text_beside(1000)).unwrap();
    assert!(kept.previous.is_some());
    let dropped: History =
        serde_json::from_str(&history.text_beside(MAX_RECORD_BYTES / 2)).unwrap();
    assert_eq!(dropped.previous, None);
    assert!(dropped.previous_dropped.unwrap() > MAX_RECORD_BYTES / 2);
}

#[test]
fn every_mode_and_action_is_a_known_label_of_the_drifted_counter() {
    let modes: Vec<&str> = [Mode::Report, Mode::Enforce]
        .iter()
        .map(|m| m.as_str())
        .collect();
    assert_eq!(modes, crate::metrics::DRIFT_MODES);
    let actions: Vec<&str> = [
        Action::Reported,
        Action::Corrected,
        Action::Recreated,
        Action::Failed,
    ]
    .iter()
    .map(|a| a.as_str())
    .collect();
    assert_eq!(actions, crate::metrics::DRIFT_ACTIONS);
}
