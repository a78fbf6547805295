//! What the heartbeat knows at rest from watches, not reads (agent.md,
//! "Probes, readiness and the rolling update", last point): the Manager's
//! own Deployment and the release contract's CRDs are read again only when
//! their watch says they changed (a watch that is forbidden or failing
//! leaves the periodic read it replaces in charge: `Refresh::Periodic`);
//! the nodes' region and zone come from the nodes' labels as their watch
//! delivers them, with no list of them at all, and a nodes' watch that
//! fails says why in `inventoryErrors`.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::kube::Client;
use crate::kube::changes::{Meta, MetaWatch, Refresh, Seen};
use crate::resource;

/// The CRDs of the release contract, watched by name (the shipped RBAC
/// grants them by `resourceNames`).
pub const CRD_NAMES: [&str; 2] = ["nexoproxies.nexo.io", "nexopipelines.nexo.io"];

/// One watched concern: its watches and whether they saw a change since it
/// was last taken.
#[derive(Debug)]
struct Concern {
    watches: Vec<MetaWatch>,
    changed: bool,
}

impl Concern {
    fn refresh(&mut self) -> Refresh {
        if self.watches.iter().all(MetaWatch::watching) {
            Refresh::Watched {
                changed: std::mem::take(&mut self.changed),
            }
        } else {
            Refresh::Periodic
        }
    }
}

/// Region and zone as the nodes' watch says them.
#[derive(Debug, PartialEq, Eq)]
pub enum NodeTopology {
    /// Configured (`NEXO_CLUSTER_REGION`, `NEXO_CLUSTER_ZONE`): not watched.
    Configured,
    /// The nodes cannot be watched now: why, for `inventoryErrors` (the
    /// watch tries again after its backoff; never, when forbidden).
    Unreadable(String),
    /// As last reported.
    Unchanged,
    /// A node's region or zone changed: what every node shares now.
    Changed {
        region: Option<String>,
        zone: Option<String>,
    },
}

/// The watches of what would otherwise be read at rest.
#[derive(Debug)]
pub struct Watched {
    own: Concern,
    crds: Concern,
    /// `None` when region and zone are configured.
    nodes: Option<MetaWatch>,
    /// Each node's topology labels, as its watch last said.
    zones: BTreeMap<String, TopologyLabels>,
    zones_changed: bool,
}

impl Watched {
    /// The watches of the Manager's own Deployment `name` in `namespace`,
    /// of the release contract's CRDs, and of the nodes unless region and
    /// zone are `configured`.
    pub fn new(namespace: &str, name: &str, configured: bool) -> Watched {
        let by_name = |n: &str| Some(format!("metadata.name={n}"));
        let deployments = resource::DEPLOYMENTS.collection(Some(namespace));
        Watched {
            own: Concern {
                watches: vec![MetaWatch::new("own deployment", deployments, by_name(name))],
                changed: false,
            },
            crds: Concern {
                watches: CRD_NAMES
                    .iter()
                    .map(|n| {
                        MetaWatch::new(
                            "release-contract CRD",
                            resource::CRDS.collection(None),
                            by_name(n),
                        )
                    })
                    .collect(),
                changed: false,
            },
            nodes: (!configured)
                .then(|| MetaWatch::new("nodes", resource::NODES.collection(None), None)),
            zones: BTreeMap::new(),
            zones_changed: false,
        }
    }

    /// Reads what the watches sent, without waiting, and opens those due.
    pub fn sync(&mut self, client: &Client, now: Instant) {
        for concern in [&mut self.own, &mut self.crds] {
            let changed = &mut concern.changed;
            for w in &mut concern.watches {
                w.sync(client, now, &mut |_| *changed = true);
            }
        }
        if let Some(nodes) = &mut self.nodes {
            let (zones, changed) = (&mut self.zones, &mut self.zones_changed);
            nodes.sync(client, now, &mut |seen| *changed |= zones_seen(zones, seen));
        }
    }

    /// Whether the Manager's own Deployment is to be read.
    pub fn own_deployment(&mut self) -> Refresh {
        self.own.refresh()
    }

    /// Whether the release contract's CRDs are to be read.
    pub fn release_contract(&mut self) -> Refresh {
        self.crds.refresh()
    }

