//! The Manager's own Deployment as it rolls out: an upgrade that does not
//! complete (the new pod crashes, or never becomes Ready) is reported in the
//! heartbeat's `inventoryErrors`, so the Control Plane sees it while the old
//! pod goes on leading.
//!
//! The decision ([`Watch::observe`]) is a pure function of a projection of
//! the Deployment and the clock. The Deployment is read at the first
//! heartbeat, at every heartbeat after an applied upgrade and while a
//! rollout is in progress, and otherwise when its watch says it changed
//! (or, while it cannot be watched, every [`QUIET_REFRESH`]).

use std::time::{Duration, Instant};

use serde::Deserialize;

/// How often the Deployment is read while no rollout is in progress.
pub const QUIET_REFRESH: Duration = Duration::from_secs(300);

/// A rollout still in progress after this many heartbeat intervals is
/// reported as stalled.
pub const STALLED_AFTER_INTERVALS: u32 = 3;

/// The fields of an `apps/v1` Deployment the watch reads.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SelfDeployment {
    /// `metadata`.
    #[serde(default)]
    pub metadata: Meta,
    /// `spec`.
    #[serde(default)]
    pub spec: Spec,
    /// `status`.
    #[serde(default)]
    pub status: Status,
}

/// `metadata.generation` and `uid`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct Meta {
    /// The generation of the spec.
    #[serde(default)]
    pub generation: i64,
    /// The Deployment's uid (what its Events are about).
    #[serde(default)]
    pub uid: String,
}

/// `spec.replicas` and the pod template's containers.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct Spec {
    /// Desired replicas (1 when absent).
    pub replicas: Option<i64>,
    /// The pod template.
    #[serde(default)]
    pub template: Template,
}

/// `spec.template`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct Template {
    /// `spec.template.spec`.
    #[serde(default)]
    pub spec: PodSpec,
}

/// `spec.template.spec.containers`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct PodSpec {
    /// Containers.
    #[serde(default)]
    pub containers: Vec<Container>,
}

/// A container's name and image.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct Container {
    /// Name.
    #[serde(default)]
    pub name: String,
    /// Image.
    #[serde(default)]
    pub image: String,
}

/// The rollout counters and the `Progressing` condition.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// The generation the controller acted on.
    #[serde(default)]
    pub observed_generation: i64,
    /// Pods of any template.
    #[serde(default)]
    pub replicas: i64,
    /// Pods of the current template.
    #[serde(default)]
    pub updated_replicas: i64,
    /// Available pods.
    #[serde(default)]
    pub available_replicas: i64,
    /// Conditions.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// A Deployment condition.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct Condition {
    /// `Progressing`, `Available`, …
    #[serde(rename = "type", default)]
    pub kind: String,
    /// Machine-readable reason.
    #[serde(default)]
    pub reason: String,
}

impl SelfDeployment {
    /// The Manager's image in the current template: the container named
    /// `manager`, else the only one.
    pub fn manager_image(&self) -> Option<&str> {
        let containers = &self.spec.template.spec.containers;
        containers
            .iter()
            .find(|c| c.name == "manager")
            .or(if containers.len() == 1 {
                containers.first()
            } else {
                None
            })
            .map(|c| c.image.as_str())
    }

    /// Whether the rollout of the current template is still in progress.
    pub fn in_progress(&self) -> bool {
        let want = self.spec.replicas.unwrap_or(1);
        let s = &self.status;
        s.observed_generation < self.metadata.generation
            || s.updated_replicas < want
            || s.replicas > s.updated_replicas
            || s.available_replicas < want
    }

    fn deadline_exceeded(&self) -> bool {
        self.status
            .conditions
            .iter()
            .any(|c| c.kind == "Progressing" && c.reason == "ProgressDeadlineExceeded")
    }
}

/// Where an upgrade of the Manager stands, from its Deployment
/// (docs/protocol.md, `rollback.v1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpgradeVerdict {
    /// Rolling out, within its deadline.
    Waiting,
    /// The Deployment runs another image than the upgrade's: changed since
    /// (rolled back, upgraded again, or by hand).
    Replaced,
    /// Every replica of the upgrade's template available, no old one left.
    Available,
    /// Not Ready in time, or the Deployment's own deadline passed: why.
    Overdue(String),
}

