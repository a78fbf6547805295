//! The Control Plane's side of inventory deltas (protocol.md,
//! `inventory.delta.v1`): each heartbeat's inventory applied to the form
//! of its base, the form of every revision kept (by epoch), and the answer:
//! a confirmation, nothing (as a CP of version 2), or a request for the
//! full form when a delta's base is not held.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// How the CP answers inventories.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Confirming {
    /// Never: every heartbeat is the full form (version 2).
    #[default]
    Never,
    /// Every revision it rebuilt.
    Always,
}

/// The inventories rebuilt from heartbeats.
#[derive(Debug, Default)]
pub struct Rebuilt {
    pub confirming: Confirming,
    /// (epoch, revision) → its entries, sorted.
    forms: BTreeMap<(String, u64), Vec<Value>>,
    /// The last (epoch, revision) rebuilt.
    last: Option<(String, u64)>,
}

/// Whether a heartbeat's `deployments` is as it must be: a list, or
/// absent from a delta.
pub fn listed(deployments: &Value, body: &Value) -> bool {
    deployments.is_array() || (deployments.is_null() && body["inventory"]["base"].is_u64())
}

fn key(e: &Value) -> (String, String, String) {
    let s = |k: &str| e[k].as_str().unwrap_or_default().to_owned();
    (s("namespace"), s("name"), s("kind"))
}

impl Rebuilt {
    /// Applies a heartbeat body's inventory; the answer's `inventory`,
    /// if any. A body without one is the full form of no epoch.
    pub fn take(&mut self, body: &Value) -> Option<Value> {
        let inv = &body["inventory"];
        let (Some(epoch), Some(revision)) = (inv["epoch"].as_str(), inv["revision"].as_u64())
        else {
            return None;
        };
        let form = if inv["full"] == true {
            body["deployments"].as_array().cloned().unwrap_or_default()
        } else {
            let base = inv["base"].as_u64()?;
            let Some(at) = self.forms.get(&(epoch.to_owned(), base)) else {
                return Some(json!({"resync": true}));
            };
            let mut by_key: BTreeMap<_, Value> = at.iter().map(|e| (key(e), e.clone())).collect();
            for e in inv["changed"].as_array().into_iter().flatten() {
                by_key.insert(key(e), e.clone());
            }
            for e in inv["removed"].as_array().into_iter().flatten() {
                by_key.remove(&key(e));
            }
            by_key.into_values().collect()
        };
        self.forms.insert((epoch.to_owned(), revision), form);
        self.last = Some((epoch.to_owned(), revision));
        match self.confirming {
            Confirming::Never => None,
            Confirming::Always => Some(json!({"epoch": epoch, "revision": revision})),
        }
    }

    /// The inventory of the last revision rebuilt.
    pub fn last(&self) -> Option<Vec<Value>> {
        self.forms.get(self.last.as_ref()?).cloned()
    }
}
