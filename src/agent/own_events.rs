//! Events of the Manager's own life, on its own Deployment (agent.md,
//! "Operating it"): bound to the Control Plane, leading (a new lease term,
//! with whom it took the lease from), a self-upgrade started and available
//! (its rollback is `self_upgrade.rs`'s `RolledBack`), a command refused
//! for its signature. `kubectl describe deployment nexo-manager` and
//! `kubectl events` tell them without the logs.
//!
//! A lease lost is told by the next leader's `LeaderElected` (it names the
//! holder it took the lease from), or by this process's own when it leads
//! again: a process that lost the lease writes nothing, Events included
//! (the lease fence, `lease.rs`).

use crate::events::{Event, Reason, Regarding};
use crate::resource::Kind;

impl super::Agent {
    /// Queues an Event about the Manager's own Deployment; nothing when it
    /// does not run from one (its uid unknown).
    pub(super) fn own_event(&mut self, reason: Reason, action: &'static str, note: String) {
        let Some(uid) = self.me.own_deployment_uid.clone() else {
            crate::debug!(reason = reason.as_str(); "no own Deployment: event not queued");
            return;
        };
        self.event(Event {
            regarding: Regarding {
                kind: Kind::Deployment,
                namespace: self.me.instance.namespace.clone(),
                name: self.me.cfg.self_deployment.clone(),
                uid,
            },
            reason,
            action,
            note,
        });
    }
}
