//! Drift records (docs/protocol.md, `drift.v1`), written: what a deploy or
//! rollout applied, kept after it in a Secret owned by the deployment and
//! carrying the Manager's proof (SECURITY.md, "Integrity the namespace
//! cannot forge"); deleted with the deployment's uninstall.

use serde_json::Value;

use super::Agent;
use crate::apply::Outcome;
use crate::commands::{Action, Command, OnFailure};
use crate::drift::{self, Found, History, Mode};
use crate::kube::{self, ApplyParams};
use crate::resource::{Kind, SECRETS};
use crate::words::AckResult;

/// Why what a deploy or rollout applied is not recorded, so that its drift
/// is not watched: the ack and the heartbeat's drift entry say so
/// (docs/protocol.md, `drift.v1`).
#[derive(Debug)]
pub(super) enum Unrecorded {
    /// Over the record's bound.
    OverBound(drift::OverBound),
    /// The apply answered no uid for the deployment's primary object (the
    /// record's owner).
    NoOwner(&'static str),
    /// No integrity key: the state Secret could not be read or written.
    NoKey,
    /// A Secret of the record's name that is not this Manager's record.
    InTheWay(String),
    /// The record could not be read or written.
    Read(kube::Error),
    Write(kube::Error),
}

impl std::fmt::Display for Unrecorded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unrecorded::OverBound(o) => o.fmt(f),
            Unrecorded::NoOwner(kind) => write!(f, "the apply gave no uid for its {kind}"),
            Unrecorded::NoKey => {
                f.write_str("no integrity key (the state secret could not be read or written)")
            }
            Unrecorded::InTheWay(name) => {
                write!(
                    f,
                    "Secret {name} is in the way and is not this Manager's record"
                )
            }
            Unrecorded::Read(e) => write!(f, "cannot read its record: {e}"),
            Unrecorded::Write(e) => write!(f, "cannot write its record: {e}"),
        }
    }
}

/// Why a record could not be read as the Manager's.
#[derive(Debug)]
pub(super) enum RecordRead {
    /// The API call failed.
    Read(kube::Error),
    /// No integrity key to check its proof with.
    NoKey,
    /// Its payload's proof is not valid.
    NotProven(drift::RecordError),
}

impl Agent {
    /// After a command applied: a deploy's record written, a rollout's
    /// image kept in its records, an uninstalled deployment forgotten. A
    /// change that could not be recorded is not watched for drift: its
    /// ack (`outcome`) and the heartbeat's drift entry say so
    /// (`Agent::watched`).
    pub(super) fn record_applied(&mut self, command: &Command, outcome: &mut Outcome) {
        // A plan wrote nothing, so there is nothing to record.
        if outcome.result != AckResult::Applied || command.plan {
            return;
        }
        // A command about a deployment is a change: a failed enforcement
        // of it may be tried again.
        match &command.action {
            Action::Deploy(d) => {
                let (ns, name) = (&d.deployment.namespace, &d.deployment.name);
                self.forget_refusal(ns, name);
                let primary = d.format.primary();
                let owner = outcome
                    .workloads
                    .iter()
                    .find(|w| w.kind == primary && &w.name == name && &w.namespace == ns);
                let written = match owner.and_then(|w| w.uid.as_deref()) {
                    Some(uid) => {
                        let payload = d.record_payload();
                        let history = History {
                            command: Some(command.id.clone()),
                            rollback: d.on_failure == OnFailure::Rollback,
                            created: created(outcome),
                            ..History::default()
                        };
                        self.write_record(ns, name, &payload, history, (primary, uid), None)
                    }
                    None => Err(Unrecorded::NoOwner(primary.name())),
                };
                self.watched(ns, name, primary.name(), d.drift.mode, written, outcome);
            }
            Action::Rollout(r) => {
                // Taken out of `outcome`, whose message `watched` extends.
                let workloads = outcome.workloads.clone();
                let history = History {
                    command: Some(command.id.clone()),
                    rollback: r.on_failure == OnFailure::Rollback,
                    ..History::default()
                };
                for w in &workloads {
                    self.forget_refusal(&w.namespace, &w.name);
                    let (Some(image), Some(uid)) = (&w.image, &w.uid) else {
                        continue;
                    };
                    if let Some((mode, written)) =
                        self.record_rollout(&w.namespace, &w.name, image, uid, history.clone())
                    {
                        self.watched(&w.namespace, &w.name, "NexoProxy", mode, written, outcome);
                    }
                }
            }
            Action::Uninstall(t) => {
                self.forget_refusal(&t.namespace, &t.name);
                self.drift.report.forget(&t.namespace, &t.name);
                self.drift
                    .unwatched
                    .remove(&(t.namespace.clone(), t.name.clone()));
                self.delete_record(&t.namespace, &t.name);
            }
            Action::Upgrade(_) => {}
        }
    }