/// The verdict on the upgrade to `to_image` from the Deployment `d`;
/// `waited`: how long since this process applied it (`None`: another did,
/// and only the Deployment's own deadline counts).
pub fn upgrade_verdict(
    d: &SelfDeployment,
    to_image: &str,
    waited: Option<Duration>,
    deadline: Duration,
) -> UpgradeVerdict {
    if d.manager_image() != Some(to_image) {
        return UpgradeVerdict::Replaced;
    }
    if !d.in_progress() {
        return UpgradeVerdict::Available;
    }
    let s = &d.status;
    let counts = format!(
        "{}/{} updated, {} available",
        s.updated_replicas,
        d.spec.replicas.unwrap_or(1),
        s.available_replicas
    );
    if d.deadline_exceeded() {
        return UpgradeVerdict::Overdue(format!(
            "the Deployment reports ProgressDeadlineExceeded ({counts})"
        ));
    }
    match waited {
        Some(w) if w >= deadline => UpgradeVerdict::Overdue(format!(
            "the new pods were not Ready within {} ({counts})",
            humantime::format_duration(deadline)
        )),
        _ => UpgradeVerdict::Waiting,
    }
}

/// What the watch remembers between heartbeats.
#[derive(Debug, Default)]
pub struct Watch {
    /// When the Deployment was read last.
    read_at: Option<Instant>,
    /// Since when the rollout of `image` has been seen in progress.
    in_progress: Option<(Instant, String)>,
    /// An upgrade was applied since the last read.
    upgraded: bool,
    /// The Deployment as last read.
    pub last: Option<SelfDeployment>,
    /// The upgrade this process applied, and when: the only one it may
    /// roll back.
    pub applied: Option<(String, Instant)>,
}

impl Watch {
    /// Whether the Deployment should be read for this heartbeat.
    pub fn due(&self, now: Instant, refresh: crate::kube::changes::Refresh) -> bool {
        self.upgraded || self.in_progress.is_some() || refresh.due(self.read_at, now, QUIET_REFRESH)
    }

    /// An upgrade command was applied: read at the next heartbeats.
    pub fn upgrade_applied(&mut self, command_id: &str, now: Instant) {
        self.upgraded = true;
        self.applied = Some((command_id.to_owned(), now));
    }

    /// The Deployment could not be read (absent when not run from it, or
    /// not readable): try again after [`QUIET_REFRESH`].
    pub fn unreadable(&mut self, now: Instant) {
        self.read_at = Some(now);
        self.upgraded = false;
        self.in_progress = None;
        self.last = None;
    }

