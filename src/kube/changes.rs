//! Watches of objects' metadata alone (`PartialObjectMetadata`): what the
//! Manager would otherwise read again every few minutes at rest (its own
//! Deployment, the release contract's CRDs, the nodes' topology labels) is
//! known from them, or read only when one says it changed (agent.md,
//! "Probes, readiness and the rolling update", last point).
//!
//! A [`MetaWatch`] lists its collection once (names, labels and versions
//! only, paged), then watches from the list's version with bookmarks,
//! read without blocking as the inventory's watches are (`watch.rs`). It
//! hands what it sees to its caller as [`Seen`] values, and keeps no copy.

use std::collections::BTreeMap;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::client::{METADATA_LIST, METADATA_WATCH};
use super::query::Query;
use super::watch::{Flow, Watch};
use super::{Client, Error};
use crate::backoff::{Backoff, Jitter};

/// A metadata watch's server-side timeout: opened again from its version
/// when it ends, so the API server sees one request each this long.
pub const TIMEOUT: Duration = Duration::from_secs(1800);

/// Items per page of the first list (metadata only: about 1 KB each).
const PAGE: u32 = 500;

/// The metadata of an object, as much as is read.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(default, rename_all = "camelCase")]
pub struct Meta {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub resource_version: Option<String>,
}

#[derive(Deserialize)]
struct Item {
    #[serde(default)]
    metadata: Meta,
}

/// A watch event: its type, the object's metadata, and an `ERROR`'s code.
#[derive(Deserialize)]
struct Event {
    #[serde(rename = "type")]
    kind: String,
    object: EventObject,
}

#[derive(Deserialize)]
struct EventObject {
    #[serde(default)]
    metadata: Meta,
    code: Option<u16>,
}

/// When what a watch covers is to be read again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refresh {
    /// Its watch is open: now if it said it changed, else not.
    Watched { changed: bool },
    /// Not watched (forbidden, failing): every few minutes, as before.
    Periodic,
}

impl Refresh {
    /// Whether what was last read at `read_at` (never: `None`) is to be
    /// read again at `now`; `every`: the period when not watched.
    pub fn due(self, read_at: Option<Instant>, now: Instant, every: Duration) -> bool {
        match (read_at, self) {
            (None, _) => true,
            (Some(_), Refresh::Watched { changed }) => changed,
            (Some(at), Refresh::Periodic) => now.saturating_duration_since(at) >= every,
        }
    }
}

