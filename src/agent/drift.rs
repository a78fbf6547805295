//! Drift (protocol.md, `drift.v1`), the agent's side: the record of what
//! a deploy or rollout applied, written after it (a Secret owned by the
//! deployment); the check, every `NEXO_DRIFT_INTERVAL` (never more often
//! than heartbeats), with one label-selected list per kind and namespace
//! and a comparison made page by page ([`crate::drift`] decides); and
//! enforcement, which applies the record again through the deploy
//! pipeline, under the same validation, content policy and ownership
//! rules as a command.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::Agent;
use crate::apply::{self, Outcome};
use crate::commands::{Action, Command};
use crate::cp::wire::{AckResult, DriftEntry, DriftObject};
use crate::drift::{self, Found, Mode};
use crate::events::{Event, Reason};
use crate::kube::ApplyParams;
use crate::resource::{Kind, SECRETS};

/// How long an enforcement that failed is not tried again while nothing
/// it was decided from changed: an object of the record that became
/// another's is not listed (not owned), so its leaving is seen only by
/// trying again.
const REFUSED_FOR: Duration = Duration::from_secs(3600);

/// When the next check is due, and what the heartbeat reports.
#[derive(Debug)]
pub(super) struct Drift {
    next: Instant,
    pub(super) report: drift::Report,
    /// Enforcements that failed, by deployment: not tried again (no reads,
    /// no dry runs) until the record, a differing object or a command
    /// changes it, or [`REFUSED_FOR`] has passed.
    refused: HashMap<(String, String), Held>,
    /// The key of the records' proofs, once the state was read as leader:
    /// without it no record is written, and none is trusted.
    pub(super) integrity: Option<crate::integrity::Key>,
    /// The deployments whose record was reported as not the Manager's at
    /// the last check, by namespace: forgotten when no longer so.
    unproven: BTreeSet<(String, String)>,
}

/// An enforcement's result as it is held.
#[derive(Debug, Clone)]
struct Held {
    /// What it was decided from ([`fingerprint`]).
    fingerprint: u64,
    since: Instant,
    enforced: Enforced,
}

/// What an enforcement did: failed whole (the message), or applied with
/// some objects left alone (each with the reason).
#[derive(Debug, Clone, Default)]
struct Enforced {
    failed: Option<String>,
    skipped: Vec<(&'static str, String, String)>,
}

impl Enforced {
    fn refused_anything(&self) -> bool {
        self.failed.is_some() || !self.skipped.is_empty()
    }

