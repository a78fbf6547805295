//! The heartbeat: what this Manager reports and what the CP answers.
//!
//! [`body`] builds the request from plain values (the inventory, the
//! session's manager id, the undelivered acks); [`TopologyCache`] decides when
//! the nodes are listed again; [`CpError::retry`] what a failure means.
//! The I/O (`Agent::heartbeat`, `Agent::accepted`) reads the inventory,
//! sends, reconnects once on a 401, and takes the answer apart.

use std::time::{Duration, Instant};

use super::Agent;
use super::session::Renewal;
use super::shared::round_ms;
use super::watched::NodeTopology;
use crate::acks;
use crate::config::Config;
use crate::cp::client::HeartbeatAnswer;
use crate::cp::wire::{
    self, Ack, ClusterInfo, ClusterRef, Commands, HeartbeatManager, HeartbeatRequest,
};
use crate::cp::{CpError, Retry};
use crate::events::{Event, Reason, Regarding};
use crate::fatal::Fatal;
use crate::inventory::{self, Inventory};
use crate::kube::changes::Refresh;
use crate::resource::{self, Kind};
use crate::self_rollout::{self, SelfDeployment};
use crate::state::LedgerEntry;
use crate::words::Phase;

pub use super::shared::{INTERVAL_MAX, INTERVAL_MIN, clamp_interval};

/// Region and zone as the nodes' watch last said them (`agent/watched.rs`),
/// or why it cannot say now (the nodes not readable: a namespace-scoped
/// install).
#[derive(Debug, Default)]
pub struct TopologyCache {
    known: Option<(Option<String>, Option<String>)>,
    failed: Option<String>,
}

impl TopologyCache {
    /// The nodes' watch cannot say: `why` goes to every heartbeat's
    /// `inventoryErrors` until it can.
    pub fn failed(&mut self, why: String) {
        self.failed = Some(why);
    }

    /// The nodes' watch is current again.
    pub fn readable(&mut self) {
        self.failed = None;
    }

    /// Remembers what the watch said (`inv.topology_read`), or fills `inv`
    /// from the last it said (and with why it cannot say now, while so).
    pub fn update(&mut self, inv: &mut Inventory) {
        if inv.topology_read {
            self.known = Some((inv.region.clone(), inv.zone.clone()));
            self.failed = None;
            return;
        }
        if let Some((region, zone)) = &self.known {
            inv.region.clone_from(region);
            inv.zone.clone_from(zone);
        }
        if let Some(why) = &self.failed {
            inv.errors.push(why.clone());
        }
    }
}

/// What the heartbeats remember from one to the next.
#[derive(Debug, Default)]
pub(super) struct Beats {
    /// The last sequence number sent.
    sequence: u64,
    topology: TopologyCache,
    /// The rollout of the Manager's own Deployment.
    pub(super) self_rollout: self_rollout::Watch,
    /// The release-contract inventory, read every few minutes.
    release: crate::release::Cache,
    /// The inventory's epoch and deltas (`inventory.delta.v1`).
    pub(super) epoch: super::inventory_form::Epoch,
    /// The index's generation the phase metric was counted at.
    phases_counted: Option<u64>,
    /// The watches of what would otherwise be read at rest (made at the
    /// first heartbeat).
    watched: Option<super::watched::Watched>,
}

/// The acks of the entries not delivered yet, for `pendingAcks`.
pub fn pending_acks<'a>(
    undelivered: impl Iterator<Item = &'a LedgerEntry>,
    manager_id: &str,
) -> Vec<Ack> {
    undelivered
        .map(|e| acks::ack(e, manager_id, e.attempts.max(1)))
        .collect()
}

/// The heartbeat request from the inventory and this Manager's facts.
pub fn body(
    inv: Inventory,
    cfg: &Config,
    cluster: &ClusterRef,
    (manager_id, sequence): (&str, u64),
    pending_acks: Vec<Ack>,
) -> HeartbeatRequest {
    HeartbeatRequest {
        manager_id: manager_id.to_owned(),
        sequence,
        sent_at: super::shared::now_rfc3339(),
        manager: HeartbeatManager {
            version: crate::VERSION.into(),
            build: crate::BUILD.into(),
            protocol_version: wire::PROTOCOL_VERSION,
            capabilities: super::advertised(cfg)
                .iter()
                .map(|c| c.to_string())
                .collect(),
        },
        proxy_image: cfg.proxy_image.to_string(),
        managed_proxy_count: inv.deployments.len(),
        deployments: inv.deployments,
        cluster: ClusterInfo {
            uid: cluster.uid.clone(),
            name: cfg.cluster_name.clone(),
            region: cfg.cluster_region.clone().or(inv.region),
            zone: cfg.cluster_zone.clone().or(inv.zone),
            kubernetes_version: cluster.kubernetes_version.clone(),
        },
        pending_acks,
        inventory_errors: inv.errors,
        release_contract: None,
        trust: None,
        wait_seconds: None,
        drift: Vec::new(),
        self_upgrade: None,
        inventory: None,
    }
}

