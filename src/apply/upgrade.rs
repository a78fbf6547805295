//! An upgrade: the Manager's own Deployment patched to the new image.

use serde_json::Value;

use super::Context;
use super::outcome::{Outcome, StepError};
use super::plan::{self, UpgradePlan, UpgradeStop};
use crate::commands::Upgrade;
use crate::cp::wire::ResourceAction;
use crate::kube::client::STRATEGIC_MERGE_PATCH;
use crate::resource::{Kind, ObjectRef};

pub(super) fn upgrade(ctx: &Context<'_>, u: &Upgrade, note: Option<&str>) -> Outcome {
    let r = ObjectRef::new(Kind::Deployment, ctx.own_namespace, ctx.self_deployment);
    let with_note = |message: String| match note {
        Some(note) => format!("{message}; {note}"),
        None => message,
    };
    let deployment: Value = match ctx.kube.get(&r.path()) {
        Ok(d) => d,
        Err(e) => {
            let e = StepError::api("cannot read the Manager's own", &r, e);
            return Outcome::failed(e.to_string(), vec![]);
        }
    };
    let image = u.manager_image.to_string();
    let patch = match plan::upgrade(&deployment, &u.manager_image, ctx.policy) {
        Ok(UpgradePlan::Patch(patch)) => patch,
        Ok(UpgradePlan::Unchanged) => {
            return Outcome::applied(
                with_note(format!("the Manager already runs {image}")),
                vec![r.ack(ResourceAction::Unchanged)],
            );
        }
        Err(UpgradeStop::Refused(refusal)) => {
            return Outcome::refused(refusal, vec![r.ack(ResourceAction::Refused)]);
        }
        Err(e) => return Outcome::failed(e.to_string(), vec![r.ack(ResourceAction::Refused)]),
    };
    match ctx.kube.patch(&r.path(), STRATEGIC_MERGE_PATCH, &patch) {
        Ok(_) => Outcome::applied(
            with_note(format!(
                "bundle {}: the Manager's Deployment now runs {image}",
                u.bundle_version
            )),
            vec![r.ack(ResourceAction::Configured)],
        ),
        Err(e) => Outcome::failed(
            StepError::api("cannot patch", &r, e).to_string(),
            vec![r.ack(ResourceAction::Refused)],
        ),
    }
}
