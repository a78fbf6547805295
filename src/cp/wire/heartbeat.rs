//! `POST /api/v2/manager/heartbeat`: the request body (the Manager, its
//! inventory, status, drift, trust and release contract).

use std::rc::Rc;

use serde::Serialize;

use super::Ack;
use crate::words::Phase;

/// `manager` in the heartbeat body.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatManager {
    /// Manager build version.
    pub version: String,
    /// Build identifier.
    pub build: String,
    /// Always [`PROTOCOL_VERSION`](super::PROTOCOL_VERSION).
    pub protocol_version: u32,
    /// Advertised capabilities.
    pub capabilities: Vec<String>,
}

/// One Manager-owned deployment in the heartbeat. The namespace and the
/// image are shared (`Rc<str>`) between the entries that have the same: a
/// cluster of 10,000 proxies of one image in one namespace holds two such
/// strings, not 20,000. Sent sorted by namespace, then name, then kind
/// (the order of the inventory's records, `inventory::Owned`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct DeploymentEntry {
    /// Namespace (first sort key).
    pub namespace: Rc<str>,
    /// Name (second sort key); also the key of the index that keeps the
    /// entry, which shares it.
    pub name: Rc<str>,
    /// `NexoProxy` or `Deployment`.
    pub kind: EntryKind,
    /// `spec.replicas`.
    pub replicas: i64,
    /// The proxy image, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<Rc<str>>,
    /// Its rollout status (`status.v1`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<EntryStatus>,
}

/// What a heartbeat entry is: one byte where its name would be sixteen
/// (BENCHMARKS.md, "The compact status"). Ordered as its name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum EntryKind {
    /// An `apps/v1` Deployment (legacy).
    Deployment,
    /// A `nexo.io/v1alpha1` NexoProxy.
    NexoProxy,
}

impl EntryKind {
    /// Its kind's name, as sent.
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::Deployment => "Deployment",
            EntryKind::NexoProxy => "NexoProxy",
        }
    }
}

/// `status` of a heartbeat entry (`status.v1`).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct EntryStatus {
    /// The first phase that holds.
    pub phase: Phase,
    /// Ready replicas.
    pub ready_replicas: i64,
    /// Updated replicas, when the object says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated_replicas: Option<i64>,
    /// `status.observedGeneration`, when the object says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `metadata.generation`.
    pub generation: i64,
    /// The deciding condition's reason (shared: few distinct values).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<Rc<str>>,
    /// Its message (at most 256 bytes), or what the replicas say (shared).
    pub message: Rc<str>,
    /// When the phase last changed, as this Manager saw it (RFC 3339;
    /// shared by the entries that changed in the same heartbeat).
    pub since: Rc<str>,
    /// The last deploy or rollout, while it is in progress and in the first
    /// heartbeat that shows its end (boxed: most entries have none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<Box<CommandProgress>>,
}

/// `status.command`: the progress of the last deploy or rollout.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CommandProgress {
    /// The command's id.
    pub id: String,
    /// `deploy` or `rollout`.
    pub class: &'static str,
    /// Where it stands.
    pub phase: CommandPhase,
    /// `rolledBack`: the command whose change was restored (docs/protocol.md,
    /// `rollback.v1`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rolled_back_to: Option<String>,
    /// `rollbackFailed`: why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Where a command stands: its deployment's phase, or how its rollback
/// ended (docs/protocol.md, `rollback.v1`).
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum CommandPhase {
    Progressing,
    Available,
    Degraded,
    Failed,
    RolledBack,
    RollbackFailed,
}

impl From<Phase> for CommandPhase {
    fn from(p: Phase) -> CommandPhase {
        match p {
            Phase::Progressing => CommandPhase::Progressing,
            Phase::Available => CommandPhase::Available,
            Phase::Degraded => CommandPhase::Degraded,
            Phase::Failed => CommandPhase::Failed,
        }
    }
}

/// `cluster` in the heartbeat body. Unknown metadata is omitted, never guessed.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ClusterInfo {
    /// `metadata.uid` of `kube-system`.
    pub uid: String,
    /// Cluster name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Region.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Zone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// The API server's `gitVersion`.
    pub kubernetes_version: String,
}

/// `POST /api/v2/manager/heartbeat` request body.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatRequest {
    /// From the connect response.
    pub manager_id: String,
    /// 1 for the first heartbeat of the process, then +1 per heartbeat.
    pub sequence: u64,
    /// RFC 3339 UTC.
    pub sent_at: String,
    /// This build.
    pub manager: HeartbeatManager,
    /// `NEXO_PROXY_IMAGE`.
    pub proxy_image: String,
    /// `deployments.len()`.
    pub managed_proxy_count: usize,
    /// Owned deployments, sorted by namespace then name: shared with the
    /// index the watches keep, not copied (10,000 entries cost 80 KB here).
    /// Written by [`crate::cp::body::HeartbeatBody`] after the other fields,
    /// as the body is sent: serializing this struct alone leaves them out.
    #[serde(skip)]
    pub deployments: Entries,
    /// The cluster.
    pub cluster: ClusterInfo,
    /// Acks whose delivery exhausted their retries.
    pub pending_acks: Vec<Ack>,
    /// What part of the inventory could not be read.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub inventory_errors: Vec<String>,
    /// The release-contract inventory (`release-contract.v1`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release_contract: Option<ReleaseContract>,
    /// Where command trust stands (docs/protocol.md, "Fail closed").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trust: Option<TrustReport>,
    /// How long the CP may hold this request (`heartbeat.wait.v1`): the
    /// interval in force, in whole seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_seconds: Option<u64>,
    /// Deployments whose objects drifted (`drift.v1`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub drift: Vec<DriftEntry>,
    /// The last upgrade of the Manager itself (`rollback.v1`), until the
    /// next one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub self_upgrade: Option<SelfUpgradeReport>,
    /// The inventory's form (`inventory.delta.v1`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inventory: Option<InventoryForm>,
}

