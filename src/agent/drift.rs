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

/// One deployment's record as the check holds it, and what the check
/// found of its objects.
struct Recorded {
    kept: drift::Kept,
    /// The uid of the NexoProxy or Deployment that owns the record: the
    /// deployment it was written for (16 bytes, no allocation).
    owner: Option<Uid>,
    /// The record's `resourceVersion`.
    version: String,
    /// The manifests whose object was listed, a bit each (at most 64).
    seen: u64,
    /// The manifests whose object differs: index, fields, and the object
    /// (kept for `enforce` only).
    found: Vec<(usize, Vec<String>, Option<Value>)>,
    /// A list it needs failed: not concluded this time.
    skipped: bool,
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

    /// One namespace: its records in one list (their own label), then one
    /// list per kind the records name, compared page by page: memory stays
    /// bounded by a page whatever the namespace holds (pages are asked
    /// smaller when over the read limit: `kube::verbs::smaller`).
    fn check_namespace(&mut self, ns: &str) {
        self.forget_unwatched_gone(ns);
        self.drift.failed.retain(|(n, _), _| n != ns);
        if self.drift.is_quiet(ns) {
            return;
        }
        let env = self.me.token.environment_id().to_owned();
        let owned = crate::ownership::owned_selector(&env);
        let kube = self.link.kube.clone();
        let mut records: Vec<Recorded> = Vec::new();
        // Records that are not the Manager's: (deployment, Secret, why).
        let mut unproven: Vec<(String, String, String)> = Vec::new();
        let key = self.leader.integrity().cloned();
        let role = crate::ownership::ROLE;
        let mut items = 0usize;
        let listed = kube.list_each(
            &SECRETS.collection(Some(ns)),
            Some(&format!("{owned},{role}={}", drift::RECORD_ROLE)),
            crate::inventory::PAGE,
            |s| {
                items += 1;
                // A record being deleted is never enforced, nor read.
                if !drift::is_record(&s, &env) || !s["metadata"]["deletionTimestamp"].is_null() {
                    return;
                }
                let proven = match &key {
                    Some(key) => drift::proven_payload(&s, &env, ns, key),
                    None => Err(drift::RecordError::NoKey),
                };
                let proven = proven.map_err(|why| {
                    let claimed = drift::claimed_deployment(&s).unwrap_or_default();
                    let name = s["metadata"]["name"].as_str().unwrap_or_default();
                    unproven.push((claimed.to_owned(), name.to_owned(), why.to_string()));
                });
                let Ok(payload) = proven else {
                    return;
                };
                match drift::Kept::read(&payload, ns) {
                    Ok(kept) => records.push(Recorded {
                        kept,
                        owner: s["metadata"]["ownerReferences"][0]["uid"]
                            .as_str()
                            .map(Uid::new),
                        version: s["metadata"]["resourceVersion"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                        seen: 0,
                        found: Vec::new(),
                        skipped: false,
                    }),
                    Err(e) => crate::warn!(
                        namespace = ns,
                        record = s["metadata"]["name"].as_str().unwrap_or("?"),
                        err:% = e;
                        "drift: a record is not readable"
                    ),
                }
            },
        );
        if let Err(e) = listed {
            crate::warn!(namespace = ns, err:% = e; "drift: cannot list the records");
            self.drift
                .failed
                .insert((ns.to_owned(), "drift records"), e.to_string());
            return;
        }
        if items == 0 {
            // Not quiet before: a quiet namespace is never listed.
            self.drift.quiet.push(ns.to_owned());
        }
        self.report_unproven(ns, unproven);
        // A list restarted after 410 Gone shows items again.
        records.sort_unstable_by(|a, b| a.kept.name.cmp(&b.kept.name));
        records.dedup_by(|a, b| a.kept.name == b.kept.name);
        // A record whose deployment is gone (its owner is not the owned
        // NexoProxy or Deployment of that name the inventory holds) is the
        // garbage collector's, never enforced; nor is one whose mode is off.
        records.retain(|r| {
            // A change that could not be recorded is newer than its record.
            if self
                .drift
                .unwatched
                .contains(&(ns.to_owned(), r.kept.name.clone()))
            {
                return false;
            }
            let alive = self
                .link
                .index
                .borrow()
                .owned(ns, &r.kept.name)
                .iter()
                .any(|o| r.owner.as_ref() == Some(&Uid::new(&o.uid)));
            let checked = alive && r.kept.settings.mode != Mode::Off;
            if !checked {
                self.drift.report.forget(ns, &r.kept.name);
            }
            checked
        });
        if records.is_empty() {
            return;
        }
        let names = by_name(&records);
        // Records are trusted only with the key, so it is here.
        let Some(key) = key else {
            return;
        };
        let proofs = crate::ownership::Verifier {
            environment_id: &env,
            key: &key,
            adopt_unproven: self.me.cfg.adopt_unproven,
        };
        let check = Compare {
            names: &names,
            proofs: &proofs,
        };
        // The deployed objects, never a record (nor any object with a
        // role: the Manager's own).
        let selector = format!("{owned},!{role}");
        let kinds: BTreeSet<&'static str> = records
            .iter()
            .flat_map(|r| r.kept.manifests.iter().map(|m| m.kind.name()))
            .collect();
        for name in kinds {
            let Some(kind) = Kind::ALL.into_iter().find(|k| k.name() == name) else {
                continue;
            };
            // Each object compared as it comes, then dropped.
            let listed = kube.list_each(
                &kind.resource().collection(Some(ns)),
                Some(&selector),
                crate::inventory::PAGE,
                |o| check.object(&mut records, kind, &o),
            );
            if let Err(e) = listed {
                crate::warn!(
                    kind:% = kind, namespace = ns, err:% = e;
                    "drift: cannot list the objects; not checked this time"
                );
                let what = kind.resource().plural;
                self.drift
                    .failed
                    .insert((ns.to_owned(), what), e.to_string());
                for r in &mut records {
                    if r.kept.manifests.iter().any(|m| m.kind == kind) {
                        r.skipped = true;
                    }
                }
            }
        }
        for r in records.into_iter().filter(|r| !r.skipped) {
            self.conclude(ns, r);
        }
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

/// Where each named object is among the records' manifests: (a hash of
/// kind and name, record, manifest), sorted; 16 bytes each, where a map
/// keyed by a copy of each name costs several times that.
type ByName = Vec<(u64, u32, u32)>;

fn name_hash(kind: Kind, name: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (kind.name(), name).hash(&mut h);
    h.finish()
}

fn by_name(records: &[Recorded]) -> ByName {
    let mut names: ByName = records
        .iter()
        .enumerate()
        .flat_map(|(r, rec)| {
            rec.kept
                .manifests
                .iter()
                .enumerate()
                .map(move |(i, m)| (name_hash(m.kind, &m.name), r as u32, i as u32))
        })
        .collect();
    names.sort_unstable();
    names
}

/// Compares the listed objects of `kind` with the records' manifests of
/// that kind (by name, each manifest parsed from its text only then); an
/// object no record names is dropped at once.
/// How listed objects are compared with the records of a namespace.
struct Compare<'a> {
    names: &'a ByName,
    proofs: &'a crate::ownership::Verifier<'a>,
}

/// The difference an object without the Manager's valid proof for its
/// deployment shows (SECURITY.md, "Integrity the namespace cannot forge"):
/// enforcement gives it its proof through `NEXO_ADOPT_UNPROVEN`, or leaves
/// it, reported `failed`.
const UNPROVEN_FIELD: &str = "/metadata/annotations/nexo.io~1proof";

impl Compare<'_> {
    /// Compares a listed object of `kind` with what the records applied.
    fn object(&self, records: &mut [Recorded], kind: Kind, o: &Value) {
        let Some(name) = o["metadata"]["name"].as_str() else {
            return;
        };
        let h = name_hash(kind, name);
        let names = self.names;
        let from = names.partition_point(|(x, _, _)| *x < h);
        for &(_, r, i) in names[from..].iter().take_while(|(x, _, _)| *x == h) {
            let (r, i) = (&mut records[r as usize], i as usize);
            if r.kept.manifests[i].kind != kind || r.kept.manifests[i].name != name {
                continue;
            }
            r.seen |= 1 << i;
            self.one(r, i, o);
        }
    }

    /// One object of a record, as listed.
    fn one(&self, r: &mut Recorded, i: usize, o: &Value) {
        let m = &r.kept.manifests[i];
        let Ok(applied) = serde_json::from_str::<Value>(&m.text) else {
            return;
        };
        let mut diff = drift::differences(&applied, o, &r.kept.settings.ignore);
        let meta = &o["metadata"];
        fn text(v: &Value) -> &str {
            v.as_str().unwrap_or_default()
        }
        let proven = self.proofs.verify(
            m.kind.name(),
            text(&meta["namespace"]),
            &m.name,
            text(&meta["uid"]),
            &r.kept.name,
            text(&meta["annotations"][crate::integrity::ANNOTATION]),
        );
        if !proven && !diff.iter().any(|d| d == UNPROVEN_FIELD) {
            diff.insert(0, UNPROVEN_FIELD.to_owned());
            diff.truncate(drift::MAX_FIELDS);
        }
        if !diff.is_empty() {
            let object = (r.kept.settings.mode == Mode::Enforce).then(|| o.clone());
            r.found.push((i, diff, object));
        }
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
