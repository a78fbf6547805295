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

use crate::cp::wire::DeploymentEntry;
use crate::kube::{self, Client};
use crate::ownership::{self, Ownership};
use crate::resource;

mod projection;
mod table;

pub use projection::*;
pub use table::*;

/// Items per page of every list.
pub const PAGE: u32 = 500;

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
        Err(e) if e.is_not_acceptable() => {
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
            Err(e) if e.is_forbidden() => {
                log::debug!("inventory: nodes not readable: {e}");
                inv.topology_read = true;
            }
            Err(e) => inv.errors.push(describe("list nodes", &e)),
        }
    }
    inv
}

#[cfg(test)]
mod tests;
