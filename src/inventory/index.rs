//! The inventory's watcher: each collection the heartbeat reports (owned
//! NexoProxies, owned legacy Deployments, per managed namespace) is
//! listed once, then watched from the list's `resourceVersion`, with
//! bookmarks ([`Index::sync`], the I/O). Each collection's store and its
//! watch's state are a [`Set`] (`set.rs`: [`Set::apply`], an event on the
//! entries, pure; [`Set::due`]); what the heartbeat reports is built from
//! the stores with no request (`report.rs`).
//!
//! A watch the server ends (its `timeoutSeconds`) is opened again from the
//! last version seen; one that breaks (the API server restarted, a reset)
//! is opened again with backoff, and while it is not open the heartbeat
//! says `inventoryErrors` (the entries may be stale); a 410 Gone (the
//! version is too old to watch from) lists again.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use super::set::{Applied, Judged, Set, Watch, WatchError, Watched, judge};
use super::status::CommandTrack;
use super::stored::{Stores, keep};
use super::{DeploymentItem, Interner, PAGE, ProxyItem, Trust};
use crate::kube::Client;
use crate::kube::client::Query;
use crate::kube::watch::Flow;
use crate::ownership;

/// How long the API server keeps a watch open before ending it (it is
/// then opened again from the last version): one request per watch every
/// 30 minutes at rest, as the metadata watches (`kube::changes`); the
/// bookmarks keep the version current meanwhile.
pub const WATCH_TIMEOUT: Duration = crate::kube::changes::TIMEOUT;

/// Every watched collection of the inventory.
#[derive(Debug)]
pub struct Index {
    pub(super) trust: Trust,
    pub(super) selector: String,
    pub(super) sets: Vec<Set>,
    pub(super) shared: Interner,
    /// Whether the heartbeat asked for it yet (a standby never does).
    pub(super) started: bool,
    /// The last deploy or rollout of each deployment, while its progress
    /// is reported.
    pub(super) commands: BTreeMap<crate::cp::wire::EntryKey, CommandTrack>,
    /// Failures the reports found, for the agent to roll back.
    pub(super) rollbacks: Vec<super::status::RollbackDue>,
    /// Counts the reports whose entries may differ from the last one's
    /// (`inventory.delta.v1`).
    pub(super) generation: u64,
    /// The last report's records, sorted, shared with the heartbeats.
    pub(super) sorted: std::rc::Rc<super::owned::Sorted>,
}

impl Index {
    /// Owned NexoProxies and Deployments of `namespaces`, nothing read
    /// yet, nothing proven before [`Index::trust`].
    pub fn new(namespaces: &[String], environment_id: &str, adopt_unproven: bool) -> Index {
        let sets = namespaces
            .iter()
            .flat_map(|ns| {
                [
                    Set::new(Watched::Proxies, ns),
                    Set::new(Watched::Deployments, ns),
                ]
            })
            .collect();
        Index {
            trust: Trust {
                environment_id: environment_id.to_owned(),
                key: None,
                adopt_unproven,
            },
            selector: ownership::owned_selector(environment_id),
            sets,
            shared: Interner::default(),
            started: false,
            commands: BTreeMap::new(),
            rollbacks: Vec::new(),
            generation: 0,
            sorted: std::rc::Rc::default(),
        }
    }

    /// The key objects are proven with, once the state was read as
    /// leader: when it is new, every collection is listed again and
    /// judged with it.
    pub fn trust(&mut self, key: &crate::integrity::Key) {
        if self.trust.key.as_ref() == Some(key) {
            return;
        }
        self.trust.key = Some(key.clone());
        for set in &mut self.sets {
            set.watch = Watch::List { retry_at: None };
        }
    }

    /// Whether the heartbeat asked for it yet.
    pub fn started(&self) -> bool {
        self.started
    }

    /// The sockets of the open watches, for the loop's `poll(2)`.
    pub fn fds(&self, out: &mut Vec<RawFd>) {
        out.extend(self.sets.iter().filter_map(|s| match &s.watch {
            Watch::Open { stream, .. } => Some(stream.fd()),
            _ => None,
        }));
    }

    /// When a watch is next to be opened (again); never before the first
    /// heartbeat asked for the inventory.
    pub fn due(&self, now: Instant) -> Option<Instant> {
        if !self.started {
            return None;
        }
        self.sets.iter().filter_map(|s| s.due(now)).min()
    }

    /// Reads what the open watches sent, without waiting, then opens the
    /// watches that are due (listing first where there is no version).
    pub fn sync(&mut self, client: &Client, now: Instant) {
        self.started = true;
        for i in 0..self.sets.len() {
            self.pump(i, now);
            if self.sets[i].due(now).is_some_and(|at| at <= now) {
                self.open(client, i, now);
            }
        }
    }

