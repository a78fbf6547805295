//! The thin executor: reads what the planners need, runs the dry runs, then
//! the writes. Every decision is the planners'.

use serde_json::{Value, json};

use super::plan::{self, ObjectRef, Refused, Removal};
use super::{Action, Command, Deploy, Rollout, Target, Upgrade};
use crate::cp::wire::AckResource;
use crate::image::ImageRef;
use crate::kube::client::{MERGE_PATCH, STRATEGIC_MERGE_PATCH};
use crate::kube::{self, Client};
use crate::ownership;

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
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Applied or failed.
    pub applied: bool,
    /// The ack message.
    pub message: String,
    /// The ack resources.
    pub resources: Vec<AckResource>,
}

impl Outcome {
    /// A failure.
    pub fn failed(message: impl Into<String>, resources: Vec<AckResource>) -> Outcome {
        Outcome {
            applied: false,
            message: message.into(),
            resources,
        }
    }

    fn applied(message: impl Into<String>, resources: Vec<AckResource>) -> Outcome {
        Outcome {
            applied: true,
            message: message.into(),
            resources,
        }
    }
}

impl From<Refused> for Outcome {
    fn from(r: Refused) -> Outcome {
        Outcome::failed(r.message, r.resources)
    }
}

fn api_error(what: &str, r: &ObjectRef, e: &kube::Error) -> String {
    let detail = match e {
        kube::Error::Api {
            status: 409, body, ..
        } if body.reason.as_deref() == Some("Conflict") => {
            format!(
                "conflict with another field manager, not taken over: {}",
                body.message.as_deref().unwrap_or("")
            )
        }
        other => other.to_string(),
    };
    format!("{what} {} {}/{}: {detail}", r.kind, r.namespace, r.name)
}

/// Whether a server-side-apply conflict is only with this Manager's own
/// non-apply updates (a rollout's merge patch of `spec.image`), never with
/// another field manager.
pub fn only_own_conflicts(e: &kube::Error) -> bool {
    let kube::Error::Api {
        status: 409, body, ..
    } = e
    else {
        return false;
    };
    if body.reason.as_deref() != Some("Conflict") {
        return false;
    }
    let causes = body.details.as_ref().and_then(|d| d["causes"].as_array());
    causes.is_some_and(|c| {
        !c.is_empty()
            && c.iter().all(|cause| {
                cause["message"].as_str().is_some_and(|m| {
                    m.starts_with(&format!(
                        "conflict with \"{}\"",
                        crate::kube::client::FIELD_MANAGER
                    )) && !m.contains("\" with ")
                })
            })
    })
}

/// Runs a validated command.
pub fn run(ctx: &Context<'_>, cmd: &Command) -> Outcome {
    match &cmd.action {
        Action::Deploy(d) => deploy(ctx, d),
        Action::Rollout(r) => rollout(ctx, r),
        Action::Upgrade(u) => upgrade(ctx, u),
        Action::Uninstall(t) => uninstall(ctx, t),
    }
}

fn summary(resources: &[AckResource]) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for r in resources {
        match counts.iter_mut().find(|(a, _)| *a == r.action) {
            Some((_, n)) => *n += 1,
            None => counts.push((&r.action, 1)),
        }
    }
    let parts: Vec<String> = counts.iter().map(|(a, n)| format!("{n} {a}")).collect();
    parts.join(", ")
}

/// Runs `attempt` again, from its reads, when a write's precondition
/// failed (an object appeared, changed or was replaced since it was read):
/// the checks are made again on what the cluster holds now.
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

/// A write whose precondition failed: the outcome it would report.
struct Raced(Outcome);

/// Guards an existing object's write with the uid and resourceVersion it
/// was read at, so that the write fails if it was replaced or changed
/// since. In place: a manifest is never copied on its way to the API server.
fn guard(w: &mut plan::Write) {
    if let (Some(uid), Some(version)) = (&w.existing_uid, &w.existing_version) {
        w.object["metadata"]["uid"] = uid.as_str().into();
        w.object["metadata"]["resourceVersion"] = version.as_str().into();
    }
}

fn deploy(ctx: &Context<'_>, d: &Deploy) -> Outcome {
    with_fresh_reads("deploy", || deploy_once(ctx, d))
}

