//! The payload of each command class, validated into its typed form: names
//! and namespaces, a deploy's manifests (kinds its format allows, sizes,
//! one primary object named like the deployment), a rollout's image tag and
//! targets, an upgrade's digest-pinned image. Errors say what is wrong and
//! where; the caller prefixes them with `invalid payload: `.

use serde_json::Value;

use super::{
    Deploy, Format, Kind, MAX_MANIFEST_BYTES, MAX_MANIFESTS, Manifest, ObjectRef, Rollout, Target,
    Upgrade,
};
use crate::image::{ImageRef, valid_digest, valid_tag};
use crate::names::{is_dns_label, is_dns_subdomain};
use crate::text::clip;

fn string<'a>(v: &'a Value, field: &str) -> Result<&'a str, String> {
    match v {
        Value::String(s) => Ok(s),
        Value::Null => Err(format!("{field} is missing")),
        _ => Err(format!("{field} is not a string")),
    }
}

pub(super) fn target(v: &Value, field: &str, managed: &[String]) -> Result<Target, String> {
    if !v.is_object() {
        return Err(format!("{field} is missing or not an object"));
    }
    let name = string(&v["name"], &format!("{field}.name"))?;
    let namespace = string(&v["namespace"], &format!("{field}.namespace"))?;
    if !is_dns_label(name) {
        return Err(format!(
            "{field}.name {:?} is not a valid name",
            clip(name, 64)
        ));
    }
    if !is_dns_label(namespace) {
        return Err(format!(
            "{field}.namespace {:?} is not a valid namespace",
            clip(namespace, 64)
        ));
    }
    if !managed.iter().any(|m| m == namespace) {
        return Err(format!(
            "namespace {namespace} is not managed by this Manager (managed: {})",
            managed.join(",")
        ));
    }
    Ok(Target {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
    })
}

/// Kinds that exist only cluster-wide, named in the refusal.
const CLUSTER_SCOPED: &[&str] = &[
    "Namespace",
    "Node",
    "PersistentVolume",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "StorageClass",
    "PriorityClass",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    "APIService",
    "IngressClass",
    "RuntimeClass",
    "CSIDriver",
    "VolumeAttachment",
];

pub(super) fn deploy(
    p: &Value,
    capabilities: &[&str],
    managed: &[String],
) -> Result<Deploy, String> {
    let deployment = target(&p["deployment"], "deployment", managed)?;
    let name = string(&p["format"], "format")?;
    let format = Format::parse(name)
        .ok_or_else(|| format!("format {:?} is neither crd nor legacy", clip(name, 32)))?;
    if !capabilities.contains(&format.capability()) {
        return Err(format!("format {format} is not supported by this Manager"));
    }
    let adopt_legacy = adopt_legacy(&p["migration"])?;
    let drift = crate::drift::Settings::parse(&p["drift"])?;
    let list = p["manifests"]
        .as_array()
        .ok_or("manifests is missing or not a list")?;
    if list.is_empty() {
        return Err("manifests is empty".into());
    }
    if list.len() > MAX_MANIFESTS {
        return Err(format!(
            "{} manifests, more than {MAX_MANIFESTS}",
            list.len()
        ));
    }
    let mut manifests: Vec<Manifest> = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let m = manifest(m, format, &deployment.namespace)
            .map_err(|why| format!("manifests[{i}]: {why}"))?;
        let r = &m.reference;
        if manifests
            .iter()
            .any(|o| o.reference.kind == r.kind && o.reference.name == r.name)
        {
            return Err(format!(
                "manifests[{i}]: {} {} appears twice",
                r.kind, r.name
            ));
        }
        manifests.push(m);
    }
    let primary = format.primary();
    let mut primaries = manifests.iter().filter(|m| m.reference.kind == primary);
    match (primaries.next(), primaries.next()) {
        (Some(m), None) if m.reference.name == deployment.name => {}
        (Some(m), None) => {
            return Err(format!(
                "the {primary} is named {}, not {}",
                m.reference.name, deployment.name
            ));
        }
        (None, _) => return Err(format!("no {primary} among the manifests")),
        (Some(_), Some(_)) => return Err(format!("more than one {primary} among the manifests")),
    }
    if format == Format::Legacy && !is_dns_label(&deployment.name) {
        return Err("deployment.name is not a valid Deployment name".into());
    }
    Ok(Deploy {
        deployment,
        format,
        manifests,
        adopt_legacy,
        drift,
    })
}

/// The command's half of the migration gate: `migration.adoptLegacy`.
fn adopt_legacy(migration: &Value) -> Result<bool, String> {
    match migration {
        Value::Null => Ok(false),
        Value::Object(m) => match m.get("adoptLegacy") {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err("migration.adoptLegacy is not a boolean".into()),
        },
        _ => Err("migration is not an object".into()),
    }
}