    fn pump(&mut self, i: usize, now: Instant) {
        let trust = &self.trust;
        let shared = &mut self.shared;
        let set = &mut self.sets[i];
        if !matches!(set.watch, Watch::Open { .. }) {
            return;
        }
        let closed = Watch::List { retry_at: None };
        let Watch::Open {
            mut version,
            mut stream,
            opened_at,
        } = std::mem::replace(&mut set.watch, closed)
        else {
            return;
        };
        let mut outcome = Applied::Taken;
        let flow = stream.pump(|line| {
            if matches!(outcome, Applied::Taken) {
                outcome = set.apply(line, trust, shared, now, &mut version);
            }
        });
        match (flow, outcome) {
            (Ok(Flow::Open), Applied::Taken) => {
                set.watch = Watch::Open {
                    version,
                    stream,
                    opened_at,
                }
            }
            // Ended by the server: opened again at once from the version.
            (Ok(Flow::Ended), Applied::Taken) => {
                crate::debug!(
                    watch = set.describe().as_str();
                    "inventory: the watch ended; watching again"
                );
                set.ended(Some(version), opened_at, now);
            }
            (_, Applied::Expired) => {
                crate::info!(
                    watch = set.describe().as_str();
                    "inventory: the watch expired (410 Gone); listing again"
                );
                set.ended(None, opened_at, now);
            }
            (_, Applied::Broken(why)) => set.failed(why, Some(version), now),
            (Err(e), Applied::Taken) => set.failed(WatchError::Broke(e), Some(version), now),
        }
    }

    fn open(&mut self, client: &Client, i: usize, now: Instant) {
        let trust = &self.trust;
        let selector = self.selector.clone();
        let shared = &mut self.shared;
        let set = &mut self.sets[i];
        let version = match &set.watch {
            Watch::Open { .. } => return,
            Watch::Closed { version, .. } => version.clone(),
            Watch::List { .. } => match list(client, set, &selector, trust, shared, now) {
                Ok(version) => version,
                Err(e) => return set.failed(WatchError::List(e), None, now),
            },
        };
        let path = format!(
            "{}{}",
            set.collection,
            Query::new()
                .param("watch", "1")
                .param("allowWatchBookmarks", "true")
                .param("resourceVersion", &version)
                .param("labelSelector", &selector)
                .param("timeoutSeconds", &WATCH_TIMEOUT.as_secs().to_string())
                .finish()
        );
        match client.watch(&path) {
            Ok(stream) => {
                if set.problem.take().is_some() {
                    crate::info!(watch = set.describe().as_str(); "inventory: watching again");
                }
                set.watch = Watch::Open {
                    version,
                    stream,
                    opened_at: now,
                };
                // Events may have come with the head: read them now.
                self.pump(i, now);
            }
            // Too old to watch from: listed first next time.
            Err(e) if e.is_gone() => set.failed(WatchError::Open(e), None, now),
            Err(e) => set.failed(WatchError::Open(e), Some(version), now),
        }
    }
}

/// Lists `set` afresh (every item read by [`judge`], as a watch event's
/// object is): what was remembered of the objects still there stays.
/// The list's version, to watch from.
fn list(
    client: &Client,
    set: &mut Set,
    selector: &str,
    trust: &Trust,
    shared: &mut Interner,
    now: Instant,
) -> Result<String, crate::kube::Error> {
    let mut unproven = BTreeSet::new();
    let kind = set.kind.kind().name();
    // Each item kept as it comes, never a list of them all: at 10,000
    // proxies that list was the process's peak (BENCHMARKS.md, "The
    // compact status"). What was remembered of an object still there
    // comes along from `old`.
    let mut old = std::mem::take(&mut set.entries).taking();
    let mut fresh = Stores::default();
    let mut take = |judged: Result<Judged, _>| {
        if let Ok(Judged {
            kept: Some((owned, uid)),
            ..
        }) = judged
        {
            let before = old.take(&owned.name);
            keep(&mut fresh, before, owned, uid, now);
        }
    };
    let listed = match set.kind {
        Watched::Proxies => {
            client.list_versioned(&set.collection, Some(selector), PAGE, |p: ProxyItem| {
                take(judge(p, kind, trust, shared, &mut unproven))
            })
        }
        Watched::Deployments => client.list_versioned(
            &set.collection,
            Some(selector),
            PAGE,
            |d: DeploymentItem| take(judge(d, kind, trust, shared, &mut unproven)),
        ),
    };
    let version = match listed {
        Ok(version) => version,
        Err(e) => {
            // Cut short: what was read is newer, the rest stays.
            set.entries = old.rest().merge(fresh);
            return Err(e);
        }
    };
    set.unproven = unproven;
    fresh.shrink();
    set.entries = fresh;
    Ok(version)
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
