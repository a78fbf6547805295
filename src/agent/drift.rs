//! Drift (docs/protocol.md, `drift.v1`), the agent's side: the check, every
//! `NEXO_DRIFT_INTERVAL` (never more often than heartbeats), with one
//! label-selected list of the records and one per kind they name, each
//! object compared as it comes ([`crate::drift`] decides), of the records
//! `record.rs` writes (only those that carry the Manager's proof, of a
//! deployment that is still there); enforcement (`enforce.rs`) where the
//! record says so. A list it cannot make is named in `inventoryErrors`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::Agent;
use super::drift_lists::{self, Lists, Recorded};
use super::enforce::Held;
use crate::cp::wire::{DriftEntry, DriftObject};
use crate::drift::{self, Found, Mode};
use crate::events::{Event, Reason};
use crate::inventory::Uid;
use crate::resource::{Kind, SECRETS};

/// When the next check is due, and what the heartbeat reports.
#[derive(Debug)]
pub(super) struct Drift {
    next: Instant,
    pub(super) report: drift::Report,
    /// Enforcements that failed, by deployment: not tried again (no reads,
    /// no dry runs) until the record, a differing object or a command
    /// changes it, or `enforce::REFUSED_FOR` has passed.
    pub(super) refused: HashMap<(String, String), Held>,
    /// The deployments whose record was reported as not the Manager's at
    /// the last check, by namespace: forgotten when no longer so.
    unproven: BTreeSet<(String, String)>,
    /// The deployments whose last change could not be recorded
    /// (`record.rs`): reported `failed`, "drift not watched", until a
    /// change is recorded, an uninstall, or the deployment is gone; an
    /// earlier record of theirs, if its deletion failed, is never checked.
    pub(super) unwatched: BTreeSet<(String, String)>,
    /// The lists the last check of each namespace could not make, by
    /// (namespace, resource): what it could not check, said in
    /// `inventoryErrors` until the namespace's next check makes them.
    failed: BTreeMap<(String, &'static str), String>,
    /// The namespaces whose last check listed no record at all, with none
    /// written since in this lease term: not listed again (nothing to
    /// check), so that a Manager with no drift record makes no request at
    /// rest but its lease's (BENCHMARKS.md, "Nothing read at rest"). A
    /// list: the managed namespaces are few.
    quiet: Vec<String>,
}

impl Drift {
    /// The first check one interval after start: the records are the last
    /// leader's, and the cluster has just been read for the inventory.
    pub(super) fn new(interval: Duration) -> Drift {
        Drift {
            next: Instant::now() + interval,
            report: drift::Report::default(),
            refused: HashMap::new(),
            unproven: BTreeSet::new(),
            unwatched: BTreeSet::new(),
            failed: BTreeMap::new(),
            quiet: Vec::new(),
        }
    }

    /// A record is about to be written in `namespace`: it is listed at
    /// the next check.
    pub(super) fn recording(&mut self, namespace: &str) {
        self.quiet.retain(|n| n != namespace);
    }

    /// A new lease term: another leader may have written records since,
    /// so every namespace is listed at the next check.
    pub(super) fn new_term(&mut self) {
        self.quiet.clear();
    }

    /// Whether `namespace` is skipped by the checks, having no record.
    fn is_quiet(&self, namespace: &str) -> bool {
        self.quiet.iter().any(|n| n == namespace)
    }

    /// The `inventoryErrors` entries of the lists the last checks could
    /// not make: the parts of the drift check that are stale.
    pub(super) fn errors(&self) -> impl Iterator<Item = String> + '_ {
        self.failed.iter().map(|((ns, what), e)| {
            format!("drift check of {what} in {ns}: {e} (not checked; drift there may go unseen)")
        })
    }

    /// The heartbeat's `drift`.
    pub(super) fn entries(&self) -> Vec<DriftEntry> {
        self.report
            .deployments()
            .map(|((namespace, name), d)| DriftEntry {
                name: name.clone(),
                namespace: namespace.clone(),
                mode: d.mode.as_str(),
                objects: d
                    .objects
                    .iter()
                    .map(|o| DriftObject {
                        kind: o.kind,
                        name: o.name.clone(),
                        fields: (!o.gone).then(|| o.fields.clone()),
                        gone: o.gone,
                        action: o.action.as_str(),
                        message: o.message.clone(),
                        detected_at: o.detected_at.clone(),
                    })
                    .collect(),
            })
            .collect()
    }
}

