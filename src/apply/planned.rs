//! A plan (docs/protocol.md, `command.plan.v1`): what a command would do to
//! each object, from what its own planner and dry runs found, nothing
//! written; and a plan's answer, whatever the planned command's outcome.
//! The fields an object would change are read as drift reads a difference
//! (`drift::differences_at_most`: one reading for both).

use serde_json::Value;

use super::outcome::{Outcome, summary};
use crate::cp::wire::{AckResource, PLAN_FIELDS, PLAN_OBJECTS, Plan, PlannedObject};
use crate::resource::ObjectRef;
use crate::words::{AckResult, ResourceAction};

/// One object a command would write: `desired` (a manifest as it would
/// be applied) against `live` (the object now; `None`: absent, so
/// created). An existing object is `configured` when a field would change
/// (or it is adopted), else `unchanged`.
pub(super) fn write(
    r: &ObjectRef,
    desired: &Value,
    live: Option<&Value>,
    adopt: bool,
) -> PlannedObject {
    let (fields, more) =
        crate::drift::differences_at_most(desired, live.unwrap_or(&Value::Null), &[], PLAN_FIELDS);
    let action = match live {
        None => ResourceAction::Created,
        Some(_) if adopt || !fields.is_empty() || more > 0 => ResourceAction::Configured,
        Some(_) => ResourceAction::Unchanged,
    };
    object(r, action, fields, more)
}

/// One object a dry run answered for: the values `dry` (the object as the
/// write would leave it) changes in `live`.
pub(super) fn dry(r: &ObjectRef, dry: &Value, live: &Value) -> PlannedObject {
    let (fields, more) = crate::drift::changed_values_at_most(dry, live, PLAN_FIELDS);
    let action = if fields.is_empty() && more == 0 {
        ResourceAction::Unchanged
    } else {
        ResourceAction::Configured
    };
    object(r, action, fields, more)
}

/// One object with no field named: deleted, absent, unchanged.
pub(super) fn plain(r: &ObjectRef, action: ResourceAction) -> PlannedObject {
    object(r, action, Vec::new(), 0)
}

/// One object the command would refuse, and why.
pub(super) fn refused(r: &ObjectRef, why: String) -> PlannedObject {
    let mut o = object(r, ResourceAction::Refused, Vec::new(), 0);
    o.message = Some(why);
    o
}

fn object(
    r: &ObjectRef,
    action: ResourceAction,
    fields: Vec<String>,
    more: usize,
) -> PlannedObject {
    PlannedObject {
        kind: r.kind.name().to_owned(),
        namespace: r.namespace.clone(),
        name: r.name.clone(),
        action,
        fields,
        more_fields: more,
        message: None,
    }
}

/// The objects planned and the ack resources they stand for.
#[derive(Debug, Default)]
pub(super) struct Planned {
    objects: Vec<PlannedObject>,
    resources: Vec<AckResource>,
    /// Why the command would fail, from the first object that would.
    failure: Option<String>,
}

impl Planned {
    /// Adds one object; a refused one makes the command fail.
    pub(super) fn push(&mut self, r: &ObjectRef, o: PlannedObject) {
        if o.action == ResourceAction::Refused && self.failure.is_none() {
            self.failure = Some(o.message.clone().unwrap_or_default());
        }
        self.resources.push(r.ack(o.action));
        self.objects.push(o);
    }

    /// The plan's outcome: the command would `verb` these objects, or
    /// fail as the first refused one says.
    pub(super) fn outcome(self, verb: &str) -> Outcome {
        let (would_succeed, message) = match self.failure {
            None => (
                true,
                format!(
                    "would {verb} {} objects ({})",
                    self.resources.len(),
                    summary(&self.resources)
                ),
            ),
            Some(why) => (false, format!("would fail: {why}")),
        };
        let mut outcome = Outcome::applied(String::new(), self.resources);
        outcome.plan = Some(Box::new(plan(would_succeed, message, self.objects)));
        outcome
    }
}

fn plan(would_succeed: bool, message: String, mut objects: Vec<PlannedObject>) -> Plan {
    let more_objects = objects.len().saturating_sub(PLAN_OBJECTS);
    objects.truncate(PLAN_OBJECTS);
    Plan {
        would_succeed,
        message,
        objects,
        more_objects,
    }
}

