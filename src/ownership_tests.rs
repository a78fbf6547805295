//! Ownership from labels, proofs and the per-deployment rule.
use super::*;
use serde_json::json;

fn with_labels(labels: Value) -> Value {
    json!({"metadata": {"name": "x", "labels": labels}})
}

/// Whether `labels` match an equality-based selector `k=v,k=v`.
fn matches(selector: &str, labels: &Value) -> bool {
    selector.split(',').all(|term| {
        let (k, v) = term.split_once('=').unwrap();
        labels[k] == v
    })
}

#[test]
fn the_owned_selector_selects_exactly_what_the_guard_calls_owned() {
    // The inventory's Table read trusts the selector alone.
    let env = "env-a";
    let selector = owned_selector(env);
    for labels in [
        json!({MANAGED_BY: MANAGER, OWNER_ID: "env-a"}),
        json!({MANAGED_BY: MANAGER, OWNER_ID: "env-a", PART_OF: "nexo", "x": "y"}),
        json!({MANAGED_BY: MANAGER, OWNER_ID: "env-b"}),
        json!({MANAGED_BY: "helm", OWNER_ID: "env-a"}),
        json!({OWNER_ID: "env-a"}),
        json!({MANAGED_BY: MANAGER}),
        json!({PART_OF: "nexo"}),
        json!({}),
    ] {
        assert_eq!(
            matches(&selector, &labels),
            classify(&with_labels(labels.clone()), env) == Ownership::Owned,
            "{labels}"
        );
    }
}

#[test]
fn own_objects_are_known_by_name_and_by_label() {
    let mut own = OwnObjects::new(
        "nexo-system",
        "nexo-manager-state",
        "nexo-manager",
        "nexo-manager",
    );
    own.add_pod_template(&json!({"spec": {"template": {"spec": {
        "serviceAccountName": "nexo-manager",
        "volumes": [
            {"name": "t", "projected": {"sources": [
                {"secret": {"name": "nexo-connect-token"}},
                {"secret": {"name": "nexo-command-keys"}}]}},
            {"name": "ca", "configMap": {"name": "nexo-cp-ca"}},
            {"name": "s", "secret": {"secretName": "extra"}}],
        "containers": [{"name": "manager",
            "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "env-secret", "key": "k"}}}],
            "envFrom": [{"configMapRef": {"name": "env-cm"}}]}]}}}}));
    for (kind, name) in [
        ("Secret", "nexo-manager-state"),
        ("Deployment", "nexo-manager"),
        ("Lease", "nexo-manager"),
        ("ServiceAccount", "nexo-manager"),
        ("Secret", "nexo-connect-token"),
        ("Secret", "nexo-command-keys"),
        ("Secret", "extra"),
        ("Secret", "env-secret"),
        ("ConfigMap", "nexo-cp-ca"),
        ("ConfigMap", "env-cm"),
        ("Role", "anything"),
        ("RoleBinding", "anything"),
    ] {
        assert_eq!(
            own.refusal(kind, "nexo-system", name, None)
                .map(|r| r.to_string())
                .as_deref(),
            Some(format!("refused: the Manager's own object {kind}/{name}").as_str()),
            "{kind}/{name}"
        );
        // The same names elsewhere are not its own.
        assert_eq!(own.refusal(kind, "shop", name, None), None, "{kind}/{name}");
    }
    assert_eq!(
        own.refusal("ConfigMap", "nexo-system", "nexo-manager-state", None),
        None
    );
    assert_eq!(own.refusal("Secret", "nexo-system", "orders", None), None);
    // Anywhere, by label, whatever else the labels say.
    let labelled =
        json!({"metadata": {"labels": {NAME: MANAGER, MANAGED_BY: MANAGER, OWNER_ID: "env-a"}}});
    assert!(
        own.refusal("Secret", "shop", "x", Some(&labelled))
            .is_some()
    );
    let state =
        json!({"metadata": {"labels": {ROLE: STATE_ROLE, MANAGED_BY: MANAGER, OWNER_ID: "env-a"}}});
    assert!(own.refusal("Secret", "shop", "y", Some(&state)).is_some());
    let plain = json!({"metadata": {"labels": {NAME: "proxy", MANAGED_BY: MANAGER}}});
    assert_eq!(own.refusal("Secret", "shop", "z", Some(&plain)), None);
}

#[test]
fn the_bundles_secrets_are_known_without_the_deployment() {
    let bare = OwnObjects::new("nexo-system", "st", "dep", "lease");
    for name in DEFAULT_SECRETS {
        assert!(bare.named("Secret", "nexo-system", name), "{name}");
        assert!(!bare.named("Secret", "shop", name), "{name}");
    }
}

#[test]
fn classification() {
    let env = "env-a";
    assert_eq!(
        classify(
            &with_labels(json!({MANAGED_BY: MANAGER, OWNER_ID: "env-a"})),
            env
        ),
        Ownership::Owned
    );
    assert_eq!(
        classify(
            &with_labels(json!({MANAGED_BY: MANAGER, OWNER_ID: "env-b"})),
            env
        ),
        Ownership::OtherEnvironment("env-b".into())
    );
    // The owner id alone is not enough: both labels are required.
    assert_eq!(
        classify(&with_labels(json!({OWNER_ID: "env-a"})), env),
        Ownership::OtherEnvironment("env-a".into())
    );
    assert_eq!(
        classify(&with_labels(json!({PART_OF: "nexo"})), env),
        Ownership::Legacy
    );
    assert_eq!(
        classify(
            &with_labels(json!({PART_OF: "nexo", MANAGED_BY: MANAGER})),
            env
        ),
        Ownership::Legacy
    );
    assert_eq!(
        classify(&with_labels(json!({MANAGED_BY: MANAGER})), env),
        Ownership::Unrelated
    );
    assert_eq!(
        classify(&json!({"metadata": {"name": "x"}}), env),
        Ownership::Unrelated
    );
    assert_eq!(
        owned_selector(env),
        "app.kubernetes.io/managed-by=nexo-manager,nexo.io/owner-id=env-a"
    );
}
