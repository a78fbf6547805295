//! A parsed command applied to the cluster: permitted by the rules of the
//! configuration ([`permit()`]), planned from what the cluster holds
//! ([`plan`]), carried out by a thin executor ([`execute`]) into an
//! [`Outcome`].

mod deploy;
pub mod execute;
pub mod outcome;
pub mod permit;
pub mod plan;
mod planned;
pub mod prune;
mod rollout;
mod uninstall;
pub mod upgrade;
pub mod upgrade_plan;

pub use outcome::Outcome;
pub use permit::{Permitted, Rules, permit};

use crate::commands::Action;
use crate::image::ImageRef;
use crate::kube::Client;

/// What the executor needs to know.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// The Kubernetes client: every read.
    pub kube: &'a Client,
    /// Every write and dry run: sent as the executor of the namespace it
    /// writes in ([`Client::executor`]), so the API server bounds it with
    /// that namespace's RBAC.
    pub writer: &'a Client,
    /// This environment.
    pub environment_id: &'a str,
    /// The cluster half of the migration gate.
    pub allow_legacy_adoption: bool,
    /// The configured Proxy image.
    pub proxy_image: &'a ImageRef,
    /// The managed namespaces.
    pub namespaces: &'a [String],
    /// The Manager's own namespace.
    pub own_namespace: &'a str,
    /// The Manager's own Deployment.
    pub self_deployment: &'a str,
    /// The content policy (an upgrade's image is checked against it).
    pub policy: &'a crate::policy::Policy,
    /// The Manager's own objects: never a target.
    pub own: &'a crate::ownership::OwnObjects,
    /// The key of the objects' proofs (the state's `integrityKey`):
    /// without it no deploy, rollout or uninstall runs.
    pub integrity: Option<&'a crate::integrity::Key>,
    /// `NEXO_ADOPT_UNPROVEN`.
    pub adopt_unproven: bool,
    /// Drift enforcement, not a command: the deploy's writes take fields
    /// back from other field managers, and an object of the record that
    /// became another's is skipped ([`Outcome::skipped`]) while the
    /// deployment's own are written (docs/protocol.md, `drift.v1`). A command's
    /// writes never take fields, and one such object refuses it whole.
    pub enforcing: bool,
    /// A plan (docs/protocol.md, `command.plan.v1`), set by [`run`] for a
    /// `plan` command: the command's reads, checks and planner, each write
    /// sent as a dry run (`dryRun=All`), nothing written.
    pub planning: bool,
}

/// Why a deploy, rollout or uninstall did not run without the integrity key.
pub const NO_KEY: &str = "the integrity key could not be read or made (see the Manager's log), so ownership cannot be proven; nothing applied";

impl<'a> Context<'a> {
    /// The verdict on ownership, once the integrity key is known.
    pub fn verifier(&self) -> Option<crate::ownership::Verifier<'a>> {
        Some(crate::ownership::Verifier {
            environment_id: self.environment_id,
            key: self.integrity?,
            adopt_unproven: self.adopt_unproven,
        })
    }

    /// What judges the objects a command reads (`None`: no integrity key).
    pub fn judge(&self) -> Option<crate::ownership::Judge<'a>> {
        Some(crate::ownership::Judge {
            own: self.own,
            verifier: self.verifier()?,
        })
    }
}

/// Runs a permitted command; plans it, writing nothing, when it is a
/// `plan`.
pub fn run(ctx: &Context<'_>, permitted: &Permitted) -> Outcome {
    if permitted.command().plan {
        let ctx = Context {
            planning: true,
            ..*ctx
        };
        return planned::answer(run_action(&ctx, permitted));
    }
    run_action(ctx, permitted)
}

fn run_action(ctx: &Context<'_>, permitted: &Permitted) -> Outcome {
    match &permitted.command().action {
        Action::Deploy(d) => {
            // Only the permit makes a `Permitted`, and it walks every deploy.
            let Some(checks) = permitted.cluster_checks() else {
                return Outcome::failed(
                    "policy: the deploy's checks are missing, nothing applied",
                    vec![],
                );
            };
            execute::with_fresh_reads("deploy", || deploy::deploy(ctx, d, checks))
        }
        Action::Rollout(r) => rollout::rollout(ctx, r),
        Action::Upgrade(u) => upgrade::upgrade(ctx, u, permitted.note()),
        Action::Uninstall(t) => {
            execute::with_fresh_reads("uninstall", || uninstall::uninstall(ctx, t))
        }
    }
}
