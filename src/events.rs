//! Kubernetes Events (`events.k8s.io/v1`) of what the Manager did, so that
//! `kubectl describe` and `kubectl events` tell it without the logs
//! (docs/protocol.md, "Kubernetes Events").
//!
//! [`Recorder`] decides, from plain values and the clock: an event is
//! queued (never written where it happens, so it never blocks a command);
//! the same event about the same object within [`SERIES_WINDOW`] of the
//! last becomes a series (one Event, its `series.count` raised, repeats
//! not yet written coalesced in the queue); at most [`PER_MINUTE`] writes
//! a minute, the rest waiting in a bounded queue. [`flush`] is the thin
//! I/O: each write one attempt, all of them within [`BUDGET`] a wake-up;
//! a denied one is a warning, never a failure of anything.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use crate::kube::client::{Body, MERGE_PATCH, Method, to_json};
use crate::kube::{self, Client};
use crate::resource::{self, Kind};

/// The `reportingController` of every Event.
pub const REPORTING_CONTROLLER: &str = "nexo.io/manager";
/// The same event within this long of the last becomes a series.
pub const SERIES_WINDOW: Duration = Duration::from_secs(10 * 60);
/// At most this many Event writes (creations and series updates) a minute.
pub const PER_MINUTE: usize = 30;
/// Events waiting to be written; past it, new ones are dropped (counted).
pub const QUEUE: usize = 64;
/// Series remembered; past it, the oldest is forgotten (its next repeat
/// starts a new Event).
const SERIES_KEPT: usize = 512;
/// What writing Events may take of one wake-up of the loop, all writes
/// together (docs/protocol.md, "Hostile and buggy values": Events and metrics
/// never delay a command or a heartbeat by more than 250 ms a wake-up).
/// What does not fit waits for the next; a write the budget cut short is
/// dropped, counted.
pub const BUDGET: Duration = Duration::from_millis(250);
/// The least time a write is started with.
const LEAST_WRITE: Duration = Duration::from_millis(20);
/// The API server's limit on `note`.
const NOTE_BYTES: usize = 1024;

/// Why an Event was recorded (its `reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// A command applied.
    Applied,
    /// A command failed.
    Failed,
    /// A command refused by the content policy or the ownership rules.
    Refused,
    /// Drift found.
    DriftDetected,
    /// Drift corrected (`enforce`).
    DriftCorrected,
    /// The phase turned `failed`.
    ProgressFailed,
    /// The phase turned `degraded`.
    Degraded,
    /// A failed change rolled back, or its rollback failed
    /// (docs/protocol.md, `rollback.v1`).
    RolledBack,
    /// The Manager's own life (on its Deployment): connected and bound to
    /// the Control Plane.
    Bound,
    /// The Manager's own life: this pod leads (a new lease term).
    LeaderElected,
    /// The Manager's own life: an upgrade of itself applied.
    SelfUpgradeStarted,
    /// The Manager's own life: the upgraded pods are Ready.
    SelfUpgradeAvailable,
    /// The Manager's own life: a command refused for its signature.
    SignatureRefused,
}

impl Reason {
    /// The `reason` field.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Applied => "Applied",
            Reason::Failed => "Failed",
            Reason::Refused => "Refused",
            Reason::DriftDetected => "DriftDetected",
            Reason::DriftCorrected => "DriftCorrected",
            Reason::ProgressFailed => "ProgressFailed",
            Reason::Degraded => "Degraded",
            Reason::RolledBack => "RolledBack",
            Reason::Bound => "Bound",
            Reason::LeaderElected => "LeaderElected",
            Reason::SelfUpgradeStarted => "SelfUpgradeStarted",
            Reason::SelfUpgradeAvailable => "SelfUpgradeAvailable",
            Reason::SignatureRefused => "SignatureRefused",
        }
    }

    /// The `type` field: what needs a person's attention is a `Warning`.
    pub fn kind(self) -> &'static str {
        match self {
            Reason::Applied
            | Reason::DriftCorrected
            | Reason::Bound
            | Reason::LeaderElected
            | Reason::SelfUpgradeStarted
            | Reason::SelfUpgradeAvailable => "Normal",
            _ => "Warning",
        }
    }
}

/// The object an Event is about: an owned NexoProxy or legacy Deployment.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Regarding {
    /// `NexoProxy` or `Deployment`.
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// One event to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub regarding: Regarding,
    pub reason: Reason,
    /// What the Manager did or tried (`Deploy`, `Rollout`, `CheckDrift`,
    /// `ObserveStatus`, ...).
    pub action: &'static str,
    /// Human-readable; clipped to the API server's 1 KiB.
    pub note: String,
}

