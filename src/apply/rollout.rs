//! A rollout: the image of owned NexoProxies, each set with the
//! resourceVersion it was read at.

use serde_json::{Value, json};

use super::Context;
use super::execute::{CONFLICT_RETRIES, own_object};
use super::outcome::{Outcome, StepError, summary};
use super::plan::{self, ImageChange};
use crate::commands::{Rollout, Target};
use crate::kube::client::MERGE_PATCH;
use crate::ownership::{self, Verifier};
use crate::resource::{Kind, ObjectRef};
use crate::words::ResourceAction;

/// The NexoProxies this environment owns (labelled, and proven or adopted
/// through the gate): one only labelled as its own is not a target.
fn owned_proxies(ctx: &Context<'_>, v: &Verifier<'_>) -> Result<Vec<Target>, Unlisted> {
    let selector = ownership::owned_selector(ctx.environment_id);
    let mut targets = Vec::new();
    for ns in ctx.namespaces {
        let collection = ObjectRef::new(Kind::NexoProxy, ns, "").collection();
        ctx.kube
            .list_each(&collection, Some(&selector), 500, |o| {
                if v.refusal_reason("NexoProxy", &o, false).is_some() {
                    return;
                }
                if let Some(name) = o["metadata"]["name"].as_str() {
                    targets.push(Target {
                        name: name.to_owned(),
                        namespace: ns.clone(),
                    });
                }
            })
            .map_err(|source| Unlisted {
                namespace: ns.clone(),
                source: Box::new(source),
            })?;
    }
    Ok(targets)
}

/// The NexoProxies of a namespace could not be listed.
#[derive(Debug)]
struct Unlisted {
    namespace: String,
    source: Box<crate::kube::Error>,
}

impl std::fmt::Display for Unlisted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cannot list NexoProxies in {}: {}",
            self.namespace, self.source
        )
    }
}

pub(super) fn rollout(ctx: &Context<'_>, r: &Rollout) -> Outcome {
    let Some(v) = ctx.verifier() else {
        return Outcome::failed(super::NO_KEY, vec![]);
    };
    let targets = match &r.targets {
        Some(t) => t.clone(),
        None => match owned_proxies(ctx, &v) {
            Ok(t) => t,
            Err(e) => return Outcome::failed(e.to_string(), vec![]),
        },
    };
    let image = plan::rollout_image(ctx.proxy_image, r.image_tag.as_deref());
    let mut observed = Vec::with_capacity(targets.len());
    // Named targets were permitted by name; the ones listed from the
    // cluster are checked by name here.
    if r.targets.is_none() {
        for t in &targets {
            let reference = ObjectRef::new(Kind::NexoProxy, &t.namespace, &t.name);
            if let Some(refused) = own_object(ctx, &reference, None) {
                return refused;
            }
        }
    }
    for t in targets {
        let reference = ObjectRef::new(Kind::NexoProxy, &t.namespace, &t.name);
        match ctx.kube.get_opt::<Value>(&reference.path()) {
            Ok(o) if o.is_some() => {
                if let Some(refused) = own_object(ctx, &reference, o.as_ref()) {
                    return refused;
                }
                observed.push((t, o));
            }
            Ok(o) => observed.push((t, o)),
            Err(e) => {
                let e = StepError::api("cannot read", &reference, e);
                return Outcome::failed(e.to_string(), vec![]);
            }
        }
    }
    let changes = match plan::rollout(&observed, &image, &v) {
        Ok(c) => c,
        Err(refused) => return refused.into(),
    };
    let mut resources = Vec::new();
    let mut workloads = Vec::new();
    for c in changes {
        if !c.changed {
            resources.push(c.reference.ack(ResourceAction::Unchanged));
            continue;
        }
        match set_image(ctx, &v, &c, &image) {
            Ok(written) => {
                resources.push(c.reference.ack(ResourceAction::Configured));
                workloads.extend(super::execute::workload(&c.reference, &written));
            }
            Err(e) => {
                resources.push(c.reference.ack(ResourceAction::Refused));
                return Outcome::failed(e.to_string(), resources);
            }
        }
    }
    let message = format!(
        "rolled out {image} to {} NexoProxies ({})",
        resources.len(),
        summary(&resources)
    );
    let mut outcome = Outcome::applied(message, resources);
    outcome.workloads = workloads;
    outcome
}

/// Sets `spec.image`, guarded by `resourceVersion`; on a conflict re-reads,
/// re-checks ownership and tries again, a bounded number of times.
fn set_image(
    ctx: &Context<'_>,
    v: &Verifier<'_>,
    c: &ImageChange,
    image: &str,
) -> Result<Value, StepError> {
    let r = &c.reference;
    let mut version = c.version.clone();
    for _ in 0..CONFLICT_RETRIES {
        let patch = json!({"metadata": {"resourceVersion": version,
            "annotations": {crate::integrity::ANNOTATION: c.proof}},
            "spec": {"image": image}});
        match ctx.writer.patch(&r.path(), MERGE_PATCH, &patch) {
            Ok(written) => return Ok(written),
            Err(e) if e.is_conflict() => {
                let fresh: Value = ctx
                    .kube
                    .get(&r.path())
                    .map_err(|e| StepError::api("cannot re-read", r, e))?;
                let own = ctx
                    .own
                    .refusal(r.kind.name(), &r.namespace, &r.name, Some(&fresh))
                    .map(|refusal| refusal.to_string());
                if let Some(why) =
                    own.or_else(|| v.refusal_for("NexoProxy", &fresh, &r.name, false))
                {
                    return Err(StepError::OwnerChanged {
                        reference: r.clone(),
                        why,
                    });
                }
                version = fresh["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
            }
            Err(e) => return Err(StepError::api("cannot set the image of", r, e)),
        }
    }
    Err(StepError::KeptChanging {
        reference: r.clone(),
        attempts: CONFLICT_RETRIES,
    })
}
