//! Planners: from a validated command and what the cluster holds (plain
//! values) to the writes to make, or a refusal. No I/O here: every decision
//! of a command is made in this module, and [`super::execute`] carries it
//! out.

use serde_json::{Value, json};

use crate::commands::{Deploy, Target};
use crate::cp::wire::AckResource;
use crate::image::{ImageRef, valid_digest};
use crate::ownership::{self, Judge, Question, Verdict, Verifier};
use crate::policy::{ClusterChecks, PodSecurity, Violation};
use crate::refusal::{Nothing, Refusal};
use crate::resource::{Kind, ObjectRef};
use crate::words::ResourceAction;

/// The uid and resourceVersion an object was read at: a write or delete
/// guarded by them fails if it was replaced or changed since.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadAt {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.resourceVersion`.
    pub version: String,
}

impl ReadAt {
    /// Where `object` was read, if it says.
    pub fn of(object: &Value) -> Option<ReadAt> {
        Some(ReadAt {
            uid: object["metadata"]["uid"].as_str()?.to_owned(),
            version: object["metadata"]["resourceVersion"].as_str()?.to_owned(),
        })
    }
}

/// A refusal of an object read without a uid or resourceVersion, which no
/// write could be guarded with (an API server always sets both).
fn unguardable(reference: &ObjectRef, nothing: Nothing) -> Refused {
    Refused {
        refusal: Refusal::NotOwned {
            nothing,
            reasons: vec![format!(
                "{reference} was read without a uid or resourceVersion"
            )],
        },
        resources: vec![reference.ack(ResourceAction::Refused)],
    }
}

/// One write of a deploy.
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    /// The object.
    pub reference: ObjectRef,
    /// The object to write: the manifest with ownership labels, guarded
    /// by [`Write::existing`] (the owner reference of `crd` runtime
    /// objects is added at execution, once the NexoProxy's uid is known).
    pub object: Value,
    /// Needs an ownerReference to the deployment's NexoProxy.
    pub owned_by_proxy: bool,
    /// Where the existing object was read; `None`: absent, so created.
    pub existing: Option<ReadAt>,
    /// Adopting a legacy object through the migration gate.
    pub adopt: bool,
    /// Its apply takes fields over from other managers: an adoption, or a
    /// conflict only with this Manager's own earlier update
    /// ([`crate::kube::Error::is_apply_conflict_only_with`]).
    pub force: bool,
}

impl Write {
    /// The ack action once written, from the `resourceVersion` the write
    /// answered with: an apply that changed nothing keeps the version.
    pub fn action(&self, written_version: Option<&str>) -> ResourceAction {
        match &self.existing {
            None => ResourceAction::Created,
            Some(_) if self.adopt => ResourceAction::Configured,
            Some(at) if Some(at.version.as_str()) == written_version => ResourceAction::Unchanged,
            Some(_) => ResourceAction::Configured,
        }
    }

    /// Whether a failed apply of it is a conflict only with this Manager's
    /// own earlier update (a rollout's image): then the deploy's desired
    /// state wins, and the write takes its fields over (`force`).
    pub fn takes_over(&mut self, e: &crate::kube::Error) -> bool {
        let ours = e.is_apply_conflict_only_with(crate::kube::client::FIELD_MANAGER);
        self.force |= ours;
        ours
    }

    /// Whether its apply fields must be taken from a dry run made once the
    /// NexoProxy exists: a new runtime object of a new NexoProxy, whose
    /// first dry run had no owner reference to carry.
    pub fn needs_owner_dry_run(&self, proxy_existed: bool) -> bool {
        self.owned_by_proxy && !proxy_existed && self.existing.is_none()
    }
}

/// A refused command: why, and the ack's resources.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    /// Why.
    pub refusal: Refusal,
    /// The ack resources.
    pub resources: Vec<AckResource>,
}

