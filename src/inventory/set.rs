//! One watched collection's store: its entries, its watch's state, and
//! the pure decisions on them ([`Set::apply`], an event on the entries;
//! [`Set::due`]).

use std::collections::BTreeSet;
use std::rc::Rc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use super::owned::Owned;
use super::stored::{Stores, keep};
use super::{DeploymentItem, Interner, MetaItem, ProxyItem, Trust, deployment_entry, proxy_entry};
use crate::backoff::{Backoff, Jitter};
use crate::ownership::Ownership;
use crate::resource::{self, Kind};

/// Backoff of a watch that cannot be opened, or that ended (or expired)
/// before it was open for [`HEALTHY`](crate::kube::watch::HEALTHY): from
/// 1 s, doubling to 30 s, jittered (docs/protocol.md, "Hostile and buggy
/// values").
const RETRY_BASE: Duration = Duration::from_secs(1);
const RETRY_CAP: Duration = Duration::from_secs(30);

/// What a set holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watched {
    /// `nexo.io/v1alpha1` NexoProxies.
    Proxies,
    /// `apps/v1` Deployments (legacy).
    Deployments,
}

pub use crate::kube::watch::Watch;

/// Why a set is not current: the list or the watch failed, or the watch
/// sent something it cannot take. Its `Display` is the `inventoryErrors`
/// line's cause.
#[derive(Debug)]
pub enum WatchError {
    /// The list failed.
    List(crate::kube::Error),
    /// The watch could not be opened.
    Open(crate::kube::Error),
    /// The open watch broke (a reset, the connection closed mid-event).
    Broke(std::io::Error),
    /// A line that is not a watch event.
    NotAnEvent(serde_json::Error),
    /// An object the set cannot read.
    Object(ObjectError),
    /// An `ERROR` event other than 410 Gone.
    ErrorEvent { code: Option<u16>, message: String },
    /// An event of a type the API does not send.
    UnknownType(String),
}

impl std::fmt::Display for WatchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WatchError::List(e) => write!(f, "cannot list: {e}"),
            WatchError::Open(e) => write!(f, "cannot watch: {e}"),
            WatchError::Broke(e) => write!(f, "the watch broke: {e}"),
            WatchError::NotAnEvent(e) => write!(f, "not a watch event: {e}"),
            WatchError::Object(e) => write!(f, "an object not understood: {e}"),
            WatchError::ErrorEvent { code, message } => write!(
                f,
                "the watch ended with an error ({}: {})",
                code.map_or("no code".to_owned(), |c| c.to_string()),
                crate::text::clip(message, 200)
            ),
            WatchError::UnknownType(t) => {
                write!(f, "an event of unknown type {}", crate::text::clip(t, 40))
            }
        }
    }
}

impl std::error::Error for WatchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WatchError::List(e) | WatchError::Open(e) => Some(e),
            WatchError::Broke(e) => Some(e),
            WatchError::NotAnEvent(e) => Some(e),
            WatchError::Object(e) => Some(e),
            WatchError::ErrorEvent { .. } | WatchError::UnknownType(_) => None,
        }
    }
}

/// An object a set cannot read.
#[derive(Debug)]
pub enum ObjectError {
    /// Not the projection of its kind.
    Decode(serde_json::Error),
    /// No `metadata.name`.
    NoName,
}

impl std::fmt::Display for ObjectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ObjectError::Decode(e) => write!(f, "{e}"),
            ObjectError::NoName => f.write_str("an object without a name"),
        }
    }
}

impl std::error::Error for ObjectError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ObjectError::Decode(e) => Some(e),
            ObjectError::NoName => None,
        }
    }
}

/// An item of a watched collection, as listed or as a watch event's
/// object: both are read by [`judge`].
pub trait Item: DeserializeOwned {
    /// Its metadata.
    fn metadata(&self) -> &MetaItem;
    /// Its record: what the heartbeat reports and what its phase is
    /// judged from.
    fn into_entry(self, shared: &mut Interner) -> Option<Owned>;
}

impl Item for ProxyItem {
    fn metadata(&self) -> &MetaItem {
        &self.metadata
    }
    fn into_entry(self, shared: &mut Interner) -> Option<Owned> {
        proxy_entry(self, shared)
    }
}

impl Item for DeploymentItem {
    fn metadata(&self) -> &MetaItem {
        &self.metadata
    }
    fn into_entry(self, shared: &mut Interner) -> Option<Owned> {
        deployment_entry(self, shared)
    }
}

/// One item judged: its name, and its record (with its uid) when it is
/// listed.
pub struct Judged {
    pub name: String,
    pub kept: Option<(Owned, Option<String>)>,
}

/// Reads one item, as listed or as a watch event's object: its ownership
/// (an unproven one remembered in `unproven`, [`listed`]), and its entry
/// when it is listed.
pub fn judge<T: Item>(
    item: T,
    kind: &str,
    trust: &Trust,
    shared: &mut Interner,
    unproven: &mut BTreeSet<Rc<str>>,
) -> Result<Judged, ObjectError> {
    let meta = item.metadata();
    let name = meta.name.clone().ok_or(ObjectError::NoName)?;
    let uid = meta.uid.clone();
    let owned = listed(unproven, &name, &meta.ownership(kind, trust), trust);
    let kept = if owned {
        item.into_entry(shared).map(|o| (o, uid))
    } else {
        None
    };
    Ok(Judged { name, kept })
}

