//! How a command ended: its result, message and resources, and the typed
//! error of one Kubernetes call on one object, written into the message.

use crate::inventory::Workload;
use std::fmt;

use super::plan::Refused;
use crate::cp::wire::{AckResource, Plan};
use crate::kube;
use crate::refusal::Refusal;
use crate::resource::ObjectRef;
use crate::words::{AckResult, ResourceAction};

/// How a command ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Applied or failed.
    pub result: AckResult,
    /// The ack message.
    pub message: String,
    /// The ack resources.
    pub resources: Vec<AckResource>,
    /// Why it was refused, when it was: nothing was changed.
    pub refusal: Option<Box<Refusal>>,
    /// The owned NexoProxies and Deployments it wrote, with the generation
    /// written: their progress is reported (`status.v1`).
    pub workloads: Vec<Workload>,
    /// Drift enforcement only ([`super::Context::enforcing`]): the objects
    /// of the record left alone because they are not the deployment's
    /// own, each with the reason.
    pub skipped: Vec<(ObjectRef, String)>,
    /// A plan ([`super::Context::planning`]): what the command would do,
    /// when it could be planned that far.
    pub plan: Option<Box<Plan>>,
    /// An upgrade applied: what it changed (`rollback.v1`).
    pub upgraded: Option<Box<super::upgrade_plan::Upgraded>>,
}

impl Outcome {
    /// A failure.
    pub fn failed(message: impl Into<String>, resources: Vec<AckResource>) -> Outcome {
        Outcome {
            result: AckResult::Failed,
            message: message.into(),
            resources,
            refusal: None,
            workloads: Vec::new(),
            skipped: Vec::new(),
            plan: None,
            upgraded: None,
        }
    }

    /// A refusal: failed, its message the refusal's.
    pub fn refused(refusal: Refusal, resources: Vec<AckResource>) -> Outcome {
        Outcome {
            result: AckResult::Failed,
            message: refusal.to_string(),
            resources,
            refusal: Some(Box::new(refusal)),
            workloads: Vec::new(),
            skipped: Vec::new(),
            plan: None,
            upgraded: None,
        }
    }

    /// A success.
    pub fn applied(message: impl Into<String>, resources: Vec<AckResource>) -> Outcome {
        Outcome {
            result: AckResult::Applied,
            message: message.into(),
            resources,
            refusal: None,
            workloads: Vec::new(),
            skipped: Vec::new(),
            plan: None,
            upgraded: None,
        }
    }
}

impl From<Refused> for Outcome {
    fn from(r: Refused) -> Outcome {
        Outcome::refused(r.refusal, r.resources)
    }
}

/// `2 created, 1 unchanged`: the resources counted by action, in order of
/// first appearance.
pub fn summary(resources: &[AckResource]) -> String {
    let mut counts: Vec<(ResourceAction, usize)> = Vec::new();
    for r in resources {
        match counts.iter_mut().find(|(a, _)| *a == r.action) {
            Some((_, n)) => *n += 1,
            None => counts.push((r.action, 1)),
        }
    }
    let parts: Vec<String> = counts.iter().map(|(a, n)| format!("{n} {a}")).collect();
    parts.join(", ")
}

/// A step of a command that failed on one object.
#[derive(Debug)]
pub enum StepError {
    /// The API server refused or failed a call.
    Api {
        /// What was tried: `cannot read`, `dry run of`, `cannot apply`…
        verb: &'static str,
        /// The object.
        reference: ObjectRef,
        /// The API error, status and `Status.reason` kept.
        source: Box<kube::Error>,
    },
    /// The object changed owner since it was read: it may no longer be
    /// written.
    OwnerChanged {
        /// The object.
        reference: ObjectRef,
        /// Why it may not be written.
        why: String,
    },
    /// The Manager's own Deployment has no container to write back.
    NoManagerContainer(super::upgrade_plan::NoManagerContainer),
    /// Every attempt met a 409 Conflict.
    KeptChanging {
        /// The object.
        reference: ObjectRef,
        /// Attempts made.
        attempts: usize,
    },
}

impl StepError {
    /// Whether the write's guard failed (the object appeared, changed or
    /// was replaced since it was read): the command is read and planned
    /// again.
    pub fn raced(&self) -> bool {
        matches!(self, StepError::Api { source, .. } if source.is_precondition_failure())
    }

    /// An API error of `verb` on `reference`.
    pub fn api(verb: &'static str, reference: &ObjectRef, source: kube::Error) -> StepError {
        StepError::Api {
            verb,
            reference: reference.clone(),
            source: Box::new(source),
        }
    }
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StepError::Api {
                verb,
                reference,
                source,
            } => match source.conflict_message() {
                Some(message) => write!(
                    f,
                    "{verb} {reference}: conflict with another field manager, not taken over: {message}"
                ),
                None => write!(f, "{verb} {reference}: {source}"),
            },
            StepError::OwnerChanged { reference, why } => write!(f, "{reference} {why}"),
            StepError::NoManagerContainer(e) => e.fmt(f),
            StepError::KeptChanging {
                reference,
                attempts,
            } => write!(f, "{reference} kept changing ({attempts} conflicts)"),
        }
    }
}

impl std::error::Error for StepError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StepError::Api { source, .. } => Some(&**source),
            StepError::NoManagerContainer(e) => Some(e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::Kind;

    #[test]
    fn step_errors_name_the_object_and_keep_the_cause() {
        let r = ObjectRef::new(Kind::ConfigMap, "shop", "orders");
        let conflict = StepError::api(
            "cannot apply",
            &r,
            kube::Error::Api {
                status: 409,
                body: kube::error::Status {
                    reason: Some("Conflict".into()),
                    message: Some("field .data.x owned by kubectl".into()),
                    details: None,
                },
                retry_after: None,
            },
        );
        assert_eq!(
            conflict.to_string(),
            "cannot apply ConfigMap shop/orders: conflict with another field manager, not taken over: field .data.x owned by kubectl"
        );
        assert!(std::error::Error::source(&conflict).is_some());
        let changing = StepError::KeptChanging {
            reference: r,
            attempts: 3,
        };
        assert_eq!(
            changing.to_string(),
            "ConfigMap shop/orders kept changing (3 conflicts)"
        );
    }

    #[test]
    fn summaries_count_by_action_in_order() {
        let r = ObjectRef::new(Kind::Secret, "shop", "s");
        let resources = [
            r.ack(ResourceAction::Created),
            r.ack(ResourceAction::Unchanged),
            r.ack(ResourceAction::Created),
        ];
        assert_eq!(summary(&resources), "2 created, 1 unchanged");
    }
}