/// The manifest with the ownership labels of `deployment` in `v`'s
/// environment and its proof, and guarded by `existing`: the write fails
/// if the object was replaced or changed since it was read. An absent
/// object's proof needs the uid its create answers with: until then it
/// is empty (set, so that the apply's fields own it), and the executor
/// writes it ([`crate::kube::Client::create_as_applied`]).
fn labelled(
    manifest: &Value,
    reference: &ObjectRef,
    v: &Verifier<'_>,
    deployment: &str,
    existing: Option<&ReadAt>,
) -> Value {
    let mut object = manifest.clone();
    let meta = &mut object["metadata"];
    let mut labels = meta["labels"].as_object().cloned().unwrap_or_default();
    labels.insert(ownership::MANAGED_BY.into(), ownership::MANAGER.into());
    labels.insert(ownership::OWNER_ID.into(), v.environment_id.into());
    labels.insert(ownership::DEPLOYMENT.into(), deployment.into());
    meta["labels"] = Value::Object(labels);
    let proof = existing.map_or_else(String::new, |at| {
        let r = reference;
        v.proof(r.kind.name(), &r.namespace, &r.name, &at.uid, deployment)
    });
    let mut annotations = meta["annotations"].as_object().cloned().unwrap_or_default();
    annotations.insert(crate::integrity::ANNOTATION.into(), proof.into());
    meta["annotations"] = Value::Object(annotations);
    if let Some(at) = existing {
        meta["uid"] = at.uid.as_str().into();
        meta["resourceVersion"] = at.version.as_str().into();
    }
    object
}

/// A deploy's plan: its writes, each complete (labels, proof, guard,
/// ownerReference when the NexoProxy exists, force), the primary object
/// first; the objects drift enforcement leaves alone, with why; the
/// existing NexoProxy's uid.
#[derive(Debug, Clone, PartialEq)]
pub struct DeployPlan {
    pub writes: Vec<Write>,
    pub skipped: Vec<(ObjectRef, String)>,
    pub proxy_uid: Option<String>,
}

/// Plans a deploy from each manifest's existing object (same order as
/// `deploy.manifests`), with one [`Verdict`] per existing object. The
/// Manager's own objects refuse the whole command (the first, in manifest
/// order: by name when absent, as read when present); objects not the
/// deployment's refuse it, naming each, but under drift enforcement
/// (`enforcing`), where those other than the deployment's NexoProxy or
/// Deployment are left alone and the rest restored. The primary object
/// comes first, so that its uid is known before the runtime objects are
/// written.
pub fn deploy(
    d: &Deploy,
    existing: &[Option<Value>],
    judge: &Judge<'_>,
    allow_legacy: bool,
    enforcing: bool,
) -> Result<DeployPlan, Refused> {
    let gate_open = allow_legacy && d.adopt_legacy;
    let mut skipped = Vec::new();
    let mut kept = Vec::with_capacity(d.manifests.len());
    for (manifest, object) in d.manifests.iter().zip(existing) {
        let r = &manifest.reference;
        let leave = enforcing && !d.is_primary(r);
        let verdict = object.as_ref().map(|o| {
            let q = question(r, &d.deployment.name, gate_open && !leave, false);
            judge.verdict(&q, o)
        });
        match (verdict, leave) {
            (Some(Verdict::ManagersOwn(refusal)), true) => {
                skipped.push((r.clone(), refusal.to_string()))
            }
            (Some(Verdict::NotTheDeployments(why)), true) => skipped.push((r.clone(), why)),
            (verdict, _) => kept.push((manifest, object.as_ref(), verdict)),
        }
    }
    for (manifest, _, verdict) in &kept {
        let r = &manifest.reference;
        let refusal = match verdict {
            Some(Verdict::ManagersOwn(refusal)) => Some(refusal.clone()),
            None => judge
                .own
                .refusal(r.kind.name(), &r.namespace, &r.name, None),
            Some(_) => None,
        };
        if let Some(refusal) = refusal {
            return Err(Refused {
                refusal,
                resources: vec![r.ack(ResourceAction::Refused)],
            });
        }
    }
    let mut writes = Vec::new();
    let mut refused = Vec::new();
    let mut reasons = Vec::new();
    for (manifest, object, verdict) in kept {
        let reference = &manifest.reference;
        if let Some(Verdict::NotTheDeployments(why)) = &verdict {
            reasons.push(format!("{reference} {why}"));
            refused.push(reference.ack(ResourceAction::Refused));
            continue;
        }
        let read_at = match object {
            None => None,
            Some(o) => Some(ReadAt::of(o).ok_or_else(|| unguardable(reference, Nothing::Applied))?),
        };
        let adopt = matches!(verdict, Some(Verdict::Deployments { adopt: true }));
        let write = Write {
            reference: reference.clone(),
            object: labelled(
                &manifest.object,
                reference,
                &judge.verifier,
                &d.deployment.name,
                read_at.as_ref(),
            ),
            owned_by_proxy: d.format.owned_by_primary(reference.kind),
            adopt,
            // Enforcement restores what the record says, whoever changed it.
            force: adopt || enforcing,
            existing: read_at,
        };
        if reference.kind == d.format.primary() {
            writes.insert(0, write)
        } else {
            writes.push(write)
        }
    }
    if !refused.is_empty() {
        return Err(Refused {
            refusal: Refusal::NotOwned {
                nothing: Nothing::Applied,
                reasons,
            },
            resources: refused,
        });
    }
    // The uid of an existing NexoProxy: its runtime objects' ownerReference
    // is known now, and their dry runs carry it.
    let proxy_uid = existing
        .iter()
        .flatten()
        .find(|o| o["kind"] == "NexoProxy")
        .and_then(|o| o["metadata"]["uid"].as_str())
        .map(str::to_owned);
    if let Some(uid) = &proxy_uid {
        for w in writes.iter_mut().filter(|w| w.owned_by_proxy) {
            w.object["metadata"]["ownerReferences"] = owner_reference(&d.deployment.name, uid);
        }
    }
    Ok(DeployPlan {
        writes,
        skipped,
        proxy_uid,
    })
}

