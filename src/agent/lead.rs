//! May this pod act? The Lease, read and renewed at the start of a cycle
//! when needed (`Agent::lead`), and on its own schedule in the loop's
//! waits ([`LeaseKeeper`], the loop's duty).

use std::cell::{Ref, RefCell, RefMut};
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::{Agent, Lead};
use crate::backoff::retry_after_wait;
use crate::kube::Client;
use crate::lease::{self, Elector};
use crate::probe::Role;

/// How long a failed scheduled renewal waits before the next attempt.
const RENEW_RETRY: Duration = Duration::from_secs(2);

/// The lease renewed on its schedule (`lease.rs`: once half of it has
/// passed), in whatever wait the loop is in: between heartbeats, or while
/// a held heartbeat waits for its answer (part of the loop's duty,
/// [`Background`]).
pub(super) struct LeaseKeeper {
    pub(super) elector: Rc<RefCell<Elector>>,
    pub(super) kube: Rc<Client>,
    /// After a failed attempt, not before this.
    retry_at: std::cell::Cell<Option<Instant>>,
}

impl LeaseKeeper {
    pub(super) fn new(elector: Rc<RefCell<Elector>>, kube: Rc<Client>) -> LeaseKeeper {
        LeaseKeeper {
            elector,
            kube,
            retry_at: std::cell::Cell::new(None),
        }
    }
}

impl LeaseKeeper {
    /// When the next renewal is due.
    pub(super) fn due(&self, now: Instant) -> Option<Instant> {
        // Borrowed elsewhere: the loop is using it, and renews itself.
        let next = self.elector.try_borrow().ok()?.next_renewal(now)?;
        Some(self.retry_at.get().map_or(next, |r| r.max(next)))
    }

    /// Renews the lease if it is due.
    pub(super) fn run(&self, now: Instant) {
        if self.due(now).is_none_or(|at| at > now) {
            return;
        }
        let Ok(mut elector) = self.elector.try_borrow_mut() else {
            return;
        };
        match elector.renew_scheduled(&self.kube) {
            Ok(true) => {
                self.retry_at.set(None);
                crate::debug!("lease renewed on schedule");
            }
            Ok(false) => crate::warn!(
                "the lease was not renewed (past its renew deadline, or written by another); reading it next cycle"
            ),
            Err(e) => {
                crate::warn!(err:% = e, retryIn:? = RENEW_RETRY; "cannot renew the lease");
                self.retry_at.set(Some(Instant::now() + RENEW_RETRY));
            }
        }
    }
}

/// Who leads, as this process knows it: the lease (through the elector),
/// the term the state was last read in, and the key of the proofs read
/// with it.
pub(super) struct Leadership {
    /// Shared with the loop's duty, which renews the lease in its waits.
    elector: Rc<RefCell<Elector>>,
    /// The lease term the state was last read in (0: not read as leader,
    /// or to be read again, after the fence stopped a command): a new term
    /// (leadership begun anew, between heartbeats or mid-batch) reads it
    /// again first.
    state_term: u64,
    /// The key of the proofs of records and objects, once the state was
    /// read as leader: without it nothing is written, and nothing
    /// labelled is trusted (SECURITY.md, "Integrity the namespace cannot
    /// forge").
    integrity: Option<crate::integrity::Key>,
}

impl Leadership {
    pub(super) fn new(elector: Rc<RefCell<Elector>>) -> Leadership {
        Leadership {
            elector,
            state_term: 0,
            integrity: None,
        }
    }

    /// The key of the proofs, once the state was read as leader.
    pub(super) fn integrity(&self) -> Option<&crate::integrity::Key> {
        self.integrity.as_ref()
    }

    /// The state is read again before the next command (after the fence
    /// stopped one: another leader may have run it meanwhile).
    pub(super) fn read_state_before_acting(&mut self) {
        self.state_term = 0;
    }
}