    /// What a record's write means for the deployment's drift: watched
    /// (an earlier "not watched" entry gone), or not watched, said in the
    /// ack and, while it lasts, in the heartbeat's drift entry (`failed`,
    /// on its `kind` object), and its earlier record deleted so that it is
    /// never enforced over this change (a rollback by the Manager itself).
    fn watched(
        &mut self,
        ns: &str,
        name: &str,
        kind: &'static str,
        mode: Mode,
        written: Result<(), Unrecorded>,
        outcome: &mut Outcome,
    ) {
        let key = (ns.to_owned(), name.to_owned());
        let why = match written {
            Ok(()) => {
                if self.drift.unwatched.remove(&key) {
                    self.drift.report.forget(ns, name);
                }
                return;
            }
            Err(why) => why,
        };
        crate::warn!(
            namespace:% = ns, deployment:% = name, err:% = why;
            "drift: what a command applied is not recorded, its drift not watched"
        );
        self.delete_record(ns, name);
        if mode == Mode::Off {
            return;
        }
        let message = format!("drift not watched: {why}");
        outcome.message = crate::text::clip(&format!("{}; {message}", outcome.message), 1024);
        let found = Found {
            kind,
            name: name.to_owned(),
            fields: Vec::new(),
            gone: false,
            action: drift::Action::Failed,
            message: Some(crate::text::clip(&message, 256)),
            detected_at: super::shared::now_rfc3339(),
        };
        self.drift.report.checked(ns, name, mode, vec![found]);
        self.drift.unwatched.insert(key);
    }

    /// The record of `namespace/name` (its path, the Secret, its payload
    /// and its history), only when it is this Manager's: labelled as a
    /// record of this environment and carrying a valid proof (a record that
    /// is not is never changed nor deleted; the garbage collector removes
    /// one from 0.4 with its owner). What stops it is logged, with what it
    /// was read `for_what`.
    fn read_record(
        &self,
        namespace: &str,
        name: &str,
        for_what: &str,
    ) -> Option<(String, Value, drift::ProvenRecord)> {
        match self.fetch_record(namespace, name) {
            Ok(record) => record,
            Err(RecordRead::Read(e)) => {
                crate::warn!(
                    namespace:% = namespace, deployment:% = name, purpose = for_what, err:% = e;
                    "drift: cannot read a record"
                );
                None
            }
            Err(RecordRead::NoKey) => None,
            Err(RecordRead::NotProven(e)) => {
                crate::warn!(
                    namespace:% = namespace, deployment:% = name, purpose = for_what, err:% = e;
                    "drift: a record is not the Manager's; left alone, not read"
                );
                None
            }
        }
    }

