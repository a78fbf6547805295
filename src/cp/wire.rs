//! The Control Plane's wire types (protocol version 2), as serde structs.
//!
//! Unknown response fields are ignored; missing required fields fail to
//! decode. Optional request fields are omitted when absent, never sent as null.

use std::fmt;
use std::rc::Rc;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// The protocol version this Manager speaks.
pub const PROTOCOL_VERSION: u32 = 2;

/// `manager` in the connect body.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ManagerInfo {
    /// Manager build version.
    pub version: String,
    /// Build identifier.
    pub build: String,
    /// Advertised capabilities.
    pub capabilities: Vec<String>,
}

/// `instance` in the connect body.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InstanceInfo {
    /// Pod uid, else hostname.
    pub id: String,
    pub pod_name: String,
    /// The Manager's namespace.
    pub namespace: String,
}

/// `cluster` in the connect body.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRef {
    /// `metadata.uid` of the `kube-system` namespace.
    pub uid: String,
    /// The API server's `gitVersion`.
    pub kubernetes_version: String,
}

/// `POST /api/v2/manager/connect` request body.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConnectRequest {
    /// Always [`PROTOCOL_VERSION`].
    pub protocol_version: u32,
    /// This build.
    pub manager: ManagerInfo,
    /// This process.
    pub instance: InstanceInfo,
    /// This cluster.
    pub cluster: ClusterRef,
}

/// `POST /api/v2/manager/connect` 200 body.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConnectResponse {
    /// Must equal the token's environment id.
    pub environment_id: String,
    /// The id the CP gave this Manager.
    pub manager_id: String,
    /// Bearer token of the session.
    pub session_token: String,
    /// When the session expires (RFC 3339), if the CP says.
    #[serde(default)]
    pub session_expires_at: Option<String>,
    /// Interval override, seconds.
    #[serde(default)]
    pub heartbeat_interval_seconds: Option<u64>,
}

/// `manager` in the heartbeat body.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatManager {
    /// Manager build version.
    pub version: String,
    /// Build identifier.
    pub build: String,
    /// Always [`PROTOCOL_VERSION`].
    pub protocol_version: u32,
    /// Advertised capabilities.
    pub capabilities: Vec<String>,
}

/// One Manager-owned deployment in the heartbeat. The namespace and the
/// image are shared (`Rc<str>`) between the entries that have the same: a
/// cluster of 10,000 proxies of one image in one namespace holds two such
/// strings, not 20,000. Ordered by namespace, then name, then kind.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct DeploymentEntry {
    /// Namespace (first sort key).
    pub namespace: Rc<str>,
    /// Name (second sort key); also the key of the index that keeps the
    /// entry, which shares it.
    pub name: Rc<str>,
    /// `NexoProxy` or `Deployment`.
    pub kind: &'static str,
    /// `spec.replicas`.
    pub replicas: i64,
    /// The proxy image, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<Rc<str>>,
    /// Its rollout status (`status.v1`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<EntryStatus>,
}

impl Ord for DeploymentEntry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (&self.namespace, &self.name, self.kind).cmp(&(&other.namespace, &other.name, other.kind))
    }
}

impl PartialOrd for DeploymentEntry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// A deployment's phase (protocol.md, "Deployment status").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// Anything not yet decided.
    Progressing,
    /// Every replica ready at the observed generation.
    Available,
    /// Was available at this generation, fewer ready now.
    Degraded,
    /// A change did not become available in time.
    Failed,
}

impl Phase {
    /// Every phase, in the protocol's order.
    pub const ALL: [Phase; 4] = [
        Phase::Progressing,
        Phase::Available,
        Phase::Degraded,
        Phase::Failed,
    ];

    /// `available` and `failed` end a command's progress.
    pub fn is_final(self) -> bool {
        matches!(self, Phase::Available | Phase::Failed)
    }

