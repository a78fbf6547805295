//! A deploy: the content policy's rules that need the cluster, the reads,
//! the plan, the dry runs and the guarded writes.

use serde_json::Value;

use super::Context;
use super::execute::{Raced, dry_run, write_all};
use super::outcome::{Outcome, StepError};
use super::plan;
use super::planned::Planned;
use crate::commands::Deploy;
use crate::ownership::Judge;
use crate::policy::ClusterChecks;
use crate::refusal::Refusal;
use crate::resource::ObjectRef;

/// The content policy's rules that need the cluster (docs/protocol.md,
/// "Command trust"): a legacy pod template meets the stricter of
/// `NEXO_POD_SECURITY` and its namespace's `pod-security.kubernetes.io/enforce`,
/// and every Secret or ConfigMap it names that the deploy does not carry
/// is an object of the same deployment. A refusal names the rule.
fn policy_in_cluster(
    ctx: &Context<'_>,
    judge: &Judge<'_>,
    d: &Deploy,
    checks: &ClusterChecks,
) -> Option<Outcome> {
    let refuse = |v: crate::policy::Violation| Some(Outcome::refused(Refusal::Policy(v), vec![]));
    if checks.pod_template {
        let ns_path = crate::resource::NAMESPACES.object(None, &d.deployment.namespace);
        let namespace = match ctx.kube.get::<Value>(&ns_path) {
            Ok(ns) => ns,
            Err(e) => {
                let message = format!(
                    "policy: cannot read namespace {} to learn its Pod Security level, nothing applied: {e}",
                    d.deployment.namespace
                );
                return Some(Outcome::failed(message, vec![]));
            }
        };
        if let Some(v) = plan::pod_security_floor(checks, d, &namespace) {
            return refuse(v);
        }
    }
    for (manifest, r) in &checks.outside {
        let reference = ObjectRef::new(r.kind, &d.deployment.namespace, &r.name);
        let read = match ctx.kube.get_opt::<Value>(&reference.path()) {
            Err(e) => {
                let e = StepError::api("cannot read", &reference, e);
                return Some(Outcome::failed(e.to_string(), vec![]));
            }
            Ok(read) => read,
        };
        if let Some(why) = plan::outside_reference(judge, d, &reference, read.as_ref()) {
            return refuse(r.refused(manifest, &why));
        }
    }
    None
}

pub(super) fn deploy(
    ctx: &Context<'_>,
    d: &Deploy,
    checks: &ClusterChecks,
) -> Result<Outcome, Raced> {
    // The Manager's own objects by name and as sent were refused by the
    // permit; as read, by the plan.
    let Some(judge) = ctx.judge() else {
        return Ok(Outcome::failed(super::NO_KEY, vec![]));
    };
    if let Some(refused) = policy_in_cluster(ctx, &judge, d, checks) {
        return Ok(refused);
    }
    let mut existing = Vec::with_capacity(d.manifests.len());
    for m in &d.manifests {
        match ctx.kube.get_opt::<Value>(&m.reference.path()) {
            Ok(o) => existing.push(o),
            Err(e) => {
                let e = StepError::api("cannot read", &m.reference, e);
                return Ok(Outcome::failed(e.to_string(), vec![]));
            }
        }
    }
    let plan = plan::deploy(
        d,
        &existing,
        &judge,
        ctx.allow_legacy_adoption,
        ctx.enforcing,
    );
    let plan::DeployPlan {
        mut writes,
        skipped,
        proxy_uid,
    } = match plan {
        Ok(plan) => plan,
        Err(refused) => return Ok(refused.into()),
    };
    if ctx.planning {
        return planned(ctx, d, writes, &existing);
    }
    drop(existing);
    let mut fields = Vec::with_capacity(writes.len());
    for w in &mut writes {
        match dry_run(ctx, w) {
            Ok(f) => fields.push(f),
            Err(outcome) => return *outcome,
        }
    }
    let mut written = write_all(ctx, &judge.verifier, d, writes, fields, proxy_uid)?;
    for (r, why) in skipped {
        written
            .resources
            .push(r.ack(crate::cp::wire::ResourceAction::Refused));
        written.skipped.push((r, why));
    }
    Ok(written)
}

/// A deploy planned (docs/protocol.md, `command.plan.v1`): each write's dry
/// run, and the fields it would change in the object read.
fn planned(
    ctx: &Context<'_>,
    d: &Deploy,
    writes: Vec<plan::Write>,
    existing: &[Option<Value>],
) -> Result<Outcome, Raced> {
    let mut out = Planned::default();
    for mut w in writes {
        let live = d
            .manifests
            .iter()
            .position(|m| m.reference == w.reference)
            .and_then(|i| existing[i].as_ref());
        let object = match dry_run(ctx, &mut w) {
            Ok(_) => super::planned::write(&w.reference, &w.object, live, w.adopt),
            Err(stop) => match *stop {
                Err(raced) => return Err(raced),
                Ok(refused) => super::planned::refused(&w.reference, refused.message),
            },
        };
        out.push(&w.reference, object);
    }
    Ok(out.outcome("apply"))
}
