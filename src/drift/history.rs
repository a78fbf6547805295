//! A drift record's history (docs/protocol.md, `rollback.v1`): the command
//! that applied what the record holds, whether its failure is rolled back,
//! the change before it (so that a rollback can restore it), and the
//! rollback already made from it (once per command). Kept in the record
//! Secret beside the payload (`data.history`) with a proof of its own that
//! binds it to the payload, so that the namespace can neither forge a
//! previous change nor move one from another record.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::MAX_RECORD_BYTES;

/// What a record remembers of the changes that led to it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct History {
    /// The command whose change the record holds (a rollback's: the
    /// command restored; `None`: a change recorded before commands were
    /// named).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Whether that change is rolled back when it fails (`onFailure`).
    #[serde(default)]
    pub rollback: bool,
    /// The change before it: what a rollback restores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<Previous>,
    /// The previous change was too big to keep beside this one: its size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_dropped: Option<usize>,
    /// The objects the change created (its ack's `created`): the only
    /// ones a rollback of it deletes (at most a deploy's manifests).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub created: Vec<Created>,
    /// The command this record's change was restored after, by a
    /// rollback: a rollback of it is never made again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolled_back_from: Option<String>,
}

/// An object a change created.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Created {
    pub api_version: String,
    pub kind: String,
    pub name: String,
}

/// A change before the last one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Previous {
    /// The command that applied it (`None`: a record written before
    /// histories were kept).
    #[serde(default)]
    pub command: Option<String>,
    /// What it applied, as a deploy's payload.
    pub payload: Value,
}

impl History {
    /// Its JSON text, within the record's bound beside a payload of
    /// `payload_bytes`: past it, the previous change is dropped and its
    /// size said instead.
    pub fn text_beside(&self, payload_bytes: usize) -> String {
        let text = serde_json::to_string(self).unwrap_or_default();
        if payload_bytes + text.len() <= MAX_RECORD_BYTES || self.previous.is_none() {
            return text;
        }
        let dropped = History {
            previous: None,
            previous_dropped: Some(text.len()),
            ..self.clone()
        };
        serde_json::to_string(&dropped).unwrap_or_default()
    }
}