    /// The lowercase name, as on the wire and in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Progressing => "progressing",
            Phase::Available => "available",
            Phase::Degraded => "degraded",
            Phase::Failed => "failed",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
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
pub struct CommandProgress {
    /// The command's id.
    pub id: String,
    /// `deploy` or `rollout`.
    pub class: &'static str,
    /// Where it stands.
    pub phase: Phase,
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
    /// Written by [`super::body::HeartbeatBody`] after the other fields,
    /// as the body is sent: serializing this struct alone leaves them out.
    #[serde(skip)]
    pub deployments: Vec<Rc<DeploymentEntry>>,
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
    /// Where command trust stands (protocol.md, "Fail closed").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trust: Option<TrustReport>,
    /// How long the CP may hold this request (`heartbeat.wait.v1`): the
    /// interval in force, in whole seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_seconds: Option<u64>,
    /// Deployments whose objects drifted (`drift.v1`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub drift: Vec<DriftEntry>,
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

/// A command's fields as slices of its text, read once: every field the
/// Manager reads, of an unsigned command, of a signed envelope and of the
/// command it signs; `None` when absent. Nothing is built from them before
/// the command's size budget is checked.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommandFields<'a> {
    #[serde(default, borrow)]
    pub id: Option<&'a RawValue>,
    #[serde(default, borrow)]
    pub class: Option<&'a RawValue>,
    #[serde(default, borrow)]
    pub requires: Option<&'a RawValue>,
    #[serde(default, borrow)]
    pub payload: Option<&'a RawValue>,
    /// A signed envelope's key id.
    #[serde(default, borrow)]
    pub key_id: Option<&'a RawValue>,
    /// A signed envelope's signed bytes, base64url.
    #[serde(default, borrow)]
    pub signed: Option<&'a RawValue>,
    /// A signed envelope's signature, base64url.
    #[serde(default, borrow)]
    pub signature: Option<&'a RawValue>,
    /// A signed command's environment.
    #[serde(default, borrow)]
    pub environment_id: Option<&'a RawValue>,
    /// A signed command's end of validity.
    #[serde(default, borrow)]
    pub not_after: Option<&'a RawValue>,
}

impl<'a> CommandFields<'a> {
    /// The fields of `text`, a JSON object (a duplicate field is an error).
    pub fn read(text: &'a str) -> Result<CommandFields<'a>, serde_json::Error> {
        serde_json::from_str(text)
    }
}

/// Most commands taken from one heartbeat answer; the rest are skipped
/// unacknowledged (the CP sends them again).
pub const MAX_COMMANDS: usize = 1000;

/// Largest command, as raw JSON (protocol.md, "Hostile and buggy values").
pub const MAX_COMMAND_BYTES: usize = 2 * 1024 * 1024;

/// `POST /api/v2/manager/heartbeat` 200 body; every field optional,
/// borrowed from the answer's bytes. A `commands` that is not a list fails
/// to decode: a failed heartbeat.
#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatResponse<'a> {
    /// Interval override, whole seconds (clamped to 5..=600 by the
    /// caller); anything but a non-negative integer is ignored.
    #[serde(default, deserialize_with = "lenient_seconds")]
    pub heartbeat_interval_seconds: Option<u64>,
    /// Commands, kept as slices of the answer and decoded one by one, so
    /// that one bad command (too deep, a lone surrogate) cannot spoil the
    /// batch and the batch is never copied.
    #[serde(default, borrow)]
    pub commands: Option<Commands<'a>>,
    /// `held: true`: the CP held the request (`heartbeat.wait.v1`), so it
    /// was the wait and the next heartbeat goes at once. Anything but
    /// `true` is not held.
    #[serde(default, deserialize_with = "lenient_true")]
    pub held: bool,
}

/// `true` only for the JSON `true`; any other value (absent, `false`,
/// `"true"`, `1`) is false.
fn lenient_true<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    let raw = <&RawValue>::deserialize(d)?;
    Ok(raw.get().trim() == "true")
}

/// The first [`MAX_COMMANDS`] commands of an answer, and how many followed.
#[derive(Debug, Default)]
pub struct Commands<'a> {
    /// The commands taken, raw.
    pub taken: Vec<&'a RawValue>,
    /// Commands past the limit, skipped without being read into memory.
    pub skipped: usize,
}

impl<'de: 'a, 'a> Deserialize<'de> for Commands<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Commands<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of commands")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut out = Commands::default();
                loop {
                    if out.taken.len() < MAX_COMMANDS {
                        match seq.next_element::<&'de RawValue>()? {
                            Some(c) => out.taken.push(c),
                            None => break,
                        }
                    } else {
                        match seq.next_element::<serde::de::IgnoredAny>()? {
                            Some(_) => out.skipped += 1,
                            None => break,
                        }
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_seq(Visit(std::marker::PhantomData))
    }
}

