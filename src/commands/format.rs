//! The two deploy formats: the kinds each may hold, its primary object,
//! the capability that announces it.

use std::fmt;

use crate::resource::Kind;

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
    /// NexoPipelines, ConfigMaps and Secrets carry an ownerReference to its
    /// NexoProxy, so its uninstall (the garbage collector) takes them all.
    pub fn owned_by_primary(self, kind: Kind) -> bool {
        self == Format::Crd && matches!(kind, Kind::NexoPipeline | Kind::ConfigMap | Kind::Secret)
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        for f in [Format::Crd, Format::Legacy] {
            assert_eq!(Format::parse(f.as_str()), Some(f));
            assert!(f.kinds().contains(&f.primary()));
        }
        assert_eq!(Format::parse("helm"), None);
        assert!(Format::Crd.owned_by_primary(Kind::Secret));
        assert!(!Format::Legacy.owned_by_primary(Kind::Secret));
        assert!(Format::Crd.owned_by_primary(Kind::NexoPipeline));
        assert!(!Format::Crd.owned_by_primary(Kind::NexoProxy));
    }
}