    /// Region and zone from the nodes' labels, when they may have
    /// changed.
    pub fn topology(&mut self) -> NodeTopology {
        match &self.nodes {
            None => NodeTopology::Configured,
            // Listed or watched: what every node shares now.
            Some(_) if std::mem::take(&mut self.zones_changed) => {
                let (region, zone) = shared_topology(&self.zones);
                NodeTopology::Changed { region, zone }
            }
            Some(nodes) => match nodes.problem() {
                Some(e) if !nodes.watching() => {
                    NodeTopology::Unreadable(crate::inventory::nodes_unreadable(e))
                }
                // Current, or between an end and the next open, or
                // listed every few minutes: as it was.
                _ => NodeTopology::Unchanged,
            },
        }
    }
}

/// A node's region and zone labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct TopologyLabels {
    region: Option<String>,
    zone: Option<String>,
}

/// A label value that every node shares; unknown when nodes disagree or one
/// lacks it (never guessed).
#[derive(Debug, Default)]
enum Shared {
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
    fn add(&mut self, value: Option<&str>) {
        *self = match (std::mem::take(self), value) {
            (Shared::Unseen, Some(v)) => Shared::Value(v.to_owned()),
            (Shared::Value(a), Some(v)) if a == v => Shared::Value(a),
            _ => Shared::Mixed,
        };
    }

    /// The shared value, if there is one.
    fn get(self) -> Option<String> {
        match self {
            Shared::Value(v) => Some(v),
            _ => None,
        }
    }
}

/// Applies what the nodes' watch saw to each node's labels; whether any
/// node's region or zone changed.
fn zones_seen(zones: &mut BTreeMap<String, TopologyLabels>, seen: Seen<'_>) -> bool {
    match seen {
        Seen::Reset => {
            zones.clear();
            true
        }
        Seen::Put(meta) => {
            let labels = topology_of(meta);
            zones.insert(meta.name.clone(), labels.clone()) != Some(labels)
        }
        Seen::Gone(meta) => zones.remove(&meta.name).is_some(),
    }
}

fn topology_of(meta: &Meta) -> TopologyLabels {
    let label = |k: &str| meta.labels.get(k).cloned();
    TopologyLabels {
        region: label("topology.kubernetes.io/region"),
        zone: label("topology.kubernetes.io/zone"),
    }
}

/// Region and zone when every node shares them (never guessed).
fn shared_topology(zones: &BTreeMap<String, TopologyLabels>) -> (Option<String>, Option<String>) {
    let (mut region, mut zone) = (Shared::default(), Shared::default());
    for labels in zones.values() {
        region.add(labels.region.as_deref());
        zone.add(labels.zone.as_deref());
    }
    (region.get(), zone.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, region: &str, zone: &str) -> Meta {
        Meta {
            name: name.into(),
            labels: [
                (
                    "topology.kubernetes.io/region".to_owned(),
                    region.to_owned(),
                ),
                ("topology.kubernetes.io/zone".to_owned(), zone.to_owned()),
                ("kubernetes.io/hostname".to_owned(), name.to_owned()),
            ]
            .into(),
            resource_version: None,
        }
    }

    #[test]
    fn the_nodes_topology_follows_their_labels_and_only_a_change_of_them_counts() {
        let mut zones = BTreeMap::new();
        assert!(zones_seen(&mut zones, Seen::Reset));
        assert!(zones_seen(&mut zones, Seen::Put(&node("a", "eu", "eu-1"))));
        assert!(zones_seen(&mut zones, Seen::Put(&node("b", "eu", "eu-1"))));
        assert_eq!(
            shared_topology(&zones),
            (Some("eu".into()), Some("eu-1".into()))
        );
        // A node's status or other labels changing: no change.
        let mut b = node("b", "eu", "eu-1");
        b.labels.insert("other".into(), "x".into());
        assert!(!zones_seen(&mut zones, Seen::Put(&b)));
        // Another zone: the zone is no longer shared; never guessed.
        assert!(zones_seen(&mut zones, Seen::Put(&node("c", "eu", "eu-2"))));
        assert_eq!(shared_topology(&zones), (Some("eu".into()), None));
        assert!(zones_seen(&mut zones, Seen::Gone(&node("c", "eu", "eu-2"))));
        assert_eq!(shared_topology(&zones).1, Some("eu-1".into()));
        assert!(!zones_seen(
            &mut zones,
            Seen::Gone(&node("z", "eu", "eu-2"))
        ));
        // A node without a zone label: no zone is shared.
        let mut bare = node("d", "eu", "");
        bare.labels.remove("topology.kubernetes.io/zone");
        assert!(zones_seen(&mut zones, Seen::Put(&bare)));
        assert_eq!(shared_topology(&zones), (Some("eu".into()), None));
        // No nodes: nothing shared.
        assert!(zones_seen(&mut zones, Seen::Reset));
        assert_eq!(shared_topology(&zones), (None, None));
    }
}
