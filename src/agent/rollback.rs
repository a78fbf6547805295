//! What failed, put back (docs/protocol.md, `rollback.v1`): a deploy or
//! rollout with `onFailure: rollback` whose change turned `failed` gets the
//! change before it restored, once; a deploy whose writes failed midway
//! gets the last applied change restored at once. A restore is a deploy of
//! what the deployment's record kept, run as a command is (validation, the
//! content policy, ownership, dry runs, the lease fence), then the objects
//! the failed change wrote that the restored one does not list are deleted
//! (only the deployment's own). It is reported in the command's progress,
//! a `RolledBack` Event and `nexo_manager_rollbacks_total`, and never
//! tried again.

use std::fmt;

use serde_json::Value;

use super::Agent;
use crate::apply::{self, Outcome};
use crate::commands::{self, Action, Command, Deploy, PayloadError, Target};
use crate::drift::{self, History, RecordError};
use crate::events::{Event, Reason};
use crate::inventory::RollbackDue;
use crate::inventory::status::RollbackEnd;
use crate::refusal::Refusal;
use crate::resource::{Kind, ObjectRef};
use crate::words::{AckResult, ResourceAction};

/// Why a failed change was not restored.
#[derive(Debug)]
pub(super) enum Unrestored {
    /// No record of the deployment that is the Manager's.
    NoRecord,
    /// Its history is not the Manager's.
    History(RecordError),
    /// The record holds another command's change: the failed one was
    /// replaced since.
    Superseded(String),
    /// Already rolled back once.
    Already,
    /// No change before the failed one is recorded.
    NothingBefore,
    /// The change before was too big to keep beside the failed one.
    TooBig(usize),
    /// What is restored is not a valid deploy.
    Invalid(PayloadError),
    /// What is restored breaks a rule (the content policy, ownership).
    Refused(Box<Refusal>),
    /// Applying it failed.
    Failed(String),
}

impl Unrestored {
    /// The metric's result: nothing to restore, or a restore that failed.
    fn result(&self) -> &'static str {
        match self {
            Unrestored::NoRecord | Unrestored::NothingBefore | Unrestored::TooBig(_) => {
                "nothing_to_restore"
            }
            _ => "failed",
        }
    }
}

impl fmt::Display for Unrestored {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unrestored::NoRecord => f.write_str("no previous change is recorded; left as it is"),
            Unrestored::History(e) => write!(f, "its record's history is not the Manager's: {e}"),
            Unrestored::Superseded(by) => {
                write!(f, "the deployment was changed since, by command {by}")
            }
            Unrestored::Already => f.write_str("it was rolled back before"),
            Unrestored::NothingBefore => {
                f.write_str("no previous change is recorded; left as it is")
            }
            Unrestored::TooBig(bytes) => write!(
                f,
                "the previous change ({bytes} bytes) was too big to keep beside it; left as it is"
            ),
            Unrestored::Invalid(e) => write!(f, "the previous change is not a valid deploy: {e}"),
            Unrestored::Refused(r) => write!(f, "{r}"),
            Unrestored::Failed(m) => write!(f, "{m}"),
        }
    }
}

/// What a rollback restores: a change as the deployment's record kept it.
struct Restore {
    /// What it applied, as a deploy's payload.
    payload: Value,
    /// The command that applied it.
    command: Option<String>,
    /// The objects the failed change wrote that it does not list.
    prune: Vec<ObjectRef>,
}

impl Agent {
    /// Rolls back the failures the last report found, while this process
    /// leads; what it cannot (the lease lost) is left: a standby never
    /// rolls back, and a new leader does not know of them.
    pub(super) fn roll_back_failures(&mut self) {
        let due = self.link.index.borrow_mut().take_rollbacks();
        for d in due {
            if !self.keep_lease(false) {
                log::warn!(
                    "rollback: not leading; the failure of command {} in {}/{} is not rolled back",
                    d.command,
                    d.namespace,
                    d.name
                );
                return;
            }
            let restored = self.roll_back(&d);
            let target = Target {
                namespace: d.namespace.to_string(),
                name: d.name.to_string(),
            };
            let end = self.rollback_ended(&target, &d.command, restored);
            self.link.index.borrow_mut().rolled_back(&d, end);
        }
    }

