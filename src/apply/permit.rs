//! The one gate between a parsed [`Command`] and the cluster. A
//! [`Permitted`] command passed every rule decidable from the command and
//! the configuration, for every class, in one place:
//!
//! - the Manager's own objects, by name and by the labels sent, never a
//!   target (deploy, rollout, uninstall), nor named by a deploy's custom
//!   resources;
//! - the content policy at its configured level (deploy);
//! - the downgrade rule (upgrade).
//!
//! Only [`permit`] makes a `Permitted`, and [`super::run`] takes
//! nothing else: executing an unpermitted command does not compile. The
//! rules that need what the cluster holds (ownership of what exists, the
//! namespace's Pod Security floor, references to objects outside the
//! deploy, the upgrade's repository against the running image) are the
//! planner's, on what the executor read, and refuse with the same
//! [`Refusal`].

use crate::commands::{Action, Command, Deploy, Target, Upgrade};
use crate::image::ImageRef;
use crate::ownership::OwnObjects;
use crate::policy::{ClusterChecks, Policy};
use crate::refusal::Refusal;
use crate::resource::{Kind, ObjectRef};

/// What a command is permitted against: the configuration's rules.
#[derive(Debug, Clone, Copy)]
pub struct Rules<'a> {
    /// The content policy.
    pub policy: &'a Policy,
    /// The configured Proxy image (its repository is always allowed).
    pub proxy_image: &'a ImageRef,
    /// The Manager's own objects.
    pub own: &'a OwnObjects,
    /// `NEXO_BUNDLE_VERSION`: an upgrade to an older bundle is refused.
    pub running_bundle: Option<&'a str>,
}

/// A command that passed [`permit`]. Its fields are private: no other
/// code makes one.
#[derive(Debug, Clone, PartialEq)]
pub struct Permitted {
    command: Command,
    note: Option<String>,
    /// A deploy's: what its one walk left to check against the cluster.
    checks: Option<ClusterChecks>,
}

impl Permitted {
    /// The command.
    pub fn command(&self) -> &Command {
        &self.command
    }

    /// What the ack should add: an upgrade whose bundle version could not
    /// be compared with the running one.
    pub fn note(&self) -> Option<&str> {
        self.note.as_deref()
    }

    /// A deploy's checks against the cluster: its namespace's Pod Security
    /// floor, its references outside the deploy (`None`: not a deploy).
    pub fn cluster_checks(&self) -> Option<&ClusterChecks> {
        self.checks.as_ref()
    }
}

/// Permits `command` under `rules`, or says why not.
pub fn permit(command: Command, rules: &Rules<'_>) -> Result<Permitted, Refusal> {
    let mut checks = None;
    let note = match &command.action {
        Action::Deploy(d) => {
            checks = Some(deploy(d, rules)?);
            None
        }
        Action::Rollout(r) => {
            for t in r.targets.iter().flatten() {
                not_own(
                    rules,
                    &ObjectRef::new(Kind::NexoProxy, &t.namespace, &t.name),
                )?;
            }
            None
        }
        Action::Uninstall(t) => {
            uninstall(t, rules)?;
            None
        }
        Action::Upgrade(u) => downgrade_check(rules.running_bundle, u)?,
    };
    Ok(Permitted {
        command,
        note,
        checks,
    })
}

/// The downgrade rule (docs/protocol.md, "upgrade"): an upgrade to an older
/// bundle than the `running` one (`NEXO_BUNDLE_VERSION`) is refused unless
/// it says `allowDowngrade`. `Ok(Some(note))` when the versions cannot be
/// compared (the running one unknown or not SemVer): the upgrade goes
/// ahead and the ack says so.
fn downgrade_check(running: Option<&str>, u: &Upgrade) -> Result<Option<String>, Refusal> {
    let Some(running_text) = running else {
        return Ok(Some(
            "the running bundle version is unknown (NEXO_BUNDLE_VERSION unset), so it could not be compared".into(),
        ));
    };
    let Ok(running) = crate::semver::Version::parse(running_text) else {
        return Ok(Some(format!(
            "the running bundle version {:?} is not SemVer, so it could not be compared",
            crate::text::clip(running_text, 64)
        )));
    };
    if u.bundle < running && !u.allow_downgrade {
        return Err(Refusal::Downgrade {
            running: running_text.to_owned(),
            to: u.bundle_version.clone(),
        });
    }
    Ok(None)
}

