//! The thin executor's shared steps: guarded writes (a dry run of each
//! object, then the writes, each guarded by where its object was read;
//! the ownerReference of a new NexoProxy's runtime objects once its uid is
//! known), and a fresh read and plan when a guard fails. Every decision is
//! the planners' ([`super::plan`]).

use crate::inventory::Workload;
use serde_json::Value;

use super::Context;
use super::outcome::{Outcome, StepError, summary};
use super::plan::{self, Write};
use crate::commands::Deploy;
use crate::cp::wire::AckResource;
use crate::kube::ApplyParams;
use crate::ownership::Verifier;
use crate::resource::{Kind, ObjectRef};
use crate::words::ResourceAction;

/// Read-modify-write attempts on 409 Conflict.
pub const CONFLICT_RETRIES: usize = 3;

/// A write whose guard failed: the outcome it would report.
pub(super) struct Raced(pub(super) Box<Outcome>);

/// Runs `attempt` again, from its reads, when a write's guard failed (an
/// object appeared, changed or was replaced since it was read): the checks
/// are made again on what the cluster holds now.
pub(super) fn with_fresh_reads(
    what: &str,
    mut attempt: impl FnMut() -> Result<Outcome, Raced>,
) -> Outcome {
    let mut n = 1;
    loop {
        match attempt() {
            Ok(outcome) => return outcome,
            Err(Raced(outcome)) if n < CONFLICT_RETRIES => {
                crate::info!(
                    step = what, message = outcome.message.as_str();
                    "the cluster changed between read and write; reading again"
                );
                n += 1;
            }
            Err(Raced(outcome)) => {
                return Outcome::failed(
                    format!(
                        "{} (the cluster kept changing between read and write, {CONFLICT_RETRIES} attempts)",
                        outcome.message
                    ),
                    outcome.resources,
                );
            }
        }
    }
}

/// The outcome of a failed write: raced when its guard failed.
pub(super) fn write_failed(
    e: StepError,
    resources: Vec<AckResource>,
    done: usize,
    count: usize,
) -> Result<Outcome, Raced> {
    if e.raced() {
        return Err(Raced(Box::new(Outcome::failed(e.to_string(), resources))));
    }
    Ok(Outcome::failed(
        format!("{e} after {done} of {count} objects were applied"),
        resources,
    ))
}

/// The server-side-apply dry run of one write: the `managedFields` an
/// apply would give it when it is absent. A conflict with this Manager's
/// own earlier update (a rollout's image) makes the write a forced one.
/// Its error is the deploy's outcome: refused by the dry run, or raced.
pub(super) fn dry_run(
    ctx: &Context<'_>,
    w: &mut Write,
) -> Result<Option<Value>, Box<Result<Outcome, Raced>>> {
    let path = w.reference.path();
    let params = ApplyParams::DRY_RUN.forced(w.force);
    let mut dry = ctx.writer.apply(&path, &w.object, params);
    if let Err(e) = &dry
        && w.takes_over(e)
    {
        dry = ctx.writer.apply(&path, &w.object, params.forced(true));
    }
    match dry {
        Ok(mut dry) => Ok(match w.existing {
            None => Some(dry["metadata"]["managedFields"].take()),
            Some(_) => None,
        }),
        Err(e) if e.is_precondition_failure() => {
            let e = StepError::api("dry run of", &w.reference, e);
            Err(Box::new(Err(Raced(Box::new(Outcome::failed(
                e.to_string(),
                vec![],
            ))))))
        }
        Err(e) => {
            let e = StepError::api("", &w.reference, e);
            Err(Box::new(Ok(Outcome::failed(
                format!(
                    "dry run refused, nothing applied: {}",
                    e.to_string().trim_start()
                ),
                vec![w.reference.ack(ResourceAction::Refused)],
            ))))
        }
    }
}