/// What a watch saw.
#[derive(Debug, PartialEq, Eq)]
pub enum Seen<'a> {
    /// Listed afresh: what was known of the collection is forgotten; its
    /// objects follow, each as [`Seen::Put`].
    Reset,
    /// An object is there (listed, added or changed).
    Put(&'a Meta),
    /// An object is gone.
    Gone(&'a Meta),
}

/// One collection's metadata, watched.
#[derive(Debug)]
pub struct MetaWatch {
    what: &'static str,
    collection: String,
    /// `fieldSelector` (one object by name, which RBAC can grant by
    /// `resourceNames`).
    field_selector: Option<String>,
    state: Watch,
    backoff: Backoff,
    /// Why it is not watched now, until it is again.
    problem: Option<Error>,
    /// It may be listed but not watched (an RBAC of 0.4, which a
    /// self-upgrade keeps: `list` on nodes, no `watch`): listed again
    /// every [`LIST_ONLY_EVERY`], never watched.
    list_only: bool,
}

/// How often a collection that may be listed but not watched is listed.
pub const LIST_ONLY_EVERY: Duration = Duration::from_secs(300);

impl MetaWatch {
    /// A watch of `collection`'s metadata (`what` names it in logs),
    /// nothing read yet.
    pub fn new(what: &'static str, collection: String, field_selector: Option<String>) -> Self {
        MetaWatch {
            what,
            collection,
            field_selector,
            state: Watch::List { retry_at: None },
            backoff: Backoff::new(
                Duration::from_secs(1),
                Duration::from_secs(300),
                Jitter::from_entropy(),
            ),
            problem: None,
            list_only: false,
        }
    }

    /// Whether it is open, so that what it says is current.
    pub fn watching(&self) -> bool {
        matches!(self.state, Watch::Open { .. })
    }

    /// Why it is not watched now.
    pub fn problem(&self) -> Option<&Error> {
        self.problem.as_ref()
    }

    /// Its socket, while open, for the loop's `poll(2)`.
    pub fn fd(&self) -> Option<RawFd> {
        match &self.state {
            Watch::Open { stream, .. } => Some(stream.fd()),
            _ => None,
        }
    }

    /// Reads what arrived, without waiting, then lists or opens it again
    /// where due; each object seen goes to `seen`.
    /// One that was forbidden (403) is not asked again: RBAC changes come
    /// with an install, which starts the process again.
    pub fn sync(&mut self, client: &Client, now: Instant, seen: &mut dyn FnMut(Seen<'_>)) {
        if self.problem.as_ref().is_some_and(Error::is_forbidden) {
            return;
        }
        self.pump(now, seen);
        let due = match &self.state {
            Watch::Open { .. } => false,
            Watch::List { retry_at } | Watch::Closed { retry_at, .. } => {
                retry_at.is_none_or(|at| at <= now)
            }
        };
        if due {
            self.open(client, now, seen);
        }
    }

    fn pump(&mut self, now: Instant, seen: &mut dyn FnMut(Seen<'_>)) {
        if !matches!(self.state, Watch::Open { .. }) {
            return;
        }
        let Watch::Open {
            mut version,
            mut stream,
            opened_at,
        } = std::mem::replace(&mut self.state, Watch::List { retry_at: None })
        else {
            return;
        };
        // 410 Gone (listed again) or another error, from an `ERROR` event.
        let mut error: Option<Option<u16>> = None;
        let flow = stream.pump(|line| {
            if error.is_some() {
                return;
            }
            match serde_json::from_slice::<Event>(line) {
                Ok(e) => {
                    if let Some(v) = &e.object.metadata.resource_version {
                        version.clone_from(v);
                    }
                    match e.kind.as_str() {
                        "ADDED" | "MODIFIED" => seen(Seen::Put(&e.object.metadata)),
                        "DELETED" => seen(Seen::Gone(&e.object.metadata)),
                        "ERROR" => error = Some(e.object.code),
                        _ => {} // BOOKMARK: the version alone.
                    }
                }
                Err(_) => error = Some(None),
            }
        });
        self.state = match (flow, error) {
            (Ok(Flow::Open), None) => Watch::Open {
                version,
                stream,
                opened_at,
            },
            (_, Some(Some(410))) => {
                crate::info!(watch = self.what; "the watch expired (410 Gone); listing again");
                Watch::List { retry_at: None }
            }
            (Ok(Flow::Ended), None) => {
                crate::debug!(watch = self.what; "the watch ended; watching again");
                let retry_at = super::watch::again_after_end(opened_at, now, &mut self.backoff);
                Watch::Closed { version, retry_at }
            }
            (flow, error) => {
                crate::debug!(
                    watch = self.what, flow:? = flow.err(), err:? = error;
                    "the watch broke; watching again"
                );
                Watch::Closed {
                    version,
                    retry_at: Some(now + self.backoff.next_delay_at_least_half()),
                }
            }
        };
    }

    fn open(&mut self, client: &Client, now: Instant, seen: &mut dyn FnMut(Seen<'_>)) {
        let field_selector = self.field_selector.clone();
        let selector = field_selector.as_deref().map(|s| ("fieldSelector", s));
        let version = match &self.state {
            Watch::Open { .. } => return,
            Watch::Closed { version, .. } => version.clone(),
            Watch::List { .. } => {
                let mut items = Vec::new();
                let listed = client.metadata_only(METADATA_LIST, |c| {
                    c.list_versioned_where(&self.collection, selector, PAGE, |i: Item| {
                        items.push(i.metadata)
                    })
                });
                match listed {
                    Ok(version) => {
                        seen(Seen::Reset);
                        items.iter().for_each(|m| seen(Seen::Put(m)));
                        version
                    }
                    Err(e) => return self.failed(e, None, now),
                }
            }
        };
        if self.list_only {
            self.state = Watch::List {
                retry_at: Some(now + LIST_ONLY_EVERY),
            };
            return;
        }
        let mut query = Query::new()
            .param("watch", "1")
            .param("allowWatchBookmarks", "true")
            .param("resourceVersion", &version)
            .param("timeoutSeconds", &TIMEOUT.as_secs().to_string());
        if let Some((key, value)) = selector {
            query = query.param(key, value);
        }
        let path = format!("{}{}", self.collection, query.finish());
        match client.metadata_only(METADATA_WATCH, |c| c.watch(&path)) {
            Ok(stream) => {
                if self.problem.take().is_some() {
                    crate::info!(watch = self.what; "watching again");
                }
                self.state = Watch::Open {
                    version,
                    stream,
                    opened_at: now,
                };
                // Events may have come with the head.
                self.pump(now, seen);
            }
            Err(e) if e.is_gone() => self.failed(e, None, now),
            Err(e) if e.is_forbidden() => {
                // Listed, not watched: listed every few minutes instead.
                crate::info!(
                    watch = self.what, err:% = e, listEverySeconds = LIST_ONLY_EVERY.as_secs();
                    "may be listed but not watched; listed instead"
                );
                self.list_only = true;
                self.state = Watch::List {
                    retry_at: Some(now + LIST_ONLY_EVERY),
                };
            }
            Err(e) => self.failed(e, Some(version), now),
        }
    }

    /// Not watched: listed (no `version`) or watched again after the
    /// backoff; the first failure of a run is logged.
    fn failed(&mut self, e: Error, version: Option<String>, now: Instant) {
        if e.is_forbidden() {
            crate::info!(
                watch = self.what, err:% = e;
                "not watched; read every few minutes instead"
            );
        } else if self.problem.is_none() {
            crate::warn!(watch = self.what, err:% = e; "cannot watch");
        }
        let retry_at = Some(now + self.backoff.next_delay_at_least_half());
        self.state = match version {
            Some(version) => Watch::Closed { version, retry_at },
            None => Watch::List { retry_at },
        };
        self.problem = Some(e);
    }
}