/// The namespace's Pod Security floor (docs/protocol.md, "Content
/// policy"): in a namespace whose `pod-security.kubernetes.io/enforce` is
/// `restricted`, the first `restricted` rule the deploy's pod template
/// breaks (found by the permit's one walk), named with the namespace.
pub fn pod_security_floor(
    checks: &ClusterChecks,
    d: &Deploy,
    namespace: &Value,
) -> Option<Violation> {
    let enforce = namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"].as_str();
    if crate::policy::namespace_profile(enforce) != PodSecurity::Restricted {
        return None;
    }
    let v = checks.restricted.as_ref()?;
    Some(Violation(format!(
        "{} (namespace {} enforces {})",
        v.0,
        d.deployment.namespace,
        enforce.unwrap_or("?")
    )))
}

/// Why an object a deploy's pod template names outside the deploy
/// (`read`: as read, `None` when absent) may not be referenced: it must be
/// the deployment's, by its labels and proof, and labelled with its name.
pub fn outside_reference(
    judge: &Judge<'_>,
    d: &Deploy,
    r: &ObjectRef,
    read: Option<&Value>,
) -> Option<String> {
    let Some(object) = read else {
        return Some("does not exist".to_owned());
    };
    match judge.verdict(&question(r, &d.deployment.name, false, true), object) {
        Verdict::ManagersOwn(_) => Some("is the Manager's own".to_owned()),
        Verdict::NotTheDeployments(why) => Some(why),
        Verdict::Deployments { .. } => None,
    }
}

/// The ownerReference of a runtime object to its NexoProxy.
pub fn owner_reference(proxy_name: &str, proxy_uid: &str) -> Value {
    let proxy = Kind::NexoProxy;
    json!([{"apiVersion": proxy.api_version(), "kind": proxy.name(), "name": proxy_name, "uid": proxy_uid, "controller": true}])
}

/// An object as read, with its verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct Judged {
    pub object: Value,
    pub verdict: Verdict,
}

/// Judges `object` (as read at `r`) for a command of `deployment`, the
/// legacy gate closed: one of the Manager's own refuses the whole command
/// at once.
pub fn judged(
    judge: &Judge<'_>,
    r: &ObjectRef,
    deployment: &str,
    labelled: bool,
    object: Value,
) -> Result<Judged, Refused> {
    match judge.verdict(&question(r, deployment, false, labelled), &object) {
        Verdict::ManagersOwn(refusal) => Err(Refused {
            refusal,
            resources: vec![r.ack(ResourceAction::Refused)],
        }),
        verdict => Ok(Judged { object, verdict }),
    }
}

/// What a command of `deployment` asks of the object at `r`.
pub(super) fn question<'a>(
    r: &'a ObjectRef,
    deployment: &'a str,
    legacy_gate: bool,
    labelled: bool,
) -> Question<'a> {
    Question {
        kind: r.kind.name(),
        namespace: &r.namespace,
        name: &r.name,
        deployment,
        legacy_gate,
        labelled,
    }
}

/// Why an object is not the deployment's, from its verdict (`None`: it is).
pub(super) fn not_ours(verdict: &Verdict) -> Option<String> {
    match verdict {
        Verdict::Deployments { .. } => None,
        Verdict::NotTheDeployments(why) => Some(why.clone()),
        Verdict::ManagersOwn(refusal) => Some(refusal.to_string()),
    }
}

/// The image a rollout sets.
pub fn rollout_image(configured: &ImageRef, image_tag: Option<&str>) -> String {
    match image_tag {
        None => configured.to_string(),
        Some(t) if valid_digest(t) => configured.with_digest(t).to_string(),
        Some(t) => configured.with_tag(t).to_string(),
    }
}

