//! The projections list items are decoded into (only the fields the
//! inventory reads), and the pure shaping of them into heartbeat entries.

use std::rc::Rc;

use serde::Deserialize;

pub use super::interner::Interner;
use super::owned::Owned;
use super::status::{Condition, MESSAGE_BYTES, MaybeGeneration, Observed, count};
use crate::ownership::{self, Ownership};

/// The metadata the inventory reads.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct MetaItem {
    /// `metadata.name`.
    pub name: Option<String>,
    /// `metadata.namespace`.
    pub namespace: Option<String>,
    /// The ownership labels; other labels are skipped.
    pub labels: OwnershipLabels,
    /// `metadata.resourceVersion` (a watch's bookmark carries only it).
    #[serde(rename = "resourceVersion")]
    pub resource_version: Option<String>,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// `metadata.uid` (what an Event is about).
    pub uid: Option<String>,
    /// The proof annotation; other annotations are skipped.
    pub annotations: ProofAnnotation,
}

/// The annotation that proves the Manager wrote an object.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ProofAnnotation {
    /// [`crate::integrity::ANNOTATION`].
    #[serde(rename = "nexo.io/proof")]
    pub proof: Option<String>,
}

/// How the inventory judges ownership: this environment, the key its
/// proofs are checked with (none before the state was read as leader:
/// nothing is proven), and the gate that lists unproven objects too.
#[derive(Debug, Clone)]
pub struct Trust {
    /// This environment.
    pub environment_id: String,
    /// The integrity key.
    pub key: Option<crate::integrity::Key>,
    /// `NEXO_ADOPT_UNPROVEN`: objects with this environment's labels and
    /// no proof are listed (they are adopted, and get their proof at
    /// their next write), and still reported.
    pub adopt_unproven: bool,
}

/// The labels that decide ownership.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct OwnershipLabels {
    /// [`ownership::MANAGED_BY`].
    #[serde(rename = "app.kubernetes.io/managed-by")]
    pub managed_by: Option<String>,
    /// [`ownership::OWNER_ID`].
    #[serde(rename = "nexo.io/owner-id")]
    pub owner_id: Option<String>,
    /// [`ownership::PART_OF`].
    #[serde(rename = "app.kubernetes.io/part-of")]
    pub part_of: Option<String>,
    /// [`ownership::DEPLOYMENT`].
    #[serde(rename = "nexo.io/deployment")]
    pub deployment: Option<String>,
}

impl MetaItem {
    /// What this object of `kind` is to the Manager: its labels, then its
    /// proof ([`ownership::Verifier::classify`]).
    pub fn ownership(&self, kind: &str, trust: &Trust) -> Ownership {
        match self.claimed(&trust.environment_id) {
            Ownership::Owned if self.proven(kind, trust) => Ownership::Owned,
            Ownership::Owned => Ownership::Unproven,
            other => other,
        }
    }

    fn proven(&self, kind: &str, trust: &Trust) -> bool {
        let Some(key) = &trust.key else {
            return false;
        };
        let v = ownership::Verifier {
            environment_id: &trust.environment_id,
            key,
            adopt_unproven: trust.adopt_unproven,
        };
        fn text(s: &Option<String>) -> &str {
            s.as_deref().unwrap_or_default()
        }
        !text(&self.uid).is_empty()
            && v.verify(
                kind,
                text(&self.namespace),
                text(&self.name),
                text(&self.uid),
                text(&self.labels.deployment),
                text(&self.annotations.proof),
            )
    }

    /// What its labels claim.
    fn claimed(&self, environment_id: &str) -> Ownership {
        let l = &self.labels;
        ownership::classify_by(
            |k| match k {
                ownership::MANAGED_BY => l.managed_by.as_deref(),
                ownership::OWNER_ID => l.owner_id.as_deref(),
                ownership::PART_OF => l.part_of.as_deref(),
                _ => None,
            },
            environment_id,
        )
    }
}

/// A NexoProxy as the inventory reads it.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ProxyItem {
    /// Its metadata.
    pub metadata: MetaItem,
    /// `spec.replicas` and `spec.image`.
    pub spec: ProxySpecItem,
    /// Its status, as its operator writes it (`status.v1`).
    pub status: Option<StatusItem>,
}

/// The fields of a status the phase is read from (a NexoProxy's or a
/// Deployment's).
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct StatusItem {
    pub observed_generation: Option<i64>,
    pub ready_replicas: Option<i64>,
    pub updated_replicas: Option<i64>,
    pub available_replicas: Option<i64>,
    pub conditions: Vec<ConditionItem>,
}

