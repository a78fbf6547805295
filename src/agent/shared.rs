//! What every part of the agent borrows: the process's connections
//! ([`Link`]), who this Manager is ([`Identity`]), the pace of the loop
//! ([`Pace`]), the Events queue, and two formatting helpers. Nothing here
//! calls a part: the parts and the loop call it.

use std::cell::{RefCell, RefMut};
use std::rc::Rc;
use std::time::Duration;

use super::Agent;
use crate::backoff::Backoff;
use crate::config::Config;
use crate::cp::CpClient;
use crate::cp::wire::{ClusterRef, InstanceInfo};
use crate::kube::Client;
use crate::probe::Health;
use crate::token::ConnectToken;
use crate::wait::Waiter;

/// Bounds of the CP's interval override.
pub const INTERVAL_MIN: Duration = Duration::from_secs(5);
/// Bounds of the CP's interval override.
pub const INTERVAL_MAX: Duration = Duration::from_secs(600);

/// Clamps the CP's interval override to [`INTERVAL_MIN`]..=[`INTERVAL_MAX`].
pub fn clamp_interval(seconds: u64) -> Duration {
    Duration::from_secs(seconds).clamp(INTERVAL_MIN, INTERVAL_MAX)
}

/// The process's connections, and what its probes answer from.
pub(super) struct Link {
    /// Shared with the loop's duty ([`super::lead::Background`]).
    pub(super) kube: Rc<Client>,
    /// What commands write with: the same connections, each write sent as
    /// the executor of its namespace (`NEXO_EXECUTOR`), or as the Manager
    /// when that is `off`.
    pub(super) writer: Rc<Client>,
    /// The inventory the watches keep; shared with the loop's duty, which
    /// reads the watches as their events arrive.
    pub(super) index: Rc<RefCell<crate::inventory::Index>>,
    pub(super) cp: CpClient,
    /// Every wait of the process; also the Kubernetes client's retry pause.
    pub(super) waiter: Rc<Waiter>,
    /// Shared with the waiter, which answers the probes.
    pub(super) status: Rc<RefCell<Health>>,
}

impl Link {
    /// The status the probes answer from, for an update.
    pub(super) fn status(&self) -> RefMut<'_, Health> {
        self.status.borrow_mut()
    }
}

/// Who this Manager is: fixed at start-up but for the connect token, which
/// is re-read from its file after a 401.
pub(super) struct Identity {
    pub(super) cfg: Config,
    /// What this Manager advertises and accepts ([`super::advertised`]).
    pub(super) capabilities: Vec<&'static str>,
    pub(super) token: ConnectToken,
    pub(super) instance: InstanceInfo,
    pub(super) cluster: ClusterRef,
    pub(super) namespaces: Vec<String>,
    /// The Manager's own objects: never a command's target.
    pub(super) own: crate::ownership::OwnObjects,
    /// The uid of the Manager's own Deployment, read at start (none when
    /// it does not run from one): what its own Events are about.
    pub(super) own_deployment_uid: Option<String>,
}

/// How long to wait: the heartbeat interval (the CP may change it) and the
/// backoff of failed calls.
pub(super) struct Pace {
    pub(super) interval: Duration,
    pub(super) backoff: Backoff,
}

impl Pace {
    /// Takes the CP's interval override, clamped.
    pub(super) fn set_interval(&mut self, secs: u64) -> Option<Duration> {
        let interval = clamp_interval(secs);
        (interval != self.interval).then(|| {
            self.interval = interval;
            interval
        })
    }
}

impl Agent {
    /// Takes the CP's interval override.
    pub(super) fn set_interval(&mut self, secs: u64) {
        if let Some(interval) = self.pace.set_interval(secs) {
            crate::info!(
                interval:% = humantime::format_duration(interval);
                "heartbeat interval set by the Control Plane"
            );
            self.link.status().interval = interval;
        }
    }
}

impl Agent {
    /// Queues a Kubernetes Event; one dropped (the queue full) is counted.
    pub(super) fn event(&mut self, event: crate::events::Event) {
        let now = std::time::Instant::now();
        let r = &event.regarding;
        crate::debug!(
            reason = event.reason.as_str(), action:% = event.action, kind:% = r.kind,
            namespace:% = r.namespace, name:% = r.name;
            "event queued"
        );
        if let Err(dropped) = self.events.record(event, now, std::time::SystemTime::now()) {
            crate::metrics::event_dropped(dropped.as_str());
        }
    }
}

/// A duration rounded to milliseconds, for log lines.
pub(super) fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

/// Now, RFC 3339 to the second.
pub(super) fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}
