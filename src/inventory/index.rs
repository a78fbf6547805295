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

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::RawFd;
use std::rc::Rc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::value::RawValue;

use super::status::{self, CommandTrack, Observed, Track, Turned};
use super::{
    DeploymentItem, Interner, MetaItem, PAGE, ProxyItem, Trust, deployment_entry, proxy_entry,
};
use crate::backoff::{Backoff, Jitter};
use crate::cp::wire::{CommandProgress, DeploymentEntry, EntryStatus};
use crate::kube::Client;
use crate::kube::client::Query;
use crate::kube::watch::{Flow, WatchStream};
use crate::ownership::{self, Ownership};
use crate::resource;

/// How long the API server keeps a watch open before ending it (it is
/// then opened again from the last version): one request per watch
/// every 10 minutes at rest.
pub const WATCH_TIMEOUT: Duration = Duration::from_secs(600);

/// Backoff of a watch that cannot be opened, or that ended (or expired)
/// before it was open for [`HEALTHY`]: from 1 s, doubling to 30 s,
/// jittered (protocol.md, "Hostile and buggy values").
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
    kind: Watched,
    namespace: Rc<str>,
    collection: String,
    /// The owned objects, by name (the key shares the entry's name).
    /// Boxed: a map's nodes hold their values inline, half empty after
    /// the list's ordered inserts; a box keeps that slack at 8 bytes.
    entries: BTreeMap<Rc<str>, Box<Stored>>,
    /// The version to watch from; `None`: list first.
    version: Option<String>,
    stream: Option<WatchStream>,
    /// Why the set is not current, while it is not.
    problem: Option<String>,
    /// Not opened again before this.
    retry_at: Option<Instant>,
    backoff: Backoff,
    /// When the open watch was opened.
    opened_at: Option<Instant>,
    /// The objects with this environment's labels but no valid proof:
    /// reported in `inventoryErrors`, listed only through the gate.
    unproven: BTreeSet<Rc<str>>,
}

