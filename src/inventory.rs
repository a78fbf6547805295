//! What the heartbeat reports: owned NexoProxies and owned legacy
//! Deployments across the managed namespaces, and cluster topology.
//!
//! Shaping is pure ([`proxy_entry`], [`deployment_entry`], [`Topology`]);
//! [`collect`] is the thin I/O layer: paged lists, one page in memory.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Node;
use serde_json::Value;

use crate::cp::wire::DeploymentEntry;
use crate::kube::{self, Client};
use crate::ownership::{self, Ownership};

/// Items per page of every list.
pub const PAGE: u32 = 500;

/// `topology.kubernetes.io/region`.
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";
/// `topology.kubernetes.io/zone`.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

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
}

/// The heartbeat entry of an owned NexoProxy.
pub fn proxy_entry(object: &Value) -> Option<DeploymentEntry> {
    let meta = &object["metadata"];
    Some(DeploymentEntry {
        namespace: meta["namespace"].as_str()?.to_owned(),
        name: meta["name"].as_str()?.to_owned(),
        kind: "NexoProxy".into(),
        replicas: object["spec"]["replicas"].as_i64().unwrap_or(1),
        image: object["spec"]["image"].as_str().map(str::to_owned),
    })
}

/// The heartbeat entry of an owned legacy `apps/v1` Deployment: its image is
/// that of the container named `proxy`, else of the first container.
pub fn deployment_entry(d: &Deployment) -> Option<DeploymentEntry> {
    let containers = d
        .spec
        .template
        .spec
        .as_ref()
        .map(|p| p.containers.as_slice())
        .unwrap_or(&[]);
    let image = containers
        .iter()
        .find(|c| c.name == "proxy")
        .or_else(|| containers.first())
        .and_then(|c| c.image.clone());
    Some(DeploymentEntry {
        namespace: d.metadata.namespace.clone()?,
        name: d.metadata.name.clone()?,
        kind: "Deployment".into(),
        replicas: d.spec.replicas.map_or(1, i64::from),
        image,
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
    /// Region.
    pub region: Shared,
    /// Zone.
    pub zone: Shared,
}

impl Topology {
    /// Adds one node.
    pub fn add_node(&mut self, node: &Node) {
        let labels = node.metadata.labels.as_ref();
        let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
        self.region.add(label(REGION_LABEL));
        self.zone.add(label(ZONE_LABEL));
    }
}

/// One `inventoryErrors` entry: what was being read, and the API's answer.
fn describe(what: &str, e: &kube::Error) -> String {
    log::warn!("inventory: cannot {what}: {e}");
    format!("{what}: {e}")
}

/// Collects the inventory. `want_topology` is false when both region and
/// zone are configured.
pub fn collect(
    client: &Client,
    namespaces: &[String],
    environment_id: &str,
    want_topology: bool,
) -> Inventory {
    let selector = ownership::owned_selector(environment_id);
    let mut inv = Inventory::default();
    for ns in namespaces {
        let proxies = format!("/apis/nexo.io/v1alpha1/namespaces/{ns}/nexoproxies");
        let result = client.list_each(&proxies, Some(&selector), PAGE, |obj| {
            // The selector already filters; the guard decides anyway.
            if ownership::classify(&obj, environment_id) == Ownership::Owned {
                inv.deployments.extend(proxy_entry(&obj));
            }
        });
        if let Err(e) = result {
            inv.errors
                .push(describe(&format!("list nexoproxies in {ns}"), &e));
        }
        let deployments = format!("/apis/apps/v1/namespaces/{ns}/deployments");
        let mut undecodable = 0;
        let result =
            client.list_each(
                &deployments,
                Some(&selector),
                PAGE,
                |obj| match serde_json::from_value::<Deployment>(obj) {
                    Ok(d)
                        if ownership::classify_meta(&d.metadata, environment_id)
                            == Ownership::Owned =>
                    {
                        inv.deployments.extend(deployment_entry(&d));
                    }
                    Ok(_) => {}
                    Err(_) => undecodable += 1,
                },
            );
        if let Err(e) = result {
            inv.errors
                .push(describe(&format!("list deployments in {ns}"), &e));
        }
        if undecodable > 0 {
            inv.errors.push(format!(
                "list deployments in {ns}: {undecodable} objects could not be decoded"
            ));
        }
    }
    // A 410 restart may have visited items twice.
    inv.deployments.sort();
    inv.deployments.dedup();
    if want_topology {
        let mut topo = Topology::default();
        let visit = |node: Value| match serde_json::from_value::<Node>(node) {
            Ok(node) => topo.add_node(&node),
            // An undecodable node makes the topology unknown, never guessed.
            Err(_) => {
                topo = Topology {
                    region: Shared::Mixed,
                    zone: Shared::Mixed,
                }
            }
        };
        match client.list_each("/api/v1/nodes", None, PAGE, visit) {
            Ok(()) => {
                inv.region = topo.region.get();
                inv.zone = topo.zone.get();
            }
            // Listing nodes is optional RBAC: without it, region and zone are omitted.
            Err(e) if e.status() == Some(403) => log::debug!("inventory: nodes not readable: {e}"),
            Err(e) => inv.errors.push(describe("list nodes", &e)),
        }
    }
    inv
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn entries_from_objects() {
        let p = json!({"metadata": {"name": "orders", "namespace": "shop"}, "spec": {"replicas": 3, "image": "p:1"}});
        assert_eq!(
            proxy_entry(&p).unwrap(),
            DeploymentEntry {
                namespace: "shop".into(),
                name: "orders".into(),
                kind: "NexoProxy".into(),
                replicas: 3,
                image: Some("p:1".into())
            }
        );
        let d: Deployment = serde_json::from_value(
            json!({"metadata": {"name": "billing", "namespace": "shop"}, "spec": {
            "selector": {}, "template": {"spec": {"containers": [
            {"name": "sidecar", "image": "s:1"}, {"name": "proxy", "image": "p:0.9"}]}}}}),
        )
        .unwrap();
        let e = deployment_entry(&d).unwrap();
        assert_eq!(
            (e.kind.as_str(), e.replicas, e.image.as_deref()),
            ("Deployment", 1, Some("p:0.9"))
        );
        assert!(proxy_entry(&json!({"metadata": {"name": "x"}})).is_none());
    }

    #[test]
    fn topology_is_never_guessed() {
        let node = |r: Option<&str>, z: Option<&str>| {
            let mut labels = serde_json::Map::new();
            if let Some(r) = r {
                labels.insert(REGION_LABEL.into(), r.into());
            }
            if let Some(z) = z {
                labels.insert(ZONE_LABEL.into(), z.into());
            }
            serde_json::from_value::<Node>(json!({"metadata": {"labels": labels}})).unwrap()
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

    #[test]
    fn entries_sort_by_namespace_then_name() {
        let e = |ns: &str, n: &str| DeploymentEntry {
            namespace: ns.into(),
            name: n.into(),
            kind: "NexoProxy".into(),
            replicas: 1,
            image: None,
        };
        let mut v = vec![e("shop", "b"), e("billing", "z"), e("shop", "a")];
        v.sort();
        assert_eq!(v, vec![e("billing", "z"), e("shop", "a"), e("shop", "b")]);
    }
}
