//! Leader election through a `coordination.k8s.io/v1` Lease in the Manager's
//! namespace, so that two pods (a rolling update, a mistake in replicas)
//! never heartbeat or execute at the same time.
//!
//! Timing:
//! - lease duration: 3 × the heartbeat interval, at least 5 s (45 s at the
//!   default 15 s), never shortened below 30 s by the CP's interval;
//! - renewal: on its own schedule, once half the duration has passed since
//!   the last renewal (22.5 s at the default), whatever the loop is doing:
//!   in the wait between heartbeats, while a held heartbeat waits for its
//!   answer, and at the checkpoints and pauses of a command's own
//!   Kubernetes calls (`wait.rs` runs it as the loop's duty); and before
//!   the first command of a batch, then before each next one once a third
//!   has passed. So half the duration is to spare at each renewal, more
//!   than the third docs/protocol.md asks for while a heartbeat is held. A
//!   leader renews with one PUT on the `resourceVersion` it wrote last (a
//!   409 sends it back to reading the lease): leading costs 2.7 requests a
//!   minute at the default interval, however often heartbeats go;
//! - renew deadline: 2/3 of the duration (30 s); past it, a leader writes
//!   nothing and re-reads the lease before acting (a process resumed after
//!   a long stop does not act on stale leadership);
//! - retry period: a follower checks once per heartbeat interval.
//!
//! Expiry is judged as client-go judges it: by this process's monotonic
//! clock, from the moment it saw the lease record last change, never by
//! comparing the holder's `renewTime` with this node's wall clock (nodes'
//! clocks differ). A leader counts its renew deadline from the moment it
//! sent its last successful renewal, which is before any follower can have
//! seen it, so it stops acting before its lease can be taken.
//!
//! The decision ([`decide`]) is a pure function of the lease, when it was
//! seen to change, and the clock.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use crate::clock::BootInstant;
use crate::kube::client::{Body, Method};
use crate::kube::{self, Client};
use crate::resource;

/// The shortest lease a Control Plane's interval can make (docs/protocol.md:
/// the CP sets the interval, never the fence's tolerance of a stall).
pub const CP_FLOOR: Duration = Duration::from_secs(30);

/// The lease duration for the heartbeat `interval` in force and the
/// `configured` one: 3 × the interval, at least 5 s, and never shorter
/// because the CP shortened the interval than 30 s (or 3 × the configured
/// interval, when the operator chose that shorter).
pub fn duration_for(interval: Duration, configured: Duration) -> Duration {
    (interval * 3)
        .max((configured * 3).min(CP_FLOOR))
        .max(Duration::from_secs(5))
}

/// The leader's fence (docs/protocol.md, "Leader election and the lease fence"): before every request
/// that may change the cluster and every ack, the age of the last
/// successful renewal, measured with `CLOCK_BOOTTIME` (it counts a stopped
/// process and a suspended machine), must be under the renew deadline, 2/3
/// of the lease duration, counted from when the renewal was sent, before
/// any follower could see it. Past it, nothing is written: a process
/// frozen mid-command and resumed after another took over writes nothing
/// more. The lease's own requests pass (they are how it renews).
#[derive(Debug)]
pub struct LeaseFence {
    lease_path: String,
    collection: String,
    renewed_at: Cell<Option<BootInstant>>,
    duration: Cell<Duration>,
}

impl LeaseFence {
    /// The age of the last successful renewal, if there is one and the
    /// clock can be read.
    fn age(&self) -> Option<Duration> {
        Some(BootInstant::now()?.since(self.renewed_at.get()?))
    }

    /// Whether this process may still act as the leader.
    pub fn holds(&self) -> bool {
        self.age()
            .is_some_and(|age| age < self.duration.get() * 2 / 3)
    }
}

impl kube::client::Fence for LeaseFence {
    fn may_write(&self, _method: &Method, path: &str) -> bool {
        path == self.lease_path || path == self.collection || self.holds()
    }
}