fn deploy_once(ctx: &Context<'_>, d: &Deploy) -> Result<Outcome, Raced> {
    let mut existing = Vec::with_capacity(d.manifests.len());
    for m in &d.manifests {
        let r = ObjectRef::of(m);
        match ctx.kube.get_opt::<Value>(&r.path()) {
            Ok(o) => existing.push(o),
            Err(e) => return Ok(Outcome::failed(api_error("cannot read", &r, &e), vec![])),
        }
    }
    let mut writes = match plan::deploy(d, &existing, ctx.environment_id, ctx.allow_legacy_adoption)
    {
        Ok(w) => w,
        Err(refused) => return Ok(refused.into()),
    };
    // The uid of an existing NexoProxy lets the dry run carry the owner reference.
    let mut proxy_uid = existing
        .iter()
        .flatten()
        .find(|o| o["kind"] == "NexoProxy")
        .and_then(|o| o["metadata"]["uid"].as_str())
        .map(str::to_owned);
    drop(existing);
    let mut forced = Vec::new();
    // The managedFields an apply would give each absent object.
    let mut apply_fields: Vec<Option<Value>> = Vec::with_capacity(writes.len());
    for w in &mut writes {
        guard(w);
        if w.owned_by_proxy
            && let Some(uid) = &proxy_uid
        {
            w.object["metadata"]["ownerReferences"] =
                plan::owner_reference(&d.deployment.name, uid);
        }
        let (w, object) = (&*w, &w.object);
        let mut dry = ctx.kube.apply(&w.reference.path(), object, w.adopt, true);
        if let Err(e) = &dry
            && only_own_conflicts(e)
        {
            // A rollout's earlier update of spec.image, by this Manager: the
            // deploy's desired state wins.
            forced.push(w.reference.clone());
            dry = ctx.kube.apply(&w.reference.path(), object, true, true);
        }
        match dry {
            Ok(mut dry) => apply_fields.push(match w.existing_version {
                None => Some(dry["metadata"]["managedFields"].take()),
                Some(_) => None,
            }),
            Err(e) if e.is_precondition_failure() => {
                return Err(Raced(Outcome::failed(
                    api_error("dry run of", &w.reference, &e),
                    vec![],
                )));
            }
            Err(e) => {
                return Ok(Outcome::failed(
                    format!(
                        "dry run refused, nothing applied: {}",
                        api_error("", &w.reference, &e).trim_start()
                    ),
                    vec![w.reference.ack("refused")],
                ));
            }
        }
    }
    // Runtime objects dry-run before their NexoProxy existed had no owner
    // reference then: their apply fields are taken again, with it.
    let dry_without_owner = proxy_uid.is_none();
    let mut resources = Vec::with_capacity(writes.len());
    let count = writes.len();
    for (w, fields) in writes.iter_mut().zip(apply_fields.iter_mut()) {
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
        let (w, object) = (&*w, &w.object);
        if w.owned_by_proxy && dry_without_owner && w.existing_version.is_none() {
            match ctx.kube.apply(&w.reference.path(), object, false, true) {
                Ok(mut dry) => *fields = Some(dry["metadata"]["managedFields"].take()),
                Err(e) => {
                    return Ok(Outcome::failed(
                        format!(
                            "{} after {} of {count} objects were applied",
                            api_error("dry run of", &w.reference, &e),
                            resources.len()
                        ),
                        resources,
                    ));
                }
            }
        }
        let force = w.adopt || forced.contains(&w.reference);
        // An absent object is created, not applied: if it appeared since it
        // was read, the create fails instead of writing over it.
        let written = match &w.existing_version {
            None => ctx.kube.create_as_applied(
                &w.reference.collection(),
                &w.reference.name,
                object,
                fields.as_ref(),
            ),
            Some(_) => ctx.kube.apply(&w.reference.path(), object, force, false),
        };
        match written {
            Ok(applied) => {
                if w.reference.kind == "NexoProxy" {
                    proxy_uid = applied["metadata"]["uid"].as_str().map(str::to_owned);
                }
                let version = applied["metadata"]["resourceVersion"].as_str();
                let action = match (&w.existing_version, w.adopt) {
                    (None, _) => "created",
                    (Some(_), true) => "configured",
                    (Some(v), false) if Some(v.as_str()) == version => "unchanged",
                    (Some(_), false) => "configured",
                };
                resources.push(w.reference.ack(action));
            }
            Err(e) if e.is_precondition_failure() => {
                return Err(Raced(Outcome::failed(
                    api_error("cannot write", &w.reference, &e),
                    resources,
                )));
            }
            Err(e) => {
                let done = resources.len();
                resources.push(w.reference.ack("refused"));
                return Ok(Outcome::failed(
                    format!(
                        "{} after {done} of {} objects were applied",
                        api_error("cannot apply", &w.reference, &e),
                        count
                    ),
                    resources,
                ));
            }
        }
    }
    Ok(Outcome::applied(
        format!(
            "applied {} objects ({})",
            resources.len(),
            summary(&resources)
        ),
        resources,
    ))
}