/// Writes a deploy's planned objects in order, the NexoProxy first.
pub(super) fn write_all(
    ctx: &Context<'_>,
    v: &Verifier<'_>,
    d: &Deploy,
    mut writes: Vec<Write>,
    mut fields: Vec<Option<Value>>,
    mut proxy_uid: Option<String>,
) -> Result<Outcome, Raced> {
    let proxy_existed = proxy_uid.is_some();
    let count = writes.len();
    let mut resources = Vec::with_capacity(writes.len());
    let mut workloads = Vec::new();
    for (w, fields) in writes.iter_mut().zip(fields.iter_mut()) {
        // The plan gave them their ownerReference when the NexoProxy
        // existed; a new one's uid is known once it is written, first.
        if w.owned_by_proxy && !proxy_existed {
            let Some(uid) = &proxy_uid else {
                return Ok(Outcome::failed(
                    "the NexoProxy has no uid after apply",
                    resources,
                ));
            };
            w.object["metadata"]["ownerReferences"] =
                plan::owner_reference(&d.deployment.name, uid);
        }
        match write_one(ctx, v, &d.deployment.name, w, fields, proxy_existed) {
            Ok(written) => {
                if w.reference.kind == Kind::NexoProxy {
                    proxy_uid = written["metadata"]["uid"].as_str().map(str::to_owned);
                }
                let version = written["metadata"]["resourceVersion"].as_str();
                resources.push(w.reference.ack(w.action(version)));
                workloads.extend(workload(&w.reference, &written));
            }
            Err(e) => {
                let done = resources.len();
                if !e.raced() {
                    resources.push(w.reference.ack(ResourceAction::Refused));
                }
                return write_failed(e, resources, done, count);
            }
        }
    }
    let message = format!(
        "applied {} objects ({})",
        resources.len(),
        summary(&resources)
    );
    let mut outcome = Outcome::applied(message, resources);
    outcome.workloads = workloads;
    Ok(outcome)
}

/// A NexoProxy or Deployment as written: the generation its status is
/// judged at.
pub(super) fn workload(r: &ObjectRef, written: &Value) -> Option<Workload> {
    if !matches!(r.kind, Kind::NexoProxy | Kind::Deployment) {
        return None;
    }
    Some(Workload {
        kind: r.kind,
        namespace: r.namespace.clone(),
        name: r.name.clone(),
        generation: written["metadata"]["generation"].as_i64()?,
        uid: written["metadata"]["uid"].as_str().map(str::to_owned),
        image: written["spec"]["image"].as_str().map(str::to_owned),
    })
}

/// One write: an absent object is created (failing if it appeared since
/// it was read) as its apply would have made it, and given its proof once
/// its uid is known; an existing one applied with its guard (and its
/// proof, [`plan::deploy`]).
pub(super) fn write_one(
    ctx: &Context<'_>,
    v: &Verifier<'_>,
    deployment: &str,
    w: &Write,
    fields: &mut Option<Value>,
    proxy_existed: bool,
) -> Result<Value, StepError> {
    let path = w.reference.path();
    if w.needs_owner_dry_run(proxy_existed) {
        let mut dry = ctx
            .writer
            .apply(&path, &w.object, ApplyParams::DRY_RUN)
            .map_err(|e| StepError::api("dry run of", &w.reference, e))?;
        *fields = Some(dry["metadata"]["managedFields"].take());
    }
    let written = match &w.existing {
        None => ctx.writer.create_as_applied(
            &w.reference.collection(),
            &w.reference.name,
            &w.object,
            fields.as_ref(),
            |created| {
                let r = &w.reference;
                let uid = created["metadata"]["uid"].as_str()?;
                let proof = v.proof(r.kind.name(), &r.namespace, &r.name, uid, deployment);
                Some(serde_json::json!({crate::integrity::ANNOTATION: proof}))
            },
        ),
        Some(_) => ctx
            .writer
            .apply(&path, &w.object, ApplyParams::WRITE.forced(w.force)),
    };
    written.map_err(|e| {
        let verb = if e.is_precondition_failure() {
            "cannot write"
        } else {
            "cannot apply"
        };
        StepError::api(verb, &w.reference, e)
    })
}
