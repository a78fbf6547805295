//! What the heartbeat reports: owned NexoProxies and owned legacy
//! Deployments across the managed namespaces, and cluster topology.
//!
//! Shaping is pure ([`proxy_entry`], [`deployment_entry`], [`Topology`]);
//! [`collect`] is the thin I/O layer: paged lists, one page in memory.
//!
//! Owned NexoProxies are read, when the installed CRD allows it, as a
//! Table of its printer columns ([`ProxyListing::Table`]): the API server
//! sends a row of name, image and replicas per proxy instead of the whole
//! object with its `managedFields`, a tenth of the bytes (BENCHMARKS.md).
//! The label selector, which is exactly the ownership guard's "owned",
//! does the filtering the objects' labels would; a Table that is refused or
//! not shaped as expected falls back to the objects, until the CRD is read
//! again. The CRD is read every 5 minutes (`release.rs`): a CRD changed in
//! between to show something else under the same column names and types is
//! believed until then.
//!
//! Items are decoded into projections ([`ProxyItem`], [`DeploymentItem`],
//! [`NodeItem`]) holding only the fields read here: serde skips the rest
//! as it parses the page, so a page of 500 is kept as its bytes and 500
//! small structs instead of 500 full objects (a Deployment's pod template,
//! a Node's status), and the binary carries no decoder for the fields it
//! never reads.

use std::ops::ControlFlow;
use std::rc::Rc;

use serde::Deserialize;

use crate::cp::wire::DeploymentEntry;
use crate::kube::{self, Client, Table};
use crate::ownership::{self, Ownership};
use crate::resource;

/// Items per page of every list.
pub const PAGE: u32 = 500;

/// The NexoProxy version the inventory lists.
pub const PROXY_VERSION: &str = resource::NEXO_PROXIES.version;

/// How the owned NexoProxies are listed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ProxyListing {
    /// As a Table of the printer columns `Image` (`.spec.image`, a string)
    /// and `Replicas` (`.spec.replicas`, an integer), without the objects.
    Table,
    /// As the objects, each projected while it is parsed: the default, and
    /// whenever the installed CRD's columns are not known to be those.
    #[default]
    Objects,
}

/// The listing an installed NexoProxy CRD allows: [`ProxyListing::Table`]
/// when its [`PROXY_VERSION`] is served with exactly one `Image` column on
/// `.spec.image` (string) and one `Replicas` column on `.spec.replicas`
/// (integer); the Table's cells are then the fields the objects would give.
pub fn proxy_listing(crd: &serde_json::Value) -> ProxyListing {
    let Some(version) = crd["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == PROXY_VERSION && v["served"] == true)
    else {
        return ProxyListing::Objects;
    };
    let columns = version["additionalPrinterColumns"].as_array();
    let column = |name: &str, path: &str, type_: &str| {
        let mut named = columns.into_iter().flatten().filter(|c| c["name"] == name);
        let first = named.next();
        named.next().is_none() && first.is_some_and(|c| c["jsonPath"] == path && c["type"] == type_)
    };
    // The Table's first column is always `Name`, the object's name: a
    // printer column of that name would make it ambiguous.
    let named_name = columns.into_iter().flatten().any(|c| c["name"] == NAME);
    if !named_name
        && column(IMAGE, ".spec.image", "string")
        && column(REPLICAS, ".spec.replicas", "integer")
    {
        ProxyListing::Table
    } else {
        ProxyListing::Objects
    }
}

const NAME: &str = "Name";
const IMAGE: &str = "Image";
const REPLICAS: &str = "Replicas";

/// Why a Table's page could not be read as the objects would have been.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableProblem {
    /// The column is missing, repeated, misplaced or of another type.
    Column(&'static str),
    /// A row has not one cell per column.
    Cells {
        /// The row's index in its page.
        row: usize,
    },
    /// A row's cell is not of its column's type.
    Cell {
        /// The row's index in its page.
        row: usize,
        /// The column.
        column: &'static str,
    },
}

impl std::fmt::Display for TableProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TableProblem::Column(c) => {
                write!(f, "the table has no single {c} column of the expected type")
            }
            TableProblem::Cells { row } => {
                write!(f, "row {row} of the table has not one cell per column")
            }
            TableProblem::Cell { row, column } => {
                write!(f, "row {row} of the table has a bad {column} cell")
            }
        }
    }
}

