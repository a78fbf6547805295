//! The commands of one heartbeat answer, in order, while the lease holds:
//! each validated, executed once (a recorded id is only acknowledged
//! again), recorded in the state Secret, then acknowledged with a bounded
//! number of attempts; an ack not delivered waits in `pendingAcks`.

use std::time::Instant;

use serde_json::value::RawValue;

use super::run::{Checked, Rejected};
use super::session::Renewal;
use super::{Agent, Next};
use crate::acks;
use crate::apply::{self, Outcome};
use crate::backoff::Jitter;
use crate::commands::{self, Action, Command, OnFailure};
use crate::cp::AckOutcome;
use crate::cp::wire::{CommandFields, Commands};
use crate::events::{self, Event, Reason, Regarding};
use crate::kube::pause::{Pause as _, Wake};
use crate::state::LedgerEntry;
use crate::words::AckResult;

/// How many times a command the lease fence stopped is taken up again in
/// one batch, each time after the lease was held again and the state read
/// again (an API server that keeps freezing leaves it to the CP, which
/// sends unacknowledged commands again).
const FENCED_RETRIES: u32 = 3;

/// How one command ended for the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Handled {
    /// Acknowledged (or attempted), recorded when it ran.
    Done,
    /// Stopped by the lease fence: nothing recorded, no ack. It is taken
    /// up again, before any later command, once this process holds the
    /// lease again and has read the state again.
    Fenced,
    /// Cut short by a stop (a read it waited for was abandoned): not
    /// recorded, no ack; the CP sends it again to the next Manager.
    Stopped,
}

/// Whether the batch goes on to its next command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Go {
    On,
    /// The lease is lost or past its renew deadline: the rest is left to
    /// the CP, which sends unacknowledged commands again.
    Leave,
    /// A stop was requested.
    Stop,
}

