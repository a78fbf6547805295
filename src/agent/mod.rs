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
mod drift;
mod enforce;
pub mod heartbeat;
mod lead;
mod record;
pub mod session;
mod startup;
mod state_store;

use std::cell::{RefCell, RefMut};
use std::rc::Rc;
use std::time::Duration;

use crate::backoff::Backoff;
use crate::config::Config;
use crate::cp::CpClient;
use crate::cp::wire::{ClusterRef, InstanceInfo};
use crate::kube::Client;
use crate::kube::pause::Wake;
use crate::lease::Elector;
use crate::probe::Health;
use crate::token::ConnectToken;
use crate::wait::Waiter;

pub use crate::fatal::Fatal;
use heartbeat::Beats;
use session::Session;
pub use state_store::StateStore;

/// The capabilities this build implements and has tested; what a Manager
/// advertises is [`advertised`] of them.
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
    "heartbeat.wait.v1",
    "status.v1",
    "drift.v1",
];

/// The capabilities advertised under `cfg`: [`CAPABILITIES`] but for
/// `command.upgrade` when self-upgrade is turned off
/// (`NEXO_ALLOW_SELF_UPGRADE=false`), so an upgrade is then refused as
/// `unsupported capability: command.upgrade`.
pub fn advertised(cfg: &Config) -> Vec<&'static str> {
    CAPABILITIES
        .iter()
        .copied()
        .filter(|c| cfg.allow_self_upgrade || *c != "command.upgrade")
        .collect()
}

/// The process's connections, and what its probes answer from.
struct Link {
    /// Shared with the loop's duty ([`lead::Background`]).
    kube: Rc<Client>,
    /// What commands write with: the same connections, each write sent as
    /// the executor of its namespace (`NEXO_EXECUTOR`), or as the Manager
    /// when that is `off`.
    writer: Rc<Client>,
    /// The inventory the watches keep; shared with the loop's duty, which
    /// reads the watches as their events arrive.
    index: Rc<RefCell<crate::inventory::Index>>,
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
    /// What this Manager advertises and accepts ([`advertised`]).
    capabilities: Vec<&'static str>,
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
    /// Shared with the loop's duty, which renews the lease in its waits.
    elector: Rc<RefCell<Elector>>,
    /// The lease term the state was last read in (0: not read as leader,
    /// or to be read again, after the fence stopped a command): a new term
    /// (leadership begun anew, between heartbeats or mid-batch) reads it
    /// again first.
    state_term: u64,
    beats: Beats,
    /// The Kubernetes Events waiting to be written.
    events: crate::events::Recorder,
    /// When drift is checked next, and what the heartbeat reports of it.
    drift: drift::Drift,
    /// The key of the proofs of records and objects, once the state was
    /// read as leader: without it nothing is written, and nothing
    /// labelled is trusted (SECURITY.md, "Integrity the namespace cannot
    /// forge").
    integrity: Option<crate::integrity::Key>,
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
            match self.link.waiter.idle(delay) {
                Ok(Wake::Stop) => return self.stopped(),
                Ok(Wake::Timeout) => {}
                Err(e) => return Err(Fatal::Wait(e)),
            }
        }
    }

    fn stopped(&mut self) -> Result<(), Fatal> {
        log::info!("stop requested; exiting");
        // What follows is not cut short by the stop it answers.
        crate::net::finish();
        if self.elector().leading() && self.state_current() {
            // The delivery flags that wait, in one write.
            self.store.flush_delivered(&self.link, true);
        }
        self.elector_mut().release(&self.link.kube);
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
        let started = std::time::Instant::now();
        let answer = match self.heartbeat()? {
            heartbeat::Sent::Answered(answer) => answer,
            heartbeat::Sent::RetryIn(delay) => return Ok(Next::Wait(delay)),
        };
        let (commands, held) = match self.accepted(&answer) {
            Ok(accepted) => accepted,
            Err(delay) => return Ok(Next::Wait(delay)),
        };
        let next = self.batch(commands);
        if next == Next::Stop {
            // The way out (`stopped`) writes what waits.
            return Ok(Next::Stop);
        }
        self.store.flush_delivered(&self.link, false);
        if self.elector().leading() {
            self.check_drift_if_due();
            // After the acks: Events never hold up a command.
            crate::events::flush(&mut self.events, &self.link.kube, crate::events::BUDGET);
        }
        self.link.status().pending_acks = self.store.undelivered().count();
        Ok(match next {
            // The heartbeat and its commands: the floor counts both.
            Next::Wait(interval) => {
                Next::Wait(heartbeat::wait_after(held, started.elapsed(), interval))
            }
            Next::Stop => Next::Stop,
        })
    }
}

impl Agent {
    /// Queues a Kubernetes Event; one dropped (the queue full) is counted.
    fn event(&mut self, event: crate::events::Event) {
        let now = std::time::Instant::now();
        let r = &event.regarding;
        log::debug!(
            "event {} ({}) about {} {}/{} queued",
            event.reason.as_str(),
            event.action,
            r.kind,
            r.namespace,
            r.name
        );
        if let Err(dropped) = self.events.record(event, now, std::time::SystemTime::now()) {
            crate::metrics::event_dropped(dropped.as_str());
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
