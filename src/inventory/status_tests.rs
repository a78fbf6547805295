//! The phase of a deployment, as plain values.
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
