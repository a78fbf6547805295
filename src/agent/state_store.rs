//! The owner of the state in memory and of its Secret: callers ask it to
//! record a result, mark acks delivered, or reload; it writes, retries once,
//! and keeps the report of a write that failed for the heartbeats.
//!
//! One write per finished command (docs/protocol.md, "State"): recording a
//! result is a write; marking acks delivered is not, the flags go with the
//! next write, or in one write once they have waited [`FLUSH_AFTER`]. A
//! crash in between only means an ack sent again, which the CP answers
//! `already_acknowledged`.

use std::time::{Duration, Instant};

use super::shared::Link;
use crate::kube::Client;
use crate::kube::pause::Wake;
use crate::state::{self, Binding, LedgerEntry, State, StateError, StateSecret};

/// How long delivery flags may wait for a write of their own.
pub const FLUSH_AFTER: Duration = Duration::from_secs(60);

/// The state, in memory and in its Secret.
#[derive(Debug)]
pub struct StateStore {
    store: StateSecret,
    state: State,
    /// A write that failed, reported in heartbeats until one succeeds.
    error: Option<String>,
    /// Acks delivered since the last write, and since when the first waits.
    delivered: Vec<String>,
    delivered_since: Option<Instant>,
}

impl StateStore {
    /// The state read from `store`.
    pub fn new(store: StateSecret, state: State) -> StateStore {
        StateStore {
            store,
            state,
            error: None,
            delivered: Vec::new(),
            delivered_since: None,
        }
    }

    /// Whether delivery flags wait for a write.
    pub fn flags_pending(&self) -> bool {
        !self.delivered.is_empty()
    }

    /// The binding recorded, if any.
    pub fn binding(&self) -> Option<&Binding> {
        self.state.binding.as_ref()
    }

    /// Whether the state records that signatures were required.
    pub fn signatures_required(&self) -> bool {
        self.state.signatures_required
    }

    /// Records whether signatures are required (the ratchet of
    /// docs/protocol.md, "Fail closed"), when it changed. Memory holds it even
    /// when the write fails (logged and reported).
    pub(super) fn require_signatures(&mut self, kube: &Client, required: bool) {
        if self.state.signatures_required == required {
            return;
        }
        self.state.signatures_required = required;
        match self
            .store
            .update(kube, &self.state, |s| s.signatures_required = required)
        {
            Ok(state) => self.state = state,
            Err(e) => {
                crate::error!(
                    signatures = if required { "required" } else { "off" }, err:% = e;
                    "cannot record the signature requirement in the state secret"
                );
                self.error
                    .get_or_insert_with(|| format!("state secret: cannot write it: {e}"));
            }
        }
    }

    /// The integrity key: the state's, or a new one written into it
    /// first (a key another pod wrote meanwhile wins: the write is re-read
    /// on a conflict and keeps a key it finds).
    pub(super) fn integrity_key(
        &mut self,
        kube: &Client,
    ) -> Result<crate::integrity::Key, IntegrityError> {
        if let Some(stored) = &self.state.integrity_key {
            return crate::integrity::Key::from_stored(stored.expose())
                .map_err(IntegrityError::Key);
        }
        let (_, fresh) = crate::integrity::Key::generate().map_err(IntegrityError::Key)?;
        let fresh = crate::secret::Secret::new(fresh);
        let written = self
            .store
            .update(kube, &self.state, |s| {
                s.integrity_key.get_or_insert_with(|| fresh.clone());
            })
            .map_err(IntegrityError::State)?;
        self.state = written;
        crate::info!("integrity key made and recorded in the state secret");
        let stored = self.state.integrity_key.as_ref().unwrap_or(&fresh);
        crate::integrity::Key::from_stored(stored.expose()).map_err(IntegrityError::Key)
    }

    /// The last upgrade of the Manager itself (`rollback.v1`).
    pub fn self_upgrade(&self) -> Option<&crate::state::SelfUpgrade> {
        self.state.self_upgrade.as_ref()
    }

    /// Records where the last upgrade of the Manager itself stands; a
    /// failed write is logged and reported (memory holds it).
    pub(super) fn set_self_upgrade(&mut self, link: &Link, upgrade: crate::state::SelfUpgrade) {
        self.state.self_upgrade = Some(upgrade.clone());
        self.persist(link, |s| s.self_upgrade = Some(upgrade.clone()));
    }

    /// The recorded result of a command, if it finished before.
    pub fn find(&self, command_id: &str) -> Option<&LedgerEntry> {
        self.state.find(command_id)
    }

    /// The entries whose ack was not delivered yet.
    pub fn undelivered(&self) -> impl Iterator<Item = &LedgerEntry> {
        self.state.ledger.iter().filter(|e| !e.delivered)
    }

    /// The report of the last failed write, until a write succeeds.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// Reads the state again (another pod may have written it); returns
    /// the number of ledger entries.
    pub(super) fn reload(&mut self, kube: &Client) -> Result<usize, StateError> {
        self.state = self.store.load(kube)?;
        // Deliveries the CP confirmed stay facts, written or not.
        self.state.mark_delivered(&self.delivered);
        Ok(self.state.ledger.len())
    }