    /// Restores the change before the one `due` names, from the record.
    fn roll_back(&mut self, due: &RollbackDue) -> Result<Option<String>, Unrestored> {
        let target = Target {
            namespace: due.namespace.to_string(),
            name: due.name.to_string(),
        };
        let (_, secret, payload) = self
            .read_record(&target.namespace, &target.name, "to roll back")
            .ok_or(Unrestored::NoRecord)?;
        let key = self.leader.integrity().ok_or(Unrestored::NoRecord)?;
        let env = self.me.token.environment_id();
        let history = drift::proven_history(&secret, env, &target.namespace, key)
            .map_err(Unrestored::History)?
            .ok_or(Unrestored::NothingBefore)?;
        if history.command != due.command {
            return Err(Unrestored::Superseded(history.command));
        }
        if history.rolled_back_from.as_deref() == Some(due.command.as_str()) {
            return Err(Unrestored::Already);
        }
        let previous = match (history.previous, history.previous_dropped) {
            (Some(p), _) => p,
            (None, Some(bytes)) => return Err(Unrestored::TooBig(bytes)),
            (None, None) => return Err(Unrestored::NothingBefore),
        };
        let prune = objects_of(&payload, &target.namespace)
            .into_iter()
            .filter(|r| !objects_of(&previous.payload, &target.namespace).contains(r))
            .collect();
        let restore = Restore {
            payload: previous.payload,
            command: previous.command,
            prune,
        };
        let restored_command = restore.command.clone();
        let outcome = self.restore(&target, &due.command, &restore)?;
        // The record now holds the restored change, marked as the rollback
        // of the failed one: never rolled back again.
        let primary = outcome
            .workloads
            .iter()
            .find(|w| w.name == target.name && w.namespace == target.namespace);
        if let Some((kind, uid)) = primary.and_then(|w| Some((w.kind, w.uid.as_deref()?))) {
            let history = History {
                command: restored_command.clone().unwrap_or_default(),
                rolled_back_from: Some(due.command.clone()),
                ..History::default()
            };
            let (ns, name) = (&target.namespace, &target.name);
            if let Err(e) =
                self.write_record(ns, name, &restore.payload, history, (kind, uid), None)
            {
                log::warn!("rollback: {ns}/{name} restored, but its record not written: {e}");
            }
        }
        Ok(restored_command)
    }

    /// A deploy whose writes failed midway (`onFailure: rollback`): the
    /// change its record holds (the last applied) restored at once, the
    /// objects it created deleted; the ack's message says what happened.
    pub(super) fn roll_back_midway(&mut self, d: &Deploy, failed: &str, outcome: &mut Outcome) {
        let wrote =
            |a: ResourceAction| matches!(a, ResourceAction::Created | ResourceAction::Configured);
        if outcome.result != AckResult::Failed
            || outcome.refusal.is_some()
            || !outcome.resources.iter().any(|r| wrote(r.action))
        {
            return;
        }
        let target = d.deployment.clone();
        let restored = match self.read_record(&target.namespace, &target.name, "to roll back") {
            None => Err(Unrestored::NothingBefore),
            Some((_, secret, payload)) => {
                let command = self.leader.integrity().and_then(|key| {
                    let env = self.me.token.environment_id();
                    drift::proven_history(&secret, env, &target.namespace, key)
                        .ok()
                        .flatten()
                        .map(|h| h.command)
                });
                let listed = objects_of(&payload, &target.namespace);
                let prune = outcome
                    .resources
                    .iter()
                    .filter(|r| r.action == ResourceAction::Created)
                    .filter_map(|r| {
                        let kind = Kind::of(&r.api_version, &r.kind)?;
                        Some(ObjectRef::new(kind, &r.namespace, &r.name))
                    })
                    .filter(|r| !listed.contains(r))
                    .collect();
                let restore = Restore {
                    payload,
                    command: command.clone(),
                    prune,
                };
                self.restore(&target, failed, &restore).map(|_| command)
            }
        };
        let end = self.rollback_ended(&target, failed, restored);
        let said = match end {
            RollbackEnd::RolledBack { to } => {
                format!(
                    "rolled back to command {}",
                    to.as_deref().unwrap_or("(unnamed)")
                )
            }
            RollbackEnd::Failed { reason } => format!("not rolled back: {reason}"),
        };
        outcome.message = crate::text::clip(&format!("{}; {said}", outcome.message), 1024);
    }