/// Validates one manifest of a deploy of `format` into `namespace`.
fn manifest(m: &Value, format: Format, namespace: &str) -> Result<Manifest, String> {
    let size = serde_json::to_vec(m).map(|v| v.len()).unwrap_or(usize::MAX);
    if size > MAX_MANIFEST_BYTES {
        return Err(format!(
            "{size} bytes, over the {} KiB limit",
            MAX_MANIFEST_BYTES / 1024
        ));
    }
    if !m.is_object() {
        return Err("not an object".into());
    }
    let api_version = string(&m["apiVersion"], "apiVersion")?;
    let kind = string(&m["kind"], "kind")?;
    if CLUSTER_SCOPED.contains(&kind) {
        return Err(format!(
            "{kind} is cluster-scoped; only namespaced objects can be deployed"
        ));
    }
    let Some(kind) = Kind::of(api_version, kind).filter(|k| format.kinds().contains(k)) else {
        let allowed: Vec<String> = format
            .kinds()
            .iter()
            .map(|k| format!("{} {k}", k.api_version()))
            .collect();
        return Err(format!(
            "{api_version} {kind} is not allowed in format {format} (allowed: {})",
            allowed.join(", ")
        ));
    };
    let meta = &m["metadata"];
    if !meta.is_object() {
        return Err("metadata is missing or not an object".into());
    }
    let name = string(&meta["name"], "metadata.name")?;
    if !is_dns_subdomain(name) {
        return Err(format!(
            "metadata.name {:?} is not a valid name",
            clip(name, 64)
        ));
    }
    match &meta["namespace"] {
        Value::Null => {}
        Value::String(ns) if ns == namespace => {}
        Value::String(ns) => {
            return Err(format!(
                "namespace {:?} differs from deployment.namespace {namespace}",
                clip(ns, 64)
            ));
        }
        _ => return Err("metadata.namespace is not a string".into()),
    }
    if !matches!(meta["labels"], Value::Null | Value::Object(_)) {
        return Err("metadata.labels is not an object".into());
    }
    if meta.get("ownerReferences").is_some() {
        return Err("metadata.ownerReferences is set by the Manager, not by the command".into());
    }
    let mut object = m.clone();
    object["metadata"]["namespace"] = Value::String(namespace.to_owned());
    Ok(Manifest {
        reference: ObjectRef::new(kind, namespace, name),
        object,
    })
}

pub(super) fn rollout(p: &Value, managed: &[String]) -> Result<Rollout, String> {
    let image_tag = match &p["imageTag"] {
        Value::Null => None,
        Value::String(t) if valid_tag(t) || valid_digest(t) => Some(t.clone()),
        Value::String(t) => {
            return Err(format!(
                "imageTag {:?} is neither a tag nor sha256:<64 hex>",
                clip(t, 80)
            ));
        }
        _ => return Err("imageTag is not a string".into()),
    };
    let targets = match &p["targets"] {
        Value::Null => None,
        Value::Array(list) => {
            if list.is_empty() {
                return Err("targets is empty (omit it to roll out every owned NexoProxy)".into());
            }
            Some(
                list.iter()
                    .enumerate()
                    .map(|(i, t)| target(t, &format!("targets[{i}]"), managed))
                    .collect::<Result<Vec<_>, _>>()?,
            )
        }
        _ => return Err("targets is not a list".into()),
    };
    Ok(Rollout { image_tag, targets })
}

pub(super) fn upgrade(p: &Value) -> Result<Upgrade, String> {
    let bundle_version = string(&p["bundleVersion"], "bundleVersion")?;
    if bundle_version.is_empty() || bundle_version.len() > 64 {
        return Err("bundleVersion is empty or too long".into());
    }
    let bundle = crate::semver::Version::parse(bundle_version)
        .map_err(|e| format!("bundleVersion {:?}: {e}", clip(bundle_version, 64)))?;
    let allow_downgrade = match &p["allowDowngrade"] {
        Value::Null => false,
        Value::Bool(b) => *b,
        _ => return Err("allowDowngrade is not a boolean".into()),
    };
    let image = string(&p["managerImage"], "managerImage")?;
    let manager_image = ImageRef::parse(image).map_err(|e| format!("managerImage: {e}"))?;
    if manager_image.digest.is_none() {
        return Err(format!(
            "managerImage {:?} is not pinned by digest (…@sha256:<64 hex>)",
            clip(image, 200)
        ));
    }
    Ok(Upgrade {
        bundle_version: bundle_version.to_owned(),
        bundle,
        allow_downgrade,
        manager_image,
    })
}
