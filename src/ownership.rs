//! Ownership: the labels every Manager-written object carries, and how an
//! existing object is classified before the Manager may touch it.

use serde_json::Value;

/// `app.kubernetes.io/managed-by`.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// The value of [`MANAGED_BY`] on owned objects.
pub const MANAGER: &str = "nexo-manager";
/// `nexo.io/owner-id`: the environment id.
pub const OWNER_ID: &str = "nexo.io/owner-id";
/// `nexo.io/deployment`: the deployment name.
pub const DEPLOYMENT: &str = "nexo.io/deployment";
/// `app.kubernetes.io/part-of`: `nexo` on objects of the 0.2.0 line.
pub const PART_OF: &str = "app.kubernetes.io/part-of";

/// What an existing object is, as far as this Manager is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// Both ownership labels, with this environment.
    Owned,
    /// Managed by a Nexo Manager of another environment: never touched.
    OtherEnvironment(String),
    /// Written by the 0.2.0 line: `part-of=nexo`, no owner id. Adopted only
    /// through the migration gate.
    Legacy,
    /// Anything else: never touched.
    Unrelated,
}

/// Classifies an object (JSON, as custom resources are read) from its `metadata.labels`.
pub fn classify(object: &Value, environment_id: &str) -> Ownership {
    let labels = &object["metadata"]["labels"];
    classify_by(|k| labels.get(k).and_then(Value::as_str), environment_id)
}

/// Classifies from a label lookup (`label(key)` gives the value of that
/// label): the one rule behind [`classify`] and the
/// inventory's projections.
pub fn classify_by<'a>(label: impl Fn(&str) -> Option<&'a str>, environment_id: &str) -> Ownership {
    match (label(MANAGED_BY), label(OWNER_ID)) {
        (Some(MANAGER), Some(owner)) if owner == environment_id => Ownership::Owned,
        (_, Some(owner)) => Ownership::OtherEnvironment(owner.to_owned()),
        (_, None) if label(PART_OF) == Some("nexo") => Ownership::Legacy,
        _ => Ownership::Unrelated,
    }
}

/// The label selector of this environment's owned objects.
pub fn owned_selector(environment_id: &str) -> String {
    format!("{MANAGED_BY}={MANAGER},{OWNER_ID}={environment_id}")
}

#[cfg(test)]
mod tests {
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
}