/// The entries of one Table page of owned NexoProxies in `namespace`: the
/// first column `Name` (a string), `Image` (a string or null) and
/// `Replicas` (an integer, or null for the CRD's default of 1).
pub fn table_entries(
    table: Table,
    namespace: &str,
    shared: &mut Interner,
) -> Result<Vec<DeploymentEntry>, TableProblem> {
    let columns = &table.column_definitions;
    let index = |name: &'static str, type_: &str| {
        let mut found = columns.iter().enumerate().filter(|(_, c)| c.name == name);
        match (found.next(), found.next()) {
            (Some((i, c)), None) if c.type_ == type_ => Ok(i),
            _ => Err(TableProblem::Column(name)),
        }
    };
    let name = index(NAME, "string")?;
    if name != 0 {
        return Err(TableProblem::Column(NAME));
    }
    let image = index(IMAGE, "string")?;
    let replicas = index(REPLICAS, "integer")?;
    let namespace = shared.get(namespace);
    let mut entries = Vec::with_capacity(table.rows.len());
    for (row, r) in table.rows.into_iter().enumerate() {
        let bad = |column| TableProblem::Cell { row, column };
        if r.cells.len() != columns.len() {
            return Err(TableProblem::Cells { row });
        }
        let cell = |i: usize| r.cells.get(i).unwrap_or(&serde_json::Value::Null);
        let name = match cell(name).as_str() {
            Some(n) if !n.is_empty() => n.to_owned(),
            _ => return Err(bad(NAME)),
        };
        let image = match cell(image) {
            serde_json::Value::Null => None,
            v => Some(shared.get(v.as_str().ok_or_else(|| bad(IMAGE))?)),
        };
        let replicas = match cell(replicas) {
            serde_json::Value::Null => 1,
            v => v.as_i64().ok_or_else(|| bad(REPLICAS))?,
        };
        entries.push(DeploymentEntry {
            namespace: namespace.clone(),
            name,
            kind: "NexoProxy",
            replicas,
            image,
        });
    }
    Ok(entries)
}

