//! A rollout: the image of owned NexoProxies, each set with the
//! resourceVersion it was read at.

use serde_json::{Value, json};

use super::Context;
use super::execute::CONFLICT_RETRIES;
use super::outcome::{Outcome, StepError, summary};
use super::plan::{self, ImageChange};
use super::planned::Planned;
use crate::commands::{Rollout, Target};
use crate::kube::client::MERGE_PATCH;
use crate::ownership::{self, Judge, Verifier};
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
    let Some(judge) = ctx.judge() else {
        return Outcome::failed(super::NO_KEY, vec![]);
    };
    let v = judge.verifier;
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
            if let Some(refusal) = ctx.own.refusal("NexoProxy", &t.namespace, &t.name, None) {
                let reference = ObjectRef::new(Kind::NexoProxy, &t.namespace, &t.name);
                return Outcome::refused(refusal, vec![reference.ack(ResourceAction::Refused)]);
            }
        }
    }
    for t in targets {
        let reference = ObjectRef::new(Kind::NexoProxy, &t.namespace, &t.name);
        match ctx.kube.get_opt::<Value>(&reference.path()) {
            Ok(Some(o)) => match plan::judged(&judge, &reference, &t.name, false, o) {
                Ok(judged) => observed.push((t, Some(judged))),
                Err(refused) => return refused.into(),
            },
            Ok(None) => observed.push((t, None)),
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
    if ctx.planning {
        return planned(ctx, &changes, &observed, &image);
    }
    let mut resources = Vec::new();
    let mut workloads = Vec::new();
    for c in changes {
        if !c.changed {
            resources.push(c.reference.ack(ResourceAction::Unchanged));
            continue;
        }
        match set_image(ctx, &judge, &c, &image) {
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

/// The patch that sets the image (and the proof) of the NexoProxy read at
/// `version`.
fn image_patch(c: &ImageChange, version: &str, image: &str) -> Value {
    json!({"metadata": {"resourceVersion": version,
        "annotations": {crate::integrity::ANNOTATION: c.proof}},
        "spec": {"image": image}})
}

/// A rollout planned (docs/protocol.md, `command.plan.v1`): each change's
/// patch as a dry run, and the values it would change.
fn planned(
    ctx: &Context<'_>,
    changes: &[ImageChange],
    observed: &[(Target, Option<plan::Judged>)],
    image: &str,
) -> Outcome {
    let mut out = Planned::default();
    // The changes follow the targets' order: one walk finds each one's
    // object (a rollout of every NexoProxy plans in linear time).
    let mut observed = observed.iter();
    for c in changes {
        let r = &c.reference;
        let live = observed
            .find(|(t, _)| t.namespace == r.namespace && t.name == r.name)
            .and_then(|(_, j)| j.as_ref())
            .map(|j| &j.object);
        let (Some(live), true) = (live, c.changed) else {
            out.push(r, super::planned::plain(r, ResourceAction::Unchanged));
            continue;
        };
        let patch = image_patch(c, &c.version, image);
        let object = match ctx.writer.patch_dry_run(&r.path(), MERGE_PATCH, &patch) {
            Ok(dry) => super::planned::dry(r, &dry, live),
            Err(e) => {
                let e = StepError::api("cannot set the image of", r, e);
                super::planned::refused(r, e.to_string())
            }
        };
        out.push(r, object);
    }
    out.outcome("roll out")
}

/// Sets `spec.image`, guarded by `resourceVersion`; on a conflict re-reads,
/// re-checks ownership and tries again, a bounded number of times.
fn set_image(
    ctx: &Context<'_>,
    judge: &Judge<'_>,
    c: &ImageChange,
    image: &str,
) -> Result<Value, StepError> {
    let r = &c.reference;
    let mut version = c.version.clone();
    for _ in 0..CONFLICT_RETRIES {
        let patch = image_patch(c, &version, image);
        match ctx.writer.patch(&r.path(), MERGE_PATCH, &patch) {
            Ok(written) => return Ok(written),
            Err(e) if e.is_conflict() => {
                let fresh: Value = ctx
                    .kube
                    .get(&r.path())
                    .map_err(|e| StepError::api("cannot re-read", r, e))?;
                let verdict = judge.verdict(&plan::question(r, &r.name, false, false), &fresh);
                if let Some(why) = plan::not_ours(&verdict) {
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