    /// Records the binding when it changed. A failure is fatal: a session
    /// is not used before its binding is recorded.
    pub(super) fn bind(&mut self, kube: &Client, binding: Binding) -> Result<(), StateError> {
        if self.state.binding.as_ref() == Some(&binding) {
            return Ok(());
        }
        if let Some(old) = &self.state.binding {
            crate::warn!(
                fromEnvironment:% = old.environment_id, fromManagerId:% = old.manager_id,
                environment:% = binding.environment_id, managerId:% = binding.manager_id;
                "the binding changes"
            );
        }
        self.state = self.store.update(kube, &self.state, |s| {
            s.binding = Some(binding.clone());
        })?;
        Ok(())
    }

    /// Records a finished command, cut to its budget, before its ack is
    /// sent: a crash from here on neither re-executes the command nor
    /// loses its ack. When it cannot be written it is kept in memory and
    /// reported.
    pub(super) fn record(&mut self, link: &Link, entry: &LedgerEntry) {
        let bounded = entry
            .clone()
            .bounded(state::MESSAGE_MAX, state::RESOURCES_MAX);
        if let Err(e) = self.write(link, |s| s.record(bounded.clone())) {
            let id = &entry.command_id;
            crate::error!(
                commandId:% = id, err:% = e;
                "cannot record the result in the state secret"
            );
            self.state.record(entry.clone());
            self.error = Some(format!(
                "state secret: the result of command {id} is not recorded: {e}"
            ));
        }
    }

    /// Marks an ack delivered, when its command is recorded (one not
    /// recorded has no entry to mark).
    pub(super) fn delivered(&mut self, id: String, recorded: bool) {
        if recorded {
            self.mark_delivered(&[id]);
        }
    }

    /// Marks acks delivered, in memory: the flags go with the next write.
    pub(super) fn mark_delivered(&mut self, ids: &[String]) {
        // An ack sent again for an entry already delivered changes
        // nothing, and writes nothing.
        let ids: Vec<String> = ids
            .iter()
            .filter(|id| self.state.find(id).is_some_and(|e| !e.delivered))
            .cloned()
            .collect();
        let ids = &ids[..];
        self.state.mark_delivered(ids);
        for id in ids {
            if !self.delivered.contains(id) {
                self.delivered.push(id.clone());
            }
        }
        if !self.delivered.is_empty() {
            self.delivered_since.get_or_insert_with(Instant::now);
        }
    }

    /// Writes the delivery flags that have waited [`FLUSH_AFTER`] (or any,
    /// with `now_anyway`, before a clean stop).
    pub(super) fn flush_delivered(&mut self, link: &Link, now_anyway: bool) {
        let due = self
            .delivered_since
            .is_some_and(|since| now_anyway || since.elapsed() >= FLUSH_AFTER);
        if due {
            self.persist(link, |_| {});
        }
    }

    /// Sets the delivery attempts of an undelivered ack.
    pub(super) fn set_attempts(&mut self, link: &Link, id: &str, attempts: u32) {
        self.state.set_attempts(id, attempts);
        self.persist(link, |s| s.set_attempts(id, attempts));
    }

    /// Persists a change already made in memory; a failure is logged and
    /// reported in the next heartbeat.
    fn persist(&mut self, link: &Link, change: impl Fn(&mut State)) {
        if let Err(e) = self.write(link, change) {
            crate::error!(err:% = e; "cannot update the state secret");
            // A result not recorded, reported already, stays the report.
            self.error
                .get_or_insert_with(|| format!("state secret: cannot write it: {e}"));
        }
    }

    /// Writes a change, trying once more after a pause when the first try
    /// (the client's own retries included) fails. On success the state in
    /// memory is the one written and a reported failure is cleared.
    fn write(&mut self, link: &Link, change: impl Fn(&mut State)) -> Result<(), StateError> {
        // Every write carries the delivery flags that wait.
        let delivered = std::mem::take(&mut self.delivered);
        let change = |s: &mut State| {
            change(s);
            s.mark_delivered(&delivered);
        };
        let mut result = self.store.update(&link.kube, &self.state, change);
        if let Err(e) = &result {
            crate::warn!(err:% = e, retryIn = "1s"; "cannot write the state secret");
            if matches!(link.waiter.wait(Duration::from_secs(1)), Ok(Wake::Stop)) {
                crate::metrics::state_write_failed();
                return result.map(|_| ());
            }
            result = self.store.update(&link.kube, &self.state, change);
        }
        match result {
            Ok(state) => {
                self.state = state;
                self.error = None;
                self.delivered_since = None;
                Ok(())
            }
            Err(e) => {
                crate::metrics::state_write_failed();
                // Not written: they wait for the next write.
                self.delivered = delivered;
                Err(e)
            }
        }
    }
}

/// Why the integrity key is not at hand.
#[derive(Debug)]
pub enum IntegrityError {
    /// Stored malformed, or the random source failed.
    Key(crate::integrity::KeyError),
    /// A new key could not be written.
    State(crate::state::StateError),
}

impl std::fmt::Display for IntegrityError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IntegrityError::Key(e) => write!(f, "integrity key: {e}"),
            IntegrityError::State(e) => write!(f, "integrity key: cannot record it: {e}"),
        }
    }
}

impl std::error::Error for IntegrityError {}