/// The shortest a held answer with no command must have taken for the
/// next heartbeat to go at once: a CP that says `held` without holding
/// gets at most one heartbeat a second, not a busy loop.
pub const HOLD_FLOOR: Duration = Duration::from_secs(1);

/// The wait after a heartbeat and its commands (docs/protocol.md, "Held
/// heartbeat"): none after a held answer (the hold was the wait), the
/// interval after any other. A held cycle (the heartbeat and its
/// commands) that took less than [`HOLD_FLOOR`] waits out the floor,
/// whatever the answer carried: a CP that answers at once, commands or
/// not, gets at most one heartbeat a second.
pub fn wait_after(held: bool, took: Duration, interval: Duration) -> Duration {
    match held {
        false => interval,
        true => HOLD_FLOOR.saturating_sub(took).min(interval),
    }
}

/// A heartbeat's answer, with what it carried.
pub(super) struct Answer {
    bytes: HeartbeatAnswer,
    sequence: u64,
    managed: usize,
    /// The ids of the pending acks it carried.
    carried: Vec<String>,
}

/// How sending a heartbeat ended.
pub(super) enum Sent {
    /// The CP answered 200 (the body is not decoded yet).
    Answered(Answer),
    /// It failed: wait this long.
    RetryIn(Duration),
}

impl Agent {
    /// Reads the inventory, builds the body and sends it; reconnects and
    /// sends it again once when the session expired (401).
    pub(super) fn heartbeat(&mut self) -> Result<Sent, Fatal> {
        let mut body = self.heartbeat_body();
        // The lease was checked before the inventory was read; a process
        // stopped in between (SIGSTOP, a frozen node) may have lost it
        // since. Past the renew deadline nothing is sent: the lease is
        // read again first.
        if !self.elector().leading() {
            crate::warn!(
                sequence = body.sequence;
                "the lease is past its renew deadline; heartbeat not sent, reading the lease again"
            );
            return Ok(Sent::RetryIn(Duration::ZERO));
        }
        let mut renewed = false;
        self.link.status().heartbeat_out = true;
        let result = loop {
            let result = match &self.session {
                Some(session) => {
                    session.manager_id.clone_into(&mut body.manager_id);
                    self.link.cp.heartbeat(&session.token, &body)
                }
                None => Err(CpError::BadRequest),
            };
            let sequence = body.sequence;
            match self.renew_if_expired(
                &result,
                &mut renewed,
                format_args!("heartbeat {sequence}"),
            )? {
                Renewal::NotExpired => break result,
                Renewal::Renewed => {}
                Renewal::NotConnected(delay) => return Ok(Sent::RetryIn(delay)),
            }
        };
        self.link.status().heartbeat_out = false;
        Ok(match result {
            // A stop ended the request (a held one, say): its commands,
            // never acknowledged, are sent again to the next Manager.
            Err(_) if self.link.waiter.stop_requested() => {
                crate::info!(sequence = body.sequence; "heartbeat abandoned: stop requested");
                Sent::RetryIn(Duration::ZERO)
            }
            Ok(bytes) => Sent::Answered(Answer {
                bytes,
                sequence: body.sequence,
                managed: body.managed_proxy_count,
                carried: body
                    .pending_acks
                    .into_iter()
                    .map(|a| a.command_id)
                    .collect(),
            }),
            Err(e) => Sent::RetryIn(self.heartbeat_failed(&e)),
        })
    }