    /// Takes a reading; returns the stalled-upgrade report, if any.
    pub fn observe(
        &mut self,
        deployment: &SelfDeployment,
        name: &str,
        now: Instant,
        interval: Duration,
    ) -> Option<String> {
        self.read_at = Some(now);
        self.upgraded = false;
        self.last = Some(deployment.clone());
        let image = deployment.manager_image().unwrap_or("?").to_owned();
        if !deployment.in_progress() {
            self.in_progress = None;
            return None;
        }
        let since = match &self.in_progress {
            Some((since, seen)) if *seen == image => *since,
            _ => {
                self.in_progress = Some((now, image.clone()));
                now
            }
        };
        let elapsed = now.saturating_duration_since(since);
        if elapsed < interval * STALLED_AFTER_INTERVALS && !deployment.deadline_exceeded() {
            return None;
        }
        let s = &deployment.status;
        Some(format!(
            "upgrade stalled: deployment {name} has not rolled out {image} for {} s: {}/{} updated, {} available{}",
            elapsed.as_secs(),
            s.updated_replicas,
            deployment.spec.replicas.unwrap_or(1),
            s.available_replicas,
            if deployment.deadline_exceeded() {
                ", progress deadline exceeded"
            } else {
                ""
            }
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(image: &str, generation: i64, status: serde_json::Value) -> SelfDeployment {
        serde_json::from_value(json!({
            "metadata": {"generation": generation},
            "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "manager", "image": image}]}}},
            "status": status,
        }))
        .unwrap()
    }

    const SEC: Duration = Duration::from_secs(1);
    /// Not watched: read every few minutes.
    const P: crate::kube::changes::Refresh = crate::kube::changes::Refresh::Periodic;

    #[test]
    fn a_rollout_that_does_not_complete_in_three_intervals_is_reported() {
        let t0 = Instant::now();
        let mut w = Watch::default();
        assert!(w.due(t0, P), "read at the first heartbeat");
        let done = deployment(
            "m@a",
            1,
            json!({"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "availableReplicas": 1}),
        );
        assert_eq!(w.observe(&done, "ns/nexo-manager", t0, 5 * SEC), None);
        assert!(
            !w.due(t0 + 10 * SEC, P),
            "quiet: not read at every heartbeat"
        );
        assert!(w.due(t0 + QUIET_REFRESH, P));
        // Watched: at rest never, when the watch saw a change at once.
        use crate::kube::changes::Refresh::Watched;
        assert!(!w.due(t0 + 100 * QUIET_REFRESH, Watched { changed: false }));
        assert!(w.due(t0 + 10 * SEC, Watched { changed: true }));
        w.upgrade_applied("u-1", t0);
        assert!(w.due(t0 + 10 * SEC, P), "read right after an upgrade");
        // The new pod crashes: two pods, one updated, one available.
        let stuck = deployment(
            "m@crash",
            2,
            json!({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 1, "availableReplicas": 1}),
        );
        assert_eq!(
            w.observe(&stuck, "ns/nexo-manager", t0 + 10 * SEC, 5 * SEC),
            None
        );
        assert!(
            w.due(t0 + 11 * SEC, P),
            "read at every heartbeat while in progress"
        );
        assert_eq!(
            w.observe(&stuck, "ns/nexo-manager", t0 + 24 * SEC, 5 * SEC),
            None
        );
        let report = w
            .observe(&stuck, "ns/nexo-manager", t0 + 25 * SEC, 5 * SEC)
            .unwrap();
        assert_eq!(
            report,
            "upgrade stalled: deployment ns/nexo-manager has not rolled out m@crash for 15 s: 1/1 updated, 1 available"
        );
        // Another upgrade starts its own clock; a completed one clears the report.
        let other = deployment(
            "m@b",
            3,
            json!({"observedGeneration": 3, "replicas": 2, "updatedReplicas": 1, "availableReplicas": 1}),
        );
        assert_eq!(
            w.observe(&other, "ns/nexo-manager", t0 + 26 * SEC, 5 * SEC),
            None
        );
        let done = deployment(
            "m@b",
            3,
            json!({"observedGeneration": 3, "replicas": 1, "updatedReplicas": 1, "availableReplicas": 1}),
        );
        assert_eq!(
            w.observe(&done, "ns/nexo-manager", t0 + 27 * SEC, 5 * SEC),
            None
        );
        assert!(!w.due(t0 + 28 * SEC, P));
    }

    #[test]
    fn the_progress_deadline_is_reported_at_once() {
        let mut w = Watch::default();
        let d = deployment(
            "m@x",
            2,
            json!({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 1, "availableReplicas": 1,
            "conditions": [{"type": "Progressing", "reason": "ProgressDeadlineExceeded"}]}),
        );
        let report = w.observe(&d, "ns/m", Instant::now(), 5 * SEC).unwrap();
        assert!(report.ends_with(", progress deadline exceeded"), "{report}");
    }

    #[test]
    fn the_manager_image_is_the_manager_container_or_the_only_one() {
        let mut d = deployment("m@a", 1, json!({}));
        assert_eq!(d.manager_image(), Some("m@a"));
        d.spec.template.spec.containers[0].name = "other".into();
        assert_eq!(d.manager_image(), Some("m@a"));
        d.spec.template.spec.containers.push(Container {
            name: "x".into(),
            image: "y".into(),
        });
        assert_eq!(d.manager_image(), None);
    }

    #[test]
    fn an_upgrade_is_available_replaced_waiting_or_overdue() {
        let rolling = deployment(
            "m@new",
            2,
            json!({"observedGeneration": 2, "replicas": 2, "updatedReplicas": 1, "availableReplicas": 1}),
        );
        let deadline = 60 * SEC;
        assert_eq!(
            upgrade_verdict(&rolling, "m@new", Some(10 * SEC), deadline),
            UpgradeVerdict::Waiting
        );
        assert_eq!(
            upgrade_verdict(&rolling, "m@new", Some(60 * SEC), deadline),
            UpgradeVerdict::Overdue(
                "the new pods were not Ready within 1m (1/1 updated, 1 available)".into()
            )
        );
        assert_eq!(
            upgrade_verdict(&rolling, "m@new", None, deadline),
            UpgradeVerdict::Waiting,
            "only the Deployment's own deadline counts for another process"
        );
        let mut exceeded = rolling.clone();
        exceeded.status.conditions.push(Condition {
            kind: "Progressing".into(),
            reason: "ProgressDeadlineExceeded".into(),
        });
        assert!(matches!(
            upgrade_verdict(&exceeded, "m@new", None, deadline),
            UpgradeVerdict::Overdue(r) if r.starts_with("the Deployment reports ProgressDeadlineExceeded")
        ));
        assert_eq!(
            upgrade_verdict(&rolling, "m@other", Some(99 * SEC), deadline),
            UpgradeVerdict::Replaced
        );
        let done = deployment(
            "m@new",
            2,
            json!({"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1, "availableReplicas": 1}),
        );
        assert_eq!(
            upgrade_verdict(&done, "m@new", Some(99 * SEC), deadline),
            UpgradeVerdict::Available
        );
    }
}