/// The `action` of a command's Event, from its class.
pub fn command_action(class: &str) -> &'static str {
    match class {
        "deploy" => "Deploy",
        "rollout" => "Rollout",
        "upgrade" => "Upgrade",
        "uninstall" => "Uninstall",
        _ => "Command",
    }
}

/// What makes two events the same (as client-go's recorder decides: the
/// object, the reason and the action; not the note).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    uid: String,
    reason: Reason,
    action: &'static str,
}

#[derive(Debug)]
struct Series {
    /// The Event's name.
    name: String,
    namespace: String,
    count: u32,
    /// How many the API server has (0: not created yet).
    written: u32,
    last: Instant,
    last_wall: SystemTime,
}

#[derive(Debug)]
enum Pending {
    Create {
        key: Key,
        event: Event,
        at: SystemTime,
    },
    Count {
        key: Key,
    },
}

/// One write for [`flush`] to send.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// POST the Event.
    Create { namespace: String, body: Value },
    /// PATCH (merge) the series of Event `name`.
    Count {
        namespace: String,
        name: String,
        body: Value,
    },
}

/// Why an event was not written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// The queue was full.
    QueueFull,
    /// The API server refused it (RBAC, admission): a warning, nothing more.
    Denied,
    /// Any other error (no answer, a 5xx, a conflict).
    Error,
}

impl Dropped {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Dropped::QueueFull => "queue_full",
            Dropped::Denied => "denied",
            Dropped::Error => "error",
        }
    }
}

/// The Events waiting to be written, the series they belong to and the
/// writes of the last minute.
#[derive(Debug)]
pub struct Recorder {
    instance: String,
    queue: VecDeque<Pending>,
    series: HashMap<Key, Series>,
    writes: VecDeque<Instant>,
    /// The key of the write [`Recorder::next`] handed out last.
    sending: Option<(Key, bool)>,
    /// The time in the last Event's name, nanoseconds: each name's is
    /// later, so two Events recorded in the same instant never collide.
    named: u128,
}

impl Recorder {
    /// `instance`: the `reportingInstance` (the pod's name).
    pub fn new(instance: &str) -> Recorder {
        Recorder {
            instance: crate::text::clip_bytes(instance, 128).to_owned(),
            queue: VecDeque::new(),
            series: HashMap::new(),
            writes: VecDeque::new(),
            sending: None,
            named: 0,
        }
    }

