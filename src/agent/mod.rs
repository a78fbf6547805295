//! The loop, as a short coordinator of parts that each answer one question:
//!
//! - [`startup`]: who am I, which cluster is this, what did I record?
//!   (identity, state, the binding check), before the loop starts;
//! - [`lead`](Agent::lead) (here): may this pod act? (the Lease);
//! - [`session`]: am I connected? (connect, 401/403, connect-token re-read:
//!   [`session::decide`] is a pure state machine);
//! - [`heartbeat`]: what do I report? (a pure body builder, the topology
//!   cache) and what did the CP answer?
//! - [`batch`]: the commands of one answer, while the lease holds: each
//!   executed once, recorded, then acknowledged.
//!
//! The state Secret is owned by a [`StateStore`]: the parts ask it to
//! record, mark delivered or reload. One thread; every blocking call has a
//! timeout; a failed heartbeat or command never ends the loop.

mod batch;
pub mod heartbeat;
pub mod session;
mod startup;
mod state_store;

use std::cell::{RefCell, RefMut};
use std::rc::Rc;
use std::time::Duration;

use crate::backoff::{Backoff, retry_after_delay};
use crate::config::Config;
use crate::cp::CpClient;
use crate::cp::wire::{ClusterRef, InstanceInfo};
use crate::kube::Client;
use crate::kube::pause::Wake;
use crate::lease::{self, Elector};
use crate::probe::{Health, Role};
use crate::token::ConnectToken;
use crate::wait::Waiter;

pub use crate::fatal::Fatal;
use heartbeat::Beats;
use session::Session;
pub use state_store::StateStore;

/// The capabilities this build advertises: only what is implemented and tested.
pub const CAPABILITIES: &[&str] = &[
    "heartbeat.inventory.v1",
    "command.deploy.crd",
    "command.deploy.legacy",
    "command.rollout",
    "command.upgrade",
    "command.uninstall",
    "ack.retry.v1",
    "ownership.guard.v1",
    "ownership.migration-gate.v1",
    "promotion-contract.v1",
    "command.signature.ed25519.v1",
    "command.policy.v1",
    "release-contract.v1",
];

/// The process's connections, and what its probes answer from.
struct Link {
    kube: Client,
    cp: CpClient,
    /// Every wait of the process; also the Kubernetes client's retry pause.
    waiter: Rc<Waiter>,
    /// Shared with the waiter, which answers the probes.
    status: Rc<RefCell<Health>>,
}

impl Link {
    /// The status the probes answer from, for an update.
    fn status(&self) -> RefMut<'_, Health> {
        self.status.borrow_mut()
    }
}

/// Who this Manager is: fixed at start-up but for the connect token, which
/// is re-read from its file after a 401.
struct Identity {
    cfg: Config,
    /// The command keys, read again before each batch.
    keys: crate::trust::KeyFile,
    token: ConnectToken,
    instance: InstanceInfo,
    cluster: ClusterRef,
    namespaces: Vec<String>,
    /// The Manager's own objects: never a command's target.
    own: crate::ownership::OwnObjects,
}

/// How long to wait: the heartbeat interval (the CP may change it) and the
/// backoff of failed calls.
struct Pace {
    interval: Duration,
    backoff: Backoff,
}

/// What the loop does after a cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// Wait this long (answering probes), then cycle again.
    Wait(Duration),
    /// A stop was requested: release the lease and exit 0.
    Stop,
}

/// Whether this pod may act this cycle.
enum Lead {
    /// It holds the lease, and its state is current.
    Acting,
    /// It does not (or cannot tell): wait this long.
    Standby(Duration),
}

/// The running agent.
pub struct Agent {
    link: Link,
    me: Identity,
    store: StateStore,
    session: Option<Session>,
    pace: Pace,
    elector: Elector,
    /// The lease term the state was last read in: a new term (leadership
    /// begun anew, between heartbeats or mid-batch) reads it again first.
    state_term: u64,
    beats: Beats,
}

impl Agent {
    /// Validates everything that can be checked without the network, then
    /// reads the cluster identity and the persisted state
    /// ([`startup`]).
    pub fn start(cfg: Config) -> Result<Agent, Fatal> {
        startup::start(cfg)
    }

