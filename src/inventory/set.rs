//! One watched collection's store: its entries, its watch's state, and
//! the pure decisions on them ([`Set::apply`], an event on the entries;
//! [`Set::due`]).

use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::value::RawValue;

use super::status::{Observed, Track};
use super::{DeploymentItem, Interner, MetaItem, ProxyItem, Trust, deployment_entry, proxy_entry};
use crate::backoff::{Backoff, Jitter};
use crate::cp::wire::DeploymentEntry;
use crate::kube::watch::WatchStream;
use crate::ownership::Ownership;
use crate::resource;

/// Backoff of a watch that cannot be opened, or that ended (or expired)
/// before it was open for [`HEALTHY`]: from 1 s, doubling to 30 s,
/// jittered (docs/protocol.md, "Hostile and buggy values").
const RETRY_BASE: Duration = Duration::from_secs(1);
const RETRY_CAP: Duration = Duration::from_secs(30);

/// A watch open this long was healthy: its backoff starts again from the
/// beginning, and when it ends it is opened again at once.
pub const HEALTHY: Duration = Duration::from_secs(60);

/// What a set holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watched {
    /// `nexo.io/v1alpha1` NexoProxies.
    Proxies,
    /// `apps/v1` Deployments (legacy).
    Deployments,
}

/// One watched collection: its entries and its watch.
#[derive(Debug)]
pub struct Set {
    pub(super) kind: Watched,
    pub(super) namespace: Rc<str>,
    pub(super) collection: String,
    /// The owned objects, by name (the key shares the entry's name).
    /// Boxed: a map's nodes hold their values inline, half empty after
    /// the list's ordered inserts; a box keeps that slack at 8 bytes.
    pub(super) entries: BTreeMap<Rc<str>, Box<Stored>>,
    /// The version to watch from; `None`: list first.
    pub(super) version: Option<String>,
    pub(super) stream: Option<WatchStream>,
    /// Why the set is not current, while it is not.
    pub(super) problem: Option<String>,
    /// Not opened again before this.
    pub(super) retry_at: Option<Instant>,
    pub(super) backoff: Backoff,
    /// When the open watch was opened.
    pub(super) opened_at: Option<Instant>,
    /// The objects with this environment's labels but no valid proof:
    /// reported in `inventoryErrors`, listed only through the gate.
    pub(super) unproven: BTreeSet<Rc<str>>,
}

/// One owned object: its heartbeat entry (shared with the heartbeat that
/// reports it, never copied), what its phase is judged from, and what this
/// Manager remembers of its phase.
#[derive(Debug)]
pub(super) struct Stored {
    pub(super) entry: Rc<DeploymentEntry>,
    pub(super) observed: Observed,
    pub(super) track: Track,
    pub(super) uid: Option<Box<str>>,
    /// Observed anew (or explained) since it was last judged.
    pub(super) fresh: bool,
    /// When the clock alone may change its phase (a deadline).
    pub(super) recheck_at: Option<Instant>,
}

/// What an event does to a set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// Taken (or a bookmark): the watch goes on.
    Taken,
    /// 410 Gone: the version is too old; list again.
    Expired,
    /// An error event, or a line that is not one: open the watch again.
    Broken(String),
}

#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(borrow)]
    object: &'a RawValue,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct StatusItem {
    code: Option<u16>,
    message: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Named {
    metadata: MetaItem,
}

impl Watched {
    /// The kind of its objects.
    pub(super) fn kind(self) -> &'static str {
        match self {
            Watched::Proxies => "NexoProxy",
            Watched::Deployments => "Deployment",
        }
    }
}

impl Set {
    pub(super) fn new(kind: Watched, namespace: &str) -> Set {
        let collection = match kind {
            Watched::Proxies => resource::NEXO_PROXIES.collection(Some(namespace)),
            Watched::Deployments => resource::DEPLOYMENTS.collection(Some(namespace)),
        };
        Set {
            kind,
            namespace: Rc::from(namespace),
            collection,
            entries: BTreeMap::new(),
            version: None,
            stream: None,
            problem: None,
            retry_at: None,
            backoff: Backoff::new(RETRY_BASE, RETRY_CAP, Jitter::from_entropy()),
            opened_at: None,
            unproven: BTreeSet::new(),
        }
    }

    /// The `inventoryErrors` line of its unproven objects, if any.
    pub(super) fn unproven_error(&self, trust: &Trust) -> Option<String> {
        if self.unproven.is_empty() {
            return None;
        }
        let names: Vec<&str> = self.unproven.iter().take(5).map(|n| &**n).collect();
        let more = match self.unproven.len() {
            n if n > names.len() => format!(" and {} more", n - names.len()),
            _ => String::new(),
        };
        let what = if trust.adopt_unproven {
            "listed through NEXO_ADOPT_UNPROVEN until a write gives them their proof"
        } else {
            "not this Manager's, not listed"
        };
        Some(format!(
            "{}: {} with this environment's labels but no valid proof ({what}): {}{more}",
            self.describe(),
            self.unproven.len(),
            crate::text::escape(&names.join(", "))
        ))
    }

    /// What this set is, for log lines and `inventoryErrors`.
    pub(super) fn describe(&self) -> String {
        let what = match self.kind {
            Watched::Proxies => "nexoproxies",
            Watched::Deployments => "deployments",
        };
        format!("{what} in {}", self.namespace)
    }

