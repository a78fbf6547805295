//! The release-contract inventory (docs/protocol.md, capability
//! `release-contract.v1`): which bundle is installed, which `nexo.io` kinds
//! the API server serves, which kinds a NexoPipeline may reference, and a
//! fingerprint of the installed CRD schemas, so that the Control Plane can
//! check a release against the cluster before it sends a command.
//!
//! The shaping is pure ([`served_kinds`], [`reference_kinds`],
//! [`fingerprint`]); [`read`] makes the requests. It is read at start, then
//! when a watch of the CRDs says they changed, or, while they cannot be
//! watched, at most every [`REFRESH`]: CRDs change with installs, not
//! heartbeats.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cp::wire::ReleaseContract;
use crate::kube::changes::Refresh;
use crate::kube::{self, Client};
use crate::resource;

/// How long a reading is reused.
pub const REFRESH: Duration = Duration::from_secs(300);

/// The CRD group.
pub const GROUP: &str = resource::NEXO_GROUP;

/// One reading of the installed CRDs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reading {
    /// The contract the heartbeat carries.
    pub contract: ReleaseContract,
}

/// The kinds of the resources (not subresources) in discovery answers
/// (`APIResourceList`s), sorted and without duplicates.
pub fn served_kinds(lists: &[Value]) -> Vec<(String, String)> {
    let mut kinds: Vec<(String, String)> = lists
        .iter()
        .flat_map(|l| l["resources"].as_array().into_iter().flatten())
        .filter_map(|r| {
            let name = r["name"].as_str()?;
            let kind = r["kind"].as_str()?;
            (!name.contains('/')).then(|| (kind.to_owned(), name.to_owned()))
        })
        .collect();
    kinds.sort();
    kinds.dedup();
    kinds
}

/// The version of a CRD whose schema is the installed one: the storage
/// version (the only one in `nexo.io` today).
fn storage_version(crd: &Value) -> Option<&Value> {
    let versions = crd["spec"]["versions"].as_array()?;
    versions
        .iter()
        .find(|v| v["storage"] == true)
        .or_else(|| versions.first())
}

/// The `spec.references[].kind` enum of the NexoPipeline CRD, sorted.
pub fn reference_kinds(crd: &Value) -> Result<Vec<String>, &'static str> {
    let version = storage_version(crd).ok_or("the NexoPipeline CRD has no version")?;
    let schema = &version["schema"]["openAPIV3Schema"];
    let kind =
        &schema["properties"]["spec"]["properties"]["references"]["items"]["properties"]["kind"];
    let mut kinds: Vec<String> = kind["enum"]
        .as_array()
        .ok_or("the NexoPipeline schema has no spec.references[].kind enum")?
        .iter()
        .filter_map(|k| k.as_str().map(str::to_owned))
        .collect();
    kinds.sort();
    kinds.dedup();
    Ok(kinds)
}

/// The canonical JSON of the CRDs' versions: one element per CRD, sorted by
/// kind; each the array of its `spec.versions` in their order, each
/// version reduced to exactly `name`, `served`, `storage`, `schema`.
/// Object keys sorted (serde_json's maps are ordered), no whitespace,
/// non-ASCII characters unescaped.
pub fn canonical(crds: &[Value]) -> String {
    let mut sorted: Vec<&Value> = crds.iter().collect();
    sorted.sort_by_key(|c| {
        c["spec"]["names"]["kind"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    });
    let doc: Vec<Value> = sorted
        .iter()
        .map(|crd| {
            let versions = crd["spec"]["versions"].as_array().into_iter().flatten();
            Value::Array(
                versions
                    .map(|v| {
                        let mut m = serde_json::Map::new();
                        for key in ["name", "served", "storage", "schema"] {
                            m.insert(key.to_owned(), v[key].clone());
                        }
                        Value::Object(m)
                    })
                    .collect(),
            )
        })
        .collect();
    Value::Array(doc).to_string()
}

/// `sha256:` and the hex SHA-256 of [`canonical`].
pub fn fingerprint(crds: &[Value]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, canonical(crds).as_bytes());
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// Reads the contract: discovery of group `nexo.io`, then each CRD.
pub fn read(client: &Client, bundle_version: Option<&str>) -> Reading {
    let mut contract = ReleaseContract {
        bundle_version: bundle_version.map(str::to_owned),
        ..ReleaseContract::default()
    };
    let kinds = match discover(client) {
        Ok(kinds) => kinds,
        Err(e) => {
            contract.errors.push(format!("discovery of {GROUP}: {e}"));
            return Reading { contract };
        }
    };
    contract.crd_kinds = Some(kinds.iter().map(|(k, _)| k.clone()).collect());
    let mut crds = Vec::with_capacity(kinds.len());
    for (kind, plural) in &kinds {
        let path = resource::CRDS.object(None, &format!("{plural}.{GROUP}"));
        match client.get::<Value>(&path) {
            Ok(crd) => crds.push((kind.clone(), crd)),
            Err(e) => contract
                .errors
                .push(format!("CustomResourceDefinition {plural}.{GROUP}: {e}")),
        }
    }
    match crds.iter().find(|(k, _)| k == "NexoPipeline") {
        Some((_, crd)) => match reference_kinds(crd) {
            Ok(kinds) => contract.pipeline_reference_kinds = Some(kinds),
            Err(why) => contract.errors.push(why.to_owned()),
        },
        None if kinds.iter().any(|(k, _)| k == "NexoPipeline") => {}
        None => contract
            .errors
            .push(format!("NexoPipeline is not served in {GROUP}")),
    }
    if crds.len() == kinds.len() {
        let crds: Vec<Value> = crds.into_iter().map(|(_, c)| c).collect();
        contract.schema_fingerprint = Some(fingerprint(&crds));
    }
    Reading { contract }
}

/// The (kind, plural) pairs served in `nexo.io`, over its versions.
fn discover(client: &Client) -> Result<Vec<(String, String)>, kube::Error> {
    let group: Option<Value> = client.get_opt(&resource::group_version_path(GROUP, None))?;
    let Some(group) = group else {
        return Ok(Vec::new());
    };
    let mut lists = Vec::new();
    for v in group["versions"].as_array().into_iter().flatten() {
        if let Some(version) = v["version"].as_str() {
            let path = resource::group_version_path(GROUP, Some(version));
            lists.push(client.get::<Value>(&path)?);
        }
    }
    Ok(served_kinds(&lists))
}

/// The last reading and when it was made.
#[derive(Debug, Default)]
pub struct Cache {
    last: Option<(Instant, Reading)>,
}

impl Cache {
    /// The reading, made again when none was made yet, when the CRDs'
    /// watch says they changed, or, not watched, when the last is
    /// [`REFRESH`] old.
    pub fn get(
        &mut self,
        now: Instant,
        refresh: Refresh,
        read: impl FnOnce() -> Reading,
    ) -> Reading {
        if refresh.due(self.last.as_ref().map(|(at, _)| *at), now, REFRESH) {
            self.last = Some((now, read()));
        }
        self.last
            .as_ref()
            .map(|(_, c)| c.clone())
            .unwrap_or_default()
    }
}

#[cfg(test)]
#[path = "release_tests.rs"]
mod tests;