impl Agent {
    /// The elector, to read (never held across a wait: the loop's duty
    /// renews through it).
    pub(super) fn elector(&self) -> Ref<'_, Elector> {
        self.leader.elector.borrow()
    }

    /// The elector, for one call that writes the lease.
    pub(super) fn elector_mut(&self) -> RefMut<'_, Elector> {
        self.leader.elector.borrow_mut()
    }

    /// Only the lease holder talks to the CP and touches the cluster. A pod
    /// that just took the lease reads the state again before acting:
    /// another pod may have finished commands since this one read it, and
    /// a finished command must not run twice.
    pub(super) fn lead(&mut self) -> Lead {
        // A leader renews on the lease's own schedule (the loop's duty,
        // [`LeaseKeeper`]), not once a heartbeat: a held heartbeat that
        // comes back with a command starts a cycle at once.
        let renewed = if self.elector().leading() && !self.elector().renewal_due() {
            Ok(true)
        } else {
            let duration = self.lease_duration();
            self.elector_mut().try_lead(&self.link.kube, duration)
        };
        match renewed {
            Ok(true) if self.state_current() => Lead::Acting,
            Ok(true) => match self.read_state_again() {
                Ok(()) => Lead::Acting,
                Err(e) => {
                    crate::warn!(
                        err:% = e;
                        "cannot read the state secret after taking the lease; not acting"
                    );
                    Lead::Standby(self.pace.backoff.next_delay().min(self.pace.interval))
                }
            },
            Ok(false) => {
                self.standby_check(true);
                Lead::Standby(self.pace.interval)
            }
            Err(e) => {
                let delay =
                    retry_after_wait(e.retry_after(), &mut self.pace.backoff, self.pace.interval);
                crate::warn!(err:% = e; "cannot read or renew the lease; not acting");
                self.standby_check(false);
                Lead::Standby(delay)
            }
        }
    }

    /// The lease duration for the interval in force (never shortened below
    /// 30 s by the CP's interval).
    pub(super) fn lease_duration(&self) -> Duration {
        lease::duration_for(self.pace.interval, self.me.cfg.heartbeat_interval)
    }

    /// Whether the state was read in the current lease term.
    pub(super) fn state_current(&self) -> bool {
        self.leader.state_term == self.elector().term()
            && self.link.status.borrow().role == Role::Leader
    }

    /// Reads the state again in a new lease term: another leader may have
    /// finished commands since this process read it, and a finished
    /// command must not run twice.
    pub(super) fn read_state_again(&mut self) -> Result<(), crate::state::StateError> {
        let entries = self.store.reload(&self.link.kube)?;
        let term = self.elector().term();
        self.leader.state_term = term;
        crate::info!(
            term = self.leader.state_term, ledgerEntries = entries;
            "leading: state read again"
        );
        self.ratchet_signatures();
        self.drift.new_term();
        match self.store.integrity_key(&self.link.kube) {
            Ok(key) => {
                self.link.index.borrow_mut().trust(&key);
                self.leader.integrity = Some(key);
            }
            Err(e) => crate::warn!(
                err:% = e;
                "no integrity key: no deploy, rollout or uninstall runs, and no record or object is trusted"
            ),
        }
        self.link.status().role = Role::Leader;
        let from = match self.elector().taken_from() {
            Some(holder) => format!("took the lease over from {holder}"),
            None => "the lease was free or this pod's".to_owned(),
        };
        let note = format!(
            "pod {} leads (term {}): {from}",
            self.me.instance.pod_name, self.leader.state_term
        );
        self.own_event(crate::events::Reason::LeaderElected, "Lead", note);
        Ok(())
    }

    /// Renews the lease when `now`, or when a third of it has passed (a
    /// long batch, an ack retried with backoff); whether this process may
    /// act now. When leadership began anew (the lease lost while this
    /// process was stopped, say), the state is read again first.
    pub(super) fn keep_lease(&mut self, now: bool) -> bool {
        if now || self.elector().renewal_due_for_command() {
            let duration = self.lease_duration();
            let renewed = self.elector_mut().try_lead(&self.link.kube, duration);
            match renewed {
                Ok(true) if self.state_current() => {}
                Ok(true) => {
                    if let Err(e) = self.read_state_again() {
                        crate::warn!(err:% = e; "leading again but cannot read the state");
                        return false;
                    }
                }
                Ok(false) => {
                    crate::warn!("lost the lease");
                    return false;
                }
                Err(e) => crate::warn!(err:% = e; "cannot renew the lease"),
            }
        }
        self.elector().leading()
    }

    /// A standby's readiness check: the lease was just read with this
    /// pod's credentials; a TLS handshake with the Control Plane (no
    /// connect, no token) shows it could reach it.
    pub(super) fn standby_check(&mut self, lease_read: bool) {
        self.link.status().role = Role::Standby;
        self.link.status().bound = false;
        if !lease_read {
            return;
        }
        match self.link.cp.handshake() {
            Ok(()) => self.link.status().standby_ok_at = Some(std::time::Instant::now()),
            Err(e) => crate::warn!(err:% = e; "standby check failed"),
        }
    }
}

/// The loop's duty (`wait.rs`): the lease renewed on its schedule, and the
/// inventory's watches read as their events arrive and opened again when
/// due.
pub(super) struct Background {
    pub(super) lease: LeaseKeeper,
    pub(super) index: Rc<RefCell<crate::inventory::Index>>,
}

impl crate::wait::Duty for Background {
    fn due(&self, now: Instant) -> Option<Instant> {
        let index = self.index.try_borrow().ok().and_then(|i| i.due(now));
        match (self.lease.due(now), index) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn fds(&self, out: &mut Vec<std::os::fd::RawFd>) {
        if let Ok(index) = self.index.try_borrow() {
            index.fds(out);
        }
    }

    fn run(&self) {
        let now = Instant::now();
        self.lease.run(now);
        // Borrowed elsewhere: the heartbeat is reading it, and syncs it.
        if let Ok(mut index) = self.index.try_borrow_mut()
            && index.started()
        {
            index.sync(&self.lease.kube, now);
        }
    }
}
