//! Deployment status (docs/protocol.md, "Deployment status", `status.v1`): the
//! phase of an owned NexoProxy or legacy Deployment, from what its list or
//! watch event says ([`Observed`], no request of its own) and what this
//! Manager remembers of it ([`Track`]). Pure: [`Track::advance`] takes the
//! time as a value.

use std::rc::Rc;
use std::time::{Duration, Instant};

use super::interner::Interner;
use crate::cp::wire::CommandPhase;
use crate::resource::Kind;
use crate::words::Phase;

/// Messages are cut to this many bytes.
pub const MESSAGE_BYTES: usize = 256;

/// The reason of a NexoProxy that failed by `NEXO_PROGRESS_DEADLINE` (a
/// Deployment's controller says the same of its own deadline).
pub const DEADLINE_REASON: &str = "ProgressDeadlineExceeded";

pub use super::interner::Condition;

/// A generation that may be absent, in the 8 bytes of one where an
/// `Option` takes 16 (each owned object holds two: BENCHMARKS.md, "One
/// record an object"). Absent is `i64::MIN`, which no generation the API
/// server sets is; an `observedGeneration` of that value reads as absent.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct MaybeGeneration(i64);

impl MaybeGeneration {
    /// None.
    pub const NONE: MaybeGeneration = MaybeGeneration(i64::MIN);

    /// `g`, held.
    pub fn new(g: Option<i64>) -> MaybeGeneration {
        MaybeGeneration(g.unwrap_or(i64::MIN))
    }

    /// The generation, if there is one.
    pub fn get(self) -> Option<i64> {
        (self.0 != i64::MIN).then_some(self.0)
    }
}

impl Default for MaybeGeneration {
    fn default() -> MaybeGeneration {
        MaybeGeneration::NONE
    }
}

impl std::fmt::Debug for MaybeGeneration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.get().fmt(f)
    }
}

/// A replica count as the API holds it (`int32`): a larger value (which
/// the API server does not store) is held as the nearest it can be.
pub fn count(n: i64) -> i32 {
    i32::try_from(n).unwrap_or(if n < 0 { i32::MIN } else { i32::MAX })
}

/// Whether condition `c` says `False`.
fn is_false(c: &Option<Rc<Condition>>) -> bool {
    c.as_ref().and_then(|c| c.status.as_deref()) == Some("False")
}

/// What an object's metadata and status say, as listed or watched.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// A legacy Deployment (else a NexoProxy).
    pub deployment: bool,
    /// `metadata.generation`.
    pub generation: i64,
    /// `status.observedGeneration`.
    pub observed_generation: MaybeGeneration,
    /// `spec.replicas`. The counts are `int32` in the API (the CRD's
    /// `format: int32`, the Deployment's), held so ([`count`]).
    pub replicas: i32,
    /// `status.readyReplicas`.
    pub ready: i32,
    /// `status.updatedReplicas`.
    pub updated: Option<i32>,
    /// `status.availableReplicas` (a Deployment).
    pub available: Option<i32>,
    /// Whether the object has a `status` at all.
    pub has_status: bool,
    /// A NexoProxy's `Ready`, a Deployment's `Available` (shared: most
    /// objects have none, or the same as others).
    pub ready_condition: Option<Rc<Condition>>,
    /// A Deployment's `Progressing`.
    pub progressing: Option<Rc<Condition>>,
}

impl Observed {
    /// Every replica ready at the generation the controller observed.
    pub fn is_available(&self) -> bool {
        if self.observed_generation.get() != Some(self.generation) || self.ready < self.replicas {
            return false;
        }
        if self.deployment {
            self.updated.unwrap_or(0) >= self.replicas
                && self.available.unwrap_or(0) >= self.replicas
        } else {
            !is_false(&self.ready_condition)
        }
    }

    /// What the replicas say, when no condition does.
    fn counts(&self) -> String {
        match self.updated {
            Some(u) => format!("{u} of {} updated, {} ready", self.replicas, self.ready),
            None => format!("{} of {} ready", self.ready, self.replicas),
        }
    }
}

