//! One owned object as the inventory keeps it ([`Owned`]): what the
//! heartbeat reports of it and what its phase is judged from, in one
//! record shared by the index and the heartbeats that report it. The wire
//! entry ([`DeploymentEntry`]) is made from the record only when it is
//! written or hashed (BENCHMARKS.md, "One record an object").

use std::rc::Rc;

use super::status::Observed;
use crate::cp::wire::{
    CommandProgress, DeploymentEntry, EntryKey, EntryKind, EntryList, EntryStatus,
};
use crate::words::Phase;

/// One owned NexoProxy or legacy Deployment. Ordered and equal by its key
/// (namespace, name, kind), as the heartbeat's entries are.
#[derive(Debug, Clone)]
pub struct Owned {
    pub namespace: Rc<str>,
    /// Also the key of the set that keeps it.
    pub name: Rc<str>,
    pub kind: EntryKind,
    /// The proxy image, when known (shared).
    pub image: Option<Rc<str>>,
    /// What its list item or watch event said.
    pub observed: Observed,
    /// What the last report said of its phase; `None` until judged.
    pub judged: Option<Reported>,
}

/// The words of a phase as reported: the rest of `status.v1` is the
/// object's own numbers ([`Observed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reported {
    pub phase: Phase,
    /// The deciding condition's reason (shared).
    pub reason: Option<Rc<str>>,
    /// Its message (at most 256 bytes), or what the replicas say (shared).
    pub message: Rc<str>,
    /// When the phase last changed (RFC 3339, shared).
    pub since: Rc<str>,
    /// The last deploy or rollout, while it is reported.
    pub command: Option<Box<CommandProgress>>,
}

impl Owned {
    /// Its wire entry, as sent.
    pub fn entry(&self) -> DeploymentEntry {
        let o = &self.observed;
        DeploymentEntry {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            kind: self.kind,
            replicas: o.replicas.into(),
            image: self.image.clone(),
            status: self.judged.as_ref().map(|j| EntryStatus {
                phase: j.phase,
                ready_replicas: o.ready.into(),
                updated_replicas: o.updated.map(i64::from),
                observed_generation: o.observed_generation.get(),
                generation: o.generation,
                reason: j.reason.clone(),
                message: j.message.clone(),
                since: j.since.clone(),
                command: j.command.clone(),
            }),
        }
    }

    /// Its key (no allocation: its names are shared).
    pub fn key(&self) -> EntryKey {
        EntryKey {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            kind: self.kind,
        }
    }

    fn sort_key(&self) -> (&str, &str, EntryKind) {
        (&self.namespace, &self.name, self.kind)
    }
}

impl PartialEq for Owned {
    fn eq(&self, other: &Owned) -> bool {
        self.sort_key() == other.sort_key()
    }
}

impl Eq for Owned {}

impl Ord for Owned {
    fn cmp(&self, other: &Owned) -> std::cmp::Ordering {
        self.sort_key().cmp(&other.sort_key())
    }
}

impl PartialOrd for Owned {
    fn partial_cmp(&self, other: &Owned) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// A report's owned objects, sorted: what a heartbeat's `deployments`
/// are written from.
#[derive(Debug, Default)]
pub struct Sorted(pub Vec<Rc<Owned>>);

impl EntryList for Sorted {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn entry(&self, i: usize) -> Option<DeploymentEntry> {
        Some(self.0.get(i)?.entry())
    }
    fn phase(&self, i: usize) -> Option<Phase> {
        Some(self.0.get(i)?.judged.as_ref()?.phase)
    }
}
