//! One resource vocabulary: every Kubernetes resource the Manager reads or
//! writes ([`Resource`]: group, version, plural, namespaced), which builds
//! the URL paths of its collections and objects, as kube-core's
//! `Resource::url_path` does; the kinds a command may write ([`Kind`]) and
//! a reference to one object ([`ObjectRef`]) with its line in an ack. No
//! API path is assembled anywhere else.

use std::fmt;

use serde_json::Value;

use crate::cp::wire::AckResource;
use crate::words::ResourceAction;

/// A Kubernetes resource: what its objects are (`apiVersion`, `kind`) and
/// where its API serves them, as kube-core's `ApiResource`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resource {
    /// The API group; empty for the core group.
    pub group: &'static str,
    /// The version.
    pub version: &'static str,
    /// `group/version`, or `version` for the core group: its objects'
    /// `apiVersion`.
    pub api_version: &'static str,
    /// Its objects' `kind`.
    pub kind: &'static str,
    /// The resource name in URL paths.
    pub plural: &'static str,
    /// Whether its objects live in a namespace.
    pub namespaced: bool,
}

/// The URL path of an API group (`version` `None`: its discovery document)
/// or of one of its versions; the core group is `/api/v1`.
pub fn group_version_path(group: &str, version: Option<&str>) -> String {
    match (group, version) {
        ("", Some(v)) => format!("/api/{v}"),
        ("", None) => "/api".to_owned(),
        (g, Some(v)) => format!("/apis/{g}/{v}"),
        (g, None) => format!("/apis/{g}"),
    }
}

impl Resource {
    /// The collection's URL path: in `namespace` for a namespaced resource
    /// (`None`: across every namespace); a cluster-scoped one ignores it.
    pub fn collection(&self, namespace: Option<&str>) -> String {
        let root = group_version_path(self.group, Some(self.version));
        match namespace.filter(|_| self.namespaced) {
            Some(ns) => format!("{root}/namespaces/{ns}/{}", self.plural),
            None => format!("{root}/{}", self.plural),
        }
    }

    /// The URL path of the object `name` (in `namespace`, when namespaced).
    pub fn object(&self, namespace: Option<&str>, name: &str) -> String {
        format!("{}/{name}", self.collection(namespace))
    }
}

const fn core(kind: &'static str, plural: &'static str, namespaced: bool) -> Resource {
    Resource {
        group: "",
        version: "v1",
        api_version: "v1",
        kind,
        plural,
        namespaced,
    }
}

/// `v1` ConfigMaps.
pub const CONFIG_MAPS: Resource = core("ConfigMap", "configmaps", true);
/// `v1` Secrets.
pub const SECRETS: Resource = core("Secret", "secrets", true);
/// `v1` Services.
pub const SERVICES: Resource = core("Service", "services", true);
/// `v1` pods: listed only to say why a legacy Deployment's pods do not run.
pub const PODS: Resource = core("Pod", "pods", true);
/// `v1` Namespaces.
pub const NAMESPACES: Resource = core("Namespace", "namespaces", false);
/// `v1` Nodes.
pub const NODES: Resource = core("Node", "nodes", false);
/// `apps/v1` Deployments.
pub const DEPLOYMENTS: Resource = Resource {
    group: "apps",
    version: "v1",
    api_version: "apps/v1",
    kind: "Deployment",
    plural: "deployments",
    namespaced: true,
};
/// `apps/v1` ReplicaSets: listed only to find a legacy Deployment's own
/// pods (those its ReplicaSets own).
pub const REPLICA_SETS: Resource = Resource {
    group: "apps",
    version: "v1",
    api_version: "apps/v1",
    kind: "ReplicaSet",
    plural: "replicasets",
    namespaced: true,
};
/// `coordination.k8s.io/v1` Leases.
pub const LEASES: Resource = Resource {
    group: "coordination.k8s.io",
    version: "v1",
    api_version: "coordination.k8s.io/v1",
    kind: "Lease",
    plural: "leases",
    namespaced: true,
};
/// `apiextensions.k8s.io/v1` CustomResourceDefinitions.
pub const CRDS: Resource = Resource {
    group: "apiextensions.k8s.io",
    version: "v1",
    api_version: "apiextensions.k8s.io/v1",
    kind: "CustomResourceDefinition",
    plural: "customresourcedefinitions",
    namespaced: false,
};
/// `events.k8s.io/v1` Events: what the Manager did, about owned objects.
pub const EVENTS: Resource = Resource {
    group: "events.k8s.io",
    version: "v1",
    api_version: "events.k8s.io/v1",
    kind: "Event",
    plural: "events",
    namespaced: true,
};
/// The Nexo group.
pub const NEXO_GROUP: &str = "nexo.io";
/// `nexo.io/v1alpha1` NexoProxies.
pub const NEXO_PROXIES: Resource = Resource {
    group: NEXO_GROUP,
    version: "v1alpha1",
    api_version: "nexo.io/v1alpha1",
    kind: "NexoProxy",
    plural: "nexoproxies",
    namespaced: true,
};
/// `nexo.io/v1alpha1` NexoPipelines.
pub const NEXO_PIPELINES: Resource = Resource {
    group: NEXO_GROUP,
    version: "v1alpha1",
    api_version: "nexo.io/v1alpha1",
    kind: "NexoPipeline",
    plural: "nexopipelines",
    namespaced: true,
};

