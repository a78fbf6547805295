//! What the heartbeat reports: owned NexoProxies and owned legacy
//! Deployments across the managed namespaces ([`Index`], kept by watches);
//! the nodes' topology is `agent/watched.rs`'s ([`nodes_unreadable`] says
//! why it is unknown).
//!
//! Shaping is pure ([`proxy_entry`], [`deployment_entry`]).
//! Items are decoded into projections ([`ProxyItem`], [`DeploymentItem`])
//! holding only the fields read here: serde skips the rest
//! as it parses a page or an event, so the binary carries no decoder for
//! the fields it never reads, and the index holds one small entry per
//! object.

use crate::kube::{self, Client};
use crate::resource;

pub mod delta;
mod index;
mod interner;
mod owned;
mod pods;
mod projection;
mod report;
mod set;
pub mod status;
mod stored;
mod uid;

pub use index::Index;
pub use owned::Owned;
pub use projection::*;
pub use report::{Turn, Workload};
pub use status::RollbackDue;
pub use uid::Uid;

/// Items per page of every list.
pub const PAGE: u32 = 500;

/// The collected inventory.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Inventory {
    /// Owned deployments, sorted by namespace, then name.
    pub deployments: crate::cp::wire::Entries,
    /// Region shared by every node, if the nodes could be listed.
    pub region: Option<String>,
    /// Zone shared by every node, if the nodes could be listed.
    pub zone: Option<String>,
    /// What could not be read.
    pub errors: Vec<String>,
    /// Whether the nodes were listed (region and zone are then current).
    pub topology_read: bool,
}
/// Why the pods of legacy Deployment `name` do not run
/// ([`pods::pod_reason`]): the Deployment read, then one list of the
/// ReplicaSets and one of the pods its selector selects, of which only the
/// pods its own ReplicaSets own are read ([`pods::own_pods`]): a pod of
/// another controller that carries the same labels says nothing here.
/// Asked only when its phase turns `failed` or `degraded`, never per
/// heartbeat.
pub fn pod_reason(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Option<String>, kube::Error> {
    let d: serde_json::Value = client.get(&resource::DEPLOYMENTS.object(Some(namespace), name))?;
    let Some(uid) = d["metadata"]["uid"].as_str() else {
        return Ok(None);
    };
    let selector: Vec<String> = d["spec"]["selector"]["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some(format!("{k}={}", v.as_str()?)))
        .collect();
    if selector.is_empty() {
        return Ok(None);
    }
    let selector = selector.join(",");
    let (sets, _) = client.list_page(
        &resource::REPLICA_SETS.collection(Some(namespace)),
        Some(&selector),
        100,
        None,
    )?;
    let (pods, _) = client.list_page(
        &resource::PODS.collection(Some(namespace)),
        Some(&selector),
        100,
        None,
    )?;
    Ok(pods::pod_reason(&pods::own_pods(uid, &sets, pods)))
}

/// The `inventoryErrors` entry of nodes whose labels cannot be read (their
/// watch, `agent/watched.rs`, failed with `e`): region and zone are then
/// left out, never guessed. Nodes that may not be read (403: a
/// namespace-scoped install) say how to give them.
pub fn nodes_unreadable(e: &kube::Error) -> String {
    if e.is_forbidden() {
        format!(
            "nodes are not readable ({}): region and zone unavailable; set NEXO_CLUSTER_REGION and NEXO_CLUSTER_ZONE",
            crate::text::clip(&e.to_string(), 200)
        )
    } else {
        format!("watch nodes: {e}")
    }
}

#[cfg(test)]
mod tests;
