//! The projections list items are decoded into (only the fields the
//! inventory reads), and the pure shaping of them into heartbeat entries.

use std::rc::Rc;

use serde::Deserialize;

use crate::cp::wire::DeploymentEntry;
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
}

impl MetaItem {
    pub fn ownership(&self, environment_id: &str) -> Ownership {
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

/// A Node as the inventory reads it: its topology labels.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct NodeItem {
    /// Its metadata.
    pub metadata: NodeMetaItem,
}

/// `metadata` of a Node.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct NodeMetaItem {
    /// `metadata.labels`: region and zone.
    pub labels: TopologyLabels,
}

/// The topology labels of a Node.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct TopologyLabels {
    /// `topology.kubernetes.io/region`.
    #[serde(rename = "topology.kubernetes.io/region")]
    pub region: Option<String>,
    /// `topology.kubernetes.io/zone`.
    #[serde(rename = "topology.kubernetes.io/zone")]
    pub zone: Option<String>,
}

/// Hands out one shared copy of equal strings (namespaces, images), so
/// that entries that agree share them. Remembers at most [`Interner::MAX`]
/// distinct values; past that, new values are simply not shared.
#[derive(Debug, Default)]
pub struct Interner {
    seen: Vec<Rc<str>>,
}

impl Interner {
    /// Distinct values remembered.
    pub const MAX: usize = 64;

    /// The shared copy of `s`.
    pub fn get(&mut self, s: &str) -> Rc<str> {
        if let Some(r) = self.seen.iter().find(|r| ***r == *s) {
            return r.clone();
        }
        let r: Rc<str> = Rc::from(s);
        if self.seen.len() < Self::MAX {
            self.seen.push(r.clone());
        }
        r
    }
}

/// The heartbeat entry of an owned NexoProxy.
pub fn proxy_entry(p: ProxyItem, shared: &mut Interner) -> Option<DeploymentEntry> {
    Some(DeploymentEntry {
        namespace: shared.get(&p.metadata.namespace?),
        name: Rc::from(p.metadata.name?),
        kind: "NexoProxy",
        replicas: p.spec.replicas.unwrap_or(1),
        image: p.spec.image.map(|i| shared.get(&i)),
    })
}

/// The heartbeat entry of an owned legacy `apps/v1` Deployment: its image is
/// that of the container named `proxy`, else of the first container.
pub fn deployment_entry(d: DeploymentItem, shared: &mut Interner) -> Option<DeploymentEntry> {
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
    Some(DeploymentEntry {
        namespace: shared.get(&d.metadata.namespace?),
        name: Rc::from(d.metadata.name?),
        kind: "Deployment",
        replicas: d.spec.replicas.map_or(1, i64::from),
        image: image.map(|i| shared.get(&i)),
    })
}

/// A label value that every node shares; unknown when nodes disagree or one
/// lacks it (never guessed).
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Shared {
    /// No node seen yet.
    #[default]
    Unseen,
    /// Every node so far has this value.
    Value(String),
    /// Nodes disagree, or one has no value.
    Mixed,
}

impl Shared {
    /// Adds one node's value.
    pub fn add(&mut self, value: Option<&str>) {
        *self = match (std::mem::take(self), value) {
            (Shared::Unseen, Some(v)) => Shared::Value(v.to_owned()),
            (Shared::Value(a), Some(v)) if a == v => Shared::Value(a),
            _ => Shared::Mixed,
        };
    }

    /// The shared value, if there is one.
    pub fn get(self) -> Option<String> {
        match self {
            Shared::Value(v) => Some(v),
            _ => None,
        }
    }
}

/// Region and zone across nodes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Topology {
    pub region: Shared,
    pub zone: Shared,
}

impl Topology {
    /// Adds one node.
    pub fn add_node(&mut self, node: &NodeItem) {
        let labels = &node.metadata.labels;
        self.region.add(labels.region.as_deref());
        self.zone.add(labels.zone.as_deref());
    }
}