fn owned_proxies(ctx: &Context<'_>) -> Result<Vec<Target>, String> {
    let selector = ownership::owned_selector(ctx.environment_id);
    let mut targets = Vec::new();
    for ns in ctx.namespaces {
        ctx.kube
            .list_each(
                &format!("/apis/nexo.io/v1alpha1/namespaces/{ns}/nexoproxies"),
                Some(&selector),
                500,
                |o| {
                    if let Some(name) = o["metadata"]["name"].as_str() {
                        targets.push(Target {
                            name: name.to_owned(),
                            namespace: ns.clone(),
                        });
                    }
                },
            )
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
    for t in targets {
        match ctx.kube.get_opt::<Value>(&ObjectRef::proxy(&t).path()) {
            Ok(o) => observed.push((t, o)),
            Err(e) => {
                return Outcome::failed(
                    api_error("cannot read", &ObjectRef::proxy(&t), &e),
                    vec![],
                );
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
            resources.push(c.reference.ack("unchanged"));
            continue;
        }
        match set_image(ctx, &c.reference, &c.version, &image) {
            Ok(()) => resources.push(c.reference.ack("configured")),
            Err(msg) => {
                resources.push(c.reference.ack("refused"));
                return Outcome::failed(msg, resources);
            }
        }
    }
    Outcome::applied(
        format!(
            "rolled out {image} to {} NexoProxies ({})",
            resources.len(),
            summary(&resources)
        ),
        resources,
    )
}

/// Sets `spec.image`, guarded by `resourceVersion`; on a conflict re-reads,
/// re-checks ownership and tries again, a bounded number of times.
fn set_image(ctx: &Context<'_>, r: &ObjectRef, version: &str, image: &str) -> Result<(), String> {
    let mut version = version.to_owned();
    for _ in 0..CONFLICT_RETRIES {
        let patch = json!({"metadata": {"resourceVersion": version}, "spec": {"image": image}});
        match ctx.kube.patch(&r.path(), MERGE_PATCH, &patch) {
            Ok(_) => return Ok(()),
            Err(e) if e.status() == Some(409) => {
                let fresh: Value = ctx
                    .kube
                    .get(&r.path())
                    .map_err(|e| api_error("cannot re-read", r, &e))?;
                if let Some(why) = plan::refusal_reason(&fresh, ctx.environment_id, false) {
                    return Err(format!("{} {}/{} {why}", r.kind, r.namespace, r.name));
                }
                version = fresh["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
            }
            Err(e) => return Err(api_error("cannot set the image of", r, &e)),
        }
    }
    Err(format!(
        "{} {}/{} kept changing ({CONFLICT_RETRIES} conflicts)",
        r.kind, r.namespace, r.name
    ))
}

fn upgrade(ctx: &Context<'_>, u: &Upgrade) -> Outcome {
    let r = ObjectRef::new(
        "apps/v1",
        "Deployment",
        ctx.own_namespace,
        ctx.self_deployment,
    );
    let deployment: Value = match ctx.kube.get(&r.path()) {
        Ok(d) => d,
        Err(e) => {
            return Outcome::failed(api_error("cannot read the Manager's own", &r, &e), vec![]);
        }
    };
    let (container, current) = match plan::upgrade_container(&deployment) {
        Ok(c) => c,
        Err(why) => return Outcome::failed(why, vec![r.ack("refused")]),
    };
    let image = u.manager_image.to_string();
    if current.as_deref() == Some(image.as_str()) {
        return Outcome::applied(
            format!("the Manager already runs {image}"),
            vec![r.ack("unchanged")],
        );
    }
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": container, "image": image}]}}}});
    match ctx.kube.patch(&r.path(), STRATEGIC_MERGE_PATCH, &patch) {
        Ok(_) => Outcome::applied(
            format!(
                "bundle {}: the Manager's Deployment now runs {image}",
                u.bundle_version
            ),
            vec![r.ack("configured")],
        ),
        Err(e) => Outcome::failed(api_error("cannot patch", &r, &e), vec![r.ack("refused")]),
    }
}

fn uninstall(ctx: &Context<'_>, t: &Target) -> Outcome {
    with_fresh_reads("uninstall", || uninstall_once(ctx, t))
}

/// The uid and resourceVersion an object was read at.
fn read_at(o: &Value) -> Option<(&str, &str)> {
    Some((
        o["metadata"]["uid"].as_str()?,
        o["metadata"]["resourceVersion"].as_str()?,
    ))
}

fn uninstall_once(ctx: &Context<'_>, t: &Target) -> Result<Outcome, Raced> {
    let proxy_ref = ObjectRef::proxy(t);
    let deployment_ref = ObjectRef::new("apps/v1", "Deployment", &t.namespace, &t.name);
    let read = |r: &ObjectRef| {
        ctx.kube
            .get_opt::<Value>(&r.path())
            .map_err(|e| api_error("cannot read", r, &e))
    };
    let proxy = match read(&proxy_ref) {
        Ok(p) => p,
        Err(m) => return Ok(Outcome::failed(m, vec![])),
    };
    let deployment = if proxy.is_some() {
        None
    } else {
        match read(&deployment_ref) {
            Ok(d) => d,
            Err(m) => return Ok(Outcome::failed(m, vec![])),
        }
    };
    let mut labelled = Vec::new();
    if deployment.is_some() {
        let selector = format!(
            "{},{}={}",
            ownership::owned_selector(ctx.environment_id),
            ownership::DEPLOYMENT,
            t.name
        );
        for kind in ["Service", "ConfigMap", "Secret"] {
            let r = ObjectRef::new("v1", kind, &t.namespace, "");
            let listed = ctx
                .kube
                .list_each(&r.collection(), Some(&selector), 500, |o| {
                    let name = o["metadata"]["name"].as_str().unwrap_or_default();
                    labelled.push((ObjectRef::new("v1", kind, &t.namespace, name), o));
                });
            if let Err(e) = listed {
                return Ok(Outcome::failed(
                    format!("cannot list {kind}s of {}/{}: {e}", t.namespace, t.name),
                    vec![],
                ));
            }
        }
    }
    let removal = match plan::uninstall(
        t,
        proxy.as_ref(),
        deployment.as_ref(),
        &labelled,
        ctx.environment_id,
    ) {
        Ok(r) => r,
        Err(refused) => return Ok(refused.into()),
    };
    let refs = match removal {
        Removal::Absent => {
            return Ok(Outcome::applied(
                format!("{}/{} is not installed", t.namespace, t.name),
                vec![proxy_ref.ack("absent")],
            ));
        }
        Removal::Proxy(r) => vec![r],
        Removal::Legacy(refs) => refs,
    };
    let mut resources = Vec::new();
    for r in refs {
        // Deleted only if it is still the object read and checked.
        let object = if r == proxy_ref {
            proxy.as_ref()
        } else if r == deployment_ref {
            deployment.as_ref()
        } else {
            labelled.iter().find(|(l, _)| *l == r).map(|(_, o)| o)
        };
        let Some(preconditions) = object.and_then(read_at) else {
            resources.push(r.ack("refused"));
            return Ok(Outcome::failed(
                format!(
                    "{} {}/{} was read without a uid or resourceVersion; not deleted",
                    r.kind, r.namespace, r.name
                ),
                resources,
            ));
        };
        match ctx
            .kube
            .delete_if(&r.path(), "Background", Some(preconditions))
        {
            Ok(_) => resources.push(r.ack("deleted")),
            Err(e) if e.is_not_found() => resources.push(r.ack("absent")),
            Err(e) if e.is_precondition_failure() => {
                return Err(Raced(Outcome::failed(
                    api_error("cannot delete", &r, &e),
                    resources,
                )));
            }
            Err(e) => {
                resources.push(r.ack("refused"));
                return Ok(Outcome::failed(
                    api_error("cannot delete", &r, &e),
                    resources,
                ));
            }
        }
    }
    Ok(Outcome::applied(
        format!(
            "uninstalled {}/{} ({})",
            t.namespace,
            t.name,
            summary(&resources)
        ),
        resources,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::Status;

    fn conflict(messages: &[&str]) -> kube::Error {
        let causes: Vec<Value> = messages
            .iter()
            .map(|m| json!({"reason": "FieldManagerConflict", "message": m}))
            .collect();
        kube::Error::Api {
            status: 409,
            body: Status {
                reason: Some("Conflict".into()),
                message: None,
                details: Some(json!({"causes": causes})),
            },
            retry_after: None,
        }
    }

    #[test]
    fn only_conflicts_with_this_managers_own_updates_are_resolved() {
        assert!(only_own_conflicts(&conflict(&[
            r#"conflict with "nexo-manager" using nexo.io/v1alpha1"#
        ])));
        assert!(!only_own_conflicts(&conflict(&[
            r#"conflict with "kubectl-edit" using v1"#
        ])));
        assert!(!only_own_conflicts(&conflict(&[
            r#"conflict with "nexo-manager" using v1"#,
            r#"conflict with "someone-else" using v1"#
        ])));
        assert!(!only_own_conflicts(&conflict(&[])));
    }
}
