//! The thin executor: reads what the planners need, runs the dry runs, then
//! the writes, each guarded by where its object was read. Every decision is
//! the planners' ([`super::plan`]); when a guard fails (the cluster changed
//! between read and write), the command is read and planned again.

use serde_json::{Value, json};

use super::outcome::{StepError, summary};
use super::permit::Permitted;
use super::plan::{self, Delete, Removal, UpgradePlan, UpgradeStop, Write};
use crate::commands::{Action, Deploy, Rollout, Target, Upgrade};
use crate::cp::wire::{AckResource, ResourceAction};
use crate::image::ImageRef;
use crate::kube::client::{MERGE_PATCH, STRATEGIC_MERGE_PATCH};
use crate::kube::{ApplyParams, Client};
use crate::ownership;
use crate::refusal::Refusal;
use crate::resource::{Kind, ObjectRef};

pub use super::outcome::Outcome;

/// Read-modify-write attempts on 409 Conflict.
pub const CONFLICT_RETRIES: usize = 3;

/// What the executor needs to know.
#[derive(Debug)]
pub struct Context<'a> {
    /// The Kubernetes client.
    pub kube: &'a Client,
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
    /// `NEXO_BUNDLE_VERSION`: an upgrade to an older bundle is refused.
    pub running_bundle: Option<&'a str>,
    /// The Manager's own objects: never a target.
    pub own: &'a crate::ownership::OwnObjects,
}

/// Runs a permitted command.
pub fn run(ctx: &Context<'_>, permitted: &Permitted) -> Outcome {
    match &permitted.command().action {
        Action::Deploy(d) => with_fresh_reads("deploy", || deploy(ctx, d)),
        Action::Rollout(r) => rollout(ctx, r),
        Action::Upgrade(u) => upgrade(ctx, u, permitted.note()),
        Action::Uninstall(t) => with_fresh_reads("uninstall", || uninstall(ctx, t)),
    }
}

/// A write whose guard failed: the outcome it would report.
struct Raced(Outcome);

