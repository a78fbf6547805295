//! `POST /api/v2/manager/commands/{id}/ack`: how a command ended, and
//! what it did to each object.

use serde::{Deserialize, Serialize};

use crate::words::{AckResult, ResourceAction};

/// One resource in an ack.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AckResource {
    /// `apiVersion` of the object.
    pub api_version: String,
    /// `kind` of the object.
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// What was done to it.
    pub action: ResourceAction,
}

/// `POST /api/v2/manager/commands/{id}/ack` body (and a `pendingAcks` entry).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Ack {
    /// From the connect response.
    pub manager_id: String,
    /// The command.
    pub command_id: String,
    /// Applied or failed.
    pub result: AckResult,
    /// Human-readable outcome.
    pub message: String,
    /// RFC 3339 UTC.
    pub completed_at: String,
    /// Delivery attempt, from 1.
    pub attempt: u32,
    /// The objects touched or refused.
    #[serde(default)]
    pub resources: Vec<AckResource>,
    /// A plan's answer (docs/protocol.md, `command.plan.v1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Plan>,
}

/// Most objects a plan names; the rest are counted ([`Plan::more_objects`]).
pub const PLAN_OBJECTS: usize = 64;
/// Most fields a plan names of one object; the rest are counted
/// ([`PlannedObject::more_fields`]).
pub const PLAN_FIELDS: usize = 64;

/// What a command would do, nothing written (docs/protocol.md,
/// `command.plan.v1`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// Whether the command would succeed, as the cluster is now.
    pub would_succeed: bool,
    /// What the command would say: its message, or why it would fail.
    pub message: String,
    /// Each object, with what the command would do to it (at most
    /// [`PLAN_OBJECTS`]).
    pub objects: Vec<PlannedObject>,
    /// Objects past [`PLAN_OBJECTS`], not listed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more_objects: usize,
}

/// One object of a [`Plan`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PlannedObject {
    /// `kind`.
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// What the command would do to it.
    pub action: ResourceAction,
    /// The JSON pointers whose value it would change, as drift reports
    /// them (at most [`PLAN_FIELDS`]).
    #[serde(default)]
    pub fields: Vec<String>,
    /// Fields past [`PLAN_FIELDS`], not listed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more_fields: usize,
    /// Why, for an object refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}