/// The kinds a command may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `nexo.io/v1alpha1` NexoProxy.
    NexoProxy,
    /// `nexo.io/v1alpha1` NexoPipeline.
    NexoPipeline,
    /// `v1` ConfigMap.
    ConfigMap,
    /// `v1` Secret.
    Secret,
    /// `v1` Service.
    Service,
    /// `apps/v1` Deployment.
    Deployment,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 6] = [
        Kind::NexoProxy,
        Kind::NexoPipeline,
        Kind::ConfigMap,
        Kind::Secret,
        Kind::Service,
        Kind::Deployment,
    ];

    /// Its `apiVersion`.
    pub fn api_version(self) -> &'static str {
        self.resource().api_version
    }

    /// Its `kind`.
    pub fn name(self) -> &'static str {
        self.resource().kind
    }

    /// The resource serving it.
    pub fn resource(self) -> Resource {
        match self {
            Kind::NexoProxy => NEXO_PROXIES,
            Kind::NexoPipeline => NEXO_PIPELINES,
            Kind::ConfigMap => CONFIG_MAPS,
            Kind::Secret => SECRETS,
            Kind::Service => SERVICES,
            Kind::Deployment => DEPLOYMENTS,
        }
    }

    /// Its resource name in URL paths.
    pub fn plural(self) -> &'static str {
        self.resource().plural
    }

    /// The kind named `kind` (every kind's name is unique), if a command
    /// may write it.
    pub fn named(kind: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == kind)
    }

    /// The kind of (`apiVersion`, `kind`), if a command may write it.
    pub fn of(api_version: &str, kind: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.api_version() == api_version && k.name() == kind)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One object: its kind and place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRef {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

impl ObjectRef {
    /// A reference from parts.
    pub fn new(kind: Kind, namespace: &str, name: &str) -> ObjectRef {
        ObjectRef {
            kind,
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// The collection URL path of its kind in its namespace.
    pub fn collection(&self) -> String {
        self.kind.resource().collection(Some(&self.namespace))
    }

    /// The object's URL path.
    pub fn path(&self) -> String {
        self.kind
            .resource()
            .object(Some(&self.namespace), &self.name)
    }

    /// Its line in an ack.
    pub fn ack(&self, action: ResourceAction) -> AckResource {
        AckResource {
            api_version: self.kind.api_version().into(),
            kind: self.kind.name().into(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            action,
        }
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// One object to write (a deploy's manifest): its reference, and the
/// object as sent.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// The object it describes.
    pub reference: ObjectRef,
    /// The manifest.
    pub object: Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_of_every_kind() {
        let paths: Vec<String> = Kind::ALL
            .into_iter()
            .map(|k| ObjectRef::new(k, "shop", "orders").path())
            .collect();
        assert_eq!(
            paths,
            [
                "/apis/nexo.io/v1alpha1/namespaces/shop/nexoproxies/orders",
                "/apis/nexo.io/v1alpha1/namespaces/shop/nexopipelines/orders",
                "/api/v1/namespaces/shop/configmaps/orders",
                "/api/v1/namespaces/shop/secrets/orders",
                "/api/v1/namespaces/shop/services/orders",
                "/apis/apps/v1/namespaces/shop/deployments/orders",
            ]
        );
    }

    #[test]
    fn kinds_are_found_by_api_version_and_kind_only() {
        for k in Kind::ALL {
            assert_eq!(Kind::of(k.api_version(), k.name()), Some(k));
        }
        assert_eq!(Kind::of("apps/v1", "ConfigMap"), None);
        assert_eq!(Kind::of("v1", "Pod"), None);
    }

    #[test]
    fn paths_of_the_other_resources() {
        assert_eq!(
            LEASES.object(Some("nexo-system"), "nexo-manager"),
            "/apis/coordination.k8s.io/v1/namespaces/nexo-system/leases/nexo-manager"
        );
        assert_eq!(NODES.collection(None), "/api/v1/nodes");
        assert_eq!(
            NAMESPACES.object(None, "kube-system"),
            "/api/v1/namespaces/kube-system"
        );
        assert_eq!(
            CRDS.object(None, "nexoproxies.nexo.io"),
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/nexoproxies.nexo.io"
        );
        assert_eq!(group_version_path("nexo.io", None), "/apis/nexo.io");
        assert_eq!(
            group_version_path("nexo.io", Some("v1alpha1")),
            "/apis/nexo.io/v1alpha1"
        );
        // A namespaced resource listed across namespaces, a cluster one
        // given a namespace by mistake: the namespace is where it belongs.
        assert_eq!(DEPLOYMENTS.collection(None), "/apis/apps/v1/deployments");
        assert_eq!(NODES.object(Some("x"), "n1"), "/api/v1/nodes/n1");
    }

    #[test]
    fn every_resource_says_its_api_version_and_kind_once() {
        let all = [
            CONFIG_MAPS,
            SECRETS,
            SERVICES,
            PODS,
            NAMESPACES,
            NODES,
            DEPLOYMENTS,
            REPLICA_SETS,
            LEASES,
            CRDS,
            NEXO_PROXIES,
            NEXO_PIPELINES,
            EVENTS,
        ];
        for r in all {
            let expected = match r.group {
                "" => r.version.to_owned(),
                g => format!("{g}/{}", r.version),
            };
            assert_eq!(r.api_version, expected, "{r:?}");
            assert!(r.plural.starts_with(&r.kind.to_lowercase()[..3]), "{r:?}");
        }
        for k in Kind::ALL {
            assert_eq!(Kind::named(k.name()), Some(k));
        }
        assert_eq!(Kind::named("Pod"), None);
        assert_eq!(
            EVENTS.object(Some("shop"), "e1"),
            "/apis/events.k8s.io/v1/namespaces/shop/events/e1"
        );
    }
}
