//! The inventory kept current by watches: each collection the heartbeat
//! reports (owned NexoProxies, owned legacy Deployments, per managed
//! namespace) is listed once, then watched from the list's
//! `resourceVersion`, with bookmarks. Only the heartbeat's projection of
//! each object is kept ([`DeploymentEntry`]); heartbeats are built from
//! it, with no request.
//!
//! A watch the server ends (its `timeoutSeconds`) is opened again from the
//! last version seen; one that breaks (the API server restarted, a reset)
//! is opened again with backoff, and while it is not open the heartbeat
//! says `inventoryErrors` (the entries may be stale); a 410 Gone (the
//! version is too old to watch from) lists again. The decisions are
//! [`Set::apply`] (an event on the entries, pure) and [`Set::due`]; the
//! I/O is [`Index::sync`].

use std::collections::BTreeMap;
use std::os::fd::RawFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::value::RawValue;

use super::{DeploymentItem, Interner, MetaItem, PAGE, ProxyItem, deployment_entry, proxy_entry};
use crate::backoff::{Backoff, Jitter};
use crate::cp::wire::DeploymentEntry;
use crate::kube::Client;
use crate::kube::client::Query;
use crate::kube::watch::{Flow, WatchStream};
use crate::ownership::{self, Ownership};
use crate::resource;

/// How long the API server keeps a watch open before ending it (it is
/// then opened again from the last version): one request per watch
/// every 10 minutes at rest.
pub const WATCH_TIMEOUT: Duration = Duration::from_secs(600);

/// Backoff of a watch that cannot be opened.
const RETRY_BASE: Duration = Duration::from_secs(1);
const RETRY_CAP: Duration = Duration::from_secs(60);

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
    kind: Watched,
    namespace: Rc<str>,
    collection: String,
    /// The owned objects, by name (the key shares the entry's name). An
    /// entry is shared with the heartbeat that reports it, never copied.
    entries: BTreeMap<Rc<str>, Rc<DeploymentEntry>>,
    /// The version to watch from; `None`: list first.
    version: Option<String>,
    stream: Option<WatchStream>,
    /// Why the set is not current, while it is not.
    problem: Option<String>,
    /// Not opened again before this.
    retry_at: Option<Instant>,
    backoff: Backoff,
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

