//! An upgrade of the Manager itself, followed to its end (docs/protocol.md,
//! `rollback.v1`): recorded in the state when applied (what it changed,
//! who applied it), judged from the Deployment as the heartbeat last read
//! it, `available` once its new pods are, and written back by the leader
//! that applied it when they are not Ready within
//! `NEXO_SELF_UPGRADE_DEADLINE` or the Deployment's own progress deadline
//! passed. Any leader reports it in `selfUpgrade` until the next upgrade.

use std::time::Instant;

use super::Agent;
use crate::apply::upgrade_plan::Upgraded;
use crate::commands::{OnFailure, Upgrade};
use crate::events::Reason;
use crate::self_rollout::{UpgradeVerdict, upgrade_verdict};
use crate::state::SelfUpgrade;
use crate::words::SelfUpgradePhase;

impl Agent {
    /// An upgrade command `id` applied, changing what `upgraded` says:
    /// recorded in the state, followed from now on by this process.
    pub(super) fn self_upgrade_applied(&mut self, id: &str, u: &Upgrade, upgraded: &Upgraded) {
        self.beats.self_rollout.upgrade_applied(id, Instant::now());
        let record = SelfUpgrade {
            command_id: id.to_owned(),
            from: self.me.cfg.bundle_version.clone().unwrap_or_default(),
            to: u.bundle_version.clone(),
            from_image: upgraded.from_image.clone(),
            to_image: upgraded.to_image.clone(),
            from_bundle_env: upgraded.from_bundle_env.clone(),
            rollback: u.on_failure == OnFailure::Rollback,
            applied_by: self.me.instance.id.clone(),
            phase: Some(SelfUpgradePhase::Progressing),
            reason: None,
        };
        let note = format!(
            "upgrade {id} to bundle {}: {} (from {})",
            record.to, record.to_image, record.from_image
        );
        self.store.set_self_upgrade(&self.link, record);
        self.own_event(
            crate::events::Reason::SelfUpgradeStarted,
            "SelfUpgrade",
            note,
        );
    }

    /// While leading, after the batch: the last upgrade's verdict, acted
    /// on.
    pub(super) fn follow_self_upgrade(&mut self) {
        // Nothing to follow once it ended: no copy of it then.
        let Some(record) = self
            .store
            .self_upgrade()
            .filter(|r| r.phase.is_none_or(|p| p == SelfUpgradePhase::Progressing))
            .cloned()
        else {
            return;
        };
        let Some(deployment) = self.beats.self_rollout.last.as_ref() else {
            return;
        };
        // Only the process that applied it may roll it back.
        let waited = self
            .beats
            .self_rollout
            .applied
            .as_ref()
            .filter(|(id, _)| *id == record.command_id)
            .map(|(_, at)| at.elapsed());
        let deadline = self.me.cfg.self_upgrade_deadline;
        match upgrade_verdict(deployment, &record.to_image, waited, deadline) {
            UpgradeVerdict::Waiting | UpgradeVerdict::Replaced => {}
            UpgradeVerdict::Available => {
                crate::info!(
                    commandId:% = record.command_id, bundle:% = record.to;
                    "self-upgrade available: the new pods are Ready"
                );
                let note = format!(
                    "upgrade {} to bundle {}: the new pods are Ready",
                    record.command_id, record.to
                );
                self.own_event(
                    crate::events::Reason::SelfUpgradeAvailable,
                    "SelfUpgrade",
                    note,
                );
                self.self_upgrade_ended(record, SelfUpgradePhase::Available, None);
            }
            UpgradeVerdict::Overdue(why) if waited.is_some() && record.rollback => {
                self.write_self_upgrade_back(record, why);
            }
            UpgradeVerdict::Overdue(_) => {}
        }
    }

    /// Writes the upgrade back: the image and bundle this process runs.
    fn write_self_upgrade_back(&mut self, record: SelfUpgrade, why: String) {
        let from = Upgraded {
            from_image: record.from_image.clone(),
            from_bundle_env: record.from_bundle_env.clone(),
            to_image: record.to_image.clone(),
        };
        let own = self.me.cfg.bundle_version.clone();
        let written = crate::apply::upgrade::write_back(&self.execution(), &from, own.as_deref());
        self.beats.self_rollout.applied = None;
        let (phase, reason, note) = match &written {
            Ok(None) => {
                crate::info!(
                    commandId:% = record.command_id, reason:% = why;
                    "self-upgrade failed, but the Deployment runs another image now; left as it is"
                );
                return;
            }
            Ok(Some(_)) => {
                crate::warn!(
                    commandId:% = record.command_id, reason:% = why, image:% = record.from_image;
                    "self-upgrade rolled back"
                );
                let note = format!(
                    "upgrade {} to bundle {} ({}): {why}; rolled back to {}",
                    record.command_id, record.to, record.to_image, record.from_image
                );
                (SelfUpgradePhase::RolledBack, why, note)
            }
            Err(e) => {
                crate::error!(
                    commandId:% = record.command_id, reason:% = why, err:% = e;
                    "self-upgrade failed and cannot be written back"
                );
                let reason = format!("{why}; cannot write it back: {e}");
                let note = format!("upgrade {}: {reason}", record.command_id);
                (SelfUpgradePhase::RollbackFailed, reason, note)
            }
        };
        crate::metrics::rolled_back(match phase {
            SelfUpgradePhase::RolledBack => "rolled_back",
            _ => "failed",
        });
        self.own_event(Reason::RolledBack, "SelfUpgrade", note);
        let reason = crate::text::clip(&reason, 256);
        self.self_upgrade_ended(record, phase, Some(reason));
    }

    fn self_upgrade_ended(
        &mut self,
        mut record: SelfUpgrade,
        phase: SelfUpgradePhase,
        reason: Option<String>,
    ) {
        record.phase = Some(phase);
        record.reason = reason;
        self.store.set_self_upgrade(&self.link, record);
    }
}
