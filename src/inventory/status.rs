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
mod tests {
    use super::*;

    const DEADLINE: Duration = Duration::from_secs(600);

    fn cond(status: &str, reason: &str, message: &str) -> Option<Rc<Condition>> {
        Some(Rc::new(Condition {
            status: Some(status.into()),
            reason: Some(reason.into()),
            message: Some(message.into()),
        }))
    }

    fn judge(o: &Observed, at: Option<i64>, waited: Duration, deadline: Duration) -> Verdict {
        super::judge(o, at, waited, deadline, &mut Interner::default())
    }

    fn advance(
        t: &mut Track,
        o: &Observed,
        c: Option<&CommandTrack>,
        now: Instant,
        deadline: Duration,
    ) -> (Verdict, Option<Turned>) {
        t.advance(o, c, now, deadline, &mut Interner::default())
    }

    fn proxy(generation: i64, observed: Option<i64>, replicas: i32, ready: i32) -> Observed {
        Observed {
            generation,
            observed_generation: MaybeGeneration::new(observed),
            replicas,
            ready,
            has_status: observed.is_some(),
            ..Observed::default()
        }
    }

    fn deployment(replicas: i32, updated: i32, ready: i32, available: i32) -> Observed {
        Observed {
            deployment: true,
            generation: 3,
            observed_generation: MaybeGeneration::new(Some(3)),
            replicas,
            ready,
            updated: Some(updated),
            available: Some(available),
            has_status: true,
            ready_condition: cond(
                "True",
                "MinimumReplicasAvailable",
                "Deployment has minimum availability.",
            ),
            progressing: cond(
                "True",
                "ReplicaSetUpdated",
                "ReplicaSet \"x-1\" is progressing.",
            ),
        }
    }

    #[test]
    fn a_proxy_is_available_when_its_generation_is_observed_and_all_ready() {
        let v = judge(&proxy(7, Some(7), 3, 3), None, Duration::ZERO, DEADLINE);
        assert_eq!(v.phase, Phase::Available);
        assert_eq!(&*v.message, "3 of 3 ready");
        // Not observed yet, not all ready, Ready=False: progressing.
        for o in [proxy(7, Some(6), 3, 3), proxy(7, Some(7), 3, 2)] {
            assert_eq!(
                judge(&o, None, Duration::ZERO, DEADLINE).phase,
                Phase::Progressing
            );
        }
        let mut o = proxy(7, Some(7), 3, 3);
        o.ready_condition = cond("False", "CrashLoop", "pod orders-1 restarts");
        let v = judge(&o, None, Duration::ZERO, DEADLINE);
        assert_eq!(
            (v.phase, v.reason.as_deref(), &*v.message),
            (
                Phase::Progressing,
                Some("CrashLoop"),
                "pod orders-1 restarts"
            )
        );
    }

    #[test]
    fn a_proxy_fails_at_the_deadline_with_or_without_status() {
        let mut o = proxy(7, Some(7), 3, 1);
        o.ready_condition = cond("False", "ImagePullBackOff", "Back-off pulling image");
        let v = judge(&o, None, DEADLINE - Duration::from_secs(1), DEADLINE);
        assert_eq!(v.phase, Phase::Progressing);
        let v = judge(&o, None, DEADLINE, DEADLINE);
        assert_eq!(
            (v.phase, v.reason.as_deref(), &*v.message),
            (
                Phase::Failed,
                Some(DEADLINE_REASON),
                "Back-off pulling image"
            )
        );
        // The condition's message clipped to 256 bytes at a character,
        // nothing of the Manager's before it.
        let long = format!("{}é", "x".repeat(MESSAGE_BYTES - 1));
        o.ready_condition = cond("False", "CrashLoop", &long);
        let v = judge(&o, None, DEADLINE, DEADLINE);
        assert_eq!(
            (v.phase, v.reason.as_deref(), v.message.len()),
            (Phase::Failed, Some(DEADLINE_REASON), MESSAGE_BYTES - 1)
        );
        let v = judge(&proxy(2, None, 1, 0), None, DEADLINE, DEADLINE);
        assert_eq!(
            (v.phase, v.reason.as_deref()),
            (Phase::Failed, Some("NoStatus"))
        );
        // Available at this generation before: degraded, never failed.
        let v = judge(&proxy(7, Some(7), 3, 1), Some(7), DEADLINE * 2, DEADLINE);
        assert_eq!(v.phase, Phase::Degraded);
    }