/// `inventory` (docs/protocol.md, `inventory.delta.v1`): the full form
/// (`deployments` sent) or what changed since `base` (`deployments` not
/// sent).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InventoryForm {
    pub epoch: String,
    pub revision: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub full: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changed: Option<Vec<DeploymentEntry>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub removed: Option<Vec<EntryKey>>,
}

impl InventoryForm {
    /// Whether it is a delta: `deployments` is not sent.
    pub fn is_delta(&self) -> bool {
        self.base.is_some()
    }
}

/// A sorted list of heartbeat entries as its keeper holds them: each
/// wire entry is made from the keeper's record only when it is written
/// (the inventory keeps one record an object, not a wire entry beside it:
/// BENCHMARKS.md, "One record an object").
pub trait EntryList {
    /// How many entries.
    fn len(&self) -> usize;
    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Entry `i` as sent (`None` past the end).
    fn entry(&self, i: usize) -> Option<DeploymentEntry>;
    /// The phase of entry `i`, if it has a status.
    fn phase(&self, i: usize) -> Option<Phase> {
        self.entry(i)?.status.map(|s| s.phase)
    }
}

/// Entries written out (the tests' lists).
#[cfg(test)]
impl EntryList for Vec<DeploymentEntry> {
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn entry(&self, i: usize) -> Option<DeploymentEntry> {
        self.get(i).cloned()
    }
}

/// No entries.
struct NoEntries;

impl EntryList for NoEntries {
    fn len(&self) -> usize {
        0
    }
    fn entry(&self, _: usize) -> Option<DeploymentEntry> {
        None
    }
}

/// The heartbeat's entries, sorted: one list shared by the index and each
/// heartbeat that reports it (a heartbeat at rest copies nothing).
#[derive(Clone)]
pub struct Entries(Rc<dyn EntryList>);

impl Entries {
    /// The entries of `list`, shared.
    pub fn new(list: Rc<dyn EntryList>) -> Entries {
        Entries(list)
    }

    /// How many entries.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Entry `i` as sent (`None` past the end).
    pub fn get(&self, i: usize) -> Option<DeploymentEntry> {
        self.0.entry(i)
    }

    /// Each entry's phase, if it has a status, in order.
    pub fn phases(&self) -> impl Iterator<Item = Option<Phase>> + '_ {
        (0..self.len()).map(|i| self.0.phase(i))
    }

    /// Each entry, as sent, in order.
    pub fn iter(&self) -> impl Iterator<Item = DeploymentEntry> + '_ {
        (0..self.len()).filter_map(|i| self.0.entry(i))
    }
}

#[cfg(test)]
impl From<Vec<DeploymentEntry>> for Entries {
    fn from(v: Vec<DeploymentEntry>) -> Entries {
        Entries(Rc::new(v))
    }
}

impl Default for Entries {
    fn default() -> Entries {
        Entries(Rc::new(NoEntries))
    }
}

impl std::fmt::Debug for Entries {
    /// The entries as sent.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl PartialEq for Entries {
    /// The same entries, as sent.
    fn eq(&self, other: &Entries) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

/// An entry's key: what `removed` names, and what the index keeps a
/// command's progress by.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct EntryKey {
    pub namespace: Rc<str>,
    pub name: Rc<str>,
    pub kind: EntryKind,
}

/// `selfUpgrade` (docs/protocol.md, `rollback.v1`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SelfUpgradeReport {
    pub command_id: String,
    /// The bundle before (empty when the running one was not known).
    pub from: String,
    /// The bundle it moved to.
    pub to: String,
    pub phase: crate::words::SelfUpgradePhase,
    /// Why it was rolled back, or why that failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// One deployment in `drift` (`drift.v1`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DriftEntry {
    pub name: String,
    pub namespace: String,
    /// `report` or `enforce`.
    pub mode: &'static str,
    pub objects: Vec<DriftObject>,
}

/// One drifted object of a [`DriftEntry`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DriftObject {
    pub kind: &'static str,
    pub name: String,
    /// The JSON pointers that differ; absent for an object gone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fields: Option<Vec<String>>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub gone: bool,
    /// `reported`, `corrected`, `recreated` or `failed`.
    pub action: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub detected_at: String,
}

/// `releaseContract` in the heartbeat (`release-contract.v1`); `release.rs`
/// reads it from the cluster.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseContract {
    /// `NEXO_BUNDLE_VERSION`; absent when unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bundle_version: Option<String>,
    /// The kinds served in group `nexo.io`, sorted; absent when unreadable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub crd_kinds: Option<Vec<String>>,
    /// The installed NexoPipeline schema's `spec.references[].kind` enum,
    /// sorted; absent when unreadable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pipeline_reference_kinds: Option<Vec<String>>,
    /// `sha256:<64 hex>` of the canonical JSON of the CRDs' versions;
    /// absent when unreadable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schema_fingerprint: Option<String>,
    /// The parts that could not be read, and why.
    pub errors: Vec<String>,
}

/// The heartbeat's `trust`: whether signatures are required, and the key
/// ids the Manager verifies with.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TrustReport {
    /// `required` or `off`.
    pub signatures: &'static str,
    /// The configured key ids (none when the key file is absent or unusable).
    pub key_ids: Vec<String>,
}