/// What the Lease says.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// `spec.holderIdentity`; empty or absent when released.
    pub holder: Option<String>,
    /// `spec.leaseDurationSeconds`.
    pub duration: Duration,
    /// `spec.renewTime`.
    pub renewed: Option<SystemTime>,
    /// `spec.leaseTransitions`.
    pub transitions: i64,
}

impl Record {
    /// Reads a Lease object.
    pub fn from_object(lease: &Value) -> Record {
        let spec = &lease["spec"];
        Record {
            holder: spec["holderIdentity"]
                .as_str()
                .filter(|h| !h.is_empty())
                .map(str::to_owned),
            duration: Duration::from_secs(spec["leaseDurationSeconds"].as_u64().unwrap_or(15)),
            renewed: spec["renewTime"]
                .as_str()
                .and_then(|t| humantime::parse_rfc3339_weak(t).ok()),
            transitions: spec["leaseTransitions"].as_i64().unwrap_or(0),
        }
    }
}

/// What to do about the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Take it or keep it; `takeover` when it changes hands.
    Lead {
        /// The holder changes.
        takeover: bool,
    },
    /// Someone else holds it.
    Follow {
        /// The holder.
        holder: String,
    },
}

/// Decides from the lease (absent: never created), the local time at which
/// this record was first seen (`observed_at`), and the local clock.
pub fn decide(record: Option<&Record>, me: &str, observed_at: Instant, now: Instant) -> Decision {
    let Some(r) = record else {
        return Decision::Lead { takeover: true };
    };
    match &r.holder {
        None => Decision::Lead { takeover: true },
        Some(h) if h == me => Decision::Lead { takeover: false },
        Some(h) => {
            // A duration too long for the clock never expires.
            let expired = observed_at
                .checked_add(r.duration)
                .is_some_and(|t| t <= now);
            if expired {
                Decision::Lead { takeover: true }
            } else {
                Decision::Follow { holder: h.clone() }
            }
        }
    }
}

/// The Manager's side of the election.
#[derive(Debug)]
pub struct Elector {
    collection: String,
    path: String,
    name: String,
    identity: String,
    /// When the lease was last renewed, shared with the Kubernetes client.
    fence: Rc<LeaseFence>,
    /// Counts the times leadership began anew (a take-over, or a take
    /// after the renew deadline passed): the state is read again whenever
    /// it changes.
    term: u64,
    following: Option<String>,
    /// The holder this Manager took the lease over from, in its current
    /// term (none: the lease was free, absent or its own).
    taken_from: Option<String>,
    /// The lease as the server returned it after this Manager's last write.
    written: Option<Value>,
    /// The lease record last read, and the local time it was first seen so.
    observed: Option<(Record, Instant)>,
}

impl Elector {
    /// The Lease `name` in `namespace`, for `identity` (the pod uid).
    pub fn new(namespace: &str, name: &str, identity: &str) -> Elector {
        let collection = resource::LEASES.collection(Some(namespace));
        let path = resource::LEASES.object(Some(namespace), name);
        Elector {
            fence: Rc::new(LeaseFence {
                lease_path: path.clone(),
                collection: collection.clone(),
                renewed_at: Cell::new(None),
                duration: Cell::new(Duration::from_secs(5)),
            }),
            path,
            collection,
            name: name.to_owned(),
            identity: identity.to_owned(),
            term: 0,
            following: None,
            taken_from: None,
            written: None,
            observed: None,
        }
    }

