//! Planners: from a validated command and what the cluster holds (plain
//! values) to the writes to make, or a refusal. No I/O here: every decision
//! of a command is made in this module, and [`super::execute`] carries it
//! out.

use std::fmt;

use serde_json::{Value, json};

use crate::commands::{Deploy, Target};
use crate::cp::wire::AckResource;
use crate::image::{ImageRef, valid_digest};
use crate::ownership::{self, Ownership, Verifier};
use crate::policy::Policy;
use crate::refusal::{Nothing, Refusal};
use crate::resource::{Kind, ObjectRef};
use crate::words::ResourceAction;

/// Drift enforcement's choice (docs/protocol.md, `drift.v1`): the record's objects,
/// but the deployment's NexoProxy or Deployment, that exist and are not the
/// deployment's (`own`: the Manager's own, as read; else
/// [`Verifier::refusal_for`] with the legacy gate closed), with the reason:
/// left alone, the rest restored.
pub fn not_the_deployments(
    d: &Deploy,
    existing: &[Option<Value>],
    v: &Verifier<'_>,
    own: impl Fn(&ObjectRef, Option<&Value>) -> Option<String>,
) -> Vec<(ObjectRef, String)> {
    d.manifests
        .iter()
        .zip(existing)
        .filter(|(m, _)| !d.is_primary(&m.reference))
        .filter_map(|(m, o)| {
            let o = o.as_ref()?;
            let why = own(&m.reference, Some(o))
                .or_else(|| v.refusal_for(m.reference.kind.name(), o, &d.deployment.name, false))?;
            Some((m.reference.clone(), why))
        })
        .collect()
}

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

/// Plans a deploy from each manifest's existing object (same order as
/// `deploy.manifests`). The primary object (NexoProxy or Deployment) comes
/// first, so that its uid is known before the runtime objects are written.
pub fn deploy(
    d: &Deploy,
    existing: &[Option<Value>],
    v: &Verifier<'_>,
    allow_legacy: bool,
) -> Result<Vec<Write>, Refused> {
    let gate_open = allow_legacy && d.adopt_legacy;
    let mut writes = Vec::new();
    let mut refused = Vec::new();
    let mut reasons = Vec::new();
    for (manifest, existing) in d.manifests.iter().zip(existing) {
        let reference = &manifest.reference;
        // Classified once: its proof is checked once.
        let ownership = existing
            .as_ref()
            .map(|o| v.classify(reference.kind.name(), o));
        if let (Some(obj), Some(o)) = (existing, &ownership)
            && let Some(why) = v.refusal_for_classified(o, obj, &d.deployment.name, gate_open)
        {
            reasons.push(format!("{reference} {why}"));
            refused.push(reference.ack(ResourceAction::Refused));
            continue;
        }
        let read_at = match existing {
            None => None,
            Some(o) => Some(ReadAt::of(o).ok_or_else(|| unguardable(reference, Nothing::Applied))?),
        };
        let adopt = ownership == Some(Ownership::Legacy);
        let write = Write {
            reference: reference.clone(),
            object: labelled(
                &manifest.object,
                reference,
                v,
                &d.deployment.name,
                read_at.as_ref(),
            ),
            owned_by_proxy: d.format.owned_by_primary(reference.kind),
            adopt,
            force: adopt,
            existing: read_at,
        };
        if reference.kind == d.format.primary() {
            writes.insert(0, write)
        } else {
            writes.push(write)
        }
    }
    if refused.is_empty() {
        Ok(writes)
    } else {
        Err(Refused {
            refusal: Refusal::NotOwned {
                nothing: Nothing::Applied,
                reasons,
            },
            resources: refused,
        })
    }
}

/// The ownerReference of a runtime object to its NexoProxy.
pub fn owner_reference(proxy_name: &str, proxy_uid: &str) -> Value {
    let proxy = Kind::NexoProxy;
    json!([{"apiVersion": proxy.api_version(), "kind": proxy.name(), "name": proxy_name, "uid": proxy_uid, "controller": true}])
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
    targets: &[(Target, Option<Value>)],
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
            Some(obj) => match v.refusal_for("NexoProxy", obj, &t.name, false) {
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

/// The Manager's own Deployment has no container an upgrade can patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoManagerContainer {
    /// How many containers it has.
    pub containers: usize,
}

impl fmt::Display for NoManagerContainer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the Manager's Deployment has {} containers and none is named manager",
            self.containers
        )
    }
}

impl std::error::Error for NoManagerContainer {}

/// The container an upgrade patches in the Manager's own Deployment: the one
/// named `manager`, or else the only one. Its name and image.
pub fn upgrade_container(deployment: &Value) -> Result<(&str, Option<&str>), NoManagerContainer> {
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let pick = match containers {
        [only] => Some(only),
        _ => containers.iter().find(|c| c["name"] == "manager"),
    };
    match pick {
        Some(c) => Ok((c["name"].as_str().unwrap_or_default(), c["image"].as_str())),
        None => Err(NoManagerContainer {
            containers: containers.len(),
        }),
    }
}