/// A phase and the words that explain it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub phase: Phase,
    pub reason: Option<Rc<str>>,
    pub message: Rc<str>,
    /// When judging again could change the phase with nothing observed
    /// (a NexoProxy's progress deadline), from the judging.
    pub recheck_in: Option<Duration>,
    /// Not the phase last judged ([`Track::advance`]): its `since` is now.
    pub changed: bool,
}

/// The phase of `o`, the first rule that holds (docs/protocol.md):
/// `failed`, `available`, `degraded`, `progressing`.
/// `available_at`: the generation at which it was last seen available;
/// `waited`: how long the current generation has been waiting to become
/// available (since the Manager applied it, or first saw it).
pub fn judge(
    o: &Observed,
    available_at: Option<i64>,
    waited: Duration,
    deadline: Duration,
    shared: &mut Interner,
) -> Verdict {
    let available = o.is_available();
    let was_available = available_at == Some(o.generation);
    // Failed: a Deployment by its controller's deadline, a NexoProxy by
    // the Manager's.
    let failed = if o.deployment {
        o.progressing.as_ref().and_then(|c| c.reason.as_deref()) == Some("ProgressDeadlineExceeded")
    } else {
        !available && !was_available && waited >= deadline
    };
    let phase = if failed {
        Phase::Failed
    } else if available {
        Phase::Available
    } else if was_available {
        Phase::Degraded
    } else {
        Phase::Progressing
    };
    // The deciding condition: a NexoProxy's `Ready`; a Deployment's
    // `Progressing` for failed and progressing, `Available` otherwise.
    let condition = match (o.deployment, phase) {
        (true, Phase::Failed | Phase::Progressing) => o.progressing.as_ref(),
        _ => o.ready_condition.as_ref(),
    };
    let (reason, said) = if !o.deployment && !o.has_status {
        (Some(shared.get("NoStatus")), shared.get("no status yet"))
    } else {
        let reason = condition.and_then(|c| c.reason.clone());
        let said = match condition.and_then(|c| c.message.clone()) {
            Some(m) if m.len() > MESSAGE_BYTES => {
                shared.get(crate::text::clip_bytes(&m, MESSAGE_BYTES))
            }
            Some(m) if !m.is_empty() => m,
            _ => shared.get(&o.counts()),
        };
        (reason, said)
    };
    // A NexoProxy failed by the Manager's deadline: the deadline is the
    // reason (as a Deployment's controller says it), the message stays the
    // condition's, clipped (docs/protocol.md); without a status, `NoStatus`.
    let reason = if phase == Phase::Failed && !o.deployment && o.has_status {
        Some(shared.get(DEADLINE_REASON))
    } else {
        reason
    };
    let message = said;
    // Only a NexoProxy still waiting can turn with nothing observed.
    let recheck_in =
        (!o.deployment && phase == Phase::Progressing).then(|| deadline.saturating_sub(waited));
    Verdict {
        phase,
        reason,
        message,
        recheck_in,
        changed: false,
    }
}

/// The last deploy or rollout of a deployment, while its progress is
/// reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandTrack {
    pub id: String,
    pub class: &'static str,
    /// The generation the command wrote: older ones do not show its end.
    pub generation: i64,
    /// When it was applied: the progress deadline counts from here.
    pub applied_at: Instant,
    /// Its end (available or failed) was in a heartbeat the CP accepted.
    pub ended: bool,
    /// Its end is in the heartbeat being sent.
    pub ending: bool,
    /// `onFailure: rollback` (docs/protocol.md, `rollback.v1`): its failure
    /// is rolled back, once; until then `failed` is not its end.
    pub rollback: bool,
    /// Its failure was handed to the agent to roll back.
    pub rollback_due: bool,
    /// How its rollback ended: its end, shown once.
    pub rolled_back: Option<RollbackEnd>,
}