impl Set {
    fn new(kind: Watched, namespace: &str) -> Set {
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
        }
    }

    /// What this set is, for log lines and `inventoryErrors`.
    fn describe(&self) -> String {
        let what = match self.kind {
            Watched::Proxies => "nexoproxies",
            Watched::Deployments => "deployments",
        };
        format!("{what} in {}", self.namespace)
    }

    /// Takes one object (as listed, added or modified): kept when owned,
    /// dropped otherwise (its labels changed).
    fn take(
        &mut self,
        object: &str,
        environment_id: &str,
        shared: &mut Interner,
    ) -> Result<(), String> {
        let (meta_name, owned, entry) = match self.kind {
            Watched::Proxies => {
                let p: ProxyItem = serde_json::from_str(object).map_err(|e| e.to_string())?;
                let owned = p.metadata.ownership(environment_id) == Ownership::Owned;
                let name = p.metadata.name.clone();
                (name, owned, proxy_entry(p, shared))
            }
            Watched::Deployments => {
                let d: DeploymentItem = serde_json::from_str(object).map_err(|e| e.to_string())?;
                let owned = d.metadata.ownership(environment_id) == Ownership::Owned;
                let name = d.metadata.name.clone();
                (name, owned, deployment_entry(d, shared))
            }
        };
        let name = meta_name.ok_or("an object without a name")?;
        match entry {
            Some(entry) if owned => {
                self.entries.insert(entry.name.clone(), Rc::new(entry));
            }
            _ => {
                self.entries.remove(name.as_str());
            }
        }
        Ok(())
    }

    /// Applies one watch event (a line of the stream) to the entries.
    pub fn apply(&mut self, line: &[u8], environment_id: &str, shared: &mut Interner) -> Applied {
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
                if let Err(e) = self.take(event.object.get(), environment_id, shared) {
                    return Applied::Broken(format!("an object not understood: {e}"));
                }
            }
            "DELETED" => {
                let named: Named = serde_json::from_str(event.object.get()).unwrap_or_default();
                if let Some(name) = named.metadata.name {
                    self.entries.remove(name.as_str());
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

    /// The watch failed: opened again after the backoff; the entries may
    /// be stale until then.
    fn failed(&mut self, problem: String, now: Instant) {
        let delay = self.backoff.next_delay();
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

/// Every watched collection of the inventory.
#[derive(Debug)]
pub struct Index {
    environment_id: String,
    selector: String,
    sets: Vec<Set>,
    shared: Interner,
    /// Whether the heartbeat asked for it yet (a standby never does).
    started: bool,
}

impl Index {
    /// Owned NexoProxies and Deployments of `namespaces`, nothing read yet.
    pub fn new(namespaces: &[String], environment_id: &str) -> Index {
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
            environment_id: environment_id.to_owned(),
            selector: ownership::owned_selector(environment_id),
            sets,
            shared: Interner::default(),
            started: false,
        }
    }

    /// Whether the heartbeat asked for it yet.
    pub fn started(&self) -> bool {
        self.started
    }

    /// The sockets of the open watches, for the loop's `poll(2)`.
    pub fn fds(&self, out: &mut Vec<RawFd>) {
        out.extend(
            self.sets
                .iter()
                .filter_map(|s| s.stream.as_ref().map(WatchStream::fd)),
        );
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
        let environment_id = &self.environment_id;
        let shared = &mut self.shared;
        let set = &mut self.sets[i];
        let Some(mut stream) = set.stream.take() else {
            return;
        };
        let mut outcome = Applied::Taken;
        let flow = stream.pump(|line| {
            if outcome == Applied::Taken {
                outcome = set.apply(line, environment_id, shared);
            }
        });
        match (flow, outcome) {
            (Ok(Flow::Open), Applied::Taken) => set.stream = Some(stream),
            // Ended by the server: opened again at once from the version.
            (Ok(Flow::Ended), Applied::Taken) => {
                log::debug!(
                    "inventory: the watch of {} ended; watching again",
                    set.describe()
                );
                set.retry_at = None;
            }
            (_, Applied::Expired) => {
                log::info!(
                    "inventory: the watch of {} expired (410 Gone); listing again",
                    set.describe()
                );
                set.version = None;
                set.retry_at = None;
            }
            (_, Applied::Broken(why)) => set.failed(why, now),
            (Err(e), Applied::Taken) => set.failed(format!("the watch broke: {e}"), now),
        }
    }

    fn open(&mut self, client: &Client, i: usize, now: Instant) {
        let environment_id = self.environment_id.clone();
        let selector = self.selector.clone();
        let shared = &mut self.shared;
        let set = &mut self.sets[i];
        if set.version.is_none() {
            let mut entries = Vec::new();
            let listed = match set.kind {
                Watched::Proxies => {
                    client.list_versioned(&set.collection, Some(&selector), PAGE, |p: ProxyItem| {
                        if p.metadata.ownership(&environment_id) == Ownership::Owned {
                            entries.extend(proxy_entry(p, shared));
                        }
                    })
                }
                Watched::Deployments => client.list_versioned(
                    &set.collection,
                    Some(&selector),
                    PAGE,
                    |d: DeploymentItem| {
                        if d.metadata.ownership(&environment_id) == Ownership::Owned {
                            entries.extend(deployment_entry(d, shared));
                        }
                    },
                ),
            };
            match listed {
                Ok(version) => {
                    set.entries = entries
                        .into_iter()
                        .map(|e| (e.name.clone(), Rc::new(e)))
                        .collect();
                    set.version = Some(version);
                }
                Err(e) => return set.failed(format!("cannot list: {e}"), now),
            }
        }
        let path = format!(
            "{}{}",
            set.collection,
            Query::new()
                .param("watch", "1")
                .param("allowWatchBookmarks", "true")
                .param("resourceVersion", set.version.as_deref().unwrap_or(""))
                .param("labelSelector", &selector)
                .param("timeoutSeconds", &WATCH_TIMEOUT.as_secs().to_string())
                .finish()
        );
        match client.watch(&path) {
            Ok(stream) => {
                if set.problem.take().is_some() {
                    log::info!("inventory: watching {} again", set.describe());
                }
                set.backoff.reset();
                set.retry_at = None;
                set.stream = Some(stream);
                // Events may have come with the head: read them now.
                self.pump(i, now);
            }
            Err(e) if e.is_gone() => {
                set.version = None;
                set.failed(format!("cannot watch: {e}"), now);
            }
            Err(e) => set.failed(format!("cannot watch: {e}"), now),
        }
    }

    /// The heartbeat's entries, sorted by namespace then name, and what
    /// may be stale.
    /// The entries are shared, not copied, and sorted in place: at 10,000
    /// proxies this costs 80 KB, where copies cost 1.9 MB (BENCHMARKS.md).
    pub fn report(&self) -> (Vec<Rc<DeploymentEntry>>, Vec<String>) {
        let mut entries: Vec<Rc<DeploymentEntry>> = self
            .sets
            .iter()
            .flat_map(|s| s.entries.values().cloned())
            .collect();
        entries.sort_unstable();
        let errors = self
            .sets
            .iter()
            .filter_map(|s| {
                let problem = s.problem.as_ref()?;
                Some(format!(
                    "{}: {problem} (not watched now; what is reported may be stale)",
                    s.describe()
                ))
            })
            .collect();
        (entries, errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set() -> (Set, Interner) {
        (Set::new(Watched::Proxies, "shop"), Interner::default())
    }

    fn proxy(name: &str, owner: &str, rv: &str) -> String {
        format!(
            r#"{{"metadata": {{"name": "{name}", "namespace": "shop", "resourceVersion": "{rv}", "labels": {{"app.kubernetes.io/managed-by": "nexo-manager", "nexo.io/owner-id": "{owner}"}}}}, "spec": {{"image": "proxy:1", "replicas": 2}}}}"#
        )
    }

    #[test]
    fn events_add_change_and_remove_entries_and_move_the_version() {
        let (mut s, mut shared) = set();
        let added = format!(
            r#"{{"type": "ADDED", "object": {}}}"#,
            proxy("a", "env-1", "10")
        );
        assert_eq!(
            s.apply(added.as_bytes(), "env-1", &mut shared),
            Applied::Taken
        );
        assert_eq!(s.entries["a"].replicas, 2);
        assert_eq!(s.version.as_deref(), Some("10"));
        let foreign = format!(
            r#"{{"type": "MODIFIED", "object": {}}}"#,
            proxy("a", "env-2", "11")
        );
        assert_eq!(
            s.apply(foreign.as_bytes(), "env-1", &mut shared),
            Applied::Taken
        );
        assert!(
            s.entries.is_empty(),
            "an object no longer owned leaves the inventory"
        );
        let again = format!(
            r#"{{"type": "ADDED", "object": {}}}"#,
            proxy("b", "env-1", "12")
        );
        s.apply(again.as_bytes(), "env-1", &mut shared);
        let deleted = format!(
            r#"{{"type": "DELETED", "object": {}}}"#,
            proxy("b", "env-1", "13")
        );
        s.apply(deleted.as_bytes(), "env-1", &mut shared);
        assert!(s.entries.is_empty());
        let bookmark = r#"{"type": "BOOKMARK", "object": {"kind": "NexoProxy", "metadata": {"resourceVersion": "99"}}}"#;
        assert_eq!(
            s.apply(bookmark.as_bytes(), "env-1", &mut shared),
            Applied::Taken
        );
        assert_eq!(s.version.as_deref(), Some("99"));
    }

    #[test]
    fn a_410_lists_again_and_other_errors_reopen() {
        let (mut s, mut shared) = set();
        let gone = r#"{"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version"}}"#;
        assert_eq!(
            s.apply(gone.as_bytes(), "env-1", &mut shared),
            Applied::Expired
        );
        let other =
            r#"{"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "boom"}}"#;
        assert!(
            matches!(s.apply(other.as_bytes(), "env-1", &mut shared), Applied::Broken(m) if m.contains("500"))
        );
        assert!(matches!(
            s.apply(b"{not json", "env-1", &mut shared),
            Applied::Broken(_)
        ));
        assert!(matches!(
            s.apply(
                br#"{"type": "SURPRISE", "object": {}}"#,
                "env-1",
                &mut shared
            ),
            Applied::Broken(_)
        ));
    }

    #[test]
    fn a_failed_watch_is_due_after_its_backoff_and_reported_stale() {
        let (mut s, _) = set();
        let now = Instant::now();
        assert_eq!(s.due(now), Some(now), "never opened: due now");
        s.failed("the watch broke".into(), now);
        assert!(s.due(now).is_some_and(|at| at > now));
        let index = Index {
            environment_id: "env-1".into(),
            selector: String::new(),
            sets: vec![s],
            shared: Interner::default(),
            started: true,
        };
        let (_, errors) = index.report();
        assert_eq!(errors.len(), 1);
        assert!(errors[0].contains("nexoproxies in shop") && errors[0].contains("stale"));
    }
}
