//! The domain's words, shared by the wire, the command pipeline, the
//! inventory and the metrics: what a command did to an object
//! ([`ResourceAction`]), how it ended ([`AckResult`]), a deployment's
//! [`Phase`]. A leaf: it imports nothing of the crate.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What a command did to one object (docs/protocol.md, "Acknowledgement").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResourceAction {
    /// It did not exist and was created.
    Created,
    /// It existed and was changed (or adopted).
    Configured,
    /// It existed and the write changed nothing.
    Unchanged,
    /// It was deleted.
    Deleted,
    /// It was not there to delete.
    Absent,
    /// It was not written: not owned, or the API server refused it.
    Refused,
}

impl ResourceAction {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceAction::Created => "created",
            ResourceAction::Configured => "configured",
            ResourceAction::Unchanged => "unchanged",
            ResourceAction::Deleted => "deleted",
            ResourceAction::Absent => "absent",
            ResourceAction::Refused => "refused",
        }
    }
}

impl std::fmt::Display for ResourceAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AckResult {
    /// Carried out (an idempotent no-op included).
    Applied,
    /// Refused or failed; the message says why.
    #[default]
    Failed,
}

impl AckResult {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            AckResult::Applied => "applied",
            AckResult::Failed => "failed",
        }
    }
}

impl std::fmt::Display for AckResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where an upgrade of the Manager itself stands (docs/protocol.md,
/// `rollback.v1`, `selfUpgrade`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SelfUpgradePhase {
    /// Applied; the new pods not Ready yet.
    Progressing,
    /// The new pods became Ready.
    Available,
    /// They did not in time: the Manager wrote its own image back.
    RolledBack,
    /// They did not, and writing back failed.
    RollbackFailed,
}

/// A deployment's phase (docs/protocol.md, "Deployment status").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Anything not yet decided.
    Progressing,
    /// Every replica ready at the observed generation.
    Available,
    /// Was available at this generation, fewer ready now.
    Degraded,
    /// A change did not become available in time.
    Failed,
}

impl Phase {
    /// Every phase, in the protocol's order.
    pub const ALL: [Phase; 4] = [
        Phase::Progressing,
        Phase::Available,
        Phase::Degraded,
        Phase::Failed,
    ];

    /// `available` and `failed` end a command's progress.
    pub fn is_final(self) -> bool {
        matches!(self, Phase::Available | Phase::Failed)
    }

    /// The lowercase name, as on the wire and in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Progressing => "progressing",
            Phase::Available => "available",
            Phase::Degraded => "degraded",
            Phase::Failed => "failed",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