/// One owned object: its heartbeat entry (shared with the heartbeat that
/// reports it, never copied), what its phase is judged from, and what this
/// Manager remembers of its phase.
#[derive(Debug)]
struct Stored {
    entry: Rc<DeploymentEntry>,
    observed: Observed,
    track: Track,
    uid: Option<Box<str>>,
    /// Observed anew (or explained) since it was last judged.
    fresh: bool,
    /// When the clock alone may change its phase (a deadline).
    recheck_at: Option<Instant>,
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
    fn kind(self) -> &'static str {
        match self {
            Watched::Proxies => "NexoProxy",
            Watched::Deployments => "Deployment",
        }
    }
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
            opened_at: None,
            unproven: BTreeSet::new(),
        }
    }

    /// The `inventoryErrors` line of its unproven objects, if any.
    fn unproven_error(&self, trust: &Trust) -> Option<String> {
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
    fn describe(&self) -> String {
        let what = match self.kind {
            Watched::Proxies => "nexoproxies",
            Watched::Deployments => "deployments",
        };
        format!("{what} in {}", self.namespace)
    }

    /// Takes one object (as listed, added or modified): kept when owned,
    /// dropped otherwise (its labels or its proof changed).
    fn take(
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
    fn keep(
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
    fn ended(&mut self, now: Instant) {
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
    fn failed(&mut self, problem: String, now: Instant) {
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
fn listed(unproven: &mut BTreeSet<Rc<str>>, name: &str, o: &Ownership, trust: &Trust) -> bool {
    if *o == Ownership::Unproven {
        if !unproven.contains(name) {
            unproven.insert(Rc::from(name));
        }
        return trust.adopt_unproven;
    }
    unproven.remove(name);
    *o == Ownership::Owned
}

/// Every watched collection of the inventory.
#[derive(Debug)]
pub struct Index {
    trust: Trust,
    selector: String,
    sets: Vec<Set>,
    shared: Interner,
    /// Whether the heartbeat asked for it yet (a standby never does).
    started: bool,
    /// The last deploy or rollout of each deployment, while its progress
    /// is reported.
    commands: BTreeMap<CommandKey, CommandTrack>,
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
            set.version = None;
            set.stream = None;
            set.retry_at = None;
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
        let trust = &self.trust;
        let shared = &mut self.shared;
        let set = &mut self.sets[i];
        let Some(mut stream) = set.stream.take() else {
            return;
        };
        let mut outcome = Applied::Taken;
        let flow = stream.pump(|line| {
            if outcome == Applied::Taken {
                outcome = set.apply(line, trust, shared, now);
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
                set.ended(now);
            }
            (_, Applied::Expired) => {
                log::info!(
                    "inventory: the watch of {} expired (410 Gone); listing again",
                    set.describe()
                );
                set.version = None;
                set.ended(now);
            }
            (_, Applied::Broken(why)) => set.failed(why, now),
            (Err(e), Applied::Taken) => set.failed(format!("the watch broke: {e}"), now),
        }
    }

    fn open(&mut self, client: &Client, i: usize, now: Instant) {
        let trust = &self.trust;
        let selector = self.selector.clone();
        let shared = &mut self.shared;
        let set = &mut self.sets[i];
        if set.version.is_none() {
            let mut entries = Vec::new();
            let mut unproven = BTreeSet::new();
            let kind = set.kind.kind();
            let mut judge = |meta: &MetaItem| {
                let name = meta.name.as_deref().unwrap_or_default();
                listed(&mut unproven, name, &meta.ownership(kind, trust), trust)
            };
            let listed = match set.kind {
                Watched::Proxies => {
                    client.list_versioned(&set.collection, Some(&selector), PAGE, |p: ProxyItem| {
                        if judge(&p.metadata) {
                            let uid = p.metadata.uid.clone();
                            entries.extend(proxy_entry(p, shared).map(|e| (e, uid)));
                        }
                    })
                }
                Watched::Deployments => client.list_versioned(
                    &set.collection,
                    Some(&selector),
                    PAGE,
                    |d: DeploymentItem| {
                        if judge(&d.metadata) {
                            let uid = d.metadata.uid.clone();
                            entries.extend(deployment_entry(d, shared).map(|e| (e, uid)));
                        }
                    },
                ),
            };
            match listed {
                Ok(version) => {
                    set.unproven = unproven;
                    // What was remembered of the objects still there stays.
                    let mut old = std::mem::take(&mut set.entries);
                    for ((entry, observed), uid) in entries {
                        if let Some(o) = old.remove(&*entry.name) {
                            set.entries.insert(o.entry.name.clone(), o);
                        }
                        set.keep(entry, observed, uid, now);
                    }
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
                set.retry_at = None;
                set.opened_at = Some(now);
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

    /// The heartbeat's entries, sorted by namespace then name, each with
    /// its status judged at `now` (`wall`: the same instant, RFC 3339), and
    /// what may be stale; the phases that turned `failed` or `degraded`
    /// go to `turned`. The entries are shared, not copied, and sorted in
    /// place: at 10,000 proxies this costs 80 KB, where copies cost 1.9 MB
    /// (BENCHMARKS.md).
    pub fn report(
        &mut self,
        now: Instant,
        wall: &str,
        deadline: Duration,
        turned: &mut Vec<Turn>,
    ) -> (Vec<Rc<DeploymentEntry>>, Vec<String>) {
        let commands = &mut self.commands;
        let shared = &mut self.shared;
        // One copy of the time for every entry whose phase changes now.
        let wall: Rc<str> = Rc::from(wall);
        let mut entries = Vec::with_capacity(self.sets.iter().map(|s| s.entries.len()).sum());
        for set in &mut self.sets {
            for stored in set.entries.values_mut() {
                let command = if commands.is_empty() {
                    None
                } else {
                    commands
                        .get_mut(&CommandKey::of(&stored.entry))
                        .filter(|c| !c.ended)
                };
                // Judged again only when something it depends on moved:
                // the object (a watch event), a command, the clock past a
                // deadline, a command's end still shown.
                let showing_command = stored
                    .entry
                    .status
                    .as_ref()
                    .is_some_and(|s| s.command.is_some());
                let due = stored.fresh
                    || command.is_some()
                    || showing_command
                    || stored.recheck_at.is_some_and(|t| now >= t);
                if !due {
                    entries.push(stored.entry.clone());
                    continue;
                }
                stored.fresh = false;
                let (verdict, turn) = stored.track.advance(
                    &stored.observed,
                    command.as_deref(),
                    now,
                    &wall,
                    deadline,
                    shared,
                );
                stored.recheck_at = verdict.recheck_in.map(|d| now + d);
                let progress = command.map(|c| {
                    let phase = status::command_phase(c, &stored.observed, verdict.phase);
                    c.ending = phase.is_final();
                    Box::new(CommandProgress {
                        id: c.id.clone(),
                        class: c.class,
                        phase,
                    })
                });
                let o = &stored.observed;
                let status = EntryStatus {
                    phase: verdict.phase,
                    ready_replicas: o.ready,
                    updated_replicas: o.updated,
                    observed_generation: o.observed_generation,
                    generation: o.generation,
                    reason: verdict.reason,
                    message: match &stored.track.detail {
                        Some(d) => Rc::from(crate::text::clip_bytes(
                            &format!("{}; {d}", verdict.message),
                            256,
                        )),
                        None => verdict.message,
                    },
                    since: stored.track.since.clone(),
                    command: progress,
                };
                if stored.entry.status.as_ref() != Some(&status) {
                    // In place unless a heartbeat still holds it.
                    Rc::make_mut(&mut stored.entry).status = Some(status);
                }
                if let Some(turn) = turn {
                    turned.push(Turn {
                        kind: stored.entry.kind,
                        namespace: stored.entry.namespace.clone(),
                        name: stored.entry.name.clone(),
                        uid: stored.uid.clone(),
                        turned: turn,
                    });
                }
                entries.push(stored.entry.clone());
            }
        }
        entries.sort_unstable();
        let mut errors: Vec<String> = self
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
        errors.extend(
            self.sets
                .iter()
                .filter_map(|s| s.unproven_error(&self.trust)),
        );
        (entries, errors)
    }

    /// The owned NexoProxy and Deployment named `name` in `namespace`, as
    /// the watches last saw them: what a command's Events are about.
    pub fn owned(&self, namespace: &str, name: &str) -> Vec<crate::events::Regarding> {
        self.sets
            .iter()
            .filter(|s| &*s.namespace == namespace)
            .filter_map(|s| {
                let stored = s.entries.get(name)?;
                Some(crate::events::Regarding {
                    kind: s.kind.kind(),
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                    uid: stored.uid.as_deref()?.to_owned(),
                })
            })
            .collect()
    }

    /// Why a deployment is in its phase, as the kubelet says: added to
    /// its status message until the phase changes.
    pub fn explain(&mut self, kind: &str, namespace: &str, name: &str, detail: String) {
        let stored = self
            .sets
            .iter_mut()
            .filter(|s| s.kind.kind() == kind && &*s.namespace == namespace)
            .find_map(|s| s.entries.get_mut(name));
        if let Some(stored) = stored {
            stored.track.detail = Some(Rc::from(detail));
            stored.fresh = true;
        }
    }

    /// A deploy or rollout applied at `now` wrote `generation` of an owned
    /// NexoProxy or Deployment: its progress is reported from the next
    /// heartbeat until its end was in one the CP accepted.
    pub fn command_applied(
        &mut self,
        workload: &Workload,
        id: &str,
        class: &'static str,
        now: Instant,
    ) {
        let key = CommandKey {
            namespace: Rc::from(workload.namespace.as_str()),
            name: Rc::from(workload.name.as_str()),
            kind: workload.kind,
        };
        self.commands.insert(
            key,
            CommandTrack {
                id: id.to_owned(),
                class,
                generation: workload.generation,
                applied_at: now,
                ended: false,
                ending: false,
            },
        );
        // Bounded: the oldest ended ones go first, then the oldest.
        while self.commands.len() > MAX_COMMANDS {
            let oldest = self
                .commands
                .iter()
                .min_by_key(|(_, c)| (!c.ended, c.applied_at))
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => self.commands.remove(&k),
                None => break,
            };
        }
    }

    /// The heartbeat that showed the ends of commands was accepted: they
    /// are not shown again.
    pub fn heartbeat_accepted(&mut self) {
        self.commands.retain(|_, c| {
            if c.ending {
                c.ended = true;
            }
            !c.ended
        });
    }
}

/// A command's deployment.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct CommandKey {
    namespace: Rc<str>,
    name: Rc<str>,
    kind: &'static str,
}

impl CommandKey {
    /// No allocation: the entry's names are shared.
    fn of(e: &DeploymentEntry) -> CommandKey {
        CommandKey {
            namespace: e.namespace.clone(),
            name: e.name.clone(),
            kind: e.kind,
        }
    }
}

/// At most this many commands' progress is remembered.
const MAX_COMMANDS: usize = 1024;

/// An owned NexoProxy or legacy Deployment a command wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workload {
    /// `NexoProxy` or `Deployment`.
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    /// `metadata.generation` after the write.
    pub generation: i64,
    /// `metadata.uid`.
    pub uid: Option<String>,
    /// A NexoProxy's `spec.image` as written (a rollout's is kept in the
    /// drift record).
    pub image: Option<String>,
}

/// A deployment whose phase turned `failed` or `degraded`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    pub kind: &'static str,
    pub namespace: Rc<str>,
    pub name: Rc<str>,
    pub uid: Option<Box<str>>,
    pub turned: Turned,
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