impl Agent {
    /// Checks drift when due (leading, between heartbeats).
    pub(super) fn check_drift_if_due(&mut self) {
        let now = Instant::now();
        if now < self.drift.next {
            return;
        }
        let interval = self.me.cfg.drift_interval.max(self.pace.interval);
        self.drift.next = now + interval;
        let started = Instant::now();
        for ns in self.me.namespaces.clone() {
            self.check_namespace(&ns);
        }
        crate::metrics::drift_checked(started.elapsed());
    }

    /// One namespace: its records in one list (their own label), beside
    /// one list per kind they name, all read in name order and compared as
    /// they come (`drift_lists.rs`): memory stays bounded by a page of each
    /// whatever the namespace holds (pages are asked smaller when over the
    /// read limit: `kube::verbs::smaller`).
    fn check_namespace(&mut self, ns: &str) {
        self.forget_unwatched_gone(ns);
        self.drift.failed.retain(|(n, _), _| n != ns);
        if self.drift.is_quiet(ns) {
            return;
        }
        let env = self.me.token.environment_id().to_owned();
        let owned = crate::ownership::owned_selector(&env);
        let kube = self.link.kube.clone();
        // Records are trusted only with the key.
        let key = self.leader.integrity().cloned();
        let proofs = key.as_ref().map(|key| crate::ownership::Verifier {
            environment_id: &env,
            key,
            adopt_unproven: self.me.cfg.adopt_unproven,
        });
        let role = crate::ownership::ROLE;
        let selector = format!("{owned},!{role}");
        let mut lists = Lists::new(&kube, ns, &selector);
        // Records that are not the Manager's: (deployment, Secret, why).
        let mut unproven: Vec<(String, String, String)> = Vec::new();
        // Records with a manifest whose object its list had passed.
        let mut late: Vec<Recorded> = Vec::new();
        let mut items = 0usize;
        let records = kube.listing(
            &SECRETS.collection(Some(ns)),
            Some(&format!("{owned},{role}={}", drift::RECORD_ROLE)),
            crate::inventory::PAGE,
        );
        for s in records {
            let s = match s {
                Ok(s) => s,
                Err(e) => {
                    crate::warn!(namespace = ns, err:% = e; "drift: cannot list the records");
                    self.drift
                        .failed
                        .insert((ns.to_owned(), "drift records"), e.to_string());
                    self.lists_failed(ns, lists.failed);
                    return;
                }
            };
            items += 1;
            let Some(mut r) = self.recorded(ns, &s, &env, proofs.as_ref(), &mut unproven) else {
                continue;
            };
            let Some(proofs) = &proofs else {
                continue;
            };
            lists.compare(&mut r, proofs);
            if r.late != 0 {
                late.push(r);
            } else if !r.skipped {
                self.conclude(ns, r);
            }
        }
        if items == 0 {
            // Not quiet before: a quiet namespace is never listed.
            self.drift.quiet.push(ns.to_owned());
        }
        self.report_unproven(ns, unproven);
        self.lists_failed(ns, lists.failed);
        if let (false, Some(proofs)) = (late.is_empty(), &proofs) {
            let failed = drift_lists::late(&kube, ns, &selector, &mut late, proofs);
            self.lists_failed(ns, failed);
        }
        for r in late.into_iter().filter(|r| !r.skipped) {
            self.conclude(ns, r);
        }
    }

    /// The lists of objects a check could not make: told, and named in
    /// `inventoryErrors` until the namespace's next check.
    fn lists_failed(&mut self, ns: &str, failed: Vec<(Kind, String)>) {
        for (kind, why) in failed {
            crate::warn!(
                kind:% = kind, namespace = ns, err:% = why;
                "drift: cannot list the objects; not checked this time"
            );
            let what = kind.resource().plural;
            self.drift.failed.insert((ns.to_owned(), what), why);
        }
    }