    /// Takes an answer apart: the carried acks are delivered, the interval
    /// override taken, and the commands returned with whether the CP held
    /// the request. A 200 whose body does not decode is a failed
    /// heartbeat: `Err` is the wait.
    pub(super) fn accepted<'a>(
        &mut self,
        answer: &'a Answer,
    ) -> Result<(Commands<'a>, bool), Duration> {
        let resp = answer
            .bytes
            .parse()
            .map_err(|e| self.heartbeat_failed(&e))?;
        self.pace.backoff.reset();
        {
            let mut status = self.link.status();
            status.heartbeat(true, Instant::now());
            status.managed_proxies = answer.managed;
        }
        let sequence = answer.sequence;
        crate::debug!(sequence; "heartbeat accepted");
        if !answer.carried.is_empty() {
            crate::info!(
                acks = answer.carried.len();
                "pending acks delivered with the heartbeat"
            );
            self.store.mark_delivered(&answer.carried);
        }
        if let Some(secs) = resp.heartbeat_interval_seconds {
            self.set_interval(secs);
        }
        // The ends of commands it showed are not shown again.
        self.link.index.borrow_mut().heartbeat_accepted();
        self.drift.report.delivered();
        self.inventory_answered(resp.inventory);
        let held = resp.held;
        let commands = resp.commands.unwrap_or_default();
        if commands.skipped > 0 {
            crate::warn!(
                sequence,
                commands = commands.taken.len() + commands.skipped,
                taken = wire::MAX_COMMANDS,
                skipped = commands.skipped;
                "too many commands in a heartbeat answer; the rest, unacknowledged, are sent again"
            );
            crate::metrics::skipped_commands(commands.skipped);
        }
        Ok((commands, held))
    }

    /// Deployments whose phase turned `failed` or `degraded`: a legacy
    /// Deployment's message completed with what the kubelet says of its
    /// pods (in the index, from the next report on), logged, and an Event
    /// about each (`ProgressFailed`, `Degraded`). Whether any was so
    /// explained.
    fn phases_turned(&mut self, turned: Vec<crate::inventory::Turn>) -> bool {
        let mut explained = false;
        for mut t in turned {
            if t.kind == Kind::Deployment {
                match inventory::pod_reason(&self.link.kube, &t.namespace, &t.name) {
                    Ok(Some(why)) => {
                        self.link.index.borrow_mut().explain(
                            t.kind,
                            &t.namespace,
                            &t.name,
                            why.clone(),
                        );
                        t.turned.message =
                            crate::text::clip_bytes(&format!("{}; {why}", t.turned.message), 256)
                                .to_owned();
                        explained = true;
                    }
                    Ok(None) => {}
                    Err(e) => crate::warn!(
                        namespace = t.namespace.as_ref(), deployment = t.name.as_ref(), err:% = e;
                        "cannot read the pods of a Deployment"
                    ),
                }
            }
            crate::warn!(
                kind:% = t.kind,
                namespace = t.namespace.as_ref(),
                deployment = t.name.as_ref(),
                phase:% = t.turned.phase,
                message = t.turned.message.as_str();
                "a deployment turned failed or degraded"
            );
            let Some(uid) = t.uid else { continue };
            let reason = match t.turned.phase {
                Phase::Failed => Reason::ProgressFailed,
                _ => Reason::Degraded,
            };
            self.event(Event {
                regarding: Regarding {
                    kind: t.kind,
                    namespace: t.namespace.to_string(),
                    name: t.name.to_string(),
                    uid: uid.into(),
                },
                reason,
                action: "ObserveStatus",
                note: format!("{}: {}", t.turned.phase, t.turned.message),
            });
        }
        explained
    }

    /// A failed heartbeat: counted, logged; the wait before the next one.
    fn heartbeat_failed(&mut self, e: &CpError) -> Duration {
        self.link.status().heartbeat(false, Instant::now());
        if e.malformed() {
            crate::error!(err:% = e; "heartbeat refused as malformed; not resending it")
        } else {
            crate::warn!(err:% = e; "heartbeat failed")
        }
        match e.retry(&mut self.pace.backoff) {
            Retry::After(d) => {
                let next = humantime::format_duration(round_ms(d));
                crate::info!(retryIn:% = next; "next heartbeat after a backoff");
                d
            }
            Retry::NextInterval => self.pace.interval,
        }
    }

    fn heartbeat_body(&mut self) -> HeartbeatRequest {
        // The trust report says what holds now: keys rotated or removed
        // between batches are seen, and the ratchet recorded.
        self.refresh_trust();
        let cfg = &self.me.cfg;
        let configured = cfg.cluster_region.is_some() && cfg.cluster_zone.is_some();
        let now = Instant::now();
        let kube = &self.link.kube;
        let bundle = self.me.cfg.bundle_version.as_deref();
        // What would be read at rest is watched: its watches first.
        let (ns, own) = (&self.me.instance.namespace, &cfg.self_deployment);
        let watched = self
            .beats
            .watched
            .get_or_insert_with(|| super::watched::Watched::new(ns, own, configured));
        watched.sync(kube, now);
        let refresh = watched.release_contract();
        let release = self
            .beats
            .release
            .get(now, refresh, || crate::release::read(kube, bundle));
        // The deployments from the index the watches keep (read now,
        // without waiting, and watches opened again where due); the nodes'
        // region and zone from their watch (listed every few minutes
        // while they cannot be watched).
        let mut inv = Inventory::default();
        let mut turned = Vec::new();
        let wall = super::shared::now_rfc3339();
        {
            let mut index = self.link.index.borrow_mut();
            index.sync(kube, now);
            (inv.deployments, inv.errors) =
                index.report(now, &wall, cfg.progress_deadline, &mut turned);
        }
        // Counted again only when an entry may have changed.
        let generation = self.link.index.borrow().generation();
        if self.beats.phases_counted != Some(generation) {
            crate::metrics::deployments_by_phase(&by_phase(&inv.deployments));
            self.beats.phases_counted = Some(generation);
        }
        match self.beats.watched.as_mut().map(|w| w.topology()) {
            Some(NodeTopology::Changed { region, zone }) => {
                inv.topology_read = true;
                (inv.region, inv.zone) = (region, zone);
            }
            Some(NodeTopology::Unreadable(why)) => self.beats.topology.failed(why),
            Some(NodeTopology::Unchanged) => self.beats.topology.readable(),
            Some(NodeTopology::Configured) | None => {}
        }
        self.beats.topology.update(&mut inv);
        let deadline = cfg.progress_deadline;
        if self.phases_turned(turned) {
            // Reported again with the kubelet's words (only the explained
            // entries are judged again; no phase turns twice).
            let mut index = self.link.index.borrow_mut();
            (inv.deployments, _) = index.report(now, &wall, deadline, &mut Vec::new());
        }
        if let Some(report) = self.check_self_rollout() {
            inv.errors.push(report);
        }
        if let Some(report) = self.store.error() {
            inv.errors.push(report.to_owned());
        }
        inv.errors.extend(self.drift.errors());
        self.beats.sequence += 1;
        let acks = pending_acks(self.store.undelivered(), self.manager_id());
        let mut body = body(
            inv,
            &self.me.cfg,
            &self.me.cluster,
            (self.manager_id(), self.beats.sequence),
            acks,
        );
        body.release_contract = Some(release.contract);
        body.self_upgrade = self.store.self_upgrade().map(|s| s.report());
        self.inventory_form(&mut body);
        // `heartbeat.wait.v1`: the CP may hold it for an interval.
        body.wait_seconds = Some(self.pace.interval.as_secs());
        body.drift = self.drift.entries();
        body.trust = Some(wire::TrustReport {
            signatures: if self.signatures_required() {
                "required"
            } else {
                "off"
            },
            key_ids: match self.trusted.keys.keys() {
                Ok(Some(k)) => k.ids().into_iter().map(str::to_owned).collect(),
                _ => Vec::new(),
            },
        });
        body
    }

    /// Reads the Manager's own Deployment when due; a stalled upgrade's
    /// report, or why the Deployment could not be read.
    fn check_self_rollout(&mut self) -> Option<String> {
        let now = Instant::now();
        let refresh = match self.beats.watched.as_mut() {
            Some(w) => w.own_deployment(),
            None => Refresh::Periodic,
        };
        let watch = &mut self.beats.self_rollout;
        if !watch.due(now, refresh) {
            return None;
        }
        let (ns, name) = (&self.me.instance.namespace, &self.me.cfg.self_deployment);
        let path = resource::DEPLOYMENTS.object(Some(ns), name);
        match self.link.kube.get_opt::<SelfDeployment>(&path) {
            Ok(Some(d)) => watch.observe(&d, &format!("{ns}/{name}"), now, self.pace.interval),
            Ok(None) => {
                // Not run from a Deployment (development, tests).
                watch.unreadable(now);
                None
            }
            Err(e) if e.is_forbidden() => {
                // RBAC without the shipped `get` on it: the watch is left
                // out, as region and zone are when nodes may not be listed.
                crate::debug!(
                    namespace = ns, name, err:% = e;
                    "the own Deployment may not be read"
                );
                watch.unreadable(now);
                None
            }
            Err(e) => {
                watch.unreadable(now);
                Some(format!("own deployment {ns}/{name}: {e}"))
            }
        }
    }
}

/// How many deployments are in each phase (every phase, zeros too).
fn by_phase(deployments: &wire::Entries) -> [(&'static str, u64); 4] {
    let mut counts = Phase::ALL.map(|p| (p.as_str(), 0));
    for phase in deployments.phases().flatten() {
        if let Some(c) = counts.iter_mut().find(|(p, _)| *p == phase.as_str()) {
            c.1 += 1;
        }
    }
    counts
}

#[cfg(test)]
#[path = "heartbeat_tests.rs"]
mod tests;