    #[test]
    fn a_deployment_reads_its_conditions() {
        let v = judge(&deployment(2, 2, 2, 2), None, Duration::ZERO, DEADLINE);
        assert_eq!(
            (v.phase, v.reason.as_deref(), &*v.message),
            (
                Phase::Available,
                Some("MinimumReplicasAvailable"),
                "Deployment has minimum availability."
            )
        );
        let v = judge(&deployment(2, 1, 2, 2), None, Duration::ZERO, DEADLINE);
        assert_eq!(
            (v.phase, v.reason.as_deref()),
            (Phase::Progressing, Some("ReplicaSetUpdated"))
        );
        let mut o = deployment(2, 2, 1, 1);
        o.progressing = cond(
            "False",
            "ProgressDeadlineExceeded",
            "ReplicaSet \"x-2\" has timed out progressing.",
        );
        let v = judge(&o, Some(3), Duration::ZERO, DEADLINE);
        assert_eq!(
            (v.phase, v.reason.as_deref()),
            (Phase::Failed, Some("ProgressDeadlineExceeded"))
        );
        // The Manager's own deadline is not a Deployment's: its controller's is.
        let v = judge(&deployment(2, 1, 1, 1), None, DEADLINE * 10, DEADLINE);
        assert_eq!(v.phase, Phase::Progressing);
        let v = judge(&deployment(2, 2, 1, 1), Some(3), Duration::ZERO, DEADLINE);
        assert_eq!(v.phase, Phase::Degraded);
        assert_eq!(v.reason.as_deref(), Some("MinimumReplicasAvailable"));
    }

    #[test]
    fn a_generation_held_in_eight_bytes_reads_as_it_was_given() {
        for g in [None, Some(0), Some(1), Some(-1), Some(i64::MAX)] {
            assert_eq!(MaybeGeneration::new(g).get(), g);
        }
        assert_eq!(MaybeGeneration::new(Some(i64::MIN)).get(), None);
        assert_eq!(size_of::<MaybeGeneration>(), 8);
    }

    #[test]
    fn messages_are_cut_to_256_bytes() {
        let mut o = proxy(1, Some(1), 1, 0);
        o.ready_condition = cond("False", "X", &"é".repeat(300));
        let v = judge(&o, None, Duration::ZERO, DEADLINE);
        assert!(v.message.len() <= MESSAGE_BYTES && v.message.len() >= 254);
    }

    #[test]
    fn the_track_says_when_the_phase_changed_and_when_it_turned() {
        let t0 = Instant::now();
        let mut t = Track::new(1, t0);
        let (v, turned) = advance(&mut t, &proxy(1, Some(1), 2, 2), None, t0, DEADLINE);
        assert_eq!((v.phase, turned, v.changed), (Phase::Available, None, true));
        let (v, _) = advance(&mut t, &proxy(1, Some(1), 2, 2), None, t0, DEADLINE);
        assert_eq!((v.phase, v.changed), (Phase::Available, false));
        let (v, turned) = advance(&mut t, &proxy(1, Some(1), 2, 1), None, t0, DEADLINE);
        assert_eq!((v.phase, v.changed), (Phase::Degraded, true));
        assert_eq!(turned.unwrap().phase, Phase::Degraded);
        // A new generation waits from when it was applied.
        let c = CommandTrack {
            id: "c".into(),
            class: "rollout",
            generation: 2,
            applied_at: t0,
            ended: false,
            ending: false,
            rollback: false,
            rollback_due: false,
            rolled_back: None,
        };
        let later = t0 + DEADLINE;
        let o = proxy(2, Some(2), 2, 0);
        let (v, turned) = advance(&mut t, &o, Some(&c), later, DEADLINE);
        assert_eq!(v.phase, Phase::Failed, "{v:?}");
        assert_eq!(turned.unwrap().phase, Phase::Failed);
        assert_eq!(command_phase(&c, &o, v.phase), Phase::Failed);
        // An older generation still listed: the command is in progress.
        assert_eq!(
            command_phase(&c, &proxy(1, Some(1), 2, 2), Phase::Available),
            Phase::Progressing
        );
    }

    #[test]
    fn a_failure_to_roll_back_is_not_the_end_its_rollback_is() {
        let t0 = Instant::now();
        let mut c = CommandTrack {
            id: "c".into(),
            class: "deploy",
            generation: 2,
            applied_at: t0,
            ended: false,
            ending: false,
            rollback: true,
            rollback_due: false,
            rolled_back: None,
        };
        let o = proxy(2, Some(2), 2, 0);
        assert_eq!(
            command_progress(&c, &o, Phase::Failed),
            (CommandPhase::Failed, false)
        );
        c.rolled_back = Some(RollbackEnd::RolledBack {
            to: Some("b".into()),
        });
        assert_eq!(
            command_progress(&c, &o, Phase::Failed),
            (CommandPhase::RolledBack, true)
        );
        c.rolled_back = Some(RollbackEnd::Failed {
            reason: "no".into(),
        });
        assert_eq!(
            command_progress(&c, &o, Phase::Progressing),
            (CommandPhase::RollbackFailed, true)
        );
        c.rolled_back = None;
        c.rollback = false;
        assert_eq!(
            command_progress(&c, &o, Phase::Failed),
            (CommandPhase::Failed, true)
        );
    }
}