    /// A listed record, if it is the Manager's (else noted in `unproven`),
    /// readable, and to be checked: of a deployment still there (its owner
    /// is the owned NexoProxy or Deployment of that name the inventory
    /// holds; else it is the garbage collector's), whose last change was
    /// recorded, with a mode other than `off`.
    fn recorded(
        &mut self,
        ns: &str,
        s: &Value,
        env: &str,
        proofs: Option<&crate::ownership::Verifier<'_>>,
        unproven: &mut Vec<(String, String, String)>,
    ) -> Option<Recorded> {
        // A record being deleted is never enforced, nor read.
        if !drift::is_record(s, env) || !s["metadata"]["deletionTimestamp"].is_null() {
            return None;
        }
        let proven = match proofs {
            Some(p) => drift::proven_payload(s, env, ns, p.key),
            None => Err(drift::RecordError::NoKey),
        };
        let payload = match proven {
            Ok(payload) => payload,
            Err(why) => {
                let claimed = drift::claimed_deployment(s).unwrap_or_default();
                let name = s["metadata"]["name"].as_str().unwrap_or_default();
                unproven.push((claimed.to_owned(), name.to_owned(), why.to_string()));
                return None;
            }
        };
        let kept = match drift::Kept::read(&payload, ns) {
            Ok(kept) => kept,
            Err(e) => {
                crate::warn!(
                    namespace = ns,
                    record = s["metadata"]["name"].as_str().unwrap_or("?"),
                    err:% = e;
                    "drift: a record is not readable"
                );
                return None;
            }
        };
        let meta = &s["metadata"];
        let owner = meta["ownerReferences"][0]["uid"].as_str().map(Uid::new);
        let version = meta["resourceVersion"].as_str().unwrap_or_default();
        let r = Recorded::new(kept, owner, version.to_owned());
        // A change that could not be recorded is newer than its record.
        let key = (ns.to_owned(), r.kept.name.clone());
        if self.drift.unwatched.contains(&key) {
            return None;
        }
        let alive = self
            .link
            .index
            .borrow()
            .owned(ns, &r.kept.name)
            .iter()
            .any(|o| r.owner.as_ref() == Some(&Uid::new(&o.uid)));
        if !alive || r.kept.settings.mode == Mode::Off {
            self.drift.report.forget(ns, &r.kept.name);
            return None;
        }
        Some(r)
    }

    /// The "drift not watched" entries of `ns` whose deployment is gone.
    fn forget_unwatched_gone(&mut self, ns: &str) {
        let gone: Vec<(String, String)> = self
            .drift
            .unwatched
            .iter()
            .filter(|(n, d)| n == ns && self.link.index.borrow().owned(n, d).is_empty())
            .cloned()
            .collect();
        for (n, d) in gone {
            self.drift.report.forget(&n, &d);
            self.drift.unwatched.remove(&(n, d));
        }
    }

    /// Records that are not the Manager's (SECURITY.md, "Integrity the
    /// namespace cannot forge"): never enforced, each reported `failed`
    /// under the deployment it claims, while it lasts.
    fn report_unproven(&mut self, ns: &str, unproven: Vec<(String, String, String)>) {
        let wall = super::shared::now_rfc3339();
        let now: BTreeSet<(String, String)> = unproven
            .iter()
            .map(|(d, _, _)| (ns.to_owned(), d.clone()))
            .collect();
        let gone: Vec<(String, String)> = self
            .drift
            .unproven
            .iter()
            .filter(|(n, _)| n == ns)
            .filter(|k| !now.contains(*k))
            .cloned()
            .collect();
        for (n, d) in gone {
            self.drift.report.forget(&n, &d);
            self.drift.unproven.remove(&(n, d));
        }
        for (deployment, secret, why) in unproven {
            let found = Found {
                kind: "Secret",
                name: secret.clone(),
                fields: Vec::new(),
                gone: false,
                action: drift::Action::Failed,
                message: Some(crate::text::clip(
                    &format!("the record is not the Manager's: {why}; not enforced"),
                    256,
                )),
                detected_at: wall.clone(),
            };
            crate::metrics::drifted(Mode::Report.as_str(), drift::Action::Failed.as_str());
            let new = self
                .drift
                .report
                .checked(ns, &deployment, Mode::Report, vec![found]);
            for f in &new {
                crate::warn!(
                    namespace = ns, record:% = secret, deployment:% = deployment,
                    message = f.message.as_deref().unwrap_or_default();
                    "drift: a record is not usable"
                );
            }
            self.drift.unproven.insert((ns.to_owned(), deployment));
        }
    }