impl Agent {
    /// Handles a batch; a stop requested mid-batch ends the loop.
    pub(super) fn batch(&mut self, commands: Commands<'_>) -> Next {
        if !commands.taken.is_empty() {
            // Keys are rotated by rewriting the file: read again when it changed.
            self.refresh_trust();
        }
        'batch: for (i, command) in commands.taken.into_iter().enumerate() {
            let mut first = i == 0;
            let mut fenced = 0;
            loop {
                // A command this process already finished is acknowledged
                // from the ledger: no renewal of the lease for it (the
                // lease's schedule, and the ack's own fence, still hold).
                let finished = fenced == 0 && self.state_current() && self.in_ledger(command);
                match self.go_on(first && !finished) {
                    Go::On => {}
                    Go::Leave => break 'batch,
                    Go::Stop => return Next::Stop,
                }
                match self.handle_command(command) {
                    Handled::Done => break,
                    Handled::Stopped => return Next::Stop,
                    Handled::Fenced if fenced < FENCED_RETRIES => {
                        // Another leader may have run it meanwhile: the
                        // state is read again (whatever the term) when the
                        // lease is renewed, at once, before it is taken up
                        // again; a recorded result is then acknowledged
                        // from the ledger, never run twice.
                        fenced += 1;
                        first = true;
                        self.leader.read_state_before_acting();
                    }
                    Handled::Fenced => {
                        crate::warn!(
                            times = fenced + 1;
                            "the lease fence stopped the same command again; leaving the rest of the batch to the CP"
                        );
                        break 'batch;
                    }
                }
            }
        }
        Next::Wait(self.pace.interval)
    }

    /// Whether `raw` is a command the ledger holds the result of.
    fn in_ledger(&self, raw: &RawValue) -> bool {
        let outer = CommandFields::read(raw.get());
        commands::id_of(raw.get(), outer.as_ref()).is_ok_and(|id| self.store.find(&id).is_some())
    }

    /// Before each command: probes are answered (once the last wait is
    /// 0.5 s old), a stop is honoured, and the lease is renewed (before the
    /// first, and then once a third of it has passed), so a command starts
    /// with most of its renew deadline ahead; during it, the scheduled
    /// renewal runs at its calls' checkpoints.
    fn go_on(&mut self, first: bool) -> Go {
        self.link.waiter.checkpoint();
        if self.link.waiter.stop_requested() {
            crate::info!("stop requested; leaving the rest of the batch to the next Manager");
            return Go::Stop;
        }
        if !self.keep_lease(first) {
            crate::warn!("not leading (or past the renew deadline); leaving the rest of the batch");
            return Go::Leave;
        }
        Go::On
    }

    /// Verifies, validates, executes (once), records and acknowledges one
    /// command.
    fn handle_command(&mut self, raw: &RawValue) -> Handled {
        let started = Instant::now();
        // The command's fields are read once, here: its id, then its trust
        // and its payload from the same reading.
        let outer = CommandFields::read(raw.get());
        let id = match commands::id_of(raw.get(), outer.as_ref()) {
            Ok(id) => id,
            Err(no_id) => {
                // Not its text: a command may carry Secret data.
                let bytes = raw.get().len();
                crate::error!(err:% = no_id, bytes; "skipping a command without a valid id");
                crate::metrics::refused(no_id.reason());
                return Handled::Done;
            }
        };
        let checked = self.checked(raw.get(), outer, &id);
        let (scope_class, deployment) = match &checked {
            Ok(c) => (
                c.permitted.command().class(),
                c.permitted
                    .command()
                    .action
                    .deployment()
                    .map(|t| (t.namespace.as_str(), t.name.as_str())),
            ),
            Err(r) => (r.class, None),
        };
        let _scope = crate::logging::CommandScope::enter(&id, scope_class, deployment);
        // A recorded id is acknowledged again with its recorded result,
        // whatever this copy of it is: nothing runs twice, and a copy that
        // fails its checks (a replay with a bad signature) changes nothing.
        if let Some(entry) = self.store.find(&id).cloned() {
            crate::info!(
                result:% = entry.result;
                "command already finished; acknowledging its recorded result again"
            );
            self.deliver(entry, true);
            return Handled::Done;
        }
        let class = checked
            .as_ref()
            .map_or("invalid", |c| c.permitted.command().class());
        // What its Events are about, read before it runs (an uninstall
        // takes its objects away).
        let (regarding, action, planned) = {
            let (targets, action) = match &checked {
                Ok(c) => (c.permitted.command().action.targets(), class),
                Err(r) => (&r.targets[..], r.class),
            };
            let planned = action == "plan";
            let index = self.link.index.borrow();
            let regarding = targets
                .iter()
                .flat_map(|t| index.owned(&t.namespace, &t.name))
                .collect::<Vec<_>>();
            (regarding, events::command_action(action), planned)
        };
        let mut rollback = false;
        let (outcome, keep_until) = match checked {
            Ok(Checked {
                permitted,
                keep_until,
            }) => {
                crate::info!("executing the command");
                let mut outcome = apply::run(&self.execution(), &permitted);
                let command = permitted.command();
                if let Action::Deploy(d) = &command.action
                    && d.on_failure == OnFailure::Rollback
                    && !command.plan
                    && outcome.result == AckResult::Failed
                    && self.elector().leading()
                    && !self.link.waiter.stop_requested()
                {
                    // Before the checks below: a restore the fence stopped
                    // is fenced like the command.
                    let d = d.clone();
                    self.roll_back_midway(&d, &id, &mut outcome);
                }
                if !self.elector().leading() {
                    // Stopped mid-command past the renew deadline: another
                    // leader may have run it since. Its writes stopped at
                    // the fence; its outcome is not this process's to
                    // record or acknowledge as it stands: the batch takes
                    // it up again once the lease and the state are held
                    // again (or leaves it to the next leader).
                    crate::warn!(
                        "the lease may have been lost while it ran (fenced); nothing recorded, no ack yet (run again, or acknowledged from the ledger, once the lease and the state are held again)"
                    );
                    return Handled::Fenced;
                }
                if outcome.result == AckResult::Failed && self.link.waiter.stop_requested() {
                    crate::warn!(
                        "command cut short by a stop request; not recorded, no ack (the CP sends it again)"
                    );
                    return Handled::Stopped;
                }
                self.record_applied(permitted.command(), &mut outcome);
                rollback = rolls_back(permitted.command());
                if let (Action::Upgrade(u), Some(upgraded)) =
                    (&permitted.command().action, &outcome.upgraded)
                    && outcome.result == AckResult::Applied
                {
                    self.self_upgrade_applied(&id, u, upgraded);
                }
                (outcome, keep_until)
            }
            Err(Rejected { refusal, .. }) if !refusal.recorded() => {
                if matches!(refusal, crate::refusal::Refusal::Untrusted(_)) && class != "plan" {
                    let note = format!("command {id} refused: {refusal}");
                    self.own_event(crate::events::Reason::SignatureRefused, "Verify", note);
                }
                // Refused before any signature verified: acknowledged, not
                // recorded (docs/protocol.md, "Command trust").
                crate::metrics::refused(refusal.reason());
                crate::warn!(err:% = refusal; "command refused");
                self.link.status().command(class, AckResult::Failed);
                let entry = LedgerEntry {
                    command_id: id.clone(),
                    result: AckResult::Failed,
                    message: refusal.to_string(),
                    completed_at: super::shared::now_rfc3339(),
                    ..LedgerEntry::default()
                };
                self.deliver(entry, false);
                return Handled::Done;
            }
            Err(Rejected { refusal, .. }) => (Outcome::refused(refusal, Vec::new()), None),
        };
        // A plan writes nothing, Events included (docs/protocol.md,
        // `command.plan.v1`).
        if !planned {
            self.command_events(&id, action, &outcome, regarding);
        }
        self.finished(&id, class, outcome, keep_until, rollback);
        crate::metrics::command_duration(class, started.elapsed());
        Handled::Done
    }

    /// Queues the command's Events: one about each owned object it wrote
    /// or names (`Applied`, `Refused` or `Failed`); written after the
    /// batch, never in its way.
    fn command_events(
        &mut self,
        id: &str,
        action: &'static str,
        outcome: &Outcome,
        mut regarding: Vec<Regarding>,
    ) {
        for w in &outcome.workloads {
            let Some(uid) = &w.uid else { continue };
            if regarding.iter().all(|r| r.uid != *uid) {
                regarding.push(Regarding {
                    kind: w.kind,
                    namespace: w.namespace.clone(),
                    name: w.name.clone(),
                    uid: uid.clone(),
                });
            }
        }
        let reason = match (outcome.result, &outcome.refusal) {
            (AckResult::Applied, _) => Reason::Applied,
            (AckResult::Failed, Some(_)) => Reason::Refused,
            (AckResult::Failed, None) => Reason::Failed,
        };
        let note = format!("command {id}: {}", outcome.message);
        for r in regarding {
            self.event(Event {
                regarding: r,
                reason,
                action,
                note: note.clone(),
            });
        }
    }

    /// Counts, logs, records and acknowledges a command's outcome;
    /// `rollback`: the failure of what it applied is rolled back.
    fn finished(
        &mut self,
        id: &str,
        class: &'static str,
        outcome: Outcome,
        keep_until: Option<String>,
        rollback: bool,
    ) {
        let result = outcome.result;
        if let Some(refusal) = &outcome.refusal {
            crate::metrics::refused(refusal.reason());
        }
        if result == AckResult::Applied {
            let now = Instant::now();
            let mut index = self.link.index.borrow_mut();
            for w in &outcome.workloads {
                index.command_applied(w, id, class, rollback, now);
            }
        }
        self.link.status().command(class, result);
        match result {
            AckResult::Applied => {
                crate::info!(
                    result:% = result, message = outcome.message.as_str();
                    "command finished"
                )
            }
            AckResult::Failed => {
                crate::warn!(
                    result:% = result, message = outcome.message.as_str();
                    "command finished"
                )
            }
        }
        let entry = LedgerEntry {
            command_id: id.to_owned(),
            class: class.to_owned(),
            result,
            message: outcome.message,
            resources: outcome.resources,
            completed_at: super::shared::now_rfc3339(),
            keep_until,
            plan: outcome.plan.map(|p| *p),
            ..LedgerEntry::default()
        };
        // Recorded before the ack: the ledger keeps the entry cut to its
        // budget; this first ack carries every resource.
        self.store.record(&self.link, &entry);
        self.deliver(entry, true);
    }

    /// Delivers one ack: up to [`acks::ATTEMPTS`] attempts with backoff, then
    /// a `recorded` one waits in `pendingAcks` of the following heartbeats
    /// (one not recorded is refused again when the CP sends it again).
    fn deliver(&mut self, entry: LedgerEntry, recorded: bool) {
        let id = entry.command_id.clone();
        let mut jitter = Jitter::from_entropy();
        let mut renewed = false;
        let mut attempt = entry.attempts;
        for n in 1..=acks::ATTEMPTS {
            attempt = entry.attempts + n;
            // The fence: no ack from a process that may have lost the lease.
            if !self.keep_lease(false) {
                crate::warn!(
                    commandId = id;
                    "the lease is past its renew deadline; no ack sent (the next leader sends it)"
                );
                return;
            }
            let Some(session) = self.session.as_ref() else {
                break;
            };
            let ack = acks::ack(&entry, &session.manager_id, attempt);
            self.link.status().ack_attempts += 1;
            let result = self.link.cp.ack(&session.token, &ack);
            // A resend after a new session is the next attempt.
            match self.renew_if_expired(&result, &mut renewed, format_args!("the ack of {id}")) {
                Ok(Renewal::NotExpired) => {}
                Ok(Renewal::Renewed) => continue,
                Ok(Renewal::NotConnected(_)) => break,
                Err(fatal) => {
                    crate::warn!(
                        commandId = id, err:% = fatal;
                        "cannot connect again; the ack waits"
                    );
                    break;
                }
            }
            let e = match result {
                Ok(AckOutcome::Forgotten) => {
                    crate::warn!(
                        commandId = id;
                        "the Control Plane does not know the command (404); its ack counts as delivered"
                    );
                    return self.store.delivered(id, recorded);
                }
                Ok(outcome) => {
                    crate::info!(commandId = id, attempt, outcome:? = outcome; "ack delivered");
                    return self.store.delivered(id, recorded);
                }
                Err(e) => e,
            };
            if e.malformed() {
                crate::error!(
                    commandId = id, err:% = e;
                    "ack refused as malformed; not resending it"
                );
                return self.store.delivered(id, recorded);
            } else if n < acks::ATTEMPTS {
                let delay = acks::delay(n, &mut jitter);
                crate::warn!(
                    commandId = id, attempt, err:% = e, retryIn:? = delay;
                    "ack attempt failed; retrying"
                );
                if matches!(self.link.waiter.wait(delay), Ok(Wake::Stop)) {
                    crate::info!(
                        commandId = id;
                        "stop requested; the ack goes with the next Manager's heartbeats"
                    );
                    break;
                }
            } else {
                crate::warn!(commandId = id, attempt, err:% = e; "ack attempt failed");
            }
        }
        if !recorded {
            crate::warn!(
                commandId = id, attempts = attempt;
                "ack not delivered; not recorded, so a copy sent again is refused again"
            );
            return;
        }
        crate::warn!(
            commandId = id, attempts = attempt;
            "ack not delivered; it goes with the next heartbeats"
        );
        self.store.set_attempts(&self.link, &id, attempt);
    }
}

/// Whether the failure of what `command` applies is rolled back
/// (docs/protocol.md, `rollback.v1`): a deploy's or rollout's
/// `onFailure: rollback`, never a plan's.
fn rolls_back(command: &Command) -> bool {
    let on_failure = match &command.action {
        Action::Deploy(d) => d.on_failure,
        Action::Rollout(r) => r.on_failure,
        _ => OnFailure::Stay,
    };
    on_failure == OnFailure::Rollback && !command.plan
}