    /// Runs until SIGTERM/SIGINT (Ok) or a fatal error. Between heartbeats
    /// it waits in one `poll(2)`, answering probe requests as they come.
    pub fn run(mut self) -> Result<(), Fatal> {
        loop {
            let Next::Wait(delay) = self.cycle()? else {
                return self.stopped();
            };
            match self.link.waiter.wait(delay) {
                Ok(Wake::Stop) => return self.stopped(),
                Ok(Wake::Timeout) => {}
                Err(e) => return Err(Fatal::Wait(e)),
            }
        }
    }

    fn stopped(&mut self) -> Result<(), Fatal> {
        log::info!("stop requested; exiting");
        if self.elector.leading() && self.state_current() {
            // The delivery flags that wait, in one write.
            self.store.flush_delivered(&self.link, true);
        }
        self.elector.release(&self.link.kube);
        Ok(())
    }

    /// One cycle: lead, connect if needed, heartbeat, then the answer's
    /// commands.
    fn cycle(&mut self) -> Result<Next, Fatal> {
        if let Lead::Standby(delay) = self.lead() {
            return Ok(Next::Wait(delay));
        }
        if self.session.as_ref().is_none_or(Session::stale)
            && let session::Connected::RetryIn(delay) = self.connect()?
        {
            return Ok(Next::Wait(delay));
        }
        let answer = match self.heartbeat()? {
            heartbeat::Sent::Answered(answer) => answer,
            heartbeat::Sent::RetryIn(delay) => return Ok(Next::Wait(delay)),
        };
        let commands = match self.accepted(&answer) {
            Ok(commands) => commands,
            Err(delay) => return Ok(Next::Wait(delay)),
        };
        let next = self.batch(commands);
        self.store.flush_delivered(&self.link, false);
        self.link.status().pending_acks = self.store.undelivered().count();
        Ok(next)
    }

    /// Only the lease holder talks to the CP and touches the cluster. A pod
    /// that just took the lease reads the state again before acting:
    /// another pod may have finished commands since this one read it, and
    /// a finished command must not run twice.
    fn lead(&mut self) -> Lead {
        let renewed = self
            .elector
            .try_lead(&self.link.kube, self.lease_duration());
        match renewed {
            Ok(true) if self.state_current() => Lead::Acting,
            Ok(true) => match self.read_state_again() {
                Ok(()) => Lead::Acting,
                Err(e) => {
                    log::warn!(
                        "cannot read the state secret after taking the lease: {e}; not acting"
                    );
                    Lead::Standby(self.pace.backoff.next_delay().min(self.pace.interval))
                }
            },
            Ok(false) => {
                self.standby_check(true);
                Lead::Standby(self.pace.interval)
            }
            Err(e) => {
                let delay = retry_after_delay(e.retry_after(), &mut self.pace.backoff);
                log::warn!("cannot read or renew the lease: {e}; not acting");
                self.standby_check(false);
                Lead::Standby(delay.min(self.pace.interval))
            }
        }
    }

    /// The lease duration for the interval in force (never shortened below
    /// 30 s by the CP's interval).
    fn lease_duration(&self) -> Duration {
        lease::duration_for(self.pace.interval, self.me.cfg.heartbeat_interval)
    }

    /// Whether the state was read in the current lease term.
    fn state_current(&self) -> bool {
        self.state_term == self.elector.term() && self.link.status.borrow().role == Role::Leader
    }

    /// Reads the state again in a new lease term: another leader may have
    /// finished commands since this process read it, and a finished
    /// command must not run twice.
    fn read_state_again(&mut self) -> Result<(), crate::state::StateError> {
        let entries = self.store.reload(&self.link.kube)?;
        self.state_term = self.elector.term();
        log::info!(
            "leading (term {}): state read again ({entries} ledger entries)",
            self.state_term
        );
        self.ratchet_signatures();
        self.link.status().role = Role::Leader;
        Ok(())
    }

    /// A standby's readiness check: the lease was just read with this
    /// pod's credentials; a TLS handshake with the Control Plane (no
    /// connect, no token) shows it could reach it.
    fn standby_check(&mut self, lease_read: bool) {
        self.link.status().role = Role::Standby;
        self.link.status().bound = false;
        if !lease_read {
            return;
        }
        match self.link.cp.handshake() {
            Ok(()) => self.link.status().standby_ok_at = Some(std::time::Instant::now()),
            Err(e) => log::warn!("standby check: {e}"),
        }
    }
}

/// A duration rounded to milliseconds, for log lines.
fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

/// Now, RFC 3339 to the second.
fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}