    /// Applies `restore` as a deploy command would be, then deletes what it
    /// does not list.
    fn restore(
        &mut self,
        target: &Target,
        failed: &str,
        restore: &Restore,
    ) -> Result<Outcome, Unrestored> {
        let deploy =
            commands::deploy_payload(&restore.payload, &self.me.capabilities, &self.me.namespaces)
                .map_err(Unrestored::Invalid)?;
        if deploy.deployment != *target {
            return Err(Unrestored::Failed(format!(
                "the record of {}/{} holds another deployment's change",
                target.namespace, target.name
            )));
        }
        let command = Command {
            id: format!("{failed}-rollback"),
            action: Action::Deploy(deploy),
            plan: false,
        };
        let permitted =
            apply::permit(command, &self.rules()).map_err(|r| Unrestored::Refused(Box::new(r)))?;
        log::info!(
            "rollback: restoring {}/{} after command {failed} failed",
            target.namespace,
            target.name
        );
        let outcome = apply::run(&self.execution(), &permitted);
        if outcome.result == AckResult::Failed {
            return Err(match outcome.refusal {
                Some(r) => Unrestored::Refused(r),
                None => Unrestored::Failed(outcome.message),
            });
        }
        if !restore.prune.is_empty() {
            apply::prune::prune(&self.execution(), &target.name, &restore.prune)
                .map_err(|e| Unrestored::Failed(e.to_string()))?;
        }
        Ok(outcome)
    }

    /// Logs, counts and tells (an Event on the deployment's object) how a
    /// rollback ended.
    fn rollback_ended(
        &mut self,
        target: &Target,
        failed: &str,
        restored: Result<Option<String>, Unrestored>,
    ) -> RollbackEnd {
        let (ns, name) = (&target.namespace, &target.name);
        let (end, note, result) = match restored {
            Ok(to) => {
                let named = to
                    .as_deref()
                    .unwrap_or("(recorded before commands were named)");
                log::warn!(
                    "rollback: command {failed} failed in {ns}/{name}; rolled back to command {named}"
                );
                let note = format!("command {failed} failed; rolled back to command {named}");
                (RollbackEnd::RolledBack { to }, note, "rolled_back")
            }
            Err(why) => {
                log::warn!(
                    "rollback: command {failed} failed in {ns}/{name}; not rolled back: {why}"
                );
                let note = format!("command {failed} failed; not rolled back: {why}");
                let reason = crate::text::clip(&why.to_string(), 256);
                (RollbackEnd::Failed { reason }, note, why.result())
            }
        };
        crate::metrics::rolled_back(result);
        let regarding = self.link.index.borrow().owned(ns, name);
        for r in regarding {
            self.event(Event {
                regarding: r,
                reason: Reason::RolledBack,
                action: "Rollback",
                note: note.clone(),
            });
        }
        end
    }
}

/// The objects a deploy payload lists, in `namespace`.
fn objects_of(payload: &Value, namespace: &str) -> Vec<ObjectRef> {
    payload["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| {
            let kind = Kind::of(m["apiVersion"].as_str()?, m["kind"].as_str()?)?;
            Some(ObjectRef::new(
                kind,
                namespace,
                m["metadata"]["name"].as_str()?,
            ))
        })
        .collect()
}