    /// Takes or renews the lease. `Ok(false)`: another holder has it.
    pub fn try_lead(&mut self, client: &Client, duration: Duration) -> Result<bool, kube::Error> {
        if self.renew(client, duration)? {
            return Ok(true);
        }
        let existing = client.get_opt::<Value>(&self.path)?;
        let record = existing.as_ref().map(Record::from_object);
        let seen = Instant::now();
        let observed_at = match (&record, &self.observed) {
            (Some(r), Some((last, at))) if r == last => *at,
            _ => seen,
        };
        self.observed = record.clone().map(|r| (r, observed_at));
        match decide(record.as_ref(), &self.identity, observed_at, seen) {
            Decision::Follow { holder } => {
                if self.following.as_deref() != Some(holder.as_str()) {
                    crate::info!(
                        lease = self.name.as_str(), holder:% = holder;
                        "following: the lease is held by another"
                    );
                    self.following = Some(holder);
                }
                self.fence.renewed_at.set(None);
                Ok(false)
            }
            Decision::Lead { takeover } => self.take(client, existing, takeover, duration),
        }
    }

    /// Within the renew deadline nobody else can have taken the lease (it
    /// has not expired), so the renewal is one PUT on the version written
    /// last. `Ok(false)`: not leading, or a 409 (someone wrote since): the
    /// lease must be read.
    fn renew(&mut self, client: &Client, duration: Duration) -> Result<bool, kube::Error> {
        let Some(mut lease) = self.written.take().filter(|_| self.leading()) else {
            return Ok(false);
        };
        let sent = BootInstant::now();
        lease["spec"]["renewTime"] =
            json!(humantime::format_rfc3339_micros(SystemTime::now()).to_string());
        lease["spec"]["leaseDurationSeconds"] = json!(duration.as_secs());
        match client.replace(&self.path, &lease) {
            Ok(written) => {
                self.renewed(written, duration, sent);
                Ok(true)
            }
            Err(e) if e.is_conflict() => {
                crate::debug!(
                    lease = self.name.as_str();
                    "the lease changed since it was renewed; reading it"
                );
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Writes the lease as this Manager's (created when absent, replaced
    /// at the version read otherwise). `Ok(false)`: another candidate
    /// wrote first.
    fn take(
        &mut self,
        client: &Client,
        existing: Option<Value>,
        takeover: bool,
        duration: Duration,
    ) -> Result<bool, kube::Error> {
        let stamp = humantime::format_rfc3339_micros(SystemTime::now()).to_string();
        let record = existing.as_ref().map(Record::from_object);
        let transitions =
            record.as_ref().map_or(0, |r| r.transitions) + i64::from(takeover && record.is_some());
        let mut lease = json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": self.name},
            "spec": {"holderIdentity": self.identity, "leaseDurationSeconds": duration.as_secs(),
                     "renewTime": stamp, "leaseTransitions": transitions},
        });
        let acquired = existing
            .as_ref()
            .and_then(|l| l["spec"]["acquireTime"].as_str())
            .filter(|_| !takeover);
        lease["spec"]["acquireTime"] = json!(acquired.map(str::to_owned).unwrap_or(stamp));
        let continuing = !takeover && self.leading();
        let sent = BootInstant::now();
        let written = match &existing {
            None => client.create(&self.collection, &lease),
            Some(old) => {
                lease["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
                client.replace(&self.path, &lease)
            }
        };
        match written {
            Ok(written) => {
                if !continuing {
                    self.term += 1;
                    self.taken_from = record
                        .and_then(|r| r.holder)
                        .filter(|h| !h.is_empty() && *h != self.identity);
                    crate::info!(
                        lease = self.name.as_str(),
                        identity = self.identity.as_str(),
                        term = self.term;
                        "leading: holding the lease"
                    );
                }
                self.following = None;
                self.renewed(written, duration, sent);
                Ok(true)
            }
            // Another candidate wrote first.
            Err(e) if e.is_conflict() => {
                self.fence.renewed_at.set(None);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    fn renewed(&mut self, written: Value, duration: Duration, sent: Option<BootInstant>) {
        self.written = Some(written).filter(|w| w["metadata"]["resourceVersion"].is_string());
        self.fence.renewed_at.set(sent);
        self.fence.duration.set(duration);
    }

    /// The fence the Kubernetes client asks before every write.
    pub fn fence(&self) -> Rc<LeaseFence> {
        Rc::clone(&self.fence)
    }

    /// The current term: it changes whenever leadership begins anew.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// The holder this Manager took the lease over from in its current
    /// term; none when the lease was free, absent or already its own.
    pub fn taken_from(&self) -> Option<&str> {
        self.taken_from.as_deref()
    }

    /// Whether a leader should renew now: half the lease has passed since
    /// the last renewal (or there is none).
    pub fn renewal_due(&self) -> bool {
        self.fence
            .age()
            .is_none_or(|age| age >= self.fence.duration.get() / 2)
    }

    /// Whether a leader about to run a command should renew first: a
    /// third of the lease has passed, so the command may not have the
    /// rest of its renew deadline to finish in.
    pub fn renewal_due_for_command(&self) -> bool {
        self.fence
            .age()
            .is_none_or(|age| age >= self.fence.duration.get() / 3)
    }

    /// When the next renewal is due, for a leader that can renew with one
    /// PUT; `None` otherwise (a follower, or a lease to read again first:
    /// the loop's next cycle does that).
    pub fn next_renewal(&self, now: Instant) -> Option<Instant> {
        self.written.as_ref()?;
        let age = self.fence.age()?;
        Some(now + (self.fence.duration.get() / 2).saturating_sub(age))
    }

    /// The scheduled renewal, with the duration of the last one. `Ok(false)`:
    /// someone wrote the lease since (409); the loop reads it next cycle.
    pub fn renew_scheduled(&mut self, client: &Client) -> Result<bool, kube::Error> {
        let duration = self.fence.duration.get();
        let written = self.written.clone();
        let result = self.renew(client, duration);
        if result.is_err() {
            // Not known to have changed: the next attempt PUTs the same
            // version (a 409 then if the failed one was written after all).
            self.written = written;
        }
        result
    }

    /// Whether the last renewal is recent enough to act on (within the
    /// renew deadline, by `CLOCK_BOOTTIME`): the fence holds.
    pub fn leading(&self) -> bool {
        self.fence.holds()
    }

    /// Gives the lease up on a clean stop, so a successor need not wait for
    /// it to expire. Best effort, bounded by the quick timeout: when the API
    /// server is going away too, the lease simply expires.
    pub fn release(&mut self, client: &Client) {
        self.written = None;
        if self.fence.renewed_at.take().is_none() {
            return;
        }
        let Ok(mut lease) = client.request_quick(Method::GET, &self.path, None) else {
            return;
        };
        if lease["spec"]["holderIdentity"] != self.identity.as_str() {
            return;
        }
        lease["spec"]["holderIdentity"] = Value::Null;
        let Ok(bytes) = serde_json::to_vec(&lease) else {
            return;
        };
        let body = Body {
            content_type: "application/json",
            bytes: &bytes,
        };
        match client.request_quick(Method::PUT, &self.path, Some(body)) {
            Ok(_) => crate::info!(lease = self.name.as_str(); "released the lease"),
            Err(e) => {
                crate::warn!(lease = self.name.as_str(), err:% = e; "cannot release the lease")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(holder: Option<&str>, renewed_ago: u64) -> Record {
        Record {
            holder: holder.map(str::to_owned),
            duration: Duration::from_secs(15),
            renewed: Some(SystemTime::now() - Duration::from_secs(renewed_ago)),
            transitions: 2,
        }
    }

    #[test]
    fn decisions() {
        let now = Instant::now();
        let ago = |s: u64| now - Duration::from_secs(s);
        assert_eq!(
            decide(None, "a", now, now),
            Decision::Lead { takeover: true }
        );
        assert_eq!(
            decide(Some(&record(Some("a"), 1)), "a", ago(1), now),
            Decision::Lead { takeover: false }
        );
        assert_eq!(
            decide(Some(&record(Some("b"), 1)), "a", ago(1), now),
            Decision::Follow { holder: "b".into() }
        );
        assert_eq!(
            decide(Some(&record(Some("b"), 1)), "a", ago(20), now),
            Decision::Lead { takeover: true },
            "unchanged for longer than its duration, as seen here"
        );
        assert_eq!(
            decide(Some(&record(None, 1)), "a", now, now),
            Decision::Lead { takeover: true }
        );
    }

    #[test]
    fn expiry_is_judged_by_the_local_clock_not_the_holders() {
        let now = Instant::now();
        // The holder's clock is an hour behind: its renewTime looks stale,
        // but the record just changed, so it is alive.
        let behind = record(Some("b"), 3600);
        assert_eq!(
            decide(Some(&behind), "a", now, now),
            Decision::Follow { holder: "b".into() }
        );
        // An hour ahead: the renewTime looks fresh for an hour, but the
        // record has not changed for longer than its duration.
        let mut ahead = record(Some("b"), 0);
        ahead.renewed = Some(SystemTime::now() + Duration::from_secs(3600));
        assert_eq!(
            decide(Some(&ahead), "a", now - Duration::from_secs(16), now),
            Decision::Lead { takeover: true }
        );
        // A duration no clock can add never expires, and does not panic.
        let mut forever = record(Some("b"), 0);
        forever.duration = Duration::from_secs(u64::MAX);
        assert_eq!(
            decide(Some(&forever), "a", now, now),
            Decision::Follow { holder: "b".into() }
        );
    }

    #[test]
    fn durations_follow_the_interval() {
        let s = Duration::from_secs;
        assert_eq!(duration_for(s(15), s(15)), s(45));
        assert_eq!(duration_for(s(1), s(1)), s(5));
        assert_eq!(
            duration_for(s(600), s(15)),
            s(1800),
            "a longer interval lengthens it"
        );
        // A CP-set interval never shortens the lease below 30 s...
        assert_eq!(duration_for(s(5), s(15)), s(30));
        assert_eq!(duration_for(s(5), s(60)), s(30));
        // ...nor below what the operator's shorter interval gives.
        assert_eq!(duration_for(s(5), s(2)), s(15));
        assert_eq!(duration_for(s(5), s(1)), s(15));
    }

    #[test]
    fn the_fence_holds_until_the_renew_deadline_and_lets_the_lease_through() {
        use crate::kube::client::Fence as _;
        let elector = Elector::new("ns", "nexo-manager", "me");
        let fence = elector.fence();
        assert!(!fence.holds(), "never renewed: nothing may be written");
        assert!(!fence.may_write(&Method::PATCH, "/api/v1/namespaces/ns/configmaps/x"));
        assert!(
            fence.may_write(&Method::PUT, &elector.path),
            "the lease itself"
        );
        assert!(fence.may_write(&Method::POST, &elector.collection));
        fence.duration.set(Duration::from_millis(300));
        fence.renewed_at.set(BootInstant::now());
        assert!(fence.holds());
        assert!(fence.may_write(&Method::DELETE, "/api/v1/namespaces/ns/secrets/s"));
        // 2/3 of 300 ms later, it no longer holds.
        std::thread::sleep(Duration::from_millis(210));
        assert!(!fence.holds());
        assert!(!elector.leading());
        assert!(elector.renewal_due());
    }

    #[test]
    fn lease_objects_are_read() {
        let r = Record::from_object(
            &json!({"spec": {"holderIdentity": "x", "leaseDurationSeconds": 9,
            "renewTime": "2026-12-02T14:20:00.123456Z", "leaseTransitions": 3}}),
        );
        assert_eq!(
            (r.holder.as_deref(), r.duration, r.transitions),
            (Some("x"), Duration::from_secs(9), 3)
        );
        assert!(r.renewed.is_some());
        assert_eq!(
            Record::from_object(&json!({"spec": {"holderIdentity": ""}})).holder,
            None
        );
    }
}