    /// What a deployment's check found: reported, enforced, counted, told.
    fn conclude(&mut self, ns: &str, mut r: Recorded) {
        let wall = super::shared::now_rfc3339();
        let mut found: Vec<Found> = Vec::new();
        let mut live: HashMap<usize, Value> = HashMap::new();
        let mut differing: HashMap<usize, Vec<String>> = HashMap::new();
        for (i, fields, object) in std::mem::take(&mut r.found) {
            differing.insert(i, fields);
            if let Some(o) = object {
                live.insert(i, o);
            }
        }
        for (i, m) in r.kept.manifests.iter().enumerate() {
            let gone = r.seen & (1 << i) == 0;
            let fields = differing.remove(&i).unwrap_or_default();
            if gone || !fields.is_empty() {
                found.push(Found {
                    kind: m.kind.name(),
                    name: m.name.clone(),
                    fields,
                    gone,
                    action: drift::Action::Reported,
                    message: None,
                    detected_at: wall.clone(),
                });
            }
        }
        let mode = r.kept.settings.mode;
        let name = r.kept.name.clone();
        if !found.is_empty() && mode == Mode::Enforce {
            let enforced = self.enforce_unless_held(ns, &r.kept, &r.version, &found, &live);
            for f in &mut found {
                (f.action, f.message) = enforced.of(f);
            }
        } else {
            self.forget_refusal(ns, &name);
        }
        for f in &found {
            crate::metrics::drifted(mode.as_str(), f.action.as_str());
        }
        let corrected: Vec<Found> = found
            .iter()
            .filter(|f| {
                matches!(
                    f.action,
                    drift::Action::Corrected | drift::Action::Recreated
                )
            })
            .cloned()
            .collect();
        let new = self.drift.report.checked(ns, &name, mode, found);
        for f in &new {
            crate::warn!(
                kind:% = f.kind, namespace = ns, name:% = f.name, deployment:% = name,
                drift = describe(f).as_str();
                "drift found"
            );
        }
        for f in &corrected {
            crate::info!(
                kind:% = f.kind, namespace = ns, name:% = f.name, deployment:% = name,
                action = f.action.as_str(), drift = describe(f).as_str();
                "drift enforced"
            );
        }
        self.drift_events(ns, &name, Reason::DriftDetected, &new);
        self.drift_events(ns, &name, Reason::DriftCorrected, &corrected);
    }

    /// One Event about the deployment's NexoProxy or Deployment, naming the objects.
    fn drift_events(&mut self, ns: &str, name: &str, reason: Reason, objects: &[Found]) {
        if objects.is_empty() {
            return;
        }
        let note = objects
            .iter()
            .map(|f| format!("{} {}: {}", f.kind, f.name, describe(f)))
            .collect::<Vec<_>>()
            .join("; ");
        let regarding = self.link.index.borrow().owned(ns, name);
        for r in regarding {
            self.event(Event {
                regarding: r,
                reason,
                action: if reason == Reason::DriftCorrected {
                    "CorrectDrift"
                } else {
                    "CheckDrift"
                },
                note: note.clone(),
            });
        }
    }
}

/// `fields /data/mode` or `gone`.
fn describe(f: &Found) -> String {
    if f.gone {
        "gone".to_owned()
    } else {
        format!("fields {}", f.fields.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_list_the_check_could_not_make_is_named_until_the_namespace_is_checked_again() {
        let mut d = Drift::new(Duration::from_secs(300));
        assert_eq!(d.errors().count(), 0);
        d.failed.insert(
            ("shop".into(), "configmaps"),
            "kubernetes api: 500 Internal Server Error".into(),
        );
        d.failed
            .insert(("web".into(), "drift records"), "timed out".into());
        let errors: Vec<String> = d.errors().collect();
        assert_eq!(
            errors,
            [
                "drift check of configmaps in shop: kubernetes api: 500 Internal Server Error (not checked; drift there may go unseen)",
                "drift check of drift records in web: timed out (not checked; drift there may go unseen)",
            ]
        );
        // What `check_namespace` does first: the namespace's own go.
        d.failed.retain(|(n, _), _| n != "shop");
        assert_eq!(d.errors().count(), 1);
    }
}
