//! Why a payload is invalid: each case with the field and value it is
//! about. `Display` is the text after `invalid payload: ` in the ack.

use std::fmt;

use super::{Format, Kind, MAX_MANIFEST_BYTES, MAX_MANIFESTS};
use crate::drift::SettingsError;
use crate::image::ImageError;
use crate::semver::NotSemver;

/// An invalid payload. Values it quotes are clipped when it is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PayloadError {
    /// `onFailure` is neither `rollback` nor `stay`.
    OnFailure(String),
    /// A plan's `class` is not a class a plan can plan.
    PlanClass(String),
    /// A plan's `payload`, invalid as its class's.
    Planned(Box<PayloadError>),
    /// `field` is absent.
    Missing(String),
    /// `field` is not a string.
    NotAString(String),
    /// `field` is absent or not an object.
    MissingOrNotObject(String),
    /// `field` (`….name`, `metadata.name`) is not a valid name.
    InvalidName { field: String, name: String },
    /// `field` (`….namespace`) is not a valid namespace.
    InvalidNamespace { field: String, namespace: String },
    /// The namespace is not one this Manager manages.
    NotManaged { namespace: String, managed: String },
    /// `format` is neither `crd` nor `legacy`.
    UnknownFormat(String),
    /// The format's capability is not advertised.
    UnsupportedFormat(Format),
    /// The deploy's `drift` settings.
    Drift(SettingsError),
    /// `manifests` is absent or not a list.
    ManifestsNotAList,
    /// `manifests` is empty.
    NoManifests,
    /// More manifests than [`MAX_MANIFESTS`].
    TooManyManifests(usize),
    /// Manifest `index` is invalid.
    Manifest {
        index: usize,
        error: Box<PayloadError>,
    },
    /// Two manifests name the same object.
    Duplicate {
        index: usize,
        kind: Kind,
        name: String,
    },
    /// The primary object is not named like the deployment.
    PrimaryMisnamed {
        primary: Kind,
        name: String,
        deployment: String,
    },
    /// No primary object.
    NoPrimary(Kind),
    /// More than one primary object.
    SeveralPrimaries(Kind),
    /// A legacy deployment's name is not a Deployment name.
    LegacyName,
    /// `field` is not a boolean.
    NotABoolean(&'static str),
    /// `field` is not an object.
    NotAnObject(&'static str),
    /// A manifest over [`MAX_MANIFEST_BYTES`]: its size.
    ManifestTooLarge(usize),
    /// A manifest that is not a JSON object.
    ManifestNotAnObject,
    /// A cluster-scoped kind.
    ClusterScoped(&'static str),
    /// A kind the format does not allow.
    KindNotAllowed {
        api_version: String,
        kind: String,
        format: Format,
    },
    /// A manifest's namespace is not the deployment's.
    NamespaceDiffers {
        namespace: String,
        deployment: String,
    },
    /// A manifest sets `metadata.ownerReferences`.
    OwnerReferences,
    /// `imageTag` is neither a tag nor a digest.
    BadImageTag(String),
    /// `targets` is an empty list.
    NoTargets,
    /// `field` is not a list.
    NotAList(&'static str),
    /// `bundleVersion` is empty or over 64 bytes.
    BundleVersionLength,
    /// `bundleVersion` is not SemVer.
    BundleVersion { text: String, error: NotSemver },
    /// `managerImage` is not an image reference.
    ManagerImage(ImageError),
    /// `managerImage` has no digest.
    NotPinned(String),
}

impl fmt::Display for PayloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use PayloadError as E;
        match self {
            E::PlanClass(class) => write!(
                f,
                "class {class:?} cannot be planned (deploy, rollout, upgrade or uninstall)"
            ),
            E::Planned(e) => write!(f, "payload.payload: {e}"),
            E::OnFailure(v) => write!(f, "onFailure {v:?} is neither \"rollback\" nor \"stay\""),
            E::Missing(field) => write!(f, "{field} is missing"),
            E::NotAString(field) => write!(f, "{field} is not a string"),
            E::MissingOrNotObject(field) => write!(f, "{field} is missing or not an object"),
            E::InvalidName { field, name } => write!(f, "{field} {name:?} is not a valid name"),
            E::InvalidNamespace { field, namespace } => {
                write!(f, "{field} {namespace:?} is not a valid namespace")
            }
            E::NotManaged { namespace, managed } => write!(
                f,
                "namespace {namespace} is not managed by this Manager (managed: {managed})"
            ),
            E::UnknownFormat(name) => write!(f, "format {name:?} is neither crd nor legacy"),
            E::UnsupportedFormat(format) => {
                write!(f, "format {format} is not supported by this Manager")
            }
            E::Drift(e) => write!(f, "{e}"),
            E::ManifestsNotAList => f.write_str("manifests is missing or not a list"),
            E::NoManifests => f.write_str("manifests is empty"),
            E::TooManyManifests(n) => write!(f, "{n} manifests, more than {MAX_MANIFESTS}"),
            E::Manifest { index, error } => write!(f, "manifests[{index}]: {error}"),
            E::Duplicate { index, kind, name } => {
                write!(f, "manifests[{index}]: {kind} {name} appears twice")
            }
            E::PrimaryMisnamed {
                primary,
                name,
                deployment,
            } => write!(f, "the {primary} is named {name}, not {deployment}"),
            E::NoPrimary(primary) => write!(f, "no {primary} among the manifests"),
            E::SeveralPrimaries(primary) => {
                write!(f, "more than one {primary} among the manifests")
            }
            E::LegacyName => f.write_str("deployment.name is not a valid Deployment name"),
            E::NotABoolean(field) => write!(f, "{field} is not a boolean"),
            E::NotAnObject(field) => write!(f, "{field} is not an object"),
            E::ManifestTooLarge(size) => write!(
                f,
                "{size} bytes, over the {} KiB limit",
                MAX_MANIFEST_BYTES / 1024
            ),
            E::ManifestNotAnObject => f.write_str("not an object"),
            E::ClusterScoped(kind) => write!(
                f,
                "{kind} is cluster-scoped; only namespaced objects can be deployed"
            ),
            E::KindNotAllowed {
                api_version,
                kind,
                format,
            } => {
                let allowed: Vec<String> = format
                    .kinds()
                    .iter()
                    .map(|k| format!("{} {k}", k.api_version()))
                    .collect();
                write!(
                    f,
                    "{api_version} {kind} is not allowed in format {format} (allowed: {})",
                    allowed.join(", ")
                )
            }
            E::NamespaceDiffers {
                namespace,
                deployment,
            } => write!(
                f,
                "namespace {namespace:?} differs from deployment.namespace {deployment}"
            ),
            E::OwnerReferences => {
                f.write_str("metadata.ownerReferences is set by the Manager, not by the command")
            }
            E::BadImageTag(tag) => {
                write!(f, "imageTag {tag:?} is neither a tag nor sha256:<64 hex>")
            }
            E::NoTargets => {
                f.write_str("targets is empty (omit it to roll out every owned NexoProxy)")
            }
            E::NotAList(field) => write!(f, "{field} is not a list"),
            E::BundleVersionLength => f.write_str("bundleVersion is empty or too long"),
            E::BundleVersion { text, error } => write!(f, "bundleVersion {text:?}: {error}"),
            E::ManagerImage(e) => write!(f, "managerImage: {e}"),
            E::NotPinned(image) => write!(
                f,
                "managerImage {image:?} is not pinned by digest (…@sha256:<64 hex>)"
            ),
        }
    }
}

impl std::error::Error for PayloadError {}

impl From<SettingsError> for PayloadError {
    fn from(e: SettingsError) -> PayloadError {
        PayloadError::Drift(e)
    }
}
