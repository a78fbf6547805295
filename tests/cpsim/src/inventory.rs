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

#[cfg(test)]
mod tests {
    use super::*;

    fn full(revision: u64, names: &[&str]) -> Value {
        let deployments: Vec<Value> = names
            .iter()
            .map(|n| json!({"namespace": "shop", "name": n, "kind": "NexoProxy", "replicas": 1}))
            .collect();
        json!({"inventory": {"epoch": "e", "revision": revision, "full": true},
               "managedProxyCount": names.len(), "deployments": deployments,
               "releaseContract": {"bundleVersion": "1"}})
    }

    fn delta(revision: u64, base: u64, changed: &[&str], removed: &[&str], count: usize) -> Value {
        let entry =
            |n: &&str| json!({"namespace": "shop", "name": n, "kind": "NexoProxy", "replicas": 2});
        let key = |n: &&str| json!({"namespace": "shop", "name": n, "kind": "NexoProxy"});
        json!({"inventory": {"epoch": "e", "revision": revision, "base": base,
                             "changed": changed.iter().map(entry).collect::<Vec<_>>(),
                             "removed": removed.iter().map(key).collect::<Vec<_>>()},
               "managedProxyCount": count})
    }

    #[test]
    fn deltas_are_applied_to_their_base_and_a_full_form_is_compared() {
        let mut r = Rebuilt {
            confirming: Confirming::Always,
            ..Rebuilt::default()
        };
        assert_eq!(
            r.take(&full(1, &["a", "b"])),
            Some(json!({"epoch": "e", "revision": 1}))
        );
        r.take(&delta(2, 1, &["c"], &["a"], 2));
        let names: Vec<_> = r
            .last()
            .unwrap()
            .iter()
            .map(|e| e["name"].clone())
            .collect();
        assert_eq!(names, [json!("b"), json!("c")]);
        assert_eq!(
            r.last_contract(),
            Some(json!({"bundleVersion": "1"})),
            "kept from the base"
        );
        // The full form of revision 2, as rebuilt: compared, equal.
        let mut same = full(2, &["b", "c"]);
        same["deployments"][1]["replicas"] = json!(2);
        r.take(&same);
        assert_eq!((r.compared, r.mismatches.len()), (1, 0));
        // A full form unlike the revision rebuilt: a mismatch.
        r.take(&delta(3, 2, &[], &["b"], 1));
        r.take(&full(3, &["c"]));
        assert_eq!(
            (r.compared, r.mismatches.len()),
            (2, 1),
            "{:?}",
            r.mismatches
        );
        // A wrong count is one too.
        r.take(&delta(4, 3, &[], &[], 5));
        assert_eq!(r.mismatches.len(), 2);
    }

    #[test]
    fn answers_late_lost_instead_or_a_resync() {
        let mut r = Rebuilt {
            confirming: Confirming::Late,
            ..Rebuilt::default()
        };
        assert_eq!(r.take(&full(1, &["a"])), None, "nothing before to confirm");
        assert_eq!(
            r.take(&full(2, &["a", "b"])),
            Some(json!({"epoch": "e", "revision": 1}))
        );
        r.confirming = Confirming::Always;
        r.lose = 1;
        assert_eq!(r.take(&full(2, &["a", "b"])), None, "lost");
        r.instead.push_back(json!({"epoch": "x", "revision": 9}));
        assert_eq!(
            r.take(&full(2, &["a", "b"])),
            Some(json!({"epoch": "x", "revision": 9}))
        );
        r.resync = true;
        assert_eq!(r.take(&full(2, &["a", "b"])), Some(json!({"resync": true})));
        // A delta on a base not held: the full form asked for.
        assert_eq!(
            r.take(&delta(5, 4, &[], &[], 2)),
            Some(json!({"resync": true}))
        );
        assert_eq!(
            r.take(&full(2, &["a", "b"])),
            Some(json!({"epoch": "e", "revision": 2}))
        );
    }
}
