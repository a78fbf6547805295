//! Planners: from a validated command and what the cluster holds (plain
//! values) to the writes to make, or a refusal. No I/O here.

use serde_json::{Value, json};

use super::{Deploy, Format, Target};
use crate::cp::wire::AckResource;
use crate::image::{ImageRef, valid_digest};
use crate::ownership::{self, Ownership};

/// One object: its type and place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRef {
    /// `apiVersion`.
    pub api_version: String,
    /// `kind`.
    pub kind: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ObjectRef {
    /// The reference of a (namespaced) manifest.
    pub fn of(manifest: &Value) -> ObjectRef {
        ObjectRef {
            api_version: manifest["apiVersion"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            kind: manifest["kind"].as_str().unwrap_or_default().to_owned(),
            namespace: manifest["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            name: manifest["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        }
    }

    /// A NexoProxy reference.
    pub fn proxy(t: &Target) -> ObjectRef {
        ObjectRef::new("nexo.io/v1alpha1", "NexoProxy", &t.namespace, &t.name)
    }

    /// A reference from parts.
    pub fn new(api_version: &str, kind: &str, namespace: &str, name: &str) -> ObjectRef {
        ObjectRef {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The collection URL path of its kind in its namespace.
    pub fn collection(&self) -> String {
        let plural = match self.kind.as_str() {
            "NexoProxy" => "nexoproxies",
            "NexoPipeline" => "nexopipelines",
            "ConfigMap" => "configmaps",
            "Secret" => "secrets",
            "Service" => "services",
            "Deployment" => "deployments",
            // Validation admits no other kind; should one get here, the
            // lowercase plural is Kubernetes' rule for simple kinds.
            other => return self.collection_of(&format!("{}s", other.to_ascii_lowercase())),
        };
        self.collection_of(plural)
    }

    fn collection_of(&self, plural: &str) -> String {
        let group = if self.api_version == "v1" {
            "/api/v1".to_owned()
        } else {
            format!("/apis/{}", self.api_version)
        };
        format!("{group}/namespaces/{}/{plural}", self.namespace)
    }

    /// The object's URL path.
    pub fn path(&self) -> String {
        format!("{}/{}", self.collection(), self.name)
    }

    /// Its line in an ack.
    pub fn ack(&self, action: &str) -> AckResource {
        AckResource {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            action: action.into(),
        }
    }
}

/// Why an existing object may not be written.
pub fn refusal_reason(existing: &Value, environment_id: &str, gate_open: bool) -> Option<String> {
    match ownership::classify(existing, environment_id) {
        Ownership::Owned => None,
        Ownership::Legacy if gate_open => None,
        Ownership::Legacy => Some(
            "is a legacy (0.2.0) object; adopting it needs both NEXO_ALLOW_LEGACY_ADOPTION=true and migration.adoptLegacy: true".into(),
        ),
        Ownership::OtherEnvironment(other) => Some(format!("belongs to environment {other}")),
        Ownership::Unrelated => Some("exists and is not managed by nexo-manager".into()),
    }
}

/// Why an owned object belongs to another deployment than `deployment`
/// (protocol.md, "Ownership"): its `nexo.io/deployment` label names another
/// one, or it has a controller ownerReference to something other than that
/// deployment's NexoProxy. An object without the label (or a controller) is
/// not claimed by any other deployment.
pub fn other_deployment(existing: &Value, deployment: &str) -> Option<String> {
    let meta = &existing["metadata"];
    if let Some(label) = meta["labels"][ownership::DEPLOYMENT].as_str()
        && label != deployment
    {
        return Some(format!(
            "belongs to deployment {}",
            crate::logging::escape(label)
        ));
    }
    let controller = meta["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["controller"] == true)?;
    let ours = controller["kind"] == "NexoProxy"
        && controller["apiVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("nexo.io/"))
        && controller["name"] == deployment;
    (!ours).then(|| {
        format!(
            "is controlled by {} {}",
            crate::logging::escape(controller["kind"].as_str().unwrap_or("?")),
            crate::logging::escape(controller["name"].as_str().unwrap_or("?"))
        )
    })
}

/// Why an existing object may not be written by a command of `deployment`:
/// [`refusal_reason`], then the per-deployment rule ([`other_deployment`])
/// for objects this environment owns.
pub fn refusal_for(
    existing: &Value,
    environment_id: &str,
    deployment: &str,
    gate_open: bool,
) -> Option<String> {
    refusal_reason(existing, environment_id, gate_open).or_else(|| {
        match ownership::classify(existing, environment_id) {
            Ownership::Owned => other_deployment(existing, deployment),
            _ => None,
        }
    })
}

/// One write of a deploy.
#[derive(Debug, Clone, PartialEq)]
pub struct Write {
    /// The object.
    pub reference: ObjectRef,
    /// The object to apply: the manifest with ownership labels (the owner
    /// reference of `crd` runtime objects is added at execution, once the
    /// NexoProxy's uid is known).
    pub object: Value,
    /// Needs an ownerReference to the deployment's NexoProxy.
    pub owned_by_proxy: bool,
    /// `resourceVersion` of the existing object, if any.
    pub existing_version: Option<String>,
    /// `uid` of the existing object, if any.
    pub existing_uid: Option<String>,
    /// Adopting a legacy object through the migration gate.
    pub adopt: bool,
}

/// A refused command: the message and the ack's resources.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    /// The ack message.
    pub message: String,
    /// The ack resources.
    pub resources: Vec<AckResource>,
}

/// Plans a deploy from each manifest's existing object (same order as
/// `deploy.manifests`). The primary object (NexoProxy or Deployment) comes
/// first, so that its uid is known before the runtime objects are written.
pub fn deploy(
    d: &Deploy,
    existing: &[Option<Value>],
    environment_id: &str,
    allow_legacy: bool,
) -> Result<Vec<Write>, Refused> {
    let gate_open = allow_legacy && d.adopt_legacy;
    let mut writes = Vec::new();
    let mut refused = Vec::new();
    let mut reasons = Vec::new();
    for (manifest, existing) in d.manifests.iter().zip(existing) {
        let reference = ObjectRef::of(manifest);
        if let Some(obj) = existing
            && let Some(why) = refusal_for(obj, environment_id, &d.deployment.name, gate_open)
        {
            reasons.push(format!(
                "{} {}/{} {why}",
                reference.kind, reference.namespace, reference.name
            ));
            refused.push(reference.ack("refused"));
            continue;
        }
        let mut object = manifest.clone();
        let labels = object["metadata"]["labels"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        let mut labels = labels;
        labels.insert(ownership::MANAGED_BY.into(), ownership::MANAGER.into());
        labels.insert(ownership::OWNER_ID.into(), environment_id.into());
        labels.insert(
            ownership::DEPLOYMENT.into(),
            d.deployment.name.clone().into(),
        );
        object["metadata"]["labels"] = Value::Object(labels);
        let primary = matches!(reference.kind.as_str(), "NexoProxy" | "Deployment");
        let owned_by_proxy =
            d.format == Format::Crd && matches!(reference.kind.as_str(), "ConfigMap" | "Secret");
        let adopt = existing
            .as_ref()
            .is_some_and(|o| ownership::classify(o, environment_id) == Ownership::Legacy);
        let existing_version = existing
            .as_ref()
            .and_then(|o| o["metadata"]["resourceVersion"].as_str())
            .map(str::to_owned);
        let existing_uid = existing
            .as_ref()
            .and_then(|o| o["metadata"]["uid"].as_str())
            .map(str::to_owned);
        let write = Write {
            reference,
            object,
            owned_by_proxy,
            existing_version,
            existing_uid,
            adopt,
        };
        if primary {
            writes.insert(0, write)
        } else {
            writes.push(write)
        }
    }
    if refused.is_empty() {
        Ok(writes)
    } else {
        Err(Refused {
            message: format!("refused, nothing applied: {}", reasons.join("; ")),
            resources: refused,
        })
    }
}

/// The ownerReference of a runtime object to its NexoProxy.
pub fn owner_reference(proxy_name: &str, proxy_uid: &str) -> Value {
    json!([{"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy", "name": proxy_name, "uid": proxy_uid, "controller": true}])
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
}

/// Plans a rollout from each target's existing NexoProxy: every target must
/// exist and be owned, or nothing changes.
pub fn rollout(
    targets: &[(Target, Option<Value>)],
    image: &str,
    environment_id: &str,
) -> Result<Vec<ImageChange>, Refused> {
    let mut changes = Vec::new();
    let mut refused = Vec::new();
    let mut reasons = Vec::new();
    for (t, existing) in targets {
        let reference = ObjectRef::proxy(t);
        match existing {
            None => {
                reasons.push(format!(
                    "NexoProxy {}/{} does not exist",
                    t.namespace, t.name
                ));
                refused.push(reference.ack("absent"));
            }
            Some(obj) => match refusal_for(obj, environment_id, &t.name, false) {
                None => changes.push(ImageChange {
                    version: obj["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    changed: obj["spec"]["image"].as_str() != Some(image),
                    reference,
                }),
                Some(why) => {
                    reasons.push(format!("NexoProxy {}/{} {why}", t.namespace, t.name));
                    refused.push(reference.ack("refused"));
                }
            },
        }
    }
    if refused.is_empty() {
        Ok(changes)
    } else {
        // The ack lists every target: the refused ones and the ones left unchanged.
        let mut resources = refused;
        resources.extend(changes.iter().map(|c| c.reference.ack("unchanged")));
        Err(Refused {
            message: format!("refused, nothing changed: {}", reasons.join("; ")),
            resources,
        })
    }
}

/// The container an upgrade patches in the Manager's own Deployment: the one
/// named `manager`, or else the only one.
pub fn upgrade_container(deployment: &Value) -> Result<(String, Option<String>), String> {
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let pick = containers
        .iter()
        .find(|c| c["name"] == "manager")
        .or(if containers.len() == 1 {
            containers.first()
        } else {
            None
        });
    match pick {
        Some(c) => Ok((
            c["name"].as_str().unwrap_or_default().to_owned(),
            c["image"].as_str().map(str::to_owned),
        )),
        None => Err(format!(
            "the Manager's Deployment has {} containers and none is named manager",
            containers.len()
        )),
    }
}

/// What an uninstall deletes.
#[derive(Debug, Clone, PartialEq)]
pub enum Removal {
    /// Nothing by that name: applied, `absent`.
    Absent,
    /// The owned NexoProxy (garbage collection removes its runtime objects).
    Proxy(ObjectRef),
    /// The owned legacy Deployment and its labelled owned objects.
    Legacy(Vec<ObjectRef>),
}

/// Plans an uninstall from the NexoProxy and the Deployment of that name,
/// and the objects labelled with the deployment name.
pub fn uninstall(
    t: &Target,
    proxy: Option<&Value>,
    deployment: Option<&Value>,
    labelled: &[(ObjectRef, Value)],
    environment_id: &str,
) -> Result<Removal, Refused> {
    let refuse = |reference: ObjectRef, why: String| Refused {
        message: format!(
            "refused, nothing deleted: {} {}/{} {why}",
            reference.kind, reference.namespace, reference.name
        ),
        resources: vec![reference.ack("refused")],
    };
    if let Some(p) = proxy {
        let reference = ObjectRef::proxy(t);
        return match refusal_for(p, environment_id, &t.name, false) {
            None => Ok(Removal::Proxy(reference)),
            Some(why) => Err(refuse(reference, why)),
        };
    }
    let Some(d) = deployment else {
        return Ok(Removal::Absent);
    };
    let reference = ObjectRef::new("apps/v1", "Deployment", &t.namespace, &t.name);
    if let Some(why) = refusal_for(d, environment_id, &t.name, false) {
        return Err(refuse(reference, why));
    }
    let mut refs = vec![reference];
    refs.extend(
        labelled
            .iter()
            .filter(|(_, o)| ownership::classify(o, environment_id) == Ownership::Owned)
            .filter(|(_, o)| o["metadata"]["labels"][ownership::DEPLOYMENT] == t.name.as_str())
            .filter(|(_, o)| other_deployment(o, &t.name).is_none())
            .map(|(r, _)| r.clone()),
    );
    Ok(Removal::Legacy(refs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::Deploy;

    const ENV: &str = "env-a";

    fn obj(kind: &str, name: &str, labels: Value) -> Value {
        json!({"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": "shop", "labels": labels, "resourceVersion": "7", "uid": "u1"}})
    }

    fn owned() -> Value {
        json!({"app.kubernetes.io/managed-by": "nexo-manager", "nexo.io/owner-id": ENV})
    }

    fn d(adopt: bool) -> Deploy {
        Deploy {
            deployment: Target {
                name: "orders".into(),
                namespace: "shop".into(),
            },
            format: Format::Crd,
            manifests: vec![
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "orders-config", "namespace": "shop", "labels": {"team": "db"}}}),
                json!({"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy", "metadata": {"name": "orders", "namespace": "shop"}}),
            ],
            adopt_legacy: adopt,
        }
    }

    #[test]
    fn deploy_labels_everything_and_orders_the_proxy_first() {
        let w = deploy(&d(false), &[None, None], ENV, false).unwrap();
        assert_eq!(w[0].reference.kind, "NexoProxy");
        assert!(w[1].owned_by_proxy && !w[0].owned_by_proxy);
        let labels = &w[1].object["metadata"]["labels"];
        assert_eq!(labels["team"], "db");
        assert_eq!(labels["nexo.io/owner-id"], ENV);
        assert_eq!(labels["nexo.io/deployment"], "orders");
        assert_eq!(
            w[1].reference.path(),
            "/api/v1/namespaces/shop/configmaps/orders-config"
        );
        assert_eq!(
            w[0].reference.path(),
            "/apis/nexo.io/v1alpha1/namespaces/shop/nexoproxies/orders"
        );
    }

    #[test]
    fn the_migration_gate_needs_both_halves() {
        let legacy = Some(obj(
            "ConfigMap",
            "orders-config",
            json!({"app.kubernetes.io/part-of": "nexo"}),
        ));
        for (cluster, command) in [(false, false), (true, false), (false, true)] {
            let r = deploy(&d(command), &[legacy.clone(), None], ENV, cluster).unwrap_err();
            assert!(r.message.contains("legacy"), "{}", r.message);
            assert_eq!(r.resources[0].action, "refused");
        }
        let w = deploy(&d(true), &[legacy, None], ENV, true).unwrap();
        assert!(w[1].adopt);
    }

    #[test]
    fn unrelated_and_foreign_objects_are_refused() {
        let foreign = Some(obj(
            "ConfigMap",
            "orders-config",
            json!({"app.kubernetes.io/managed-by": "nexo-manager", "nexo.io/owner-id": "env-b"}),
        ));
        let r = deploy(&d(true), &[foreign, None], ENV, true).unwrap_err();
        assert!(
            r.message.contains("belongs to environment env-b"),
            "{}",
            r.message
        );
        let unrelated = Some(obj("ConfigMap", "orders-config", json!({})));
        let r = deploy(&d(true), &[unrelated, None], ENV, true).unwrap_err();
        assert!(r.message.contains("not managed by nexo-manager"));
        let mine = Some(obj("ConfigMap", "orders-config", owned()));
        assert_eq!(
            deploy(&d(false), &[mine, None], ENV, false).unwrap()[1]
                .existing_version
                .as_deref(),
            Some("7")
        );
    }

    #[test]
    fn an_object_of_another_deployment_is_refused_by_every_class() {
        // beta's deploy names alpha's ConfigMap: refused, never relabelled.
        let mut alpha = owned();
        alpha["nexo.io/deployment"] = json!("alpha");
        let alphas = obj("ConfigMap", "orders-config", alpha.clone());
        let r = deploy(&d(false), &[Some(alphas.clone()), None], ENV, false).unwrap_err();
        assert!(
            r.message.contains("belongs to deployment alpha"),
            "{}",
            r.message
        );
        assert_eq!(r.resources.len(), 1);
        assert_eq!(r.resources[0].action, "refused");
        // The same with the label right but a controller elsewhere.
        let mut controlled = obj("ConfigMap", "orders-config", owned());
        controlled["metadata"]["ownerReferences"] = owner_reference("alpha", "u-alpha");
        let r = deploy(&d(false), &[Some(controlled.clone()), None], ENV, false).unwrap_err();
        assert!(
            r.message.contains("controlled by NexoProxy alpha"),
            "{}",
            r.message
        );
        // Its own controller, its own label, or no label at all: fine.
        let mut mine = obj("ConfigMap", "orders-config", owned());
        mine["metadata"]["ownerReferences"] = owner_reference("orders", "u-orders");
        mine["metadata"]["labels"]["nexo.io/deployment"] = json!("orders");
        assert!(deploy(&d(false), &[Some(mine), None], ENV, false).is_ok());
        // A non-controller reference does not claim the object.
        let mut referenced = obj("ConfigMap", "orders-config", owned());
        referenced["metadata"]["ownerReferences"] =
            json!([{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"}]);
        assert!(deploy(&d(false), &[Some(referenced), None], ENV, false).is_ok());
        // A rollout or uninstall of "orders" whose NexoProxy says "alpha".
        let t = Target {
            name: "orders".into(),
            namespace: "shop".into(),
        };
        let mut proxy = obj("NexoProxy", "orders", alpha.clone());
        proxy["spec"] = json!({"image": "p:1"});
        let r = rollout(&[(t.clone(), Some(proxy.clone()))], "p:2", ENV).unwrap_err();
        assert_eq!(r.resources[0].action, "refused");
        assert!(
            r.message.contains("belongs to deployment alpha"),
            "{}",
            r.message
        );
        let r = uninstall(&t, Some(&proxy), None, &[], ENV).unwrap_err();
        assert!(
            r.message.contains("belongs to deployment alpha"),
            "{}",
            r.message
        );
        let dep = obj("Deployment", "orders", alpha);
        assert!(uninstall(&t, None, Some(&dep), &[], ENV).is_err());
        // A labelled object controlled by something else is left alone.
        let mut labels = owned();
        labels["nexo.io/deployment"] = json!("orders");
        let mine = obj("Deployment", "orders", labels.clone());
        let mut svc = obj("Service", "orders", labels);
        svc["metadata"]["ownerReferences"] = owner_reference("alpha", "u-alpha");
        let Removal::Legacy(refs) = uninstall(
            &t,
            None,
            Some(&mine),
            &[(ObjectRef::new("v1", "Service", "shop", "orders"), svc)],
            ENV,
        )
        .unwrap() else {
            panic!("an owned legacy Deployment is removed")
        };
        assert_eq!(refs.len(), 1, "{refs:?}");
        // A hostile label value cannot forge a line of the ack message.
        let mut forged = owned();
        forged["nexo.io/deployment"] = json!("x\nINFO fake");
        let r = deploy(
            &d(false),
            &[Some(obj("ConfigMap", "orders-config", forged)), None],
            ENV,
            false,
        )
        .unwrap_err();
        assert!(!r.message.contains('\n'), "{}", r.message);
    }

    #[test]
    fn rollout_checks_every_target_first() {
        let t = |n: &str| Target {
            name: n.into(),
            namespace: "shop".into(),
        };
        let mut mine = obj("NexoProxy", "a", owned());
        mine["spec"] = json!({"image": "p:1"});
        let ok = rollout(&[(t("a"), Some(mine.clone()))], "p:2", ENV).unwrap();
        assert!(ok[0].changed);
        assert!(!rollout(&[(t("a"), Some(mine.clone()))], "p:1", ENV).unwrap()[0].changed);
        let r = rollout(
            &[
                (t("a"), Some(mine.clone())),
                (t("b"), None),
                (t("c"), Some(obj("NexoProxy", "c", json!({})))),
            ],
            "p:2",
            ENV,
        )
        .unwrap_err();
        let actions: Vec<&str> = r.resources.iter().map(|x| x.action.as_str()).collect();
        assert_eq!(actions, ["absent", "refused", "unchanged"]);
        let img = ImageRef::parse("r.io/nexo/proxy:1.4.2").unwrap();
        assert_eq!(rollout_image(&img, Some("1.4.3")), "r.io/nexo/proxy:1.4.3");
        assert_eq!(rollout_image(&img, None), "r.io/nexo/proxy:1.4.2");
        let dg = format!("sha256:{}", "a".repeat(64));
        assert_eq!(
            rollout_image(&img, Some(&dg)),
            format!("r.io/nexo/proxy@{dg}")
        );
    }

    #[test]
    fn upgrade_picks_the_manager_container() {
        let dep = |cs: Value| json!({"spec": {"template": {"spec": {"containers": cs}}}});
        assert_eq!(
            upgrade_container(&dep(json!([{"name": "x", "image": "i"}])))
                .unwrap()
                .0,
            "x"
        );
        assert_eq!(
            upgrade_container(&dep(json!([{"name": "x"}, {"name": "manager"}])))
                .unwrap()
                .0,
            "manager"
        );
        assert!(upgrade_container(&dep(json!([{"name": "x"}, {"name": "y"}]))).is_err());
    }

    #[test]
    fn uninstall_refuses_what_is_not_owned() {
        let t = Target {
            name: "orders".into(),
            namespace: "shop".into(),
        };
        assert_eq!(
            uninstall(&t, None, None, &[], ENV).unwrap(),
            Removal::Absent
        );
        let mine = obj("NexoProxy", "orders", owned());
        assert!(matches!(
            uninstall(&t, Some(&mine), None, &[], ENV).unwrap(),
            Removal::Proxy(_)
        ));
        assert!(
            uninstall(
                &t,
                Some(&obj("NexoProxy", "orders", json!({}))),
                None,
                &[],
                ENV
            )
            .is_err()
        );
        let mut labels = owned();
        labels["nexo.io/deployment"] = json!("orders");
        let svc = (
            ObjectRef::new("v1", "Service", "shop", "orders"),
            obj("Service", "orders", labels),
        );
        let other = (
            ObjectRef::new("v1", "Service", "shop", "x"),
            obj("Service", "x", owned()),
        );
        let Removal::Legacy(refs) = uninstall(&t, None, Some(&mine), &[svc, other], ENV).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            refs.iter().map(|r| r.kind.as_str()).collect::<Vec<_>>(),
            ["Deployment", "Service"]
        );
    }
}