    /// Takes one object (as listed, added or modified): kept when owned,
    /// dropped otherwise (its labels or its proof changed).
    pub(super) fn take(
        &mut self,
        object: &str,
        trust: &Trust,
        shared: &mut Interner,
        now: Instant,
    ) -> Result<(), String> {
        let kind = self.kind.kind();
        let (meta_name, ownership, uid, taken) = match self.kind {
            Watched::Proxies => {
                let p: ProxyItem = serde_json::from_str(object).map_err(|e| e.to_string())?;
                let ownership = p.metadata.ownership(kind, trust);
                let (name, uid) = (p.metadata.name.clone(), p.metadata.uid.clone());
                (name, ownership, uid, proxy_entry(p, shared))
            }
            Watched::Deployments => {
                let d: DeploymentItem = serde_json::from_str(object).map_err(|e| e.to_string())?;
                let ownership = d.metadata.ownership(kind, trust);
                let (name, uid) = (d.metadata.name.clone(), d.metadata.uid.clone());
                (name, ownership, uid, deployment_entry(d, shared))
            }
        };
        let name = meta_name.ok_or("an object without a name")?;
        let owned = listed(&mut self.unproven, &name, &ownership, trust);
        match taken {
            Some((entry, observed)) if owned => self.keep(entry, observed, uid, now),
            _ => {
                self.entries.remove(name.as_str());
            }
        }
        Ok(())
    }

    /// Keeps an owned object's entry; what was remembered of its phase
    /// stays (the same object, by uid).
    pub(super) fn keep(
        &mut self,
        entry: DeploymentEntry,
        observed: Observed,
        uid: Option<String>,
        now: Instant,
    ) {
        let uid = uid.map(String::into_boxed_str);
        let track = match self.entries.remove(&*entry.name) {
            Some(old) if old.uid == uid => old.track,
            _ => Track::new(observed.generation, now),
        };
        self.entries.insert(
            entry.name.clone(),
            Box::new(Stored {
                entry: Rc::new(entry),
                observed,
                track,
                uid,
                fresh: true,
                recheck_at: None,
            }),
        );
    }

    /// Applies one watch event (a line of the stream) to the entries.
    pub fn apply(
        &mut self,
        line: &[u8],
        trust: &Trust,
        shared: &mut Interner,
        now: Instant,
    ) -> Applied {
        let event: Event = match serde_json::from_slice(line) {
            Ok(e) => e,
            Err(e) => return Applied::Broken(format!("not a watch event: {e}")),
        };
        let version = || {
            serde_json::from_str::<Named>(event.object.get())
                .ok()
                .and_then(|n| n.metadata.resource_version)
        };
        match event.kind {
            "ADDED" | "MODIFIED" => {
                if let Err(e) = self.take(event.object.get(), trust, shared, now) {
                    return Applied::Broken(format!("an object not understood: {e}"));
                }
            }
            "DELETED" => {
                let named: Named = serde_json::from_str(event.object.get()).unwrap_or_default();
                if let Some(name) = named.metadata.name {
                    self.entries.remove(name.as_str());
                    self.unproven.remove(name.as_str());
                }
            }
            "BOOKMARK" => {}
            "ERROR" => {
                let status: StatusItem =
                    serde_json::from_str(event.object.get()).unwrap_or_default();
                return match status.code {
                    Some(410) => Applied::Expired,
                    code => Applied::Broken(format!(
                        "the watch ended with an error ({}: {})",
                        code.map_or("no code".to_owned(), |c| c.to_string()),
                        crate::text::clip(status.message.as_deref().unwrap_or(""), 200)
                    )),
                };
            }
            other => {
                return Applied::Broken(format!(
                    "an event of unknown type {}",
                    crate::text::clip(other, 40)
                ));
            }
        }
        if let Some(v) = version() {
            self.version = Some(v);
        }
        Applied::Taken
    }

    /// When the watch should be opened (again), seen at `now`: `None`
    /// while it is open.
    pub fn due(&self, now: Instant) -> Option<Instant> {
        match (&self.stream, self.retry_at) {
            (Some(_), _) => None,
            (None, Some(at)) => Some(at),
            (None, None) => Some(now),
        }
    }

    /// The watch ended (the server's timeout, or a 410 Gone): opened again
    /// at once if it was open for [`HEALTHY`] (its backoff then starts
    /// again), else after the backoff: a watch that ends as soon as it is
    /// opened is not opened again as fast as it ends.
    pub(super) fn ended(&mut self, now: Instant) {
        self.stream = None;
        let healthy = self
            .opened_at
            .is_some_and(|at| now.saturating_duration_since(at) >= HEALTHY);
        if healthy {
            self.backoff.reset();
            self.retry_at = None;
        } else {
            self.retry_at = Some(now + self.backoff.next_delay_at_least_half());
        }
    }

    /// The watch failed: opened again after the backoff; the entries may
    /// be stale until then.
    pub(super) fn failed(&mut self, problem: String, now: Instant) {
        let delay = self.backoff.next_delay_at_least_half();
        log::warn!(
            "inventory: {}: {problem}; watching again in {:?}",
            self.describe(),
            Duration::from_millis(delay.as_millis() as u64)
        );
        self.problem = Some(problem);
        self.stream = None;
        self.retry_at = Some(now + delay);
    }
}

/// Whether an object so judged is listed; an unproven one is remembered
/// in `unproven` (for `inventoryErrors`), and listed only through the gate.
pub(super) fn listed(
    unproven: &mut BTreeSet<Rc<str>>,
    name: &str,
    o: &Ownership,
    trust: &Trust,
) -> bool {
    if *o == Ownership::Unproven {
        if !unproven.contains(name) {
            unproven.insert(Rc::from(name));
        }
        return trust.adopt_unproven;
    }
    unproven.remove(name);
    *o == Ownership::Owned
}
