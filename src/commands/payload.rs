//! The payload of each command class, validated into its typed form: names
//! and namespaces, a deploy's manifests (kinds its format allows, sizes,
//! one primary object named like the deployment), a rollout's image tag and
//! targets, an upgrade's digest-pinned image. Errors say what is wrong and
//! where; the caller prefixes them with `invalid payload: `.

use serde_json::Value;

use super::{
    Deploy, Format, Kind, MAX_MANIFEST_BYTES, MAX_MANIFESTS, Manifest, ObjectRef, OnFailure,
    PayloadError, Rollout, Target, Upgrade,
};
use crate::image::{ImageRef, valid_digest, valid_tag};
use crate::names::{is_dns_label, is_dns_subdomain};
use crate::text::clip;

fn string<'a>(v: &'a Value, field: &str) -> Result<&'a str, PayloadError> {
    match v {
        Value::String(s) => Ok(s),
        Value::Null => Err(PayloadError::Missing(field.to_owned())),
        _ => Err(PayloadError::NotAString(field.to_owned())),
    }
}

pub(super) fn target(v: &Value, field: &str, managed: &[String]) -> Result<Target, PayloadError> {
    if !v.is_object() {
        return Err(PayloadError::MissingOrNotObject(field.to_owned()));
    }
    let name = string(&v["name"], &format!("{field}.name"))?;
    let namespace = string(&v["namespace"], &format!("{field}.namespace"))?;
    if !is_dns_label(name) {
        return Err(PayloadError::InvalidName {
            field: format!("{field}.name"),
            name: clip(name, 64),
        });
    }
    if !is_dns_label(namespace) {
        return Err(PayloadError::InvalidNamespace {
            field: format!("{field}.namespace"),
            namespace: clip(namespace, 64),
        });
    }
    if !managed.iter().any(|m| m == namespace) {
        return Err(PayloadError::NotManaged {
            namespace: namespace.to_owned(),
            managed: managed.join(","),
        });
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
) -> Result<Deploy, PayloadError> {
    let deployment = target(&p["deployment"], "deployment", managed)?;
    let name = string(&p["format"], "format")?;
    let format = Format::parse(name).ok_or_else(|| PayloadError::UnknownFormat(clip(name, 32)))?;
    if !capabilities.contains(&format.capability()) {
        return Err(PayloadError::UnsupportedFormat(format));
    }
    let adopt_legacy = adopt_legacy(&p["migration"])?;
    let drift = crate::drift::Settings::parse(&p["drift"])?;
    let list = p["manifests"]
        .as_array()
        .ok_or(PayloadError::ManifestsNotAList)?;
    if list.is_empty() {
        return Err(PayloadError::NoManifests);
    }
    if list.len() > MAX_MANIFESTS {
        return Err(PayloadError::TooManyManifests(list.len()));
    }
    let mut manifests: Vec<Manifest> = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let m =
            manifest(m, format, &deployment.namespace).map_err(|error| PayloadError::Manifest {
                index: i,
                error: Box::new(error),
            })?;
        let r = &m.reference;
        if manifests
            .iter()
            .any(|o| o.reference.kind == r.kind && o.reference.name == r.name)
        {
            return Err(PayloadError::Duplicate {
                index: i,
                kind: r.kind,
                name: r.name.clone(),
            });
        }
        manifests.push(m);
    }
    let primary = format.primary();
    let mut primaries = manifests.iter().filter(|m| m.reference.kind == primary);
    match (primaries.next(), primaries.next()) {
        (Some(m), None) if m.reference.name == deployment.name => {}
        (Some(m), None) => {
            return Err(PayloadError::PrimaryMisnamed {
                primary,
                name: m.reference.name.clone(),
                deployment: deployment.name.clone(),
            });
        }
        (None, _) => return Err(PayloadError::NoPrimary(primary)),
        (Some(_), Some(_)) => return Err(PayloadError::SeveralPrimaries(primary)),
    }
    if format == Format::Legacy && !is_dns_label(&deployment.name) {
        return Err(PayloadError::LegacyName);
    }
    let on_failure = on_failure(&p["onFailure"], OnFailure::Stay)?;
    Ok(Deploy {
        deployment,
        format,
        manifests,
        adopt_legacy,
        drift,
        on_failure,
    })
}

/// `onFailure` (docs/protocol.md, `rollback.v1`): `rollback` or `stay`;
/// `default` when absent.
fn on_failure(v: &Value, default: OnFailure) -> Result<OnFailure, PayloadError> {
    match v {
        Value::Null => Ok(default),
        Value::String(s) if s == "rollback" => Ok(OnFailure::Rollback),
        Value::String(s) if s == "stay" => Ok(OnFailure::Stay),
        Value::String(s) => Err(PayloadError::OnFailure(clip(s, 32))),
        _ => Err(PayloadError::NotAString("onFailure".into())),
    }
}

