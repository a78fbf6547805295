//! How a command runs: every check made before the cluster is read (the
//! signature, validation, the content policy), and what the executor and
//! the permit borrow from the agent. The batch and drift enforcement both
//! run commands through it.

use std::time::SystemTime;

use super::Agent;
use crate::apply::{self, Permitted};
use crate::commands::{self, Target};
use crate::cp::wire::CommandFields;
use crate::refusal::Refusal;
use crate::trust::Trust;

impl Agent {
    /// Every check made before anything is read from the cluster: the
    /// signature first (docs/protocol.md, "Command trust"), then validation,
    /// then the content policy.
    pub(super) fn checked(
        &self,
        raw: &str,
        outer: Result<CommandFields<'_>, serde_json::Error>,
        id: &str,
    ) -> Result<Checked, Rejected> {
        let trust = Trust {
            keys: self.trusted.keys.keys().map_err(Refusal::Untrusted)?,
            required: self.signatures_required(),
            environment_id: self.me.token.environment_id(),
            now: SystemTime::now(),
        };
        let received = commands::receive(
            raw,
            outer,
            id,
            &trust,
            &self.me.capabilities,
            &self.me.namespaces,
        )?;
        // From here the command is valid: what it names is known, and a
        // refusal is told on those of them that are owned.
        let targets = received.command.action.targets().to_vec();
        let class = received.command.class();
        let rules = self.rules();
        let keep_until = received
            .keep_until
            .map(|t| humantime::format_rfc3339_seconds(t).to_string());
        match apply::permit(received.command, &rules) {
            Ok(permitted) => Ok(Checked {
                keep_until,
                permitted,
            }),
            Err(refusal) => Err(Rejected {
                refusal,
                targets,
                class,
            }),
        }
    }

    /// The rules a command is permitted by, borrowed from the agent.
    pub(super) fn rules(&self) -> apply::Rules<'_> {
        let cfg = &self.me.cfg;
        apply::Rules {
            policy: &cfg.policy,
            proxy_image: &cfg.proxy_image,
            own: &self.me.own,
            running_bundle: cfg.bundle_version.as_deref(),
        }
    }

    /// What the executor needs, borrowed from the agent.
    pub(super) fn execution(&self) -> apply::Context<'_> {
        apply::Context {
            kube: &self.link.kube,
            writer: &self.link.writer,
            environment_id: self.me.token.environment_id(),
            allow_legacy_adoption: self.me.cfg.allow_legacy_adoption,
            proxy_image: &self.me.cfg.proxy_image,
            namespaces: &self.me.namespaces,
            own_namespace: &self.me.instance.namespace,
            self_deployment: &self.me.cfg.self_deployment,
            policy: &self.me.cfg.policy,
            own: &self.me.own,
            integrity: self.leader.integrity(),
            adopt_unproven: self.me.cfg.adopt_unproven,
            enforcing: false,
            planning: false,
        }
    }
}

/// A command refused by a check made before the cluster is read; the
/// deployments it names, when it was valid enough to name them.
pub(super) struct Rejected {
    pub(super) refusal: Refusal,
    pub(super) targets: Vec<Target>,
    /// Its class, when it was valid enough to have one (for its Events;
    /// its metrics and record say `invalid`).
    pub(super) class: &'static str,
}

impl From<Refusal> for Rejected {
    fn from(refusal: Refusal) -> Rejected {
        Rejected {
            refusal,
            targets: Vec::new(),
            class: "invalid",
        }
    }
}

/// A command that passed every check made before the cluster is read.
pub(super) struct Checked {
    pub(super) permitted: Permitted,
    /// Its ledger entry's keep-until (a verified signed command), RFC 3339.
    pub(super) keep_until: Option<String>,
}