/// One NexoProxy a rollout changes (or leaves as it is).
#[derive(Debug, Clone, PartialEq)]
pub struct ImageChange {
    /// The NexoProxy.
    pub reference: ObjectRef,
    /// Its `resourceVersion` when read.
    pub version: String,
    /// Whether its image differs from the new one.
    pub changed: bool,
    /// Its proof (written with the image: an unproven NexoProxy adopted
    /// through `NEXO_ADOPT_UNPROVEN` gets it).
    pub proof: String,
}

/// Plans a rollout from each target's existing NexoProxy: every target must
/// exist and be owned, or nothing changes.
pub fn rollout(
    targets: &[(Target, Option<Judged>)],
    image: &str,
    v: &Verifier<'_>,
) -> Result<Vec<ImageChange>, Refused> {
    let mut changes = Vec::new();
    let mut refused = Vec::new();
    let mut reasons = Vec::new();
    for (t, existing) in targets {
        let reference = ObjectRef::new(Kind::NexoProxy, &t.namespace, &t.name);
        let why = match existing {
            None => "does not exist".to_owned(),
            Some(Judged {
                object: obj,
                verdict,
            }) => match not_ours(verdict) {
                None => {
                    changes.push(ImageChange {
                        version: obj["metadata"]["resourceVersion"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                        changed: obj["spec"]["image"].as_str() != Some(image),
                        proof: v.proof(
                            "NexoProxy",
                            &t.namespace,
                            &t.name,
                            obj["metadata"]["uid"].as_str().unwrap_or_default(),
                            &t.name,
                        ),
                        reference,
                    });
                    continue;
                }
                Some(why) => why,
            },
        };
        let action = match existing {
            None => ResourceAction::Absent,
            Some(_) => ResourceAction::Refused,
        };
        reasons.push(format!("{reference} {why}"));
        refused.push(reference.ack(action));
    }
    if refused.is_empty() {
        return Ok(changes);
    }
    // The ack lists every target: the refused ones and the ones left unchanged.
    let mut resources = refused;
    resources.extend(
        changes
            .iter()
            .map(|c| c.reference.ack(ResourceAction::Unchanged)),
    );
    Err(Refused {
        refusal: Refusal::NotOwned {
            nothing: Nothing::Changed,
            reasons,
        },
        resources,
    })
}

/// One delete of an uninstall, guarded by where the object was read.
#[derive(Debug, Clone, PartialEq)]
pub struct Delete {
    /// The object.
    pub reference: ObjectRef,
    /// Its uid and resourceVersion when read and checked.
    pub read_at: ReadAt,
}

/// What an uninstall deletes.
#[derive(Debug, Clone, PartialEq)]
pub enum Removal {
    /// Nothing by that name: applied, `absent`.
    Absent,
    /// The owned NexoProxy (garbage collection removes its runtime objects).
    Proxy(Delete),
    /// The owned legacy Deployment and its labelled owned objects.
    Legacy(Vec<Delete>),
}

/// Plans an uninstall from the NexoProxy and the Deployment of that name,
/// and the objects labelled with the deployment name.
pub fn uninstall(
    t: &Target,
    proxy: Option<&Judged>,
    deployment: Option<&Judged>,
    labelled: &[(ObjectRef, Judged)],
) -> Result<Removal, Refused> {
    let delete = |reference: ObjectRef, judged: &Judged| {
        if let Some(why) = not_ours(&judged.verdict) {
            return Err(Refused {
                refusal: Refusal::NotOwned {
                    nothing: Nothing::Deleted,
                    reasons: vec![format!("{reference} {why}")],
                },
                resources: vec![reference.ack(ResourceAction::Refused)],
            });
        }
        match ReadAt::of(&judged.object) {
            Some(read_at) => Ok(Delete { reference, read_at }),
            None => Err(unguardable(&reference, Nothing::Deleted)),
        }
    };
    if let Some(p) = proxy {
        let reference = ObjectRef::new(Kind::NexoProxy, &t.namespace, &t.name);
        return delete(reference, p).map(Removal::Proxy);
    }
    let Some(d) = deployment else {
        return Ok(Removal::Absent);
    };
    let reference = ObjectRef::new(Kind::Deployment, &t.namespace, &t.name);
    let mut deletes = vec![delete(reference, d)?];
    // Only the deployment's own, by label, proof and the per-deployment
    // rule (judged with the label rule); the rest is left alone.
    for (reference, judged) in labelled {
        if matches!(judged.verdict, Verdict::Deployments { .. }) {
            deletes.push(delete(reference.clone(), judged)?);
        }
    }
    Ok(Removal::Legacy(deletes))
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