/// The command's half of the migration gate: `migration.adoptLegacy`.
fn adopt_legacy(migration: &Value) -> Result<bool, PayloadError> {
    match migration {
        Value::Null => Ok(false),
        Value::Object(m) => match m.get("adoptLegacy") {
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(PayloadError::NotABoolean("migration.adoptLegacy")),
        },
        _ => Err(PayloadError::NotAnObject("migration")),
    }
}

/// Validates one manifest of a deploy of `format` into `namespace`.
fn manifest(m: &Value, format: Format, namespace: &str) -> Result<Manifest, PayloadError> {
    let size = serde_json::to_vec(m).map(|v| v.len()).unwrap_or(usize::MAX);
    if size > MAX_MANIFEST_BYTES {
        return Err(PayloadError::ManifestTooLarge(size));
    }
    if !m.is_object() {
        return Err(PayloadError::ManifestNotAnObject);
    }
    let api_version = string(&m["apiVersion"], "apiVersion")?;
    let kind = string(&m["kind"], "kind")?;
    if let Some(scoped) = CLUSTER_SCOPED.iter().find(|k| **k == kind) {
        return Err(PayloadError::ClusterScoped(scoped));
    }
    let Some(kind) = Kind::of(api_version, kind).filter(|k| format.kinds().contains(k)) else {
        return Err(PayloadError::KindNotAllowed {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
            format,
        });
    };
    let meta = &m["metadata"];
    if !meta.is_object() {
        return Err(PayloadError::MissingOrNotObject("metadata".into()));
    }
    let name = string(&meta["name"], "metadata.name")?;
    if !is_dns_subdomain(name) {
        return Err(PayloadError::InvalidName {
            field: "metadata.name".into(),
            name: clip(name, 64),
        });
    }
    match &meta["namespace"] {
        Value::Null => {}
        Value::String(ns) if ns == namespace => {}
        Value::String(ns) => {
            return Err(PayloadError::NamespaceDiffers {
                namespace: clip(ns, 64),
                deployment: namespace.to_owned(),
            });
        }
        _ => return Err(PayloadError::NotAString("metadata.namespace".into())),
    }
    if !matches!(meta["labels"], Value::Null | Value::Object(_)) {
        return Err(PayloadError::NotAnObject("metadata.labels"));
    }
    if meta.get("ownerReferences").is_some() {
        return Err(PayloadError::OwnerReferences);
    }
    let mut object = m.clone();
    object["metadata"]["namespace"] = Value::String(namespace.to_owned());
    Ok(Manifest {
        reference: ObjectRef::new(kind, namespace, name),
        object,
    })
}

pub(super) fn rollout(p: &Value, managed: &[String]) -> Result<Rollout, PayloadError> {
    let image_tag = match &p["imageTag"] {
        Value::Null => None,
        Value::String(t) if valid_tag(t) || valid_digest(t) => Some(t.clone()),
        Value::String(t) => {
            return Err(PayloadError::BadImageTag(clip(t, 80)));
        }
        _ => return Err(PayloadError::NotAString("imageTag".into())),
    };
    let targets = match &p["targets"] {
        Value::Null => None,
        Value::Array(list) => {
            if list.is_empty() {
                return Err(PayloadError::NoTargets);
            }
            Some(
                list.iter()
                    .enumerate()
                    .map(|(i, t)| target(t, &format!("targets[{i}]"), managed))
                    .collect::<Result<Vec<_>, _>>()?,
            )
        }
        _ => return Err(PayloadError::NotAList("targets")),
    };
    let on_failure = on_failure(&p["onFailure"], OnFailure::Stay)?;
    Ok(Rollout {
        image_tag,
        targets,
        on_failure,
    })
}

pub(super) fn upgrade(p: &Value) -> Result<Upgrade, PayloadError> {
    let bundle_version = string(&p["bundleVersion"], "bundleVersion")?;
    if bundle_version.is_empty() || bundle_version.len() > 64 {
        return Err(PayloadError::BundleVersionLength);
    }
    let bundle = crate::semver::Version::parse(bundle_version).map_err(|error| {
        PayloadError::BundleVersion {
            text: clip(bundle_version, 64),
            error,
        }
    })?;
    let allow_downgrade = match &p["allowDowngrade"] {
        Value::Null => false,
        Value::Bool(b) => *b,
        _ => return Err(PayloadError::NotABoolean("allowDowngrade")),
    };
    let image = string(&p["managerImage"], "managerImage")?;
    let manager_image = ImageRef::parse(image).map_err(PayloadError::ManagerImage)?;
    if manager_image.digest.is_none() {
        return Err(PayloadError::NotPinned(clip(image, 200)));
    }
    let on_failure = on_failure(&p["onFailure"], OnFailure::Rollback)?;
    Ok(Upgrade {
        bundle_version: bundle_version.to_owned(),
        bundle,
        allow_downgrade,
        manager_image,
        on_failure,
    })
}
