//! Drift (docs/protocol.md, `drift.v1`), decided from plain values: a deploy's
//! `drift` settings, the record of what was last applied (kept in a Secret
//! owned by the deployment, `record.rs`), what differs between an applied
//! manifest and the object now, and the report. The lists, the record's
//! writes and the enforcement are the agent's (`agent/drift.rs`,
//! `agent/record.rs`, `agent/enforce.rs`).

mod diff;
mod history;
pub mod in_order;
mod record;
mod settings;

pub use diff::{changed_values_at_most, differences, differences_at_most, keeping_ignored};
pub use history::{Created, History, Previous};
pub use settings::{Mode, PointerProblem, Settings, SettingsError};

pub use record::{
    Kept, KeptManifest, OverBound, ProvenRecord, RecordError, claimed_deployment, is_record,
    proven_payload, proven_record, record_name, record_secret,
};

use std::collections::BTreeMap;

/// At most this many `ignore` pointers.
pub const MAX_IGNORE: usize = 32;
/// At most this long, each.
pub const MAX_POINTER: usize = 256;
/// At most this many fields named per drifted object.
pub const MAX_FIELDS: usize = 32;
/// The record's size limit (a Secret holds 1 MiB).
pub const MAX_RECORD_BYTES: usize = 512 * 1024;
/// At most this many objects a record (a deploy's manifests at most).
pub const MAX_OBJECTS: usize = 64;
/// `nexo.io/role` of a record Secret: the Manager's own, never a target.
pub const RECORD_ROLE: &str = "applied-record";

/// What happened to a drifted object (`action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Reported,
    Corrected,
    Recreated,
    Failed,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Reported => "reported",
            Action::Corrected => "corrected",
            Action::Recreated => "recreated",
            Action::Failed => "failed",
        }
    }

    /// Shown once, then gone.
    fn once(self) -> bool {
        matches!(self, Action::Corrected | Action::Recreated)
    }
}

/// One drifted object, as the heartbeat reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub kind: &'static str,
    pub name: String,
    /// Empty when `gone`.
    pub fields: Vec<String>,
    pub gone: bool,
    pub action: Action,
    pub message: Option<String>,
    /// RFC 3339, when first found.
    pub detected_at: String,
}

/// A deployment's drift in the heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drifted {
    pub mode: Mode,
    pub objects: Vec<Found>,
}

/// What the heartbeat reports, between checks: `reported` and `failed`
/// entries while they last (the next check says), `corrected` and
/// `recreated` ones until a heartbeat carrying them is accepted.
#[derive(Debug, Default)]
pub struct Report {
    /// By (namespace, deployment).
    entries: BTreeMap<(String, String), Drifted>,
}

impl Report {
    /// A deployment's objects as a check found them; `detectedAt` kept
    /// for an object still drifted. Returns the objects newly found.
    pub fn checked(
        &mut self,
        namespace: &str,
        deployment: &str,
        mode: Mode,
        mut found: Vec<Found>,
    ) -> Vec<Found> {
        let key = (namespace.to_owned(), deployment.to_owned());
        let before = self.entries.remove(&key);
        let mut new = Vec::new();
        for f in &mut found {
            let earlier = before.as_ref().and_then(|b| {
                b.objects
                    .iter()
                    .find(|o| o.kind == f.kind && o.name == f.name && !o.action.once())
            });
            match earlier {
                Some(e) => f.detected_at.clone_from(&e.detected_at),
                None => new.push(f.clone()),
            }
        }
        // What was corrected and not yet reported stays until it is.
        if let Some(b) = before {
            for o in b.objects.into_iter().filter(|o| o.action.once()) {
                if !found.iter().any(|f| f.kind == o.kind && f.name == o.name) {
                    found.push(o);
                }
            }
        }
        if !found.is_empty() {
            self.entries.insert(
                key,
                Drifted {
                    mode,
                    objects: found,
                },
            );
        }
        new
    }

    /// A deployment no longer checked (uninstalled, mode `off`).
    pub fn forget(&mut self, namespace: &str, deployment: &str) {
        self.entries
            .remove(&(namespace.to_owned(), deployment.to_owned()));
    }

    /// The deployments reported, by (namespace, name).
    pub fn deployments(&self) -> impl Iterator<Item = (&(String, String), &Drifted)> {
        self.entries.iter()
    }

    /// A heartbeat carrying the report was accepted: what was shown once goes.
    pub fn delivered(&mut self) {
        for d in self.entries.values_mut() {
            d.objects.retain(|o| !o.action.once());
        }
        self.entries.retain(|_, d| !d.objects.is_empty());
    }
}

#[cfg(test)]
mod tests;