/// One condition of a status.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ConditionItem {
    #[serde(rename = "type")]
    pub kind: String,
    pub status: Option<String>,
    pub reason: Option<String>,
    pub message: Option<String>,
}

impl StatusItem {
    /// The condition of type `kind`, in the few bytes the status keeps.
    fn take(&mut self, kind: &str, shared: &mut Interner) -> Option<Rc<Condition>> {
        let i = self.conditions.iter().position(|c| c.kind == kind)?;
        let c = self.conditions.swap_remove(i);
        let mut clip = |s: String| shared.get(crate::text::clip_bytes(&s, MESSAGE_BYTES));
        let condition = Condition {
            status: c.status.map(&mut clip),
            reason: c.reason.map(&mut clip),
            message: c.message.map(&mut clip),
        };
        Some(shared.condition(condition))
    }
}

/// What the phase is judged from, out of an object's metadata, replicas
/// and status.
fn observed(
    meta: &MetaItem,
    replicas: i32,
    status: Option<StatusItem>,
    deployment: bool,
    shared: &mut Interner,
) -> Observed {
    let has_status = status.is_some();
    let mut s = status.unwrap_or_default();
    let (ready_condition, progressing) = if deployment {
        (s.take("Available", shared), s.take("Progressing", shared))
    } else {
        (s.take("Ready", shared), None)
    };
    Observed {
        deployment,
        generation: meta.generation.unwrap_or(0),
        observed_generation: MaybeGeneration::new(s.observed_generation),
        replicas,
        ready: count(s.ready_replicas.unwrap_or(0)),
        updated: if deployment {
            Some(count(s.updated_replicas.unwrap_or(0)))
        } else {
            s.updated_replicas.map(count)
        },
        available: deployment.then(|| count(s.available_replicas.unwrap_or(0))),
        has_status,
        ready_condition,
        progressing,
    }
}

/// The fields of a NexoProxy's spec the heartbeat reports.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ProxySpecItem {
    /// `spec.replicas` (1 when absent, the CRD's default).
    pub replicas: Option<i64>,
    /// `spec.image`.
    pub image: Option<String>,
}

/// An `apps/v1` Deployment as the inventory reads it.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct DeploymentItem {
    /// Its metadata.
    pub metadata: MetaItem,
    /// `spec.replicas` and the pod template's containers.
    pub spec: DeploymentSpecItem,
    /// Its status, as the deployment controller writes it.
    pub status: Option<StatusItem>,
}

/// The fields of a Deployment's spec the heartbeat reports.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct DeploymentSpecItem {
    /// `spec.replicas` (1 when absent, the API's default).
    pub replicas: Option<i32>,
    /// `spec.template`.
    pub template: TemplateItem,
}

/// `spec.template` of a Deployment.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct TemplateItem {
    /// `spec.template.spec`.
    pub spec: PodSpecItem,
}

/// `spec.template.spec` of a Deployment.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct PodSpecItem {
    /// Its containers.
    pub containers: Vec<ContainerItem>,
}

/// A container's name and image.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ContainerItem {
    pub name: String,
    pub image: Option<String>,
}

/// The heartbeat entry of an owned NexoProxy, and what its phase is judged
/// from.
pub fn proxy_entry(p: ProxyItem, shared: &mut Interner) -> Option<Owned> {
    let replicas = super::status::count(p.spec.replicas.unwrap_or(1));
    let observed = observed(&p.metadata, replicas, p.status, false, shared);
    Some(Owned {
        namespace: shared.get(&p.metadata.namespace?),
        name: Rc::from(p.metadata.name?),
        kind: crate::cp::wire::EntryKind::NexoProxy,
        image: p.spec.image.map(|i| shared.get(&i)),
        observed,
        judged: None,
    })
}

/// The heartbeat entry of an owned legacy `apps/v1` Deployment: its image is
/// that of the container named `proxy`, else of the first container.
pub fn deployment_entry(d: DeploymentItem, shared: &mut Interner) -> Option<Owned> {
    let mut containers = d.spec.template.spec.containers;
    let i = containers
        .iter()
        .position(|c| c.name == "proxy")
        .unwrap_or(0);
    let image = if i < containers.len() {
        containers.swap_remove(i).image
    } else {
        None
    };
    let replicas = d.spec.replicas.unwrap_or(1);
    let observed = observed(&d.metadata, replicas, d.status, true, shared);
    Some(Owned {
        namespace: shared.get(&d.metadata.namespace?),
        name: Rc::from(d.metadata.name?),
        kind: crate::cp::wire::EntryKind::Deployment,
        image: image.map(|i| shared.get(&i)),
        observed,
        judged: None,
    })
}