/// A plan's answer from the planned command's outcome: `applied` with
/// the plan when it was made, the command's own refusal included (it
/// would not succeed); `failed` when it could not be made (a read failed).
pub(super) fn answer(mut outcome: Outcome) -> Outcome {
    let plan = match outcome.plan.take() {
        Some(plan) => *plan,
        None if outcome.result == AckResult::Applied || outcome.refusal.is_some() => {
            let would_succeed = outcome.result == AckResult::Applied;
            let why = &outcome.message;
            let objects = outcome
                .resources
                .iter()
                .map(|r| PlannedObject {
                    kind: r.kind.clone(),
                    namespace: r.namespace.clone(),
                    name: r.name.clone(),
                    action: r.action,
                    fields: Vec::new(),
                    more_fields: 0,
                    message: (r.action == ResourceAction::Refused).then(|| why.clone()),
                })
                .collect();
            let message = if would_succeed {
                why.clone()
            } else {
                format!("would fail: {why}")
            };
            plan(would_succeed, message, objects)
        }
        None => {
            outcome.message = format!("cannot plan: {}", outcome.message);
            return outcome;
        }
    };
    let mut answer = Outcome::applied(format!("plan: {}", plan.message), outcome.resources);
    answer.plan = Some(Box::new(plan));
    answer
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::refusal::Refusal;
    use crate::resource::Kind;
    use serde_json::json;

    fn config(data: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "orders-config", "labels": {"app": "orders"}}, "data": data})
    }

    fn r() -> ObjectRef {
        ObjectRef::new(Kind::ConfigMap, "shop", "orders-config")
    }

    #[test]
    fn a_write_names_the_fields_it_would_change_as_drift_reads_them() {
        let desired = config(json!({"mode": "fast", "size": "1Gi"}));
        let created = write(&r(), &desired, None, false);
        assert_eq!(created.action, ResourceAction::Created);
        assert_eq!(created.fields, ["/data", "/metadata/labels"]);
        // The same values: unchanged, a quantity written another way too.
        let live = config(json!({"mode": "fast", "size": "1024Mi", "other": "x"}));
        let same = write(&r(), &desired, Some(&live), false);
        assert_eq!(same.action, ResourceAction::Unchanged);
        assert!(same.fields.is_empty());
        // Adopted: configured even when no value changes.
        assert_eq!(
            write(&r(), &desired, Some(&live), true).action,
            ResourceAction::Configured
        );
        let live = config(json!({"mode": "slow", "size": "1Gi"}));
        let changed = write(&r(), &desired, Some(&live), false);
        assert_eq!(changed.action, ResourceAction::Configured);
        assert_eq!(changed.fields, ["/data/mode"]);
    }

    #[test]
    fn an_object_names_at_most_64_fields_and_counts_the_rest() {
        let data: serde_json::Map<String, Value> = (0..100)
            .map(|i| (format!("k{i:03}"), json!("new")))
            .collect();
        let old: serde_json::Map<String, Value> = (0..100)
            .map(|i| (format!("k{i:03}"), json!("old")))
            .collect();
        let o = write(
            &r(),
            &config(Value::Object(data)),
            Some(&config(Value::Object(old))),
            false,
        );
        assert_eq!(o.fields.len(), PLAN_FIELDS);
        assert_eq!(o.more_fields, 100 - PLAN_FIELDS);
        assert_eq!(o.fields[0], "/data/k000");
    }

    #[test]
    fn a_dry_run_answer_counts_only_values_that_change() {
        // Another manager's fields in the dry run's answer are not changes.
        let live = json!({"metadata": {"name": "m", "managedFields": [{"manager": "helm", "fieldsV1": {"f:spec": {}}}]},
                          "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "manager", "image": "a"}]}}}});
        let mut dry_answer = live.clone();
        dry_answer["spec"]["template"]["spec"]["containers"][0]["image"] = json!("b");
        let o = dry(&r(), &dry_answer, &live);
        assert_eq!(o.action, ResourceAction::Configured);
        assert_eq!(o.fields, ["/spec/template/spec/containers/0/image"]);
        assert_eq!(dry(&r(), &live, &live).action, ResourceAction::Unchanged);
    }

    #[test]
    fn a_plan_is_applied_when_made_and_failed_only_when_it_could_not_be() {
        // The planned command refused: the plan was made, and says so.
        let own = Outcome::refused(
            Refusal::OwnObject {
                kind: "ConfigMap".into(),
                name: "orders-config".into(),
                named_by: None,
            },
            vec![r().ack(ResourceAction::Refused)],
        );
        let answer_ = answer(own);
        assert_eq!(answer_.result, AckResult::Applied);
        let plan = answer_.plan.unwrap();
        assert!(!plan.would_succeed);
        assert!(plan.message.starts_with("would fail: "), "{}", plan.message);
        assert_eq!(plan.objects[0].action, ResourceAction::Refused);
        assert!(plan.objects[0].message.is_some());
        // A read failed: no plan could be made.
        let failed = answer(Outcome::failed(
            "cannot read NexoProxy shop/orders: 500",
            vec![],
        ));
        assert_eq!(failed.result, AckResult::Failed);
        assert_eq!(failed.plan, None);
        assert!(failed.message.starts_with("cannot plan: cannot read"));
        // Planned objects, one refused by its dry run.
        let mut out = Planned::default();
        let desired = config(json!({"mode": "fast"}));
        out.push(&r(), write(&r(), &desired, None, false));
        let other = ObjectRef::new(Kind::Secret, "shop", "orders-tls");
        out.push(&other, refused(&other, "dry run refused: invalid".into()));
        let answer_ = answer(out.outcome("apply"));
        assert_eq!(answer_.result, AckResult::Applied);
        assert_eq!(answer_.resources.len(), 2);
        let plan = answer_.plan.unwrap();
        assert!(!plan.would_succeed);
        assert_eq!(plan.message, "would fail: dry run refused: invalid");
        assert_eq!(
            answer_.message,
            "plan: would fail: dry run refused: invalid"
        );
        let mut out = Planned::default();
        out.push(&r(), write(&r(), &desired, None, false));
        let plan = out.outcome("apply").plan.unwrap();
        assert!(plan.would_succeed);
        assert_eq!(plan.message, "would apply 1 objects (1 created)");
    }
}