/// A change that failed and is to be rolled back (docs/protocol.md,
/// `rollback.v1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollbackDue {
    /// `NexoProxy` or `Deployment`.
    pub kind: Kind,
    pub namespace: Rc<str>,
    pub name: Rc<str>,
    /// The command whose change failed.
    pub command: String,
}

/// How a rollback ended (docs/protocol.md, `rollback.v1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RollbackEnd {
    /// The previous change, applied by this command (`None`: a change
    /// recorded before commands were), restored.
    RolledBack { to: Option<String> },
    /// Not restored, and why (nothing to restore included).
    Failed { reason: String },
}

/// What a command's progress shows, from the deployment's phase and its
/// rollback; and whether it is its end.
pub fn command_progress(c: &CommandTrack, o: &Observed, phase: Phase) -> (CommandPhase, bool) {
    match &c.rolled_back {
        Some(RollbackEnd::RolledBack { .. }) => (CommandPhase::RolledBack, true),
        Some(RollbackEnd::Failed { .. }) => (CommandPhase::RollbackFailed, true),
        None => {
            let phase = command_phase(c, o, phase);
            // A failure to roll back is not the end: its rollback is.
            let end = phase.is_final() && !(phase == Phase::Failed && c.rollback);
            (CommandPhase::from(phase), end)
        }
    }
}

/// What this Manager remembers of one deployment between observations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Track {
    /// The phase last judged (when it changed is the record's
    /// `Reported::since`).
    pub phase: Option<Phase>,
    /// The generation last seen available.
    pub available_at: MaybeGeneration,
    /// The generation being waited on, and since when.
    pub generation: i64,
    pub waiting_since: Instant,
    /// Why, as the kubelet says (a legacy Deployment's pods), added to the
    /// message while the phase that asked for it lasts.
    pub detail: Option<Rc<str>>,
}

/// A phase change worth an Event (`ProgressFailed`, `Degraded`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turned {
    pub phase: Phase,
    pub message: String,
}

impl Track {
    /// A deployment first seen at `now`.
    pub fn new(generation: i64, now: Instant) -> Track {
        Track {
            phase: None,
            available_at: MaybeGeneration::NONE,
            generation,
            waiting_since: now,
            detail: None,
        }
    }

    /// Judges `o` at `now`, with the command that wrote its generation if
    /// there is one; remembers the phase. Returns the verdict, and the
    /// change when it turned `failed` or `degraded`; the verdict's
    /// `changed` says whether the phase is not the one last judged.
    pub fn advance(
        &mut self,
        o: &Observed,
        command: Option<&CommandTrack>,
        now: Instant,
        deadline: Duration,
        shared: &mut Interner,
    ) -> (Verdict, Option<Turned>) {
        if o.generation != self.generation {
            self.generation = o.generation;
            self.waiting_since = now;
        }
        let start = match command {
            Some(c) if c.generation == o.generation => c.applied_at.min(self.waiting_since),
            _ => self.waiting_since,
        };
        let mut verdict = judge(
            o,
            self.available_at.get(),
            now.saturating_duration_since(start),
            deadline,
            shared,
        );
        if verdict.phase == Phase::Available {
            self.available_at = MaybeGeneration::new(Some(o.generation));
        }
        let mut turned = None;
        if self.phase != Some(verdict.phase) {
            if self.phase.is_some() && matches!(verdict.phase, Phase::Failed | Phase::Degraded) {
                turned = Some(Turned {
                    phase: verdict.phase,
                    message: verdict.message.to_string(),
                });
            }
            self.phase = Some(verdict.phase);
            self.detail = None;
            verdict.changed = true;
        }
        (verdict, turned)
    }
}

/// The phase of a command's progress: the deployment's, once the
/// generation it wrote is observed; `progressing` until then.
pub fn command_phase(c: &CommandTrack, o: &Observed, phase: Phase) -> Phase {
    if o.generation < c.generation {
        Phase::Progressing
    } else {
        phase
    }
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
