//! The inventory's form in each heartbeat (docs/protocol.md,
//! `inventory.delta.v1`): full, or what changed since the revision the
//! Control Plane confirmed; a new epoch each time this process begins to
//! lead. The decision is `inventory::delta`'s, from a hash of each entry
//! the index keeps; this part only carries it into the body and takes the
//! CP's answer.

use std::rc::Rc;

use super::Agent;
use crate::cp::wire::{HeartbeatRequest, InventoryAnswer, InventoryForm};
use crate::inventory::Owned;
use crate::inventory::delta::{self, Deltas, Form};

/// The epoch of the current leadership and its deltas.
#[derive(Debug, Default)]
pub(super) struct Epoch {
    /// The lease term it belongs to, and its deltas.
    current: Option<(u64, Deltas<Rc<Owned>>)>,
    /// A confirmation was ignored (logged once an epoch).
    warned: bool,
}

impl Agent {
    /// Sets `body`'s inventory form: the full form (its `deployments` as
    /// they are) or a delta (no `deployments`; what changed in
    /// `inventory`).
    pub(super) fn inventory_form(&mut self, body: &mut HeartbeatRequest) {
        if !self.me.capabilities.contains(&"inventory.delta.v1") {
            return;
        }
        let term = self.elector().term();
        let epoch = &mut self.beats.epoch;
        if epoch.current.as_ref().is_none_or(|(t, _)| *t != term) {
            epoch.current = Some((term, Deltas::new(new_epoch_id())));
            epoch.warned = false;
        }
        let Some((_, deltas)) = epoch.current.as_mut() else {
            return;
        };
        let index = self.link.index.borrow();
        let contract = delta::content_hash(&body.release_contract);
        let form = deltas.next(index.generation(), || index.hashes(), contract);
        drop(index);
        let epoch = deltas.epoch().to_owned();
        body.inventory = Some(match form {
            Form::Full { revision } => InventoryForm {
                epoch,
                revision,
                full: Some(true),
                base: None,
                changed: None,
                removed: None,
            },
            Form::Delta {
                revision,
                base,
                changed,
                removed,
                contract,
            } => {
                if !contract {
                    // The CP holds it as it was at the base.
                    body.release_contract = None;
                }
                InventoryForm {
                    epoch,
                    revision,
                    full: None,
                    base: Some(base),
                    changed: Some(changed.iter().map(|o| o.entry()).collect()),
                    removed: Some(removed.iter().map(|o| o.key()).collect()),
                }
            }
        });
    }

    /// Takes what the CP said of the inventory in its answer; a malformed
    /// or ignored one is logged once an epoch.
    pub(super) fn inventory_answered(&mut self, raw: Option<&serde_json::value::RawValue>) {
        let Some(raw) = raw else { return };
        let epoch = &mut self.beats.epoch;
        let Some((_, deltas)) = epoch.current.as_mut() else {
            return;
        };
        let ignored = match InventoryAnswer::read(raw) {
            Some(InventoryAnswer::Resync) => {
                deltas.resync();
                return;
            }
            Some(InventoryAnswer::Confirmed { epoch, revision }) => {
                match deltas.confirmed(&epoch, revision) {
                    Ok(()) => return,
                    Err(why) => why.to_string(),
                }
            }
            None => "a malformed inventory answer".to_owned(),
        };
        if !std::mem::replace(&mut epoch.warned, true) {
            crate::warn!(
                sent:% = ignored;
                "inventory: the Control Plane sent something ignored (logged once an epoch)"
            );
        }
    }
}

/// A new epoch id from 16 random bytes (the clock and the process id when
/// the system's source fails: an epoch need only differ from the last).
fn new_epoch_id() -> String {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 16];
    if ring::rand::SystemRandom::new().fill(&mut bytes).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        bytes = (nanos ^ (u128::from(std::process::id()) << 64)).to_be_bytes();
    }
    delta::epoch_id(bytes)
}
