//! The objects commands write: the kinds they may name, the two deploy
//! formats, and a reference to one object (its kind, namespace and name)
//! with its URL paths and its line in an ack.

use std::fmt;

use crate::cp::wire::{AckResource, ResourceAction};

/// The kinds a command may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
        match self {
            Kind::NexoProxy | Kind::NexoPipeline => "nexo.io/v1alpha1",
            Kind::ConfigMap | Kind::Secret | Kind::Service => "v1",
            Kind::Deployment => "apps/v1",
        }
    }

    /// Its `kind`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::NexoProxy => "NexoProxy",
            Kind::NexoPipeline => "NexoPipeline",
            Kind::ConfigMap => "ConfigMap",
            Kind::Secret => "Secret",
            Kind::Service => "Service",
            Kind::Deployment => "Deployment",
        }
    }

    /// Its resource name in URL paths.
    pub fn plural(self) -> &'static str {
        match self {
            Kind::NexoProxy => "nexoproxies",
            Kind::NexoPipeline => "nexopipelines",
            Kind::ConfigMap => "configmaps",
            Kind::Secret => "secrets",
            Kind::Service => "services",
            Kind::Deployment => "deployments",
        }
    }

    /// The kind of (`apiVersion`, `kind`), if a command may write it.
    pub fn of(api_version: &str, kind: &str) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|k| k.api_version() == api_version && k.name() == kind)
    }

    /// The URL path of the API group and version serving it.
    fn group_path(self) -> &'static str {
        match self.api_version() {
            "v1" => "/api/v1",
            "apps/v1" => "/apis/apps/v1",
            _ => "/apis/nexo.io/v1alpha1",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The two deploy formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Nexo custom resources plus runtime ConfigMaps and Secrets.
    Crd,
    /// The 0.2.0 line's Deployment, Services, ConfigMaps and Secrets.
    Legacy,
}

impl Format {
    /// The format named `s` in a payload.
    pub fn parse(s: &str) -> Option<Format> {
        match s {
            "crd" => Some(Format::Crd),
            "legacy" => Some(Format::Legacy),
            _ => None,
        }
    }

    /// Its name in a payload.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Crd => "crd",
            Format::Legacy => "legacy",
        }
    }

    /// The capability a Manager advertises when it deploys this format.
    pub fn capability(self) -> &'static str {
        match self {
            Format::Crd => "command.deploy.crd",
            Format::Legacy => "command.deploy.legacy",
        }
    }

    /// The kinds a deploy of this format may hold.
    pub fn kinds(self) -> &'static [Kind] {
        match self {
            Format::Crd => &[
                Kind::NexoProxy,
                Kind::NexoPipeline,
                Kind::ConfigMap,
                Kind::Secret,
            ],
            Format::Legacy => &[
                Kind::Deployment,
                Kind::Service,
                Kind::ConfigMap,
                Kind::Secret,
            ],
        }
    }

    /// The one object named like the deployment: its NexoProxy, or its
    /// legacy Deployment.
    pub fn primary(self) -> Kind {
        match self {
            Format::Crd => Kind::NexoProxy,
            Format::Legacy => Kind::Deployment,
        }
    }

    /// The kinds that belong to the primary object: a `crd` deploy's
    /// ConfigMaps and Secrets carry an ownerReference to its NexoProxy.
    pub fn owned_by_primary(self, kind: Kind) -> bool {
        self == Format::Crd && matches!(kind, Kind::ConfigMap | Kind::Secret)
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
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
        format!(
            "{}/namespaces/{}/{}",
            self.kind.group_path(),
            self.namespace,
            self.kind.plural()
        )
    }

    /// The object's URL path.
    pub fn path(&self) -> String {
        format!("{}/{}", self.collection(), self.name)
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
    fn formats() {
        for f in [Format::Crd, Format::Legacy] {
            assert_eq!(Format::parse(f.as_str()), Some(f));
            assert!(f.kinds().contains(&f.primary()));
        }
        assert_eq!(Format::parse("helm"), None);
        assert!(Format::Crd.owned_by_primary(Kind::Secret));
        assert!(!Format::Legacy.owned_by_primary(Kind::Secret));
        assert!(!Format::Crd.owned_by_primary(Kind::NexoPipeline));
    }
}