/// Refuses one of the Manager's own objects, by name.
fn not_own(rules: &Rules<'_>, r: &ObjectRef) -> Result<(), Refusal> {
    match rules
        .own
        .refusal(r.kind.name(), &r.namespace, &r.name, None)
    {
        Some(refusal) => Err(refusal),
        None => Ok(()),
    }
}

fn deploy(d: &Deploy, rules: &Rules<'_>) -> Result<ClusterChecks, Refusal> {
    for m in &d.manifests {
        let r = &m.reference;
        if let Some(refusal) =
            rules
                .own
                .refusal(r.kind.name(), &r.namespace, &r.name, Some(&m.object))
        {
            return Err(refusal);
        }
        for (kind, name) in crate::policy::custom_resource_references(&m.object) {
            if let Some(Refusal::OwnObject { kind, name, .. }) =
                rules
                    .own
                    .refusal(kind.name(), &d.deployment.namespace, name, None)
            {
                return Err(Refusal::OwnObject {
                    kind,
                    name,
                    named_by: Some(r.to_string()),
                });
            }
        }
    }
    rules
        .policy
        .walk_deploy(&d.manifests, rules.proxy_image)
        .map_err(Refusal::Policy)
}

fn uninstall(t: &Target, rules: &Rules<'_>) -> Result<(), Refusal> {
    for kind in [Kind::NexoProxy, Kind::Deployment] {
        not_own(rules, &ObjectRef::new(kind, &t.namespace, &t.name))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::{Format, Rollout, Upgrade};
    use crate::resource::Manifest;
    use serde_json::json;

    fn own() -> OwnObjects {
        OwnObjects::new(
            "nexo-system",
            "nexo-manager-state",
            "nexo-manager",
            "nexo-manager",
        )
    }

    fn image() -> ImageRef {
        ImageRef::parse("r.example/nexo/proxy:1.0.0").unwrap()
    }

    fn check(action: Action, running_bundle: Option<&str>) -> Result<Permitted, Refusal> {
        let (policy, image, own) = (Policy::default(), image(), own());
        let rules = Rules {
            policy: &policy,
            proxy_image: &image,
            own: &own,
            running_bundle,
        };
        permit(
            Command {
                id: "c-1".into(),
                action,
                plan: false,
            },
            &rules,
        )
    }

    fn target(ns: &str, name: &str) -> Target {
        Target {
            name: name.into(),
            namespace: ns.into(),
        }
    }

    fn deploy_of(ns: &str, kind: Kind, name: &str, object: serde_json::Value) -> Action {
        Action::Deploy(Deploy {
            deployment: target(ns, name),
            format: Format::Crd,
            manifests: vec![Manifest {
                reference: ObjectRef::new(kind, ns, name),
                object,
            }],
            adopt_legacy: false,
            drift: Default::default(),
            on_failure: Default::default(),
        })
    }

    #[test]
    fn the_managers_own_objects_are_refused_in_every_class() {
        let state = deploy_of(
            "nexo-system",
            Kind::Secret,
            "nexo-manager-state",
            json!({"metadata": {"name": "nexo-manager-state"}}),
        );
        let refusals = [
            check(state, None),
            check(
                Action::Uninstall(target("nexo-system", "nexo-manager")),
                None,
            ),
        ];
        for r in refusals {
            assert!(matches!(r, Err(Refusal::OwnObject { .. })), "{r:?}");
        }
        // Named by a NexoProxy's Secret reference.
        let proxy = deploy_of(
            "nexo-system",
            Kind::NexoProxy,
            "p",
            json!({"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy", "metadata": {"name": "p"}, "spec": {"mongodb": {"secretRef": {"name": "nexo-manager-state"}}}}),
        );
        let Err(Refusal::OwnObject { named_by, .. }) = check(proxy, None) else {
            panic!("the state Secret named by a NexoProxy is refused");
        };
        assert_eq!(named_by.as_deref(), Some("NexoProxy nexo-system/p"));
        // The same names elsewhere are not its own; nor is a NexoProxy
        // named like its Deployment (the Manager has no NexoProxy).
        assert!(check(Action::Uninstall(target("shop", "nexo-manager")), None).is_ok());
        let rollout = Action::Rollout(Rollout {
            image_tag: None,
            targets: Some(vec![target("nexo-system", "nexo-manager")]),
            on_failure: Default::default(),
        });
        assert!(check(rollout, None).is_ok());
    }

    #[test]
    fn the_content_policy_and_the_downgrade_rule_are_checked_here() {
        let privileged = deploy_of(
            "shop",
            Kind::NexoProxy,
            "p",
            json!({"metadata": {"name": "p"}, "spec": {"image": "evil.example/x:1"}}),
        );
        assert!(matches!(check(privileged, None), Err(Refusal::Policy(_))));
        let upgrade = |to: &str| {
            Action::Upgrade(Upgrade {
                bundle_version: to.into(),
                bundle: crate::semver::Version::parse(to).unwrap(),
                allow_downgrade: false,
                manager_image: ImageRef::parse(&format!("m@sha256:{}", "1".repeat(64))).unwrap(),
                on_failure: Default::default(),
            })
        };
        assert!(matches!(
            check(upgrade("0.2.0"), Some("0.3.0")),
            Err(Refusal::Downgrade { .. })
        ));
        let unknown = check(upgrade("0.2.0"), None).unwrap();
        assert!(
            unknown
                .note()
                .is_some_and(|n| n.contains("could not be compared"))
        );
        assert_eq!(check(upgrade("0.4.0"), Some("0.3.0")).unwrap().note(), None);
    }

    #[test]
    fn downgrades_are_refused_unless_the_command_allows_them() {
        let upgrade = |bundle: &str, allow: bool| Upgrade {
            bundle_version: bundle.into(),
            bundle: crate::semver::Version::parse(bundle).unwrap(),
            allow_downgrade: allow,
            manager_image: ImageRef::parse(&format!(
                "registry.example.com/nexo/manager@sha256:{}",
                "a".repeat(64)
            ))
            .unwrap(),
            on_failure: Default::default(),
        };
        assert_eq!(
            downgrade_check(Some("0.3.0"), &upgrade("0.2.9", false)).map_err(|r| r.to_string()),
            Err("downgrade: 0.3.0 to 0.2.9".into())
        );
        assert_eq!(
            downgrade_check(Some("0.3.0"), &upgrade("0.3.0-rc.2", false))
                .map_err(|r| r.to_string()),
            Err("downgrade: 0.3.0 to 0.3.0-rc.2".into())
        );
        assert_eq!(
            downgrade_check(Some("0.3.0"), &upgrade("0.2.9", true)),
            Ok(None)
        );
        assert_eq!(
            downgrade_check(Some("0.3.0"), &upgrade("0.3.0", false)),
            Ok(None)
        );
        assert_eq!(
            downgrade_check(Some("0.3.0"), &upgrade("0.4.0", false)),
            Ok(None)
        );
        // Unknown or not SemVer: it goes ahead, and the ack says so.
        for running in [None, Some("latest")] {
            let note = downgrade_check(running, &upgrade("0.1.0", false))
                .unwrap()
                .unwrap();
            assert!(note.contains("could not be compared"), "{note}");
        }
    }
}