/// What an upgrade does.
#[derive(Debug, Clone, PartialEq)]
pub enum UpgradePlan {
    /// The Manager already runs the image: applied, `unchanged`.
    Unchanged,
    /// This strategic merge patch of the Deployment.
    Patch(Value),
}

/// Why an upgrade cannot be planned.
#[derive(Debug, Clone, PartialEq)]
pub enum UpgradeStop {
    /// No container to patch.
    NoManagerContainer(NoManagerContainer),
    /// The content policy refuses the image.
    Refused(Refusal),
}

impl fmt::Display for UpgradeStop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpgradeStop::NoManagerContainer(e) => e.fmt(f),
            UpgradeStop::Refused(r) => r.fmt(f),
        }
    }
}

/// The annotation of the Manager's Deployment naming the bundle a
/// self-upgrade moved it to: the chart reads it (`lookup`) so that a
/// `helm upgrade` to an older or the same chart keeps the newer Manager
/// (charts/nexo-manager/README.md, "Self-upgrade and Helm").
pub const UPGRADED_BUNDLE_ANNOTATION: &str = "nexo.io/upgraded-bundle";

/// Plans an upgrade of the Manager's own Deployment to `image` of bundle
/// `bundle_version`, within `policy`: the image stays in the repository
/// the Manager runs from (or the one configured). The patch sets the
/// image, the container's `NEXO_BUNDLE_VERSION` (so the new pod reports,
/// and compares downgrades with, the bundle it runs) and
/// [`UPGRADED_BUNDLE_ANNOTATION`].
pub fn upgrade(
    deployment: &Value,
    image: &ImageRef,
    bundle_version: &str,
    policy: &Policy,
) -> Result<UpgradePlan, UpgradeStop> {
    let (container, current) =
        upgrade_container(deployment).map_err(UpgradeStop::NoManagerContainer)?;
    policy
        .check_upgrade(image, current)
        .map_err(|v| UpgradeStop::Refused(Refusal::Policy(v)))?;
    let image = image.to_string();
    if current == Some(image.as_str()) {
        return Ok(UpgradePlan::Unchanged);
    }
    Ok(UpgradePlan::Patch(json!({
        "metadata": {"annotations": {UPGRADED_BUNDLE_ANNOTATION: bundle_version}},
        "spec": {"template": {"spec": {"containers": [{
            "name": container,
            "image": image,
            "env": [{"name": "NEXO_BUNDLE_VERSION", "value": bundle_version}],
        }]}}},
    })))
}

/// After a self-upgrade: a JSON patch that removes the Manager's own
/// field-manager entries (`field_manager`, `Update`) from its Deployment's
/// `managedFields`, or `None` when it has none. Each removal is guarded by
/// `test`s of that entry's manager and operation (the API server keeps the
/// entries in an order of its own, which another writer may change: a
/// failed test is a 422, and the caller reads again). Without it the
/// Manager would own the image it set, and the next server-side apply of
/// a newer chart (Helm 4) would conflict with it; the fields are left
/// owned by whoever else owns them, or by no one.
pub fn hand_back(deployment: &Value, field_manager: &str) -> Option<Value> {
    let entries = deployment["metadata"]["managedFields"].as_array()?;
    let mut ops = Vec::new();
    // From the last, so that each index is still that entry's when removed.
    for (i, e) in entries.iter().enumerate().rev() {
        if e["manager"] == field_manager && e["operation"] == "Update" {
            let at = format!("/metadata/managedFields/{i}");
            ops.push(
                json!({"op": "test", "path": format!("{at}/manager"), "value": field_manager}),
            );
            ops.push(json!({"op": "test", "path": format!("{at}/operation"), "value": "Update"}));
            ops.push(json!({"op": "remove", "path": at}));
        }
    }
    (!ops.is_empty()).then_some(Value::Array(ops))
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
    proxy: Option<&Value>,
    deployment: Option<&Value>,
    labelled: &[(ObjectRef, Value)],
    v: &Verifier<'_>,
) -> Result<Removal, Refused> {
    let delete = |reference: ObjectRef, object: &Value| {
        if let Some(why) = v.refusal_for(reference.kind.name(), object, &t.name, false) {
            return Err(Refused {
                refusal: Refusal::NotOwned {
                    nothing: Nothing::Deleted,
                    reasons: vec![format!("{reference} {why}")],
                },
                resources: vec![reference.ack(ResourceAction::Refused)],
            });
        }
        match ReadAt::of(object) {
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
    for (reference, o) in labelled {
        let ours = match v.classify(reference.kind.name(), o) {
            Ownership::Owned => true,
            Ownership::Unproven => v.adopt_unproven,
            _ => false,
        } && o["metadata"]["labels"][ownership::DEPLOYMENT] == t.name.as_str()
            && ownership::other_deployment(o, &t.name).is_none();
        if ours {
            deletes.push(delete(reference.clone(), o)?);
        }
    }
    Ok(Removal::Legacy(deletes))
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