    /// The record of `namespace/name`, when there is one labelled as this
    /// environment's record (`Ok(None)`: none), read with its proofs.
    pub(super) fn fetch_record(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<(String, Value, drift::ProvenRecord)>, RecordRead> {
        let path = SECRETS.object(Some(namespace), &drift::record_name(name));
        let env = self.me.token.environment_id();
        let secret = match self.link.kube.get_opt::<Value>(&path) {
            Ok(Some(s)) if drift::is_record(&s, env) => s,
            Ok(_) => return Ok(None),
            Err(e) => return Err(RecordRead::Read(e)),
        };
        let key = self.leader.integrity().ok_or(RecordRead::NoKey)?;
        let record =
            drift::proven_record(&secret, env, namespace, key).map_err(RecordRead::NotProven)?;
        Ok(Some((path, secret, record)))
    }

    /// Deletes a deployment's record after its uninstall (docs/protocol.md,
    /// `drift.v1`: the garbage collector would, but a finalizer may hold
    /// it); only this Manager's record, as read.
    pub(super) fn delete_record(&mut self, namespace: &str, name: &str) {
        let Some((path, secret, _)) = self.read_record(namespace, name, "to delete it") else {
            return;
        };
        let Some(read_at) = crate::apply::plan::ReadAt::of(&secret) else {
            return;
        };
        let guard = Some((read_at.uid.as_str(), read_at.version.as_str()));
        match self.link.writer.delete_if(&path, "Background", guard) {
            Ok(_) => {
                crate::debug!(
                    namespace:% = namespace, deployment:% = name;
                    "drift: the record deleted with its deployment"
                )
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                crate::warn!(
                    namespace:% = namespace, deployment:% = name, err:% = e;
                    "drift: cannot delete a record"
                )
            }
        }
    }

    /// Keeps a rollout's image in the deployment's record, so that
    /// enforcing it never rolls back; only a record the Manager wrote is
    /// carried forward (a rollout never launders a forged one into a
    /// proven one). `None` when there is no record to keep; else its mode
    /// and whether it was written.
    fn record_rollout(
        &mut self,
        namespace: &str,
        name: &str,
        image: &str,
        uid: &str,
        mut history: History,
    ) -> Option<(Mode, Result<(), Unrecorded>)> {
        let (_, secret, record) = self.read_record(namespace, name, "to keep its image")?;
        // What the record held is the change before this one, read once.
        history.previous = previous_change(&record.history, record.payload.clone(), namespace);
        let mut payload = record.payload;
        let mode = drift::Settings::parse(&payload["drift"])
            .map(|s| s.mode)
            .unwrap_or_default();
        let manifests = payload["manifests"].as_array_mut().into_iter().flatten();
        for m in manifests {
            if m["kind"] == "NexoProxy" && m["metadata"]["name"] == name {
                m["spec"]["image"] = Value::String(image.to_owned());
            }
        }
        let owner = (Kind::NexoProxy, uid);
        Some((
            mode,
            self.write_record(namespace, name, &payload, history, owner, Some(&secret)),
        ))
    }

    /// Writes a record with its `history` (docs/protocol.md, `rollback.v1`),
    /// unless a Secret of its name that is not one is in the way (never
    /// touched). `read`: the record as the caller has just read it and
    /// found it one (else it is read here). The change the record held
    /// becomes the history's previous one, when the history has none and
    /// the record is the Manager's (both proofs valid).
    pub(super) fn write_record(
        &mut self,
        namespace: &str,
        name: &str,
        payload: &Value,
        mut history: History,
        owner: (Kind, &str),
        read: Option<&Value>,
    ) -> Result<(), Unrecorded> {
        let env = self.me.token.environment_id();
        let key = self.leader.integrity().ok_or(Unrecorded::NoKey)?;
        let path = SECRETS.object(Some(namespace), &drift::record_name(name));
        let fetched;
        let existing = match read {
            Some(r) => Some(r),
            None => {
                fetched = self
                    .link
                    .kube
                    .get_opt::<Value>(&path)
                    .map_err(Unrecorded::Read)?;
                fetched.as_ref()
            }
        };
        if let Some(other) = existing {
            if !drift::is_record(other, env) {
                return Err(Unrecorded::InTheWay(format!(
                    "{namespace}/{}",
                    drift::record_name(name)
                )));
            }
            if history.previous.is_none() && history.rolled_back_from.is_none() {
                history.previous = previous_of(other, env, namespace, key);
            }
        }
        let secret = drift::record_secret(payload, &history, namespace, name, env, owner, key)
            .map_err(Unrecorded::OverBound)?;
        self.drift.recording(namespace);
        self.link
            .writer
            .apply(&path, &secret, ApplyParams::WRITE.forced(true))
            .map(drop)
            .map_err(Unrecorded::Write)
    }
}

/// The objects an applied deploy created, as its record's history keeps
/// them (docs/protocol.md, `rollback.v1`).
pub(super) fn created(outcome: &Outcome) -> Vec<drift::Created> {
    outcome
        .resources
        .iter()
        .filter(|r| r.action == crate::words::ResourceAction::Created)
        .map(|r| drift::Created {
            api_version: r.api_version.clone(),
            kind: r.kind.clone(),
            name: r.name.clone(),
        })
        .collect()
}

/// The change a record Secret holds, as the previous one of the next
/// record: only a record with the Manager's proofs.
fn previous_of(
    secret: &Value,
    env: &str,
    namespace: &str,
    key: &crate::integrity::Key,
) -> Option<drift::Previous> {
    match drift::proven_record(secret, env, namespace, key) {
        Ok(record) => previous_change(&record.history, record.payload, namespace),
        Err(e) => {
            crate::info!(
                namespace:% = namespace, err:% = e;
                "rollback: the record is not the Manager's; no previous change kept"
            );
            None
        }
    }
}

/// The change of a proven record's `payload`, with the command its
/// `history` names, as the previous one of the next record; none when
/// the history is not the Manager's.
fn previous_change(
    history: &Result<Option<History>, drift::RecordError>,
    payload: Value,
    namespace: &str,
) -> Option<drift::Previous> {
    match history {
        Ok(h) => Some(drift::Previous {
            command: h.as_ref().and_then(|h| h.command.clone()),
            payload,
        }),
        Err(e) => {
            crate::info!(
                namespace:% = namespace, err:% = e;
                "rollback: the history of the record is not the Manager's; no previous change kept"
            );
            None
        }
    }
}
