//! A deploy: the content policy's rules that need the cluster, the reads,
//! the plan, the dry runs and the guarded writes.

use serde_json::Value;

use super::Context;
use super::execute::{Raced, dry_run, own_object, write_all};
use super::outcome::{Outcome, StepError};
use super::plan;
use crate::commands::Deploy;
use crate::ownership::{self, Verifier};
use crate::refusal::Refusal;
use crate::resource::{Kind, ObjectRef};

/// The content policy's rules that need the cluster (docs/protocol.md,
/// "Command trust"): a legacy pod template meets the stricter of
/// `NEXO_POD_SECURITY` and its namespace's `pod-security.kubernetes.io/enforce`,
/// and every Secret or ConfigMap it names that the deploy does not carry
/// is an object of the same deployment. A refusal names the rule.
fn policy_in_cluster(ctx: &Context<'_>, v: &Verifier<'_>, d: &Deploy) -> Option<Outcome> {
    let refuse = |v: crate::policy::Violation| Some(Outcome::refused(Refusal::Policy(v), vec![]));
    if !d
        .manifests
        .iter()
        .any(|m| m.reference.kind == Kind::Deployment)
    {
        return None;
    }
    let ns_path = crate::resource::NAMESPACES.object(None, &d.deployment.namespace);
    let enforce = match ctx.kube.get::<Value>(&ns_path) {
        Ok(ns) => ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
            .as_str()
            .map(str::to_owned),
        Err(e) => {
            let message = format!(
                "policy: cannot read namespace {} to learn its Pod Security level, nothing applied: {e}",
                d.deployment.namespace
            );
            return Some(Outcome::failed(message, vec![]));
        }
    };
    let profile = crate::policy::namespace_profile(enforce.as_deref());
    let policy = ctx.policy.at_least(profile);
    let outside = match policy.check_deploy(&d.manifests, ctx.proxy_image) {
        Ok(outside) => outside,
        Err(v) => {
            return refuse(crate::policy::Violation(format!(
                "{} (namespace {} enforces {})",
                v.0,
                d.deployment.namespace,
                enforce.as_deref().unwrap_or("?")
            )));
        }
    };
    for (manifest, r) in outside {
        let reference = ObjectRef::new(r.kind, &d.deployment.namespace, &r.name);
        let why = match ctx.kube.get_opt::<Value>(&reference.path()) {
            Err(e) => {
                let e = StepError::api("cannot read", &reference, e);
                return Some(Outcome::failed(e.to_string(), vec![]));
            }
            Ok(None) => Some("does not exist".to_owned()),
            Ok(Some(o)) => ctx
                .own
                .refusal(r.kind.name(), &reference.namespace, &r.name, Some(&o))
                .map(|_| "is the Manager's own".to_owned())
                .or_else(|| v.refusal_for(r.kind.name(), &o, &d.deployment.name, false))
                .or_else(|| {
                    // Owned, and claimed by this deployment by label.
                    (o["metadata"]["labels"][ownership::DEPLOYMENT] != d.deployment.name.as_str())
                        .then(|| {
                            format!(
                                "is not labelled {}={}",
                                ownership::DEPLOYMENT,
                                d.deployment.name
                            )
                        })
                }),
        };
        if let Some(why) = why {
            return refuse(r.refused(&manifest, &why));
        }
    }
    None
}

pub(super) fn deploy(ctx: &Context<'_>, d: &Deploy) -> Result<Outcome, Raced> {
    // The Manager's own objects by name and as sent were refused by the
    // permit; here, as read.
    let Some(v) = ctx.verifier() else {
        return Ok(Outcome::failed(super::NO_KEY, vec![]));
    };
    if let Some(refused) = policy_in_cluster(ctx, &v, d) {
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
    // Drift enforcement leaves the objects that became another's alone
    // and restores the rest; a command is refused whole by any of them.
    let skipped = if ctx.enforcing {
        plan::not_the_deployments(d, &existing, &v, |r, o| {
            ctx.own
                .refusal(r.kind.name(), &r.namespace, &r.name, o)
                .map(|refusal| refusal.to_string())
        })
    } else {
        Vec::new()
    };
    let rest;
    let d = if skipped.is_empty() {
        d
    } else {
        let (manifests, kept): (Vec<_>, Vec<_>) = d
            .manifests
            .iter()
            .zip(existing)
            .filter(|(m, _)| !skipped.iter().any(|(r, _)| *r == m.reference))
            .map(|(m, o)| (m.clone(), o))
            .unzip();
        existing = kept;
        rest = Deploy {
            manifests,
            ..d.clone()
        };
        &rest
    };
    for (m, o) in d.manifests.iter().zip(&existing) {
        if let Some(refused) = own_object(ctx, &m.reference, o.as_ref()) {
            return Ok(refused);
        }
    }
    let mut writes = match plan::deploy(d, &existing, &v, ctx.allow_legacy_adoption) {
        Ok(w) => w,
        Err(refused) => return Ok(refused.into()),
    };
    // The uid of an existing NexoProxy lets the dry run carry the owner reference.
    let proxy_uid = existing
        .iter()
        .flatten()
        .find(|o| o["kind"] == "NexoProxy")
        .and_then(|o| o["metadata"]["uid"].as_str())
        .map(str::to_owned);
    drop(existing);
    let mut fields = Vec::with_capacity(writes.len());
    for w in &mut writes {
        w.force |= ctx.enforcing;
        if w.owned_by_proxy
            && let Some(uid) = &proxy_uid
        {
            w.object["metadata"]["ownerReferences"] =
                plan::owner_reference(&d.deployment.name, uid);
        }
        match dry_run(ctx, w) {
            Ok(f) => fields.push(f),
            Err(outcome) => return outcome,
        }
    }
    let mut written = write_all(ctx, &v, d, writes, fields, proxy_uid)?;
    for (r, why) in skipped {
        written
            .resources
            .push(r.ack(crate::cp::wire::ResourceAction::Refused));
        written.skipped.push((r, why));
    }
    Ok(written)
}
