//! Drift enforcement (docs/protocol.md, `drift.v1`): a record applied again
//! through the deploy pipeline, under the same validation, content policy
//! and ownership rules as a command, object by object (what became
//! another's is left alone and reported, the rest restored); an
//! enforcement that failed is held, not tried again, until what it was
//! decided from changes.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::Agent;
use crate::apply;
use crate::commands::{Action, Command};
use crate::drift::{self, Found};
use crate::words::AckResult;

/// How long an enforcement that failed is not tried again while nothing
/// it was decided from changed: an object of the record that became
/// another's is not listed (not owned), so its leaving is seen only by
/// trying again.
const REFUSED_FOR: Duration = Duration::from_secs(3600);

/// An enforcement's result as it is held.
#[derive(Debug, Clone)]
pub(super) struct Held {
    /// What it was decided from ([`fingerprint`]).
    fingerprint: u64,
    since: Instant,
    enforced: Enforced,
}

/// What an enforcement did: failed whole (the message), or applied with
/// some objects left alone (each with the reason).
#[derive(Debug, Clone, Default)]
pub(super) struct Enforced {
    failed: Option<String>,
    skipped: Vec<(&'static str, String, String)>,
}

impl Enforced {
    fn refused_anything(&self) -> bool {
        self.failed.is_some() || !self.skipped.is_empty()
    }

    /// The action and message of one differing object.
    pub(super) fn of(&self, f: &Found) -> (drift::Action, Option<String>) {
        if let Some((_, _, why)) = self
            .skipped
            .iter()
            .find(|(kind, name, _)| *kind == f.kind && *name == f.name)
        {
            return (drift::Action::Failed, Some(why.clone()));
        }
        match &self.failed {
            Some(m) => (drift::Action::Failed, Some(m.clone())),
            None if f.gone => (drift::Action::Recreated, None),
            None => (drift::Action::Corrected, None),
        }
    }
}

impl Agent {
    /// Enforces a deployment's record, unless an enforcement that failed
    /// was decided from the same record, differences and versions (then
    /// its result stands: no reads, no dry runs).
    pub(super) fn enforce_unless_held(
        &mut self,
        ns: &str,
        kept: &drift::Kept,
        record_version: &str,
        found: &[Found],
        live: &HashMap<usize, Value>,
    ) -> Enforced {
        let key = (ns.to_owned(), kept.name.clone());
        let print = fingerprint(record_version, found, live);
        if let Some(h) = self.drift.refused.get(&key)
            && h.fingerprint == print
            && h.since.elapsed() < REFUSED_FOR
        {
            crate::debug!(
                namespace:% = ns, deployment:% = kept.name;
                "drift: enforcement failed before and nothing changed; not tried again"
            );
            return h.enforced.clone();
        }
        let enforced = self.enforce(ns, kept, live);
        if enforced.refused_anything() {
            let held = Held {
                fingerprint: print,
                since: Instant::now(),
                enforced: enforced.clone(),
            };
            self.drift.refused.insert(key, held);
        } else {
            self.drift.refused.remove(&key);
        }
        enforced
    }

    /// Forgets a failed enforcement of a deployment: something changed.
    pub(super) fn forget_refusal(&mut self, namespace: &str, name: &str) {
        self.drift
            .refused
            .remove(&(namespace.to_owned(), name.to_owned()));
    }

    /// Applies a record again: what drift ignores kept as it is now, the
    /// same checks as a deploy command, fields taken back from other field
    /// managers. The result, and the message of a failure.
    fn enforce(&mut self, ns: &str, kept: &drift::Kept, live: &HashMap<usize, Value>) -> Enforced {
        let failed = |message: String| Enforced {
            failed: Some(crate::text::clip(&message, 256)),
            skipped: Vec::new(),
        };
        let ignore = &kept.settings.ignore;
        let payload = kept.payload(ns, |i, m| drift::keeping_ignored(&m, live.get(&i), ignore));
        let deploy = match crate::commands::deploy_payload(
            &payload,
            &self.me.capabilities,
            &self.me.namespaces,
        ) {
            Ok(d) => d,
            Err(e) => return failed(format!("the record is not a valid deploy: {e}")),
        };
        let command = Command {
            id: format!("drift-{}", kept.name),
            action: Action::Deploy(deploy),
            plan: false,
        };
        let permitted = match apply::permit(command, &self.rules()) {
            Ok(p) => p,
            Err(refusal) => return failed(refusal.to_string()),
        };
        let mut ctx = self.execution();
        ctx.enforcing = true;
        let outcome = apply::run(&ctx, &permitted);
        let skipped = outcome
            .skipped
            .into_iter()
            .map(|(r, why)| {
                let why = crate::text::clip(&format!("{r} {why}; left alone"), 256);
                (r.kind.name(), r.name, why)
            })
            .collect();
        Enforced {
            failed: (outcome.result == AckResult::Failed)
                .then(|| crate::text::clip(&outcome.message, 256)),
            skipped,
        }
    }
}

/// What an enforcement is decided from: the record's version and, for
/// each differing object, its fields, whether it is gone, and the version
/// it was listed at.
fn fingerprint(record_version: &str, found: &[Found], live: &HashMap<usize, Value>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    record_version.hash(&mut h);
    for f in found {
        (f.kind, &f.name, &f.fields, f.gone).hash(&mut h);
    }
    let mut versions: Vec<(usize, &str)> = live
        .iter()
        .map(|(i, o)| {
            (
                *i,
                o["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default(),
            )
        })
        .collect();
    versions.sort_unstable();
    versions.hash(&mut h);
    h.finish()
}
