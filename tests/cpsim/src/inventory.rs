//! The Control Plane's side of inventory deltas (protocol.md,
//! `inventory.delta.v1`): each heartbeat's inventory applied to the form
//! of its base, the form of every revision kept (by epoch), and the answer:
//! a confirmation (at once, or one heartbeat late), nothing (as a CP of
//! version 2, or an answer lost), a request for the full form (asked for,
//! or when a delta's base is not held), or whatever a test makes it send.
//! A full form of a revision already rebuilt from deltas is compared with
//! it: what differs is kept as a mismatch for the tests to read.

use std::collections::{BTreeMap, VecDeque};

use serde_json::{Value, json};

/// How the CP answers inventories.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Confirming {
    /// Never: every heartbeat is the full form (version 2).
    #[default]
    Never,
    /// Every revision it rebuilt, in the answer to it.
    Always,
    /// One heartbeat late: the revision of the heartbeat before.
    Late,
}

/// A revision as the CP holds it: its entries (sorted) and the release
/// contract.
#[derive(Debug, Clone, PartialEq)]
struct Held {
    entries: Vec<Value>,
    contract: Value,
}

/// The inventories rebuilt from heartbeats.
#[derive(Debug, Default)]
pub struct Rebuilt {
    pub confirming: Confirming,
    /// The next answers whose confirmation is lost.
    pub lose: u32,
    /// Answers sent instead of the next confirmations, in order.
    pub instead: VecDeque<Value>,
    /// Ask for the full form in the next answer.
    pub resync: bool,
    /// (epoch, revision) → what it holds.
    forms: BTreeMap<(String, u64), Held>,
    /// The (epoch, revision) of the last heartbeat, and of the one before.
    last: Option<(String, u64)>,
    before: Option<(String, u64)>,
    /// Full forms compared with a revision rebuilt from deltas.
    pub compared: u64,
    /// Deltas applied.
    pub deltas: u64,
    /// What did not hold: a full form unlike the revision rebuilt, a count
    /// unlike the entries.
    pub mismatches: Vec<String>,
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

fn sorted(mut entries: Vec<Value>) -> Vec<Value> {
    entries.sort_by_key(key);
    entries
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
        let at = (epoch.to_owned(), revision);
        let held = if inv["full"] == true {
            let held = Held {
                entries: sorted(body["deployments"].as_array().cloned().unwrap_or_default()),
                contract: body["releaseContract"].clone(),
            };
            if let Some(rebuilt) = self.forms.get(&at) {
                self.compared += 1;
                if *rebuilt != held {
                    self.mismatches.push(format!(
                        "revision {revision} of {epoch}: rebuilt {rebuilt:?}, full form {held:?}"
                    ));
                }
            }
            held
        } else {
            let base = inv["base"].as_u64()?;
            let Some(at_base) = self.forms.get(&(epoch.to_owned(), base)) else {
                return Some(json!({"resync": true}));
            };
            self.deltas += 1;
            let mut by_key: BTreeMap<_, Value> = at_base
                .entries
                .iter()
                .map(|e| (key(e), e.clone()))
                .collect();
            for e in inv["changed"].as_array().into_iter().flatten() {
                by_key.insert(key(e), e.clone());
            }
            for e in inv["removed"].as_array().into_iter().flatten() {
                by_key.remove(&key(e));
            }
            Held {
                entries: by_key.into_values().collect(),
                contract: match body.get("releaseContract") {
                    Some(c) => c.clone(),
                    None => at_base.contract.clone(),
                },
            }
        };
        let count = body["managedProxyCount"].as_u64();
        if count != Some(held.entries.len() as u64) {
            self.mismatches.push(format!(
                "revision {revision} of {epoch}: managedProxyCount {count:?}, {} entries",
                held.entries.len()
            ));
        }
        self.forms.insert(at.clone(), held);
        self.before = self.last.replace(at.clone());
        self.answer(at)
    }

    fn answer(&mut self, at: (String, u64)) -> Option<Value> {
        if std::mem::take(&mut self.resync) {
            return Some(json!({"resync": true}));
        }
        if let Some(instead) = self.instead.pop_front() {
            return Some(instead);
        }
        let confirm = match self.confirming {
            Confirming::Never => return None,
            Confirming::Always => at,
            Confirming::Late => self.before.clone().filter(|b| b.0 == at.0)?,
        };
        if self.lose > 0 {
            self.lose -= 1;
            return None;
        }
        Some(json!({"epoch": confirm.0, "revision": confirm.1}))
    }

    /// The inventory of the last revision rebuilt.
    pub fn last(&self) -> Option<Vec<Value>> {
        Some(self.forms.get(self.last.as_ref()?)?.entries.clone())
    }

    /// The release contract of the last revision rebuilt.
    pub fn last_contract(&self) -> Option<Value> {
        Some(self.forms.get(self.last.as_ref()?)?.contract.clone())
    }
}