/// Runs `attempt` again, from its reads, when a write's guard failed (an
/// object appeared, changed or was replaced since it was read): the checks
/// are made again on what the cluster holds now.
fn with_fresh_reads(what: &str, mut attempt: impl FnMut() -> Result<Outcome, Raced>) -> Outcome {
    let mut n = 1;
    loop {
        match attempt() {
            Ok(outcome) => return outcome,
            Err(Raced(outcome)) if n < CONFLICT_RETRIES => {
                log::info!(
                    "{what}: the cluster changed between read and write ({}); reading again",
                    outcome.message
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
fn write_failed(
    e: StepError,
    resources: Vec<AckResource>,
    done: usize,
    count: usize,
) -> Result<Outcome, Raced> {
    if e.raced() {
        return Err(Raced(Outcome::failed(e.to_string(), resources)));
    }
    Ok(Outcome::failed(
        format!("{e} after {done} of {count} objects were applied"),
        resources,
    ))
}

/// The refusal of a command that names one of the Manager's own objects
/// (protocol.md, "Ownership"): by name, or by the labels of the object as
/// read (`None`: absent or not read yet) or as sent.
fn own_object(ctx: &Context<'_>, r: &ObjectRef, object: Option<&Value>) -> Option<Outcome> {
    let refusal = ctx
        .own
        .refusal(r.kind.name(), &r.namespace, &r.name, object)?;
    Some(Outcome::refused(
        refusal,
        vec![r.ack(ResourceAction::Refused)],
    ))
}

/// The content policy's rules that need the cluster (protocol.md,
/// "Command trust"): a legacy pod template meets the stricter of
/// `NEXO_POD_SECURITY` and its namespace's `pod-security.kubernetes.io/enforce`,
/// and every Secret or ConfigMap it names that the deploy does not carry
/// is an object of the same deployment. A refusal names the rule.
fn policy_in_cluster(ctx: &Context<'_>, d: &Deploy) -> Option<Outcome> {
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
                .or_else(|| plan::refusal_for(&o, ctx.environment_id, &d.deployment.name, false))
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

fn deploy(ctx: &Context<'_>, d: &Deploy) -> Result<Outcome, Raced> {
    // The Manager's own objects by name and as sent were refused by the
    // permit; here, as read.
    if let Some(refused) = policy_in_cluster(ctx, d) {
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
    for (m, o) in d.manifests.iter().zip(&existing) {
        if let Some(refused) = own_object(ctx, &m.reference, o.as_ref()) {
            return Ok(refused);
        }
    }
    let mut writes = match plan::deploy(d, &existing, ctx.environment_id, ctx.allow_legacy_adoption)
    {
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
    write_all(ctx, d, writes, fields, proxy_uid)
}

/// The server-side-apply dry run of one write: the `managedFields` an
/// apply would give it when it is absent. A conflict with this Manager's
/// own earlier update (a rollout's image) makes the write a forced one.
fn dry_run(ctx: &Context<'_>, w: &mut Write) -> Result<Option<Value>, Result<Outcome, Raced>> {
    let path = w.reference.path();
    let params = ApplyParams::DRY_RUN.forced(w.force);
    let mut dry = ctx.kube.apply(&path, &w.object, params);
    if let Err(e) = &dry
        && plan::only_own_conflicts(e)
    {
        // A rollout's earlier update of spec.image, by this Manager: the
        // deploy's desired state wins.
        w.force = true;
        dry = ctx.kube.apply(&path, &w.object, params.forced(true));
    }
    match dry {
        Ok(mut dry) => Ok(match w.existing {
            None => Some(dry["metadata"]["managedFields"].take()),
            Some(_) => None,
        }),
        Err(e) if e.is_precondition_failure() => {
            let e = StepError::api("dry run of", &w.reference, e);
            Err(Err(Raced(Outcome::failed(e.to_string(), vec![]))))
        }
        Err(e) => {
            let e = StepError::api("", &w.reference, e);
            Err(Ok(Outcome::failed(
                format!(
                    "dry run refused, nothing applied: {}",
                    e.to_string().trim_start()
                ),
                vec![w.reference.ack(ResourceAction::Refused)],
            )))
        }
    }
}

/// Writes a deploy's planned objects in order, the NexoProxy first.
fn write_all(
    ctx: &Context<'_>,
    d: &Deploy,
    mut writes: Vec<Write>,
    mut fields: Vec<Option<Value>>,
    mut proxy_uid: Option<String>,
) -> Result<Outcome, Raced> {
    let proxy_existed = proxy_uid.is_some();
    let count = writes.len();
    let mut resources = Vec::with_capacity(writes.len());
    for (w, fields) in writes.iter_mut().zip(fields.iter_mut()) {
        if w.owned_by_proxy {
            let Some(uid) = &proxy_uid else {
                return Ok(Outcome::failed(
                    "the NexoProxy has no uid after apply",
                    resources,
                ));
            };
            w.object["metadata"]["ownerReferences"] =
                plan::owner_reference(&d.deployment.name, uid);
        }
        match write_one(ctx, w, fields, proxy_existed) {
            Ok(written) => {
                if w.reference.kind == Kind::NexoProxy {
                    proxy_uid = written["metadata"]["uid"].as_str().map(str::to_owned);
                }
                let version = written["metadata"]["resourceVersion"].as_str();
                resources.push(w.reference.ack(w.action(version)));
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
    Ok(Outcome::applied(message, resources))
}

/// One write: an absent object is created (failing if it appeared since
/// it was read) as its apply would have made it; an existing one applied
/// with its guard.
fn write_one(
    ctx: &Context<'_>,
    w: &Write,
    fields: &mut Option<Value>,
    proxy_existed: bool,
) -> Result<Value, StepError> {
    let path = w.reference.path();
    if w.needs_owner_dry_run(proxy_existed) {
        let mut dry = ctx
            .kube
            .apply(&path, &w.object, ApplyParams::DRY_RUN)
            .map_err(|e| StepError::api("dry run of", &w.reference, e))?;
        *fields = Some(dry["metadata"]["managedFields"].take());
    }
    let written = match &w.existing {
        None => ctx.kube.create_as_applied(
            &w.reference.collection(),
            &w.reference.name,
            &w.object,
            fields.as_ref(),
        ),
        Some(_) => ctx
            .kube
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

fn owned_proxies(ctx: &Context<'_>) -> Result<Vec<Target>, String> {
    let selector = ownership::owned_selector(ctx.environment_id);
    let mut targets = Vec::new();
    for ns in ctx.namespaces {
        let collection = ObjectRef::new(Kind::NexoProxy, ns, "").collection();
        ctx.kube
            .list_each(&collection, Some(&selector), 500, |o| {
                if let Some(name) = o["metadata"]["name"].as_str() {
                    targets.push(Target {
                        name: name.to_owned(),
                        namespace: ns.clone(),
                    });
                }
            })
            .map_err(|e| format!("cannot list NexoProxies in {ns}: {e}"))?;
    }
    Ok(targets)
}

fn rollout(ctx: &Context<'_>, r: &Rollout) -> Outcome {
    let targets = match &r.targets {
        Some(t) => t.clone(),
        None => match owned_proxies(ctx) {
            Ok(t) => t,
            Err(e) => return Outcome::failed(e, vec![]),
        },
    };
    let image = plan::rollout_image(ctx.proxy_image, r.image_tag.as_deref());
    let mut observed = Vec::with_capacity(targets.len());
    // Named targets were permitted by name; listed ones are checked here.
    for t in targets.iter().filter(|_| r.targets.is_none()) {
        let reference = ObjectRef::new(Kind::NexoProxy, &t.namespace, &t.name);
        if let Some(refused) = own_object(ctx, &reference, None) {
            return refused;
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
    let changes = match plan::rollout(&observed, &image, ctx.environment_id) {
        Ok(c) => c,
        Err(refused) => return refused.into(),
    };
    let mut resources = Vec::new();
    for c in changes {
        if !c.changed {
            resources.push(c.reference.ack(ResourceAction::Unchanged));
            continue;
        }
        match set_image(ctx, &c.reference, &c.version, &image) {
            Ok(()) => resources.push(c.reference.ack(ResourceAction::Configured)),
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
    Outcome::applied(message, resources)
}

/// Sets `spec.image`, guarded by `resourceVersion`; on a conflict re-reads,
/// re-checks ownership and tries again, a bounded number of times.
fn set_image(
    ctx: &Context<'_>,
    r: &ObjectRef,
    version: &str,
    image: &str,
) -> Result<(), StepError> {
    let mut version = version.to_owned();
    for _ in 0..CONFLICT_RETRIES {
        let patch = json!({"metadata": {"resourceVersion": version}, "spec": {"image": image}});
        match ctx.kube.patch(&r.path(), MERGE_PATCH, &patch) {
            Ok(_) => return Ok(()),
            Err(e) if e.status() == Some(409) => {
                let fresh: Value = ctx
                    .kube
                    .get(&r.path())
                    .map_err(|e| StepError::api("cannot re-read", r, e))?;
                let own = ctx
                    .own
                    .refusal(r.kind.name(), &r.namespace, &r.name, Some(&fresh))
                    .map(|refusal| refusal.to_string());
                if let Some(why) =
                    own.or_else(|| plan::refusal_for(&fresh, ctx.environment_id, &r.name, false))
                {
                    return Err(StepError::Refused {
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

fn upgrade(ctx: &Context<'_>, u: &Upgrade, note: Option<&str>) -> Outcome {
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

/// Reads what an uninstall of `t` may delete: its NexoProxy, else its
/// legacy Deployment and the objects labelled with its name.
fn uninstall_reads(ctx: &Context<'_>, t: &Target) -> Result<Removal, Outcome> {
    let proxy_ref = ObjectRef::new(Kind::NexoProxy, &t.namespace, &t.name);
    let deployment_ref = ObjectRef::new(Kind::Deployment, &t.namespace, &t.name);
    let read = |r: &ObjectRef| {
        let o = ctx.kube.get_opt::<Value>(&r.path()).map_err(|e| {
            Outcome::failed(StepError::api("cannot read", r, e).to_string(), vec![])
        })?;
        if let Some(object) = &o
            && let Some(refused) = own_object(ctx, r, Some(object))
        {
            return Err(refused);
        }
        Ok(o)
    };
    let proxy = read(&proxy_ref)?;
    let deployment = match proxy {
        Some(_) => None,
        None => read(&deployment_ref)?,
    };
    let mut labelled = Vec::new();
    if deployment.is_some() {
        let selector = format!(
            "{},{}={}",
            ownership::owned_selector(ctx.environment_id),
            ownership::DEPLOYMENT,
            t.name
        );
        for kind in [Kind::Service, Kind::ConfigMap, Kind::Secret] {
            let collection = ObjectRef::new(kind, &t.namespace, "").collection();
            let listed = ctx.kube.list_each(&collection, Some(&selector), 500, |o| {
                let name = o["metadata"]["name"].as_str().unwrap_or_default();
                labelled.push((ObjectRef::new(kind, &t.namespace, name), o));
            });
            for (r, o) in &labelled {
                if let Some(refused) = own_object(ctx, r, Some(o)) {
                    return Err(refused);
                }
            }
            if let Err(e) = listed {
                let message = format!("cannot list {kind}s of {}/{}: {e}", t.namespace, t.name);
                return Err(Outcome::failed(message, vec![]));
            }
        }
    }
    let plan = plan::uninstall(
        t,
        proxy.as_ref(),
        deployment.as_ref(),
        &labelled,
        ctx.environment_id,
    );
    plan.map_err(Outcome::from)
}

fn uninstall(ctx: &Context<'_>, t: &Target) -> Result<Outcome, Raced> {
    let deletes = match uninstall_reads(ctx, t) {
        Err(outcome) => return Ok(outcome),
        Ok(Removal::Absent) => {
            let r = ObjectRef::new(Kind::NexoProxy, &t.namespace, &t.name);
            return Ok(Outcome::applied(
                format!("{}/{} is not installed", t.namespace, t.name),
                vec![r.ack(ResourceAction::Absent)],
            ));
        }
        Ok(Removal::Proxy(delete)) => vec![delete],
        Ok(Removal::Legacy(deletes)) => deletes,
    };
    let mut resources = Vec::new();
    for Delete { reference, read_at } in deletes {
        // Deleted only if it is still the object read and checked.
        let guard = Some((read_at.uid.as_str(), read_at.version.as_str()));
        match ctx.kube.delete_if(&reference.path(), "Background", guard) {
            Ok(_) => resources.push(reference.ack(ResourceAction::Deleted)),
            Err(e) if e.is_not_found() => resources.push(reference.ack(ResourceAction::Absent)),
            Err(e) => {
                let raced = e.is_precondition_failure();
                if !raced {
                    resources.push(reference.ack(ResourceAction::Refused));
                }
                let message = StepError::api("cannot delete", &reference, e).to_string();
                let outcome = Outcome::failed(message, resources);
                return if raced {
                    Err(Raced(outcome))
                } else {
                    Ok(outcome)
                };
            }
        }
    }
    let message = format!(
        "uninstalled {}/{} ({})",
        t.namespace,
        t.name,
        summary(&resources)
    );
    Ok(Outcome::applied(message, resources))
}
