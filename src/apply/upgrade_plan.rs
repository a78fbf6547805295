//! An upgrade of the Manager's own Deployment, planned from plain values:
//! the container it patches, the no-op, the patch (image, bundle version,
//! annotation) and the field-ownership hand-back after it.

use std::fmt;

use serde_json::{Value, json};

use crate::image::ImageRef;
use crate::policy::Policy;
use crate::refusal::Refusal;

/// The Manager's own Deployment has no container an upgrade can patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoManagerContainer {
    /// How many containers it has.
    pub containers: usize,
}

impl fmt::Display for NoManagerContainer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the Manager's Deployment has {} containers and none is named manager",
            self.containers
        )
    }
}

impl std::error::Error for NoManagerContainer {}

/// The container an upgrade patches in the Manager's own Deployment: the one
/// named `manager`, or else the only one. Its name and image.
pub fn upgrade_container(deployment: &Value) -> Result<(&str, Option<&str>), NoManagerContainer> {
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let pick = match containers {
        [only] => Some(only),
        _ => containers.iter().find(|c| c["name"] == "manager"),
    };
    match pick {
        Some(c) => Ok((c["name"].as_str().unwrap_or_default(), c["image"].as_str())),
        None => Err(NoManagerContainer {
            containers: containers.len(),
        }),
    }
}

/// What an upgrade does.
#[derive(Debug, Clone, PartialEq)]
pub enum UpgradePlan {
    /// The Manager already runs the image: applied, `unchanged`.
    Unchanged,
    /// This strategic merge patch of the Deployment.
    Patch(Value),
}

/// Why an upgrade cannot be planned.
#[derive(Debug, Clone, PartialEq)]
pub enum UpgradeStop {
    /// No container to patch.
    NoManagerContainer(NoManagerContainer),
    /// The content policy refuses the image.
    Refused(Refusal),
}

impl fmt::Display for UpgradeStop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpgradeStop::NoManagerContainer(e) => e.fmt(f),
            UpgradeStop::Refused(r) => r.fmt(f),
        }
    }
}

/// The annotation of the Manager's Deployment naming the bundle a
/// self-upgrade moved it to: the chart reads it (`lookup`) so that a
/// `helm upgrade` to an older or the same chart keeps the newer Manager
/// (charts/nexo-manager/README.md, "Self-upgrade and Helm").
pub const UPGRADED_BUNDLE_ANNOTATION: &str = "nexo.io/upgraded-bundle";

/// Plans an upgrade of the Manager's own Deployment to `image` of bundle
/// `bundle_version`, within `policy`: the image stays in the repository
/// the Manager runs from (or the one configured). The patch sets the
/// image, the container's `NEXO_BUNDLE_VERSION` (so the new pod reports,
/// and compares downgrades with, the bundle it runs) and
/// [`UPGRADED_BUNDLE_ANNOTATION`].
pub fn upgrade(
    deployment: &Value,
    image: &ImageRef,
    bundle_version: &str,
    policy: &Policy,
) -> Result<UpgradePlan, UpgradeStop> {
    let (container, current) =
        upgrade_container(deployment).map_err(UpgradeStop::NoManagerContainer)?;
    policy
        .check_upgrade(image, current)
        .map_err(|v| UpgradeStop::Refused(Refusal::Policy(v)))?;
    let image = image.to_string();
    if current == Some(image.as_str()) {
        return Ok(UpgradePlan::Unchanged);
    }
    Ok(UpgradePlan::Patch(json!({
        "metadata": {"annotations": {UPGRADED_BUNDLE_ANNOTATION: bundle_version}},
        "spec": {"template": {"spec": {"containers": [{
            "name": container,
            "image": image,
            "env": [{"name": "NEXO_BUNDLE_VERSION", "value": bundle_version}],
        }]}}},
    })))
}

/// What an applied upgrade changed in the Manager's Deployment: what a
/// rollback writes back (docs/protocol.md, `rollback.v1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upgraded {
    /// The manager container's image before.
    pub from_image: String,
    /// Its `NEXO_BUNDLE_VERSION` before (`None`: it had none).
    pub from_bundle_env: Option<String>,
    /// The image it runs now.
    pub to_image: String,
}

impl Upgraded {
    /// What the upgrade of `deployment` (as read before the patch) to
    /// `image` changes.
    pub fn of(deployment: &Value, image: &str) -> Option<Upgraded> {
        let (name, current) = upgrade_container(deployment).ok()?;
        let container = deployment["spec"]["template"]["spec"]["containers"]
            .as_array()?
            .iter()
            .find(|c| c["name"] == name)?;
        let from_bundle_env = container["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == "NEXO_BUNDLE_VERSION")
            .and_then(|e| e["value"].as_str())
            .map(str::to_owned);
        Some(Upgraded {
            from_image: current?.to_owned(),
            from_bundle_env,
            to_image: image.to_owned(),
        })
    }
}

/// The strategic merge patch that writes an upgrade back: the manager
/// container's image and `NEXO_BUNDLE_VERSION` as they were (removed when
/// there was none), so that the pod template is the old ReplicaSet's
/// again and the old pod stays; [`UPGRADED_BUNDLE_ANNOTATION`] set to
/// `own_bundle`, the version of the Manager writing it back (removed when
/// unknown).
pub fn write_back(
    deployment: &Value,
    from: &Upgraded,
    own_bundle: Option<&str>,
) -> Result<Value, NoManagerContainer> {
    let (container, _) = upgrade_container(deployment)?;
    let env = match &from.from_bundle_env {
        Some(v) => json!({"name": "NEXO_BUNDLE_VERSION", "value": v}),
        None => json!({"name": "NEXO_BUNDLE_VERSION", "$patch": "delete"}),
    };
    Ok(json!({
        "metadata": {"annotations": {UPGRADED_BUNDLE_ANNOTATION: own_bundle}},
        "spec": {"template": {"spec": {"containers": [{
            "name": container,
            "image": from.from_image,
            "env": [env],
        }]}}},
    }))
}

/// After a self-upgrade: a JSON patch that removes the Manager's own
/// field-manager entries (`field_manager`, `Update`) from its Deployment's
/// `managedFields`, or `None` when it has none. Each removal is guarded by
/// `test`s of that entry's manager and operation (the API server keeps the
/// entries in an order of its own, which another writer may change: a
/// failed test is a 422, and the caller reads again). Without it the
/// Manager would own the image it set, and the next server-side apply of
/// a newer chart (Helm 4) would conflict with it; the fields are left
/// owned by whoever else owns them, or by no one.
pub fn hand_back(deployment: &Value, field_manager: &str) -> Option<Value> {
    let entries = deployment["metadata"]["managedFields"].as_array()?;
    let mut ops = Vec::new();
    // From the last, so that each index is still that entry's when removed.
    for (i, e) in entries.iter().enumerate().rev() {
        if e["manager"] == field_manager && e["operation"] == "Update" {
            let at = format!("/metadata/managedFields/{i}");
            ops.push(
                json!({"op": "test", "path": format!("{at}/manager"), "value": field_manager}),
            );
            ops.push(json!({"op": "test", "path": format!("{at}/operation"), "value": "Update"}));
            ops.push(json!({"op": "remove", "path": at}));
        }
    }
    (!ops.is_empty()).then_some(Value::Array(ops))
}

#[cfg(test)]
#[path = "upgrade_plan_tests.rs"]
mod tests;
