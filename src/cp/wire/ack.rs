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
}