fn lenient_seconds<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let raw = <&RawValue>::deserialize(d)?;
    Ok(crate::backoff::whole_number(raw.get()))
}

/// One resource in an ack.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AckResource {
    /// `apiVersion` of the object.
    pub api_version: String,
    /// `kind` of the object.
    pub kind: String,
    pub namespace: String,
    pub name: String,
    /// What was done to it.
    pub action: ResourceAction,
}

/// What a command did to one object (protocol.md, "Acknowledgement").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResourceAction {
    /// It did not exist and was created.
    Created,
    /// It existed and was changed (or adopted).
    Configured,
    /// It existed and the write changed nothing.
    Unchanged,
    /// It was deleted.
    Deleted,
    /// It was not there to delete.
    Absent,
    /// It was not written: not owned, or the API server refused it.
    Refused,
}

impl ResourceAction {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceAction::Created => "created",
            ResourceAction::Configured => "configured",
            ResourceAction::Unchanged => "unchanged",
            ResourceAction::Deleted => "deleted",
            ResourceAction::Absent => "absent",
            ResourceAction::Refused => "refused",
        }
    }
}

impl std::fmt::Display for ResourceAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AckResult {
    /// Carried out (an idempotent no-op included).
    Applied,
    /// Refused or failed; the message says why.
    #[default]
    Failed,
}

impl AckResult {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            AckResult::Applied => "applied",
            AckResult::Failed => "failed",
        }
    }
}

impl std::fmt::Display for AckResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `POST /api/v2/manager/commands/{id}/ack` body (and a `pendingAcks` entry).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Ack {
    /// From the connect response.
    pub manager_id: String,
    /// The command.
    pub command_id: String,
    /// Applied or failed.
    pub result: AckResult,
    /// Human-readable outcome.
    pub message: String,
    /// RFC 3339 UTC.
    pub completed_at: String,
    /// Delivery attempt, from 1.
    pub attempt: u32,
    /// The objects touched or refused.
    #[serde(default)]
    pub resources: Vec<AckResource>,
}

/// The body of a non-2xx answer: `{"error": {...}}`. Every field optional.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
pub struct ErrorEnvelope {
    /// The error.
    #[serde(default)]
    pub error: ErrorBody,
}

/// The `error` object.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
pub struct ErrorBody {
    /// Machine-readable code, `token_invalid`, ...
    #[serde(default)]
    pub code: Option<String>,
    /// Human-readable message.
    #[serde(default)]
    pub message: Option<String>,
    /// Whether the CP thinks a retry may succeed.
    #[serde(default)]
    pub retryable: Option<bool>,
}