/// The collected inventory.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Inventory {
    /// Owned deployments, sorted by namespace, then name.
    pub deployments: Vec<DeploymentEntry>,
    /// Region shared by every node, if the nodes could be listed.
    pub region: Option<String>,
    /// Zone shared by every node, if the nodes could be listed.
    pub zone: Option<String>,
    /// What could not be read.
    pub errors: Vec<String>,
    /// Whether the nodes were listed (region and zone are then current).
    pub topology_read: bool,
    /// Whether a Table of NexoProxies was refused or misshaped, and the
    /// objects were listed instead.
    pub table_fell_back: bool,
}

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
    fn ownership(&self, environment_id: &str) -> Ownership {
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
        name: p.metadata.name?,
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
        name: d.metadata.name?,
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

/// One `inventoryErrors` entry: what was being read, and the API's answer.
fn describe(what: &str, e: &kube::Error) -> String {
    log::warn!("inventory: cannot {what}: {e}");
    format!("{what}: {e}")
}

/// The owned NexoProxies of one namespace as a Table; `Ok(None)` when the
/// Table was refused (406) or is not shaped as [`table_entries`] expects
/// (no page is fetched after the first such one), and the objects must be
/// listed instead.
fn proxies_by_table(
    client: &Client,
    collection: &str,
    selector: &str,
    namespace: &str,
    shared: &mut Interner,
) -> Result<Option<Vec<DeploymentEntry>>, kube::Error> {
    let mut entries = Vec::new();
    let mut problem = None;
    let result = client.table_each(
        collection,
        Some(selector),
        PAGE,
        |table| match table_entries(table, namespace, shared) {
            Ok(page) => {
                entries.extend(page);
                ControlFlow::Continue(())
            }
            Err(p) => {
                problem = Some(p);
                ControlFlow::Break(())
            }
        },
    );
    match result {
        Err(e) if e.status() == Some(406) => {
            log::warn!(
                "inventory: {collection} cannot be listed as a table ({e}); listing the objects"
            );
            Ok(None)
        }
        Err(e) => Err(e),
        Ok(()) => match problem {
            Some(p) => {
                log::warn!("inventory: {collection} as a table: {p}; listing the objects");
                Ok(None)
            }
            None => Ok(Some(entries)),
        },
    }
}

/// Collects the inventory. `want_topology` is false when both region and
/// zone are configured, or when the caller's copy is recent enough;
/// `listing` is what the installed NexoProxy CRD allows ([`proxy_listing`]).
pub fn collect(
    client: &Client,
    namespaces: &[String],
    environment_id: &str,
    want_topology: bool,
    listing: ProxyListing,
) -> Inventory {
    let selector = ownership::owned_selector(environment_id);
    let mut inv = Inventory::default();
    let mut shared = Interner::default();
    for ns in namespaces {
        let proxies = resource::NEXO_PROXIES.collection(Some(ns));
        let by_table = match listing {
            ProxyListing::Table => proxies_by_table(client, &proxies, &selector, ns, &mut shared),
            ProxyListing::Objects => Ok(None),
        };
        inv.table_fell_back |= matches!(by_table, Ok(None)) && listing == ProxyListing::Table;
        let result = match by_table {
            Ok(Some(entries)) => {
                inv.deployments.extend(entries);
                Ok(())
            }
            Ok(None) => client.list_each_as(&proxies, Some(&selector), PAGE, |p: ProxyItem| {
                // The selector already filters; the guard decides anyway.
                if p.metadata.ownership(environment_id) == Ownership::Owned {
                    inv.deployments.extend(proxy_entry(p, &mut shared));
                }
            }),
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            inv.errors
                .push(describe(&format!("list nexoproxies in {ns}"), &e));
        }
        let deployments = resource::DEPLOYMENTS.collection(Some(ns));
        let result =
            client.list_each_as(&deployments, Some(&selector), PAGE, |d: DeploymentItem| {
                if d.metadata.ownership(environment_id) == Ownership::Owned {
                    inv.deployments.extend(deployment_entry(d, &mut shared));
                }
            });
        if let Err(e) = result {
            inv.errors
                .push(describe(&format!("list deployments in {ns}"), &e));
        }
    }
    // A 410 restart may have visited items twice.
    inv.deployments.sort();
    inv.deployments.dedup();
    if want_topology {
        let mut topo = Topology::default();
        let visit = |node: NodeItem| topo.add_node(&node);
        match client.list_each_as(&resource::NODES.collection(None), None, PAGE, visit) {
            Ok(()) => {
                inv.region = topo.region.get();
                inv.zone = topo.zone.get();
                inv.topology_read = true;
            }
            // Listing nodes is optional RBAC: without it, region and zone are omitted.
            Err(e) if e.status() == Some(403) => {
                log::debug!("inventory: nodes not readable: {e}");
                inv.topology_read = true;
            }
            Err(e) => inv.errors.push(describe("list nodes", &e)),
        }
    }
    inv
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn entries_from_objects() {
        let p: ProxyItem = serde_json::from_value(json!({"metadata": {"name": "orders", "namespace": "shop",
            "managedFields": [{"manager": "x"}]}, "spec": {"replicas": 3, "image": "p:1", "port": 27017}}))
        .unwrap();
        assert_eq!(
            proxy_entry(p, &mut Interner::default()).unwrap(),
            DeploymentEntry {
                namespace: "shop".into(),
                name: "orders".into(),
                kind: "NexoProxy",
                replicas: 3,
                image: Some("p:1".into())
            }
        );
        let d: DeploymentItem = serde_json::from_value(
            json!({"metadata": {"name": "billing", "namespace": "shop"}, "spec": {
            "selector": {}, "template": {"spec": {"containers": [
            {"name": "sidecar", "image": "s:1"}, {"name": "proxy", "image": "p:0.9"}]}}}}),
        )
        .unwrap();
        let e = deployment_entry(d, &mut Interner::default()).unwrap();
        assert_eq!(
            (e.kind, e.replicas, e.image.as_deref()),
            ("Deployment", 1, Some("p:0.9"))
        );
        let d: DeploymentItem = serde_json::from_value(json!({"metadata": {"name": "one", "namespace": "shop"},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "main", "image": "m:1"}]}}}}))
        .unwrap();
        let e = deployment_entry(d, &mut Interner::default()).unwrap();
        assert_eq!((e.replicas, e.image.as_deref()), (2, Some("m:1")));
        let d: DeploymentItem =
            serde_json::from_value(json!({"metadata": {"name": "bare", "namespace": "shop"}}))
                .unwrap();
        assert_eq!(
            deployment_entry(d, &mut Interner::default()).unwrap().image,
            None
        );
        let nameless: ProxyItem =
            serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap();
        assert!(proxy_entry(nameless, &mut Interner::default()).is_none());
    }

    #[test]
    fn ownership_from_projected_labels() {
        let meta = |labels: Value| {
            serde_json::from_value::<ProxyItem>(
                json!({"metadata": {"name": "x", "namespace": "n", "labels": labels}}),
            )
            .unwrap()
            .metadata
        };
        let owned = json!({"app.kubernetes.io/managed-by": "nexo-manager", "nexo.io/owner-id": "env-a", "app": "y"});
        assert_eq!(meta(owned).ownership("env-a"), Ownership::Owned);
        let other =
            json!({"app.kubernetes.io/managed-by": "nexo-manager", "nexo.io/owner-id": "env-b"});
        assert_eq!(
            meta(other).ownership("env-a"),
            Ownership::OtherEnvironment("env-b".into())
        );
        let legacy = json!({"app.kubernetes.io/part-of": "nexo"});
        assert_eq!(meta(legacy).ownership("env-a"), Ownership::Legacy);
        let half = json!({"app.kubernetes.io/managed-by": "nexo-manager"});
        assert_eq!(meta(half).ownership("env-a"), Ownership::Unrelated);
    }

    #[test]
    fn equal_namespaces_and_images_are_shared() {
        let mut shared = Interner::default();
        let item = |name: &str, image: &str| -> ProxyItem {
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "shop"},
                "spec": {"image": image}}))
            .unwrap()
        };
        let a = proxy_entry(item("a", "p:1"), &mut shared).unwrap();
        let b = proxy_entry(item("b", "p:1"), &mut shared).unwrap();
        let c = proxy_entry(item("c", "p:2"), &mut shared).unwrap();
        assert!(Rc::ptr_eq(&a.namespace, &b.namespace));
        assert!(Rc::ptr_eq(
            a.image.as_ref().unwrap(),
            b.image.as_ref().unwrap()
        ));
        assert_eq!(c.image.as_deref(), Some("p:2"));
        // Past the bound, values are still right, only no longer shared.
        for i in 0..Interner::MAX {
            shared.get(&format!("v{i}"));
        }
        let x = shared.get("late");
        let y = shared.get("late");
        assert_eq!((&*x, &*y), ("late", "late"));
        assert!(!Rc::ptr_eq(&x, &y));
    }

    #[test]
    fn topology_is_never_guessed() {
        let node = |r: Option<&str>, z: Option<&str>| {
            let mut labels = serde_json::Map::new();
            if let Some(r) = r {
                labels.insert("topology.kubernetes.io/region".into(), r.into());
            }
            if let Some(z) = z {
                labels.insert("topology.kubernetes.io/zone".into(), z.into());
            }
            serde_json::from_value::<NodeItem>(json!({"metadata": {"labels": labels}})).unwrap()
        };
        let mut t = Topology::default();
        t.add_node(&node(Some("eu-west-1"), Some("eu-west-1a")));
        t.add_node(&node(Some("eu-west-1"), Some("eu-west-1b")));
        assert_eq!(
            (t.region.get(), t.zone.get()),
            (Some("eu-west-1".into()), None)
        );
        let mut t = Topology::default();
        t.add_node(&node(Some("eu"), None));
        t.add_node(&node(None, None));
        assert_eq!((t.region.get(), t.zone.get()), (None, None));
        assert_eq!(Topology::default().region.get(), None);
    }

    fn proxy_crd(columns: Value) -> Value {
        json!({"spec": {"versions": [
            {"name": "v1alpha1", "served": true, "storage": true, "additionalPrinterColumns": columns}]}})
    }

    fn image_and_replicas() -> Value {
        json!([{"name": "Image", "type": "string", "jsonPath": ".spec.image"},
               {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
               {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"}])
    }

    #[test]
    fn a_table_only_when_the_crd_columns_are_the_fields() {
        assert_eq!(
            proxy_listing(&proxy_crd(image_and_replicas())),
            ProxyListing::Table
        );
        let changed = |i: usize, key: &str, value: &str| {
            let mut c = image_and_replicas();
            c[i][key] = value.into();
            proxy_listing(&proxy_crd(c))
        };
        assert_eq!(
            changed(0, "jsonPath", ".status.image"),
            ProxyListing::Objects
        );
        assert_eq!(
            changed(1, "jsonPath", ".status.replicas"),
            ProxyListing::Objects
        );
        assert_eq!(changed(1, "type", "string"), ProxyListing::Objects);
        assert_eq!(changed(0, "name", "Picture"), ProxyListing::Objects);
        // A second column of the same name would make the Table ambiguous.
        assert_eq!(changed(2, "name", "Replicas"), ProxyListing::Objects);
        assert_eq!(proxy_listing(&proxy_crd(json!([]))), ProxyListing::Objects);
        // A column of its own named Name would shadow the object's name.
        assert_eq!(changed(2, "name", "Name"), ProxyListing::Objects);
        let mut other_version = proxy_crd(image_and_replicas());
        other_version["spec"]["versions"][0]["name"] = "v1beta1".into();
        assert_eq!(proxy_listing(&other_version), ProxyListing::Objects);
        let mut not_served = proxy_crd(image_and_replicas());
        not_served["spec"]["versions"][0]["served"] = false.into();
        assert_eq!(proxy_listing(&not_served), ProxyListing::Objects);
        assert_eq!(proxy_listing(&json!({})), ProxyListing::Objects);
    }

    fn table(columns: Value, rows: Value) -> Table {
        serde_json::from_value(json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": "7"}, "columnDefinitions": columns, "rows": rows}))
        .unwrap()
    }

    fn table_columns() -> Value {
        json!([{"name": "Name", "type": "string", "format": "name", "description": "Name must be unique", "priority": 0},
               {"name": "Image", "type": "string", "format": "", "description": "", "priority": 0},
               {"name": "Replicas", "type": "integer", "format": "", "description": "", "priority": 0},
               {"name": "Ready", "type": "integer", "format": "", "description": "", "priority": 0},
               {"name": "Age", "type": "date", "format": "", "description": "", "priority": 0}])
    }

    #[test]
    fn table_rows_become_the_entries_the_objects_would() {
        let t = table(
            table_columns(),
            json!([{"cells": ["orders", "p:1", 3, 2, "5m"], "object": null},
                   {"cells": ["bare", null, null, null, "1s"]}]),
        );
        let mut shared = Interner::default();
        let entries = table_entries(t, "shop", &mut shared).unwrap();
        let object = |v: Value| {
            proxy_entry(serde_json::from_value(v).unwrap(), &mut Interner::default()).unwrap()
        };
        assert_eq!(
            entries,
            vec![
                object(json!({"metadata": {"name": "orders", "namespace": "shop"},
                    "spec": {"image": "p:1", "replicas": 3}})),
                object(json!({"metadata": {"name": "bare", "namespace": "shop"}})),
            ]
        );
        assert!(Rc::ptr_eq(&entries[0].namespace, &entries[1].namespace));
        let empty = table(table_columns(), json!([]));
        assert_eq!(table_entries(empty, "shop", &mut shared), Ok(vec![]));
    }

    #[test]
    fn a_table_of_another_shape_is_refused_with_the_reason() {
        let with = |columns: Value, rows: Value| {
            table_entries(table(columns, rows), "shop", &mut Interner::default()).unwrap_err()
        };
        let row = json!([{"cells": ["orders", "p:1", 3, 2, "5m"]}]);
        let mut c = table_columns();
        c.as_array_mut().unwrap().remove(2);
        assert_eq!(with(c, row.clone()), TableProblem::Column("Replicas"));
        let mut c = table_columns();
        c[1]["type"] = "integer".into();
        assert_eq!(with(c, row.clone()), TableProblem::Column("Image"));
        let mut c = table_columns();
        c[3]["name"] = "Image".into();
        assert_eq!(with(c, row.clone()), TableProblem::Column("Image"));
        let mut c = table_columns();
        c.as_array_mut().unwrap().swap(0, 1);
        assert_eq!(with(c, row.clone()), TableProblem::Column("Name"));
        let cells = |cells: Value| with(table_columns(), json!([{"cells": cells}]));
        assert_eq!(
            cells(json!(["", "p:1", 3, 0, "1s"])),
            TableProblem::Cell {
                row: 0,
                column: "Name"
            }
        );
        assert_eq!(
            cells(json!([7, "p:1", 3, 0, "1s"])),
            TableProblem::Cell {
                row: 0,
                column: "Name"
            }
        );
        assert_eq!(
            cells(json!(["a", 1, 3, 0, "1s"])),
            TableProblem::Cell {
                row: 0,
                column: "Image"
            }
        );
        assert_eq!(
            cells(json!(["a", "p:1", "3", 0, "1s"])),
            TableProblem::Cell {
                row: 0,
                column: "Replicas"
            }
        );
        assert_eq!(
            cells(json!(["a", "p:1", 1.5, 0, "1s"])),
            TableProblem::Cell {
                row: 0,
                column: "Replicas"
            }
        );
        // A short row never reads as defaults.
        assert_eq!(cells(json!(["a", "p:1"])), TableProblem::Cells { row: 0 });
        assert_eq!(
            TableProblem::Cells { row: 2 }.to_string(),
            "row 2 of the table has not one cell per column"
        );
        assert_eq!(
            TableProblem::Cell {
                row: 4,
                column: "Image"
            }
            .to_string(),
            "row 4 of the table has a bad Image cell"
        );
        assert_eq!(
            TableProblem::Column("Replicas").to_string(),
            "the table has no single Replicas column of the expected type"
        );
    }

    #[test]
    fn entries_sort_by_namespace_then_name() {
        let e = |ns: &str, n: &str| DeploymentEntry {
            namespace: ns.into(),
            name: n.into(),
            kind: "NexoProxy",
            replicas: 1,
            image: None,
        };
        let mut v = vec![e("shop", "b"), e("billing", "z"), e("shop", "a")];
        v.sort();
        assert_eq!(v, vec![e("billing", "z"), e("shop", "a"), e("shop", "b")]);
    }
}
