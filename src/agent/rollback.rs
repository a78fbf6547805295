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
use super::record::RecordRead;
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
    /// No record of the deployment.
    NoRecord,
    /// A record that is not the Manager's, or whose history is not.
    NotProven(RecordError),
    /// No integrity key to check the record with.
    NoKey,
    /// The record holds another command's change: the failed one was
    /// replaced since.
    Superseded(Option<String>),
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
            Unrestored::NoRecord | Unrestored::NothingBefore => {
                f.write_str("no previous change is recorded; left as it is")
            }
            Unrestored::NotProven(e) => write!(f, "its record's history is not the Manager's: {e}"),
            Unrestored::NoKey => f.write_str(
                "no integrity key to check its record with (the state secret could not be read)",
            ),
            Unrestored::Superseded(by) => write!(
                f,
                "the deployment was changed since, by command {}",
                by.as_deref().unwrap_or("(unnamed)")
            ),
            Unrestored::Already => f.write_str("it was rolled back before"),
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
    /// The objects the failed change created that it does not list.
    prune: Vec<ObjectRef>,
}

impl Agent {
    /// Rolls back the failures the last report found, while this process
    /// leads. What it cannot roll back now (the lease lost) waits for it
    /// to lead again (the record then says whether it still may): a
    /// standby never rolls back.
    pub(super) fn roll_back_failures(&mut self) {
        let mut due = self.link.index.borrow_mut().take_rollbacks().into_iter();
        while let Some(d) = due.next() {
            if !self.keep_lease(false) {
                crate::warn!(
                    failedCommand:% = d.command, namespace:% = d.namespace, deployment:% = d.name;
                    "rollback: not leading; the failure waits"
                );
                let mut index = self.link.index.borrow_mut();
                index.requeue_rollbacks(std::iter::once(d).chain(due));
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

    /// The record of `target` with its history, both proven (`Ok(None)`:
    /// no record).
    fn proven_record(
        &self,
        target: &Target,
    ) -> Result<Option<(Value, Option<History>)>, Unrestored> {
        let read = self.fetch_record(&target.namespace, &target.name);
        let Some((_, _, record)) = read.map_err(|e| match e {
            RecordRead::Read(e) => Unrestored::Failed(format!("cannot read its record: {e}")),
            RecordRead::NoKey => Unrestored::NoKey,
            RecordRead::NotProven(e) => Unrestored::NotProven(e),
        })?
        else {
            return Ok(None);
        };
        let history = record.history.map_err(Unrestored::NotProven)?;
        Ok(Some((record.payload, history)))
    }

    /// Restores the change before the one `due` names, from the record.
    fn roll_back(&mut self, due: &RollbackDue) -> Result<Option<String>, Unrestored> {
        let target = Target {
            namespace: due.namespace.to_string(),
            name: due.name.to_string(),
        };
        let (_, history) = self.proven_record(&target)?.ok_or(Unrestored::NoRecord)?;
        let history = history.ok_or(Unrestored::NothingBefore)?;
        if history.command.as_deref() != Some(due.command.as_str()) {
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
        // Only what the failed change created, and the restored one does
        // not list, is deleted.
        let prune = unlisted(&history.created, &previous.payload, &target.namespace);
        let restore = Restore {
            payload: previous.payload,
            command: previous.command,
            prune,
        };
        let outcome = self.restore(&target, &due.command, &restore)?;
        // The record holds the restored change, marked as the rollback of
        // the failed one, before anything is deleted: never rolled back
        // again, and drift never enforces the failed change over it. A
        // record that cannot be written is deleted (`Agent::watched`).
        let primary = outcome
            .workloads
            .iter()
            .find(|w| w.name == target.name && w.namespace == target.namespace);
        let history = History {
            command: restore.command.clone(),
            rolled_back_from: Some(due.command.clone()),
            ..History::default()
        };
        let (ns, name) = (&target.namespace, &target.name);
        let written = match primary.and_then(|w| Some((w.kind, w.uid.as_deref()?))) {
            Some(owner) => self.write_record(ns, name, &restore.payload, history, owner, None),
            None => Err(super::record::Unrecorded::NoOwner("primary object")),
        };
        if let Err(e) = written {
            crate::warn!(
                namespace:% = ns, deployment:% = name, err:% = e;
                "rollback: restored, but the record not written; deleting it"
            );
            self.delete_record(ns, name);
        }
        self.prune(&target, &restore.prune)?;
        Ok(restore.command)
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
        let restored = match self.proven_record(&target) {
            Err(why) => Err(why),
            Ok(None) => Err(Unrestored::NothingBefore),
            Ok(Some((payload, history))) => {
                let command = history.and_then(|h| h.command);
                let created = super::record::created(outcome);
                let prune = unlisted(&created, &payload, &target.namespace);
                let restore = Restore {
                    payload,
                    command: command.clone(),
                    prune,
                };
                self.restore(&target, failed, &restore)
                    .and_then(|_| self.prune(&target, &restore.prune))
                    .map(|()| command)
            }
        };
        let end = self.rollback_ended(&target, failed, restored);
        let said = match end {
            RollbackEnd::RolledBack { to } => {
                format!(
                    "; rolled back to command {}",
                    to.as_deref().unwrap_or("(unnamed)")
                )
            }
            RollbackEnd::Failed { reason } => format!("; not rolled back: {reason}"),
        };
        // The message's end says what happened: its start is cut first.
        let room = 1024usize.saturating_sub(said.len());
        outcome.message = format!("{}{said}", crate::text::clip(&outcome.message, room));
    }

    /// Applies `restore` as a deploy command would be.
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
        crate::info!(
            namespace:% = target.namespace, deployment:% = target.name, failedCommand:% = failed;
            "rollback: restoring after a failed command"
        );
        let outcome = apply::run(&self.execution(), &permitted);
        if outcome.result == AckResult::Failed {
            return Err(match outcome.refusal {
                Some(r) => Unrestored::Refused(r),
                None => Unrestored::Failed(outcome.message),
            });
        }
        Ok(outcome)
    }

    /// Deletes what a restore does not list and the failed change created.
    fn prune(&mut self, target: &Target, objects: &[ObjectRef]) -> Result<(), Unrestored> {
        if objects.is_empty() {
            return Ok(());
        }
        apply::prune::prune(&self.execution(), &target.name, objects)
            .map(drop)
            .map_err(|e| Unrestored::Failed(format!("restored, but {e}")))
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
                crate::warn!(
                    failedCommand:% = failed, namespace:% = ns, deployment:% = name, to:% = named;
                    "rollback: a failed command rolled back"
                );
                let note = format!("command {failed} failed; rolled back to command {named}");
                (RollbackEnd::RolledBack { to }, note, "rolled_back")
            }
            Err(why) => {
                crate::warn!(
                    failedCommand:% = failed, namespace:% = ns, deployment:% = name, err:% = why;
                    "rollback: a failed command not rolled back"
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

/// The objects of `created` that `payload` (a deploy's, in `namespace`)
/// does not list: what a restore of it deletes.
fn unlisted(created: &[drift::Created], payload: &Value, namespace: &str) -> Vec<ObjectRef> {
    let listed = objects_of(payload, namespace);
    created
        .iter()
        .filter_map(|c| {
            Some(ObjectRef::new(
                Kind::of(&c.api_version, &c.kind)?,
                namespace,
                &c.name,
            ))
        })
        .filter(|r| !listed.contains(r))
        .collect()
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