/// Whether `id` is a valid command id, `[A-Za-z0-9][A-Za-z0-9._-]{0,127}`:
/// it starts with a letter or digit, so `.` and `..` are not ids (they
/// would name another path in the ack URL).
pub fn valid_command_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id.as_bytes()[0].is_ascii_alphanumeric()
        && id
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// Whether `token` can be sent as `Authorization: Bearer <token>`: 1 to
/// 4096 characters of RFC 6750's `b64token` (`[A-Za-z0-9._~+/-]+=*`). A
/// session token that is not, whatever the CP meant, makes the connect a
/// failed one: it never reaches a header.
pub fn valid_session_token(token: &str) -> bool {
    let body = token.trim_end_matches('=');
    (1..=4096).contains(&token.len())
        && !body.is_empty()
        && body.bytes().all(|c| {
            c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~' | b'+' | b'/')
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn command_ids_start_with_a_letter_or_digit() {
        for ok in ["cmd-01J", "a", "0.1_x-y", &"x".repeat(128)] {
            assert!(valid_command_id(ok), "{ok}");
        }
        for bad in [
            ".",
            "..",
            "-x",
            "_x",
            ".hidden",
            "",
            "a/b",
            "a b",
            &"x".repeat(129),
        ] {
            assert!(!valid_command_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn session_tokens_must_fit_a_bearer_header() {
        for ok in ["s", "abc.DEF-123_~+/", "dG9rZW4=", "x=="] {
            assert!(valid_session_token(ok), "{ok}");
        }
        let long = "x".repeat(4097);
        for bad in [
            "",
            "=",
            "a\r\nX-Evil: 1",
            "a b",
            "tök",
            "a\u{0}",
            "a=b",
            long.as_str(),
        ] {
            assert!(!valid_session_token(bad), "{bad:?}");
        }
    }

    #[test]
    fn held_is_true_only_for_the_json_true() {
        for (body, held) in [
            (r#"{"held": true}"#, true),
            (r#"{"held": false}"#, false),
            (r#"{"held": "true"}"#, false),
            (r#"{"held": 1}"#, false),
            (r#"{"held": null}"#, false),
            (r#"{"held": {"a": true}}"#, false),
            ("{}", false),
        ] {
            let r: HeartbeatResponse = serde_json::from_str(body).unwrap();
            assert_eq!(r.held, held, "{body}");
        }
    }

    #[test]
    fn heartbeat_response_fields_are_optional_and_unknown_ignored() {
        let r: HeartbeatResponse = serde_json::from_str("{}").unwrap();
        assert!(r.heartbeat_interval_seconds.is_none() && r.commands.is_none());
        let deep = format!("{}{}", "[".repeat(500), "]".repeat(500));
        let body = format!(
            r#"{{"heartbeatIntervalSeconds": 30, "commands": [{{"id": "a", "payload": {deep}}}, {{"id": "b\ud800"}}], "future": 1}}"#
        );
        let r: HeartbeatResponse = serde_json::from_slice(body.as_bytes()).unwrap();
        assert_eq!(r.heartbeat_interval_seconds, Some(30));
        assert_eq!(
            r.commands.unwrap().taken.len(),
            2,
            "bad commands do not spoil the batch"
        );
        assert!(serde_json::from_str::<HeartbeatResponse>(r#"{"commands": {"id": "a"}}"#).is_err());
    }

    #[test]
    fn an_answer_gives_at_most_1000_commands_and_counts_the_rest() {
        let one = r#"{"id":"c","class":"deploy","payload":{}}"#;
        let body = format!(
            r#"{{"commands":[{}]}}"#,
            vec![one; MAX_COMMANDS + 234].join(",")
        );
        let r: HeartbeatResponse = serde_json::from_slice(body.as_bytes()).unwrap();
        let c = r.commands.unwrap();
        assert_eq!((c.taken.len(), c.skipped), (MAX_COMMANDS, 234));
        assert_eq!(c.taken[999].get(), one, "a slice of the answer, not a copy");
    }

    #[test]
    fn a_non_integer_interval_is_ignored_not_a_failed_heartbeat() {
        for (raw, want) in [
            ("30", Some(30)),
            ("0", Some(0)),
            ("99999999999999999999999", Some(u64::MAX)),
            ("30.5", None),
            ("-5", None),
            ("\"30\"", None),
            ("null", None),
            ("[30]", None),
            ("1e3", None),
        ] {
            let body = format!(r#"{{"heartbeatIntervalSeconds": {raw}}}"#);
            let r: HeartbeatResponse = serde_json::from_str(&body).unwrap();
            assert_eq!(r.heartbeat_interval_seconds, want, "{raw}");
        }
    }

    #[test]
    fn connect_response_requires_its_fields() {
        let ok =
            json!({"environmentId": "env-a", "managerId": "m", "sessionToken": "s", "extra": true});
        assert!(serde_json::from_value::<ConnectResponse>(ok).is_ok());
        let missing = json!({"environmentId": "env-a", "managerId": "m"});
        assert!(serde_json::from_value::<ConnectResponse>(missing).is_err());
    }

    #[test]
    fn optional_cluster_fields_are_omitted() {
        let c = ClusterInfo {
            uid: "u".into(),
            kubernetes_version: "v1.37.2".into(),
            ..Default::default()
        };
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            json!({"uid": "u", "kubernetesVersion": "v1.37.2"})
        );
    }

    #[test]
    fn command_ids() {
        assert!(valid_command_id("cmd-01J.x_y"));
        assert!(!valid_command_id(""));
        assert!(!valid_command_id("a/b"));
        assert!(!valid_command_id(&"a".repeat(129)));
    }
}