    /// The action and message of one differing object.
    fn of(&self, f: &Found) -> (drift::Action, Option<String>) {
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

impl Drift {
    /// The first check one interval after start: the records are the last
    /// leader's, and the cluster has just been read for the inventory.
    pub(super) fn new(interval: Duration) -> Drift {
        Drift {
            next: Instant::now() + interval,
            report: drift::Report::default(),
            refused: HashMap::new(),
            integrity: None,
            unproven: BTreeSet::new(),
        }
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
    /// deployment it was written for.
    owner: Option<String>,
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
    /// After a command applied: a deploy's record written, a rollout's
    /// image kept in its records, an uninstalled deployment forgotten.
    pub(super) fn record_applied(&mut self, command: &Command, outcome: &Outcome) {
        if outcome.result != AckResult::Applied {
            return;
        }
        // A command about a deployment is a change: enforcement may try again.
        match &command.action {
            Action::Deploy(d) => self.forget_refusal(&d.deployment.namespace, &d.deployment.name),
            Action::Uninstall(t) => self.forget_refusal(&t.namespace, &t.name),
            Action::Rollout(_) => {
                for w in &outcome.workloads {
                    self.forget_refusal(&w.namespace, &w.name);
                }
            }
            Action::Upgrade(_) => {}
        }
        match &command.action {
            Action::Deploy(d) => {
                let primary = d.format.primary();
                let owner = outcome.workloads.iter().find(|w| {
                    w.kind == primary.name()
                        && w.name == d.deployment.name
                        && w.namespace == d.deployment.namespace
                });
                let Some(uid) = owner.and_then(|w| w.uid.as_deref()) else {
                    log::warn!(
                        "drift: no uid for the {primary} of {}; what it applied is not recorded",
                        d.deployment.name
                    );
                    return;
                };
                let payload = d.record_payload();
                self.write_record(
                    &d.deployment.namespace,
                    &d.deployment.name,
                    &payload,
                    (primary.name(), uid),
                    false,
                );
            }
            Action::Rollout(_) => {
                for w in &outcome.workloads {
                    if let (Some(image), Some(uid)) = (&w.image, &w.uid) {
                        self.record_rollout(&w.namespace, &w.name, image, uid);
                    }
                }
            }
            Action::Uninstall(t) => {
                self.drift.report.forget(&t.namespace, &t.name);
                self.delete_record(&t.namespace, &t.name);
            }
            Action::Upgrade(_) => {}
        }
    }

    fn forget_refusal(&mut self, namespace: &str, name: &str) {
        self.drift
            .refused
            .remove(&(namespace.to_owned(), name.to_owned()));
    }

    /// Deletes a deployment's record after its uninstall (protocol.md,
    /// `drift.v1`: the garbage collector would, but a finalizer may hold
    /// it); only a record of this environment, as read.
    fn delete_record(&mut self, namespace: &str, name: &str) {
        let path = SECRETS.object(Some(namespace), &drift::record_name(name));
        let secret = match self.link.kube.get_opt::<Value>(&path) {
            Ok(Some(s)) if drift::is_record(&s, self.me.token.environment_id()) => s,
            Ok(_) => return,
            Err(e) => {
                log::warn!("drift: cannot read the record of {namespace}/{name} to delete it: {e}");
                return;
            }
        };
        let Some(read_at) = crate::apply::plan::ReadAt::of(&secret) else {
            return;
        };
        let guard = Some((read_at.uid.as_str(), read_at.version.as_str()));
        match self.link.kube.delete_if(&path, "Background", guard) {
            Ok(_) => log::debug!("drift: the record of {namespace}/{name} deleted with it"),
            Err(e) if e.is_not_found() => {}
            Err(e) => log::warn!("drift: cannot delete the record of {namespace}/{name}: {e}"),
        }
    }

    /// Keeps a rollout's image in the deployment's record, so that
    /// enforcing it never rolls back.
    fn record_rollout(&mut self, namespace: &str, name: &str, image: &str, uid: &str) {
        let path = SECRETS.object(Some(namespace), &drift::record_name(name));
        let secret = match self.link.kube.get_opt::<Value>(&path) {
            Ok(Some(s)) if drift::is_record(&s, self.me.token.environment_id()) => s,
            Ok(_) => return,
            Err(e) => {
                log::warn!("drift: cannot read the record of {namespace}/{name}: {e}");
                return;
            }
        };
        let Some(key) = &self.drift.integrity else {
            return;
        };
        // Only a record the Manager wrote is carried forward (a rollout
        // never launders a forged one into a proven one).
        let env = self.me.token.environment_id();
        let mut payload = match drift::proven_payload(&secret, env, namespace, key) {
            Ok(p) => p,
            Err(e) => {
                log::warn!(
                    "drift: the record of {namespace}/{name} is not the Manager's ({e}); not kept up to date"
                );
                return;
            }
        };
        let manifests = payload["manifests"].as_array_mut().into_iter().flatten();
        for m in manifests {
            if m["kind"] == "NexoProxy" && m["metadata"]["name"] == name {
                m["spec"]["image"] = Value::String(image.to_owned());
            }
        }
        self.write_record(namespace, name, &payload, ("NexoProxy", uid), true);
    }

    /// Writes a record, unless a Secret of its name that is not one is in
    /// the way (never touched); `read_as_record`: the caller has just read
    /// it and found it one, so it is not read again.
    fn write_record(
        &mut self,
        namespace: &str,
        name: &str,
        payload: &Value,
        owner: (&str, &str),
        read_as_record: bool,
    ) {
        let env = self.me.token.environment_id();
        let Some(key) = &self.drift.integrity else {
            log::warn!(
                "drift: no integrity key (the state secret could not be read or written); what {namespace}/{name} applied is not recorded"
            );
            return;
        };
        let Some(secret) = drift::record_secret(payload, namespace, name, env, owner, key) else {
            log::warn!(
                "drift: what {namespace}/{name} applied is over {} bytes; not recorded, its drift not checked",
                drift::MAX_RECORD_BYTES
            );
            return;
        };
        let path = SECRETS.object(Some(namespace), &drift::record_name(name));
        let in_the_way = if read_as_record {
            Ok(None)
        } else {
            self.link.kube.get_opt::<Value>(&path)
        };
        match in_the_way {
            Ok(Some(other)) if !drift::is_record(&other, env) => {
                log::warn!(
                    "drift: Secret {namespace}/{} is not this Manager's record; left alone, the drift of {name} is not checked",
                    drift::record_name(name)
                );
                return;
            }
            Ok(_) => {}
            Err(e) => {
                log::warn!("drift: cannot read {path}: {e}; what {name} applied is not recorded");
                return;
            }
        }
        if let Err(e) = self
            .link
            .kube
            .apply(&path, &secret, ApplyParams::WRITE.forced(true))
        {
            log::warn!("drift: cannot write the record of {namespace}/{name}: {e}");
        }
    }

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

    /// One namespace: its records and its Secrets in one list, then one
    /// list per other kind the records name.
    fn check_namespace(&mut self, ns: &str) {
        let env = self.me.token.environment_id().to_owned();
        let selector = crate::ownership::owned_selector(&env);
        let kube = self.link.kube.clone();
        let mut records: Vec<Recorded> = Vec::new();
        // Records that are not the Manager's: (deployment, Secret, why).
        let mut unproven: Vec<(String, String, String)> = Vec::new();
        let key = self.drift.integrity.clone();
        // The deployed Secrets, as text until compared (a Value each would
        // cost several times their size for the check's length).
        let mut secrets: Vec<Box<str>> = Vec::new();
        let listed = kube.list_each(
            &SECRETS.collection(Some(ns)),
            Some(&selector),
            crate::inventory::PAGE,
            |s| {
                if drift::is_record(&s, &env) {
                    // A record being deleted is never enforced, nor read.
                    if !s["metadata"]["deletionTimestamp"].is_null() {
                        return;
                    }
                    let proven = match &key {
                        Some(key) => drift::proven_payload(&s, &env, ns, key),
                        None => Err("no integrity key to check it with".to_owned()),
                    };
                    let proven = proven.map_err(|why| {
                        let claimed = drift::claimed_deployment(&s).unwrap_or_default();
                        let name = s["metadata"]["name"].as_str().unwrap_or_default();
                        unproven.push((claimed.to_owned(), name.to_owned(), why));
                    });
                    let Ok(payload) = proven else {
                        return;
                    };
                    match drift::Kept::read(&payload, ns) {
                        Ok(kept) => records.push(Recorded {
                            kept,
                            owner: s["metadata"]["ownerReferences"][0]["uid"]
                                .as_str()
                                .map(str::to_owned),
                            version: s["metadata"]["resourceVersion"]
                                .as_str()
                                .unwrap_or_default()
                                .to_owned(),
                            seen: 0,
                            found: Vec::new(),
                            skipped: false,
                        }),
                        Err(e) => log::warn!(
                            "drift: record {ns}/{} is not readable: {e}",
                            s["metadata"]["name"].as_str().unwrap_or("?")
                        ),
                    }
                } else {
                    secrets.push(s.to_string().into_boxed_str());
                }
            },
        );
        if let Err(e) = listed {
            log::warn!("drift: cannot list the Secrets of {ns}: {e}");
            return;
        }
        self.report_unproven(ns, unproven);
        // A list restarted after 410 Gone shows items again.
        records.sort_unstable_by(|a, b| a.kept.name.cmp(&b.kept.name));
        records.dedup_by(|a, b| a.kept.name == b.kept.name);
        // A record whose deployment is gone (its owner is not the owned
        // NexoProxy or Deployment of that name the inventory holds) is the
        // garbage collector's, never enforced; nor is one whose mode is off.
        records.retain(|r| {
            let alive = self
                .link
                .index
                .borrow()
                .owned(ns, &r.kept.name)
                .iter()
                .any(|o| r.owner.as_deref() == Some(o.uid.as_str()));
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
        // Secrets are compared from the list already made.
        let secrets = secrets.iter().filter_map(|t| serde_json::from_str(t).ok());
        compare_kind(&mut records, &names, Kind::Secret, secrets);
        let kinds: BTreeSet<&'static str> = records
            .iter()
            .flat_map(|r| r.kept.manifests.iter().map(|m| m.kind.name()))
            .filter(|k| *k != "Secret")
            .collect();
        for name in kinds {
            let Some(kind) = Kind::ALL.into_iter().find(|k| k.name() == name) else {
                continue;
            };
            let mut page = Vec::new();
            let listed = kube.list_each(
                &kind.resource().collection(Some(ns)),
                Some(&selector),
                crate::inventory::PAGE,
                |o| {
                    page.push(o);
                    if page.len() >= crate::inventory::PAGE as usize {
                        compare_kind(&mut records, &names, kind, page.drain(..));
                    }
                },
            );
            compare_kind(&mut records, &names, kind, page.drain(..));
            if let Err(e) = listed {
                log::warn!("drift: cannot list the {kind}s of {ns}: {e}; not checked this time");
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

    /// Records that are not the Manager's (SECURITY.md, "Integrity the
    /// namespace cannot forge"): never enforced, each reported `failed`
    /// under the deployment it claims, while it lasts.
    fn report_unproven(&mut self, ns: &str, unproven: Vec<(String, String, String)>) {
        let wall = super::now_rfc3339();
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
                log::warn!(
                    "drift: record {ns}/{secret} of {deployment}: {}",
                    f.message.as_deref().unwrap_or_default()
                );
            }
            self.drift.unproven.insert((ns.to_owned(), deployment));
        }
    }

    /// What a deployment's check found: reported, enforced, counted, told.
    fn conclude(&mut self, ns: &str, mut r: Recorded) {
        let wall = super::now_rfc3339();
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
        let key = (ns.to_owned(), name.clone());
        if !found.is_empty() && mode == Mode::Enforce {
            let print = fingerprint(&r.version, &found, &live);
            let enforced = match self.drift.refused.get(&key) {
                Some(h) if h.fingerprint == print && h.since.elapsed() < REFUSED_FOR => {
                    log::debug!(
                        "drift: enforcement of {ns}/{name} failed before and nothing changed; not tried again"
                    );
                    h.enforced.clone()
                }
                _ => {
                    let enforced = self.enforce(ns, &r.kept, &live);
                    if enforced.refused_anything() {
                        let held = Held {
                            fingerprint: print,
                            since: Instant::now(),
                            enforced: enforced.clone(),
                        };
                        self.drift.refused.insert(key.clone(), held);
                    } else {
                        self.drift.refused.remove(&key);
                    }
                    enforced
                }
            };
            for f in &mut found {
                (f.action, f.message) = enforced.of(f);
            }
        } else {
            self.drift.refused.remove(&key);
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
            log::warn!(
                "drift: {} {ns}/{} of {name}: {}",
                f.kind,
                f.name,
                describe(f)
            );
        }
        for f in &corrected {
            log::info!(
                "drift: {} {ns}/{} of {name} {}: {}",
                f.kind,
                f.name,
                f.action.as_str(),
                describe(f)
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
fn compare_kind(
    records: &mut [Recorded],
    names: &ByName,
    kind: Kind,
    objects: impl Iterator<Item = Value>,
) {
    for o in objects {
        let Some(name) = o["metadata"]["name"].as_str() else {
            continue;
        };
        let h = name_hash(kind, name);
        let from = names.partition_point(|(x, _, _)| *x < h);
        for &(_, r, i) in names[from..].iter().take_while(|(x, _, _)| *x == h) {
            let (r, i) = (&mut records[r as usize], i as usize);
            let m = &r.kept.manifests[i];
            if m.kind != kind || m.name != name {
                continue;
            }
            r.seen |= 1 << i;
            let Ok(applied) = serde_json::from_str::<Value>(&m.text) else {
                continue;
            };
            let diff = drift::differences(&applied, &o, &r.kept.settings.ignore);
            if !diff.is_empty() {
                let object = (r.kept.settings.mode == Mode::Enforce).then(|| o.clone());
                r.found.push((i, diff, object));
            }
        }
    }
}