    /// Queues `event`; `Err` when it was dropped (the queue full).
    pub fn record(&mut self, event: Event, now: Instant, wall: SystemTime) -> Result<(), Dropped> {
        let key = Key {
            uid: event.regarding.uid.clone(),
            reason: event.reason,
            action: event.action,
        };
        if let Some(s) = self.series.get_mut(&key)
            && now.saturating_duration_since(s.last) < SERIES_WINDOW
        {
            s.count += 1;
            s.last = now;
            s.last_wall = wall;
            // A repeat whose Event or count is still queued goes with it.
            let queued = self.queue.iter().any(|p| match p {
                Pending::Create { key: k, .. } | Pending::Count { key: k } => *k == key,
            });
            if queued {
                return Ok(());
            }
            if self.queue.len() >= QUEUE {
                return Err(Dropped::QueueFull);
            }
            self.queue.push_back(Pending::Count { key });
            return Ok(());
        }
        if self.queue.len() >= QUEUE {
            return Err(Dropped::QueueFull);
        }
        if self.series.len() >= SERIES_KEPT {
            let oldest = self
                .series
                .iter()
                .min_by_key(|(_, s)| s.last)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                self.series.remove(&k);
            }
        }
        let nanos = wall
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
            .max(self.named + 1);
        self.named = nanos;
        // `<object>.<nanoseconds, hex>`, as client-go names Events; 253
        // bytes for a name, the suffix takes at most 33.
        let name = format!(
            "{}.{nanos:x}",
            crate::text::clip_bytes(&event.regarding.name, 200)
        );
        self.series.insert(
            key.clone(),
            Series {
                name,
                namespace: event.regarding.namespace.clone(),
                count: 1,
                written: 0,
                last: now,
                last_wall: wall,
            },
        );
        self.queue.push_back(Pending::Create {
            key,
            event,
            at: wall,
        });
        Ok(())
    }

    /// How many wait.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// The next write, if one waits and the last minute's writes allow it.
    pub fn next(&mut self, now: Instant) -> Option<Write> {
        while self
            .writes
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= Duration::from_secs(60))
        {
            self.writes.pop_front();
        }
        loop {
            if self.writes.len() >= PER_MINUTE {
                return None;
            }
            let pending = self.queue.pop_front()?;
            let (key, create) = match &pending {
                Pending::Create { key, .. } => (key.clone(), true),
                Pending::Count { key } => (key.clone(), false),
            };
            let Some(series) = self.series.get(&key) else {
                continue;
            };
            let write = match pending {
                Pending::Create { event, at, .. } => Write::Create {
                    namespace: series.namespace.clone(),
                    body: self.body(&event, series, at),
                },
                // Nothing new since the last write, or the Event never made.
                Pending::Count { .. } if series.written == 0 || series.count == series.written => {
                    continue;
                }
                Pending::Count { .. } => Write::Count {
                    namespace: series.namespace.clone(),
                    name: series.name.clone(),
                    body: json!({"series": {
                        "count": series.count,
                        "lastObservedTime": micro_time(series.last_wall),
                    }}),
                },
            };
            let count = series.count;
            if let Some(s) = self.series.get_mut(&key) {
                // Optimistic: undone by `failed`.
                s.written = count;
            }
            self.sending = Some((key, create));
            self.writes.push_back(now);
            return Some(write);
        }
    }

    /// The write handed out last failed: a failed creation forgets its
    /// series, so the next repeat creates the Event again.
    pub fn failed(&mut self) {
        if let Some((key, create)) = self.sending.take() {
            if create {
                self.series.remove(&key);
            } else if let Some(s) = self.series.get_mut(&key) {
                s.written = 1.max(s.written.saturating_sub(1));
            }
        }
    }

    fn body(&self, event: &Event, series: &Series, at: SystemTime) -> Value {
        let r = &event.regarding;
        let mut body = json!({
            "apiVersion": resource::EVENTS.api_version,
            "kind": resource::EVENTS.kind,
            "metadata": {"name": series.name, "namespace": r.namespace},
            "eventTime": micro_time(at),
            "reportingController": REPORTING_CONTROLLER,
            "reportingInstance": self.instance,
            "action": event.action,
            "reason": event.reason.as_str(),
            "type": event.reason.kind(),
            "note": crate::text::clip_bytes(&event.note, NOTE_BYTES),
            "regarding": {
                "apiVersion": r.kind.api_version(),
                "kind": r.kind.name(),
                "namespace": r.namespace,
                "name": r.name,
                "uid": r.uid,
            },
        });
        if series.count > 1 {
            body["series"] = json!({
                "count": series.count,
                "lastObservedTime": micro_time(series.last_wall),
            });
        }
        body
    }
}

/// A `MicroTime`: RFC 3339 with microseconds.
fn micro_time(t: SystemTime) -> String {
    humantime::format_rfc3339_micros(t).to_string()
}

/// Writes what the rate and `budget` allow, each write one attempt (no
/// retry) within what is left of the budget, so that a slow or refusing
/// API server costs at most `budget` a call and never a command's time:
/// called between heartbeats, after a batch is acknowledged. What is left
/// waits for the next call.
pub fn flush(recorder: &mut Recorder, kube: &Client, budget: Duration) {
    let started = Instant::now();
    loop {
        let left = budget.saturating_sub(started.elapsed());
        if left < LEAST_WRITE {
            if recorder.queued() > 0 {
                crate::debug!(
                    queued = recorder.queued();
                    "Events wait for the next wake-up (budget spent)"
                );
            }
            return;
        }
        let Some(write) = recorder.next(Instant::now()) else {
            return;
        };
        let (path, method, content_type, body) = match &write {
            Write::Create { namespace, body } => (
                resource::EVENTS.collection(Some(namespace)),
                Method::POST,
                "application/json",
                body,
            ),
            Write::Count {
                namespace,
                name,
                body,
            } => (
                resource::EVENTS.object(Some(namespace), name),
                Method::PATCH,
                MERGE_PATCH,
                body,
            ),
        };
        let bytes = match to_json("event", body) {
            Ok(b) => b,
            Err(e) => {
                crate::warn!(err:% = e; "event not written");
                recorder.failed();
                crate::metrics::event_dropped(Dropped::Error.as_str());
                continue;
            }
        };
        let sent = kube.request_within(
            method,
            &path,
            Some(Body {
                content_type,
                bytes: &bytes,
            }),
            left,
        );
        match sent {
            Ok(_) => crate::metrics::event_written(),
            Err(e) => {
                recorder.failed();
                let dropped = if e.is_rejected() {
                    Dropped::Denied
                } else {
                    Dropped::Error
                };
                crate::metrics::event_dropped(dropped.as_str());
                if matches!(e, kube::Error::Fenced) {
                    crate::info!("event not written: not leading");
                } else {
                    crate::warn!(path:% = path, err:% = e; "event not written");
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "events_tests.rs"]
mod tests;
