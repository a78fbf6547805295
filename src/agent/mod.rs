//! The loop (this file: `run`, `cycle`, `stopped`), a short coordinator
//! of parts that each answer one question and keep their own state:
//!
//! - `startup`: who am I, which cluster is this, what did I record?
//!   (identity, state, the binding check), before the loop starts;
//! - `lead`: who leads? (the Lease, the term the state was read in, the
//!   integrity key: `Leadership`; the loop's duty that renews the lease);
//! - `trusted`: what is trusted? (the command keys, signatures required now,
//!   the ratchet);
//! - [`session`]: am I connected? (connect, 401/403, connect-token re-read:
//!   [`session::decide`] is a pure state machine);
//! - [`heartbeat`]: what do I report? (a pure body from gathered inputs,
//!   the topology cache) and what did the CP answer?
//! - `batch` and `run`: how a command runs (its checks, the executor's
//!   context) and the commands of one answer, each executed once,
//!   recorded, then acknowledged;
//! - `drift`, `record`, `enforce`: what drifted, the records it is
//!   judged from, and its enforcement;
//! - [`StateStore`]: the state Secret (record, mark delivered, reload);
//!   `shared`: what every part borrows (connections, identity, pace, the
//!   Events queue).
//!
//! No part calls back into the loop, and the calls between parts have no
//! cycle (`tests/layers.rs` checks both, with the imports). One thread;
//! every call has a timeout (a watch: its head's, and the server's end of
//! it), and every wait is the loop's; a failed heartbeat or command never
//! ends the loop.

mod batch;
mod drift;
mod drift_lists;
mod enforce;
pub mod heartbeat;
mod inventory_form;
mod lead;
mod own_events;
mod record;
mod rollback;
mod run;
mod self_upgrade;
pub mod session;
mod shared;
mod startup;
mod state_store;
mod trusted;
mod watched;

use std::time::Duration;

use crate::config::Config;
use crate::kube::pause::Wake;

pub use crate::fatal::Fatal;
use heartbeat::Beats;
use session::Session;
use shared::{Identity, Link, Pace};
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
    "command.plan.v1",
    "rollback.v1",
    "inventory.delta.v1",
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
    /// Who leads: the lease, the term the state was read in, the
    /// integrity key.
    leader: lead::Leadership,
    /// What is trusted: the command keys.
    trusted: trusted::Trusted,
    beats: Beats,
    /// The Kubernetes Events waiting to be written.
    events: crate::events::Recorder,
    /// When drift is checked next, and what the heartbeat reports of it.
    drift: drift::Drift,
}

impl Agent {
    /// Validates everything that can be checked without the network, then
    /// reads the cluster identity and the persisted state (`startup`).
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
        crate::info!("stop requested; exiting");
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
            self.roll_back_failures();
            self.follow_self_upgrade();
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
