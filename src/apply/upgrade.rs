//! An upgrade: the Manager's own Deployment patched to the new image, then
//! its field ownership handed back ([`upgrade_plan::hand_back`]).

use serde_json::Value;

use super::Context;
use super::outcome::{Outcome, StepError};
use super::upgrade_plan::{self, UpgradePlan, UpgradeStop};
use crate::commands::Upgrade;
use crate::kube::client::{FIELD_MANAGER, JSON_PATCH, STRATEGIC_MERGE_PATCH};
use crate::resource::{Kind, ObjectRef};
use crate::words::ResourceAction;

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
    let patch =
        match upgrade_plan::upgrade(&deployment, &u.manager_image, &u.bundle_version, ctx.policy) {
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
    if ctx.planning {
        // A plan (docs/protocol.md, `command.plan.v1`): the patch as a dry run.
        let mut out = super::planned::Planned::default();
        let object = match ctx
            .kube
            .patch_dry_run(&r.path(), STRATEGIC_MERGE_PATCH, &patch)
        {
            Ok(dry) => super::planned::dry(&r, &dry, &deployment),
            Err(e) => {
                super::planned::refused(&r, StepError::api("cannot patch", &r, e).to_string())
            }
        };
        out.push(&r, object);
        return out.outcome("upgrade");
    }
    match ctx.kube.patch(&r.path(), STRATEGIC_MERGE_PATCH, &patch) {
        Ok(patched) => {
            hand_back(ctx, &r, &patched);
            let mut outcome = Outcome::applied(
                with_note(format!(
                    "bundle {}: the Manager's Deployment now runs {image}",
                    u.bundle_version
                )),
                vec![r.ack(ResourceAction::Configured)],
            );
            outcome.upgraded = upgrade_plan::Upgraded::of(&deployment, &image).map(Box::new);
            outcome
        }
        Err(e) => Outcome::failed(
            StepError::api("cannot patch", &r, e).to_string(),
            vec![r.ack(ResourceAction::Refused)],
        ),
    }
}

/// Writes an upgrade back (docs/protocol.md, `rollback.v1`): the
/// Deployment read again and, while it still runs the upgrade's image,
/// patched to what it was at the version read, its field ownership handed
/// back. `Ok(None)`: it runs another image now (changed since), left as it
/// is. The error is the failed call.
pub fn write_back(
    ctx: &Context<'_>,
    from: &upgrade_plan::Upgraded,
    own_bundle: Option<&str>,
) -> Result<Option<Value>, StepError> {
    let r = ObjectRef::new(Kind::Deployment, ctx.own_namespace, ctx.self_deployment);
    let deployment: Value = ctx
        .kube
        .get(&r.path())
        .map_err(|e| StepError::api("cannot read the Manager's own", &r, e))?;
    let (_, image) =
        upgrade_plan::upgrade_container(&deployment).map_err(StepError::NoManagerContainer)?;
    if image != Some(from.to_image.as_str()) {
        return Ok(None);
    }
    let mut patch = upgrade_plan::write_back(&deployment, from, own_bundle)
        .map_err(StepError::NoManagerContainer)?;
    // Guarded: a writer between the read and the patch answers 409.
    patch["metadata"]["resourceVersion"] = deployment["metadata"]["resourceVersion"].clone();
    let patched = ctx
        .kube
        .patch(&r.path(), STRATEGIC_MERGE_PATCH, &patch)
        .map_err(|e| StepError::api("cannot patch", &r, e))?;
    hand_back(ctx, &r, &patched);
    Ok(Some(patched))
}

/// Drops the Manager's field-manager entries from its Deployment once
/// patched, reading it again when another writer moved the entries (a 422
/// of the patch's tests), three times at most. The upgrade is done either
/// way: a failure here is only logged, and a later `helm upgrade` with a
/// newer chart under server-side apply then names `nexo-manager` in its
/// conflict.
fn hand_back(ctx: &Context<'_>, r: &ObjectRef, patched: &Value) {
    const ATTEMPTS: usize = 3;
    let mut read = patched.clone();
    for attempt in 1..=ATTEMPTS {
        let Some(patch) = upgrade_plan::hand_back(&read, FIELD_MANAGER) else {
            return;
        };
        let e = match ctx.kube.patch(&r.path(), JSON_PATCH, &patch) {
            Ok(_) => return,
            Err(e) => e,
        };
        if !e.is_unprocessable() || attempt == ATTEMPTS {
            crate::warn!(
                err:% = StepError::api("cannot hand the field ownership back on", r, e);
                "self-upgrade: field ownership not handed back"
            );
            return;
        }
        read = match ctx.kube.get(&r.path()) {
            Ok(d) => d,
            Err(e) => {
                crate::warn!(
                    err:% = StepError::api("cannot read again", r, e);
                    "self-upgrade: the Deployment not read again"
                );
                return;
            }
        };
    }
}