/// One watched collection: its entries and its watch.
#[derive(Debug)]
pub struct Set {
    pub(super) kind: Watched,
    pub(super) namespace: Rc<str>,
    pub(super) collection: String,
    /// The owned objects, sorted by name.
    pub(super) entries: Stores,
    /// Where its watch stands.
    pub(super) watch: Watch,
    /// Why the set is not current, while it is not.
    pub(super) problem: Option<WatchError>,
    pub(super) backoff: Backoff,
    /// The objects with this environment's labels but no valid proof:
    /// reported in `inventoryErrors`, listed only through the gate.
    pub(super) unproven: BTreeSet<Rc<str>>,
}

/// What an event does to a set.
#[derive(Debug)]
pub enum Applied {
    /// Taken (or a bookmark): the watch goes on.
    Taken,
    /// 410 Gone: the version is too old; list again.
    Expired,
    /// An error event, or a line that is not one: open the watch again.
    Broken(WatchError),
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
    pub(super) fn kind(self) -> Kind {
        match self {
            Watched::Proxies => Kind::NexoProxy,
            Watched::Deployments => Kind::Deployment,
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
            entries: Stores::default(),
            watch: Watch::List { retry_at: None },
            problem: None,
            backoff: Backoff::new(RETRY_BASE, RETRY_CAP, Jitter::from_entropy()),
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

    /// Takes one object (added or modified): kept when owned, dropped
    /// otherwise (its labels or its proof changed).
    pub(super) fn take(
        &mut self,
        object: &str,
        trust: &Trust,
        shared: &mut Interner,
        now: Instant,
    ) -> Result<(), ObjectError> {
        let kind = self.kind.kind().name();
        let unproven = &mut self.unproven;
        let judged = match self.kind {
            Watched::Proxies => {
                let p: ProxyItem = serde_json::from_str(object).map_err(ObjectError::Decode)?;
                judge(p, kind, trust, shared, unproven)?
            }
            Watched::Deployments => {
                let d: DeploymentItem =
                    serde_json::from_str(object).map_err(ObjectError::Decode)?;
                judge(d, kind, trust, shared, unproven)?
            }
        };
        match judged.kept {
            Some((owned, uid)) => self.keep(owned, uid, now),
            None => {
                self.entries.remove(judged.name.as_str());
            }
        }
        Ok(())
    }

    /// Keeps an owned object's record; what was remembered of its phase
    /// stays (the same object, by uid).
    pub(super) fn keep(&mut self, owned: Owned, uid: Option<String>, now: Instant) {
        let before = self.entries.remove(&owned.name);
        keep(&mut self.entries, before, owned, uid, now);
    }

    /// Applies one watch event (a line of the stream) to the entries;
    /// `version` becomes the event's.
    pub fn apply(
        &mut self,
        line: &[u8],
        trust: &Trust,
        shared: &mut Interner,
        now: Instant,
        version: &mut String,
    ) -> Applied {
        let event: Event = match serde_json::from_slice(line) {
            Ok(e) => e,
            Err(e) => return Applied::Broken(WatchError::NotAnEvent(e)),
        };
        let named = || serde_json::from_str::<Named>(event.object.get()).unwrap_or_default();
        match event.kind {
            "ADDED" | "MODIFIED" => {
                if let Err(e) = self.take(event.object.get(), trust, shared, now) {
                    return Applied::Broken(WatchError::Object(e));
                }
            }
            "DELETED" => {
                if let Some(name) = named().metadata.name {
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
                    code => Applied::Broken(WatchError::ErrorEvent {
                        code,
                        message: status.message.unwrap_or_default(),
                    }),
                };
            }
            other => return Applied::Broken(WatchError::UnknownType(other.to_owned())),
        }
        if let Some(v) = named().metadata.resource_version {
            *version = v;
        }
        Applied::Taken
    }

    /// When the watch should be opened (again), seen at `now`: `None`
    /// while it is open.
    pub fn due(&self, now: Instant) -> Option<Instant> {
        match &self.watch {
            Watch::Open { .. } => None,
            Watch::List { retry_at } | Watch::Closed { retry_at, .. } => {
                Some(retry_at.unwrap_or(now))
            }
        }
    }

    /// Not watched, waiting until `retry_at`: from `version`, or listed
    /// first when there is none.
    fn wait(&mut self, version: Option<String>, retry_at: Option<Instant>) {
        self.watch = match version {
            Some(version) => Watch::Closed { version, retry_at },
            None => Watch::List { retry_at },
        };
    }

    /// The watch opened at `opened_at` ended (the server's timeout; a 410
    /// Gone, when `version` is `None`): opened again as
    /// [`again_after_end`](crate::kube::watch::again_after_end) says.
    pub(super) fn ended(&mut self, version: Option<String>, opened_at: Instant, now: Instant) {
        let retry_at = crate::kube::watch::again_after_end(opened_at, now, &mut self.backoff);
        self.wait(version, retry_at);
    }

    /// The list or the watch failed: tried again after the backoff, from
    /// `version` (listed first when there is none); the entries may be
    /// stale until then.
    pub(super) fn failed(&mut self, problem: WatchError, version: Option<String>, now: Instant) {
        let delay = self.backoff.next_delay_at_least_half();
        crate::warn!(
            watch = self.describe().as_str(), err:% = problem,
            retryIn:? = Duration::from_millis(delay.as_millis() as u64);
            "inventory: the watch failed; watching again"
        );
        self.problem = Some(problem);
        self.wait(version, Some(now + delay));
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
