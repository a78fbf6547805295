//! The drift record: a Secret owned by the deployment, labelled as the
//! Manager's own, holding what a deploy or rollout applied as a deploy
//! payload and the Manager's proof of it (SECURITY.md, "Integrity the
//! namespace cannot forge"); read back only with a valid proof, and kept
//! small while a check holds it ([`Kept`]).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use super::history::History;
use super::{MAX_OBJECTS, MAX_RECORD_BYTES, RECORD_ROLE, Settings, SettingsError};
use crate::ownership;
use crate::resource::Kind;

/// What a deploy applied, too big for its record ([`MAX_RECORD_BYTES`]):
/// applied, but not recorded, so its drift is not watched (docs/protocol.md,
/// `drift.v1`: the ack and the drift entry say so, naming the bound).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverBound {
    /// The payload's size as JSON.
    pub bytes: usize,
}

impl std::fmt::Display for OverBound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "what it applied is {} bytes, over the drift record's bound of {MAX_RECORD_BYTES} bytes",
            self.bytes
        )
    }
}

/// What a record Secret's name starts with; the deployment's name follows.
const NAME_PREFIX: &str = "nexo-applied-";

/// The name of a deployment's record Secret.
pub fn record_name(deployment: &str) -> String {
    format!("{NAME_PREFIX}{deployment}")
}

/// The record Secret of a deployment: `payload` (the deploy's
/// `deployment`, `format`, `manifests` and `drift`, as a deploy command's
/// payload, so that enforcing it passes the same validation), owned by
/// the deployment's NexoProxy or Deployment (`owner`: kind, uid) and
/// labelled as the Manager's own, but not with the deployment's label:
/// an uninstall or a deploy that lists the deployment's objects never
/// meets it (the garbage collector removes it with its owner).
pub fn record_secret(
    payload: &Value,
    history: &History,
    namespace: &str,
    deployment: &str,
    environment_id: &str,
    owner: (Kind, &str),
    key: &crate::integrity::Key,
) -> Result<Value, OverBound> {
    let text = payload.to_string();
    if text.len() > MAX_RECORD_BYTES {
        return Err(OverBound { bytes: text.len() });
    }
    let claim = crate::integrity::RecordClaim {
        environment_id,
        namespace,
        deployment,
        owner_uid: owner.1,
        payload: text.as_bytes(),
    };
    let proof = key.record_proof(&claim);
    let history = history.text_beside(text.len());
    let history_proof = key.history_proof(&claim, history.as_bytes());
    Ok(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": record_name(deployment),
            "namespace": namespace,
            "labels": {
                ownership::MANAGED_BY: ownership::MANAGER,
                ownership::OWNER_ID: environment_id,
                ownership::ROLE: RECORD_ROLE,
            },
            "annotations": {
                crate::integrity::ANNOTATION: proof,
                crate::integrity::HISTORY_ANNOTATION: history_proof,
            },
            "ownerReferences": [{"apiVersion": owner.0.api_version(), "kind": owner.0.name(), "name": deployment, "uid": owner.1}],
        },
        "type": "Opaque",
        "data": {"payload": STANDARD.encode(&text), "history": STANDARD.encode(&history)},
    }))
}

/// The payload of a record Secret (found in `namespace`, labelled as this
/// environment's), only if it carries the Manager's proof of it (SECURITY.md,
/// "Integrity the namespace cannot forge"): its payload's exact bytes, its
/// place, its deployment and its owner's uid. An error says why it is not
/// the Manager's, or what is wrong.
pub fn proven_payload(
    secret: &Value,
    environment_id: &str,
    namespace: &str,
    key: &crate::integrity::Key,
) -> Result<Value, RecordError> {
    proven_bytes(secret, environment_id, namespace, key).map(|(proven, _)| proven.payload)
}

/// A record's payload, proven: parsed, and its exact bytes.
pub(super) struct Proven {
    pub(super) payload: Value,
    pub(super) bytes: Vec<u8>,
}

/// What a record's claim is made of, but its payload's bytes.
pub(super) struct ClaimOf<'a> {
    environment_id: &'a str,
    namespace: &'a str,
    deployment: String,
    owner_uid: &'a str,
}

impl ClaimOf<'_> {
    /// The claim, with the payload's bytes.
    pub(super) fn claim<'b>(&'b self, payload: &'b [u8]) -> crate::integrity::RecordClaim<'b> {
        crate::integrity::RecordClaim {
            environment_id: self.environment_id,
            namespace: self.namespace,
            deployment: &self.deployment,
            owner_uid: self.owner_uid,
            payload,
        }
    }
}

/// [`proven_payload`], with the payload's bytes and what its claim is
/// made of (a history's proof is checked against them).
pub(super) fn proven_bytes<'a>(
    secret: &'a Value,
    environment_id: &'a str,
    namespace: &'a str,
    key: &crate::integrity::Key,
) -> Result<(Proven, ClaimOf<'a>), RecordError> {
    let meta = &secret["metadata"];
    let proof = meta["annotations"][crate::integrity::ANNOTATION]
        .as_str()
        .ok_or(RecordError::NoProof)?;
    let data = secret["data"]["payload"]
        .as_str()
        .ok_or(RecordError::NoData)?;
    let bytes = STANDARD.decode(data).map_err(RecordError::NotBase64)?;
    if bytes.len() > MAX_RECORD_BYTES {
        return Err(RecordError::TooLarge);
    }
    let payload: Value = serde_json::from_slice(&bytes).map_err(RecordError::NotJson)?;
    let deployment = payload["deployment"]["name"]
        .as_str()
        .ok_or(RecordError::NoDeploymentName)?;
    if meta["name"].as_str() != Some(record_name(deployment).as_str()) {
        return Err(RecordError::Misnamed(crate::text::clip(deployment, 64)));
    }
    let claim_of = ClaimOf {
        environment_id,
        namespace,
        deployment: deployment.to_owned(),
        owner_uid: meta["ownerReferences"][0]["uid"]
            .as_str()
            .unwrap_or_default(),
    };
    if !key.verify_record(&claim_of.claim(&bytes), proof) {
        return Err(RecordError::BadProof);
    }
    Ok((Proven { payload, bytes }, claim_of))
}

/// A record Secret read with the Manager's proofs: its payload (proven),
/// and its history (docs/protocol.md, `rollback.v1`), proven beside that
/// payload or not (`Ok(None)`: a record written without one).
#[derive(Debug)]
pub struct ProvenRecord {
    pub payload: Value,
    pub history: Result<Option<History>, RecordError>,
}

/// The payload of a record Secret (this environment's, found in
/// `namespace`) with its proof, as [`proven_payload`], and its history
/// checked against the same verified bytes: one decode and one check of
/// the payload for both.
pub fn proven_record(
    secret: &Value,
    environment_id: &str,
    namespace: &str,
    key: &crate::integrity::Key,
) -> Result<ProvenRecord, RecordError> {
    let (proven, claim_of) = proven_bytes(secret, environment_id, namespace, key)?;
    let history = proven_history(secret, &claim_of.claim(&proven.bytes), key);
    Ok(ProvenRecord {
        payload: proven.payload,
        history,
    })
}

/// The history beside a payload whose `claim` is proven.
fn proven_history(
    secret: &Value,
    claim: &crate::integrity::RecordClaim<'_>,
    key: &crate::integrity::Key,
) -> Result<Option<History>, RecordError> {
    let Some(data) = secret["data"]["history"].as_str() else {
        return Ok(None);
    };
    let proof = secret["metadata"]["annotations"][crate::integrity::HISTORY_ANNOTATION]
        .as_str()
        .ok_or(RecordError::NoProof)?;
    let bytes = STANDARD.decode(data).map_err(RecordError::NotBase64)?;
    if bytes.len() > MAX_RECORD_BYTES {
        return Err(RecordError::TooLarge);
    }
    if !key.verify_history(claim, &bytes, proof) {
        return Err(RecordError::BadProof);
    }
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(RecordError::NotJson)
}

/// The deployment a record Secret claims to be of, by its name.
pub fn claimed_deployment(secret: &Value) -> Option<&str> {
    secret["metadata"]["name"]
        .as_str()?
        .strip_prefix(NAME_PREFIX)
}

/// A record as a check holds it: small, each manifest kept as its JSON
/// text until its object is compared (10,000 parsed manifests would cost
/// the check tens of MiB).
#[derive(Debug, Clone, PartialEq)]
pub struct Kept {
    pub name: String,
    /// `crd` or `legacy`.
    pub format: &'static str,
    pub settings: Settings,
    pub manifests: Vec<KeptManifest>,
}

/// One manifest of a [`Kept`] record.
#[derive(Debug, Clone, PartialEq)]
pub struct KeptManifest {
    pub kind: crate::resource::Kind,
    pub name: String,
    pub text: Box<str>,
}

impl Kept {
    /// Reads a record's payload, found in `namespace`; an error names what
    /// is wrong. Enough to compare; enforcing it validates it whole, as a
    /// deploy.
    pub fn read(payload: &Value, namespace: &str) -> Result<Kept, RecordError> {
        let field = |v: &Value, what: &str| -> Result<String, RecordError> {
            v.as_str()
                .map(str::to_owned)
                .ok_or_else(|| RecordError::NotAString(what.to_owned()))
        };
        let name = field(&payload["deployment"]["name"], "deployment.name")?;
        if payload["deployment"]["namespace"] != namespace {
            return Err(RecordError::ElsewhereNamespace(namespace.to_owned()));
        }
        let format = match payload["format"].as_str() {
            Some("crd") => "crd",
            Some("legacy") => "legacy",
            _ => return Err(RecordError::UnknownFormat),
        };
        let settings = Settings::parse(&payload["drift"])?;
        let list = payload["manifests"]
            .as_array()
            .ok_or(RecordError::ManifestsNotAList)?;
        if list.len() > MAX_OBJECTS {
            return Err(RecordError::TooManyManifests);
        }
        let mut manifests = Vec::with_capacity(list.len());
        for (i, m) in list.iter().enumerate() {
            let api_version = m["apiVersion"].as_str().unwrap_or_default();
            let kind = m["kind"].as_str().unwrap_or_default();
            let kind = crate::resource::Kind::of(api_version, kind).ok_or_else(|| {
                RecordError::UnknownKind {
                    index: i,
                    api_version: crate::text::clip(api_version, 64),
                    kind: crate::text::clip(kind, 64),
                }
            })?;
            let name = field(
                &m["metadata"]["name"],
                &format!("manifests[{i}].metadata.name"),
            )?;
            manifests.push(KeptManifest {
                kind,
                name,
                text: m.to_string().into_boxed_str(),
            });
        }
        Ok(Kept {
            name,
            format,
            settings,
            manifests,
        })
    }

    /// The deploy payload it was read from (in `namespace`), for
    /// enforcement; each manifest through `edit` (index, manifest).
    pub fn payload(&self, namespace: &str, mut edit: impl FnMut(usize, Value) -> Value) -> Value {
        let manifests: Vec<Value> = self
            .manifests
            .iter()
            .enumerate()
            .map(|(i, m)| edit(i, serde_json::from_str(&m.text).unwrap_or(Value::Null)))
            .collect();
        json!({
            "deployment": {"name": self.name, "namespace": namespace},
            "format": self.format,
            "manifests": manifests,
            "drift": self.settings.to_json(),
        })
    }
}

/// Whether `secret` is a record of this environment (labels).
pub fn is_record(secret: &Value, environment_id: &str) -> bool {
    let labels = &secret["metadata"]["labels"];
    labels[ownership::ROLE] == RECORD_ROLE
        && labels[ownership::OWNER_ID] == environment_id
        && labels[ownership::MANAGED_BY] == ownership::MANAGER
}

/// Why a record is not the Manager's, or cannot be read.
#[derive(Debug)]
pub enum RecordError {
    NoProof,
    NoData,
    NotBase64(base64::DecodeError),
    TooLarge,
    NotJson(serde_json::Error),
    NoDeploymentName,
    /// Not named after the deployment its payload names (clipped).
    Misnamed(String),
    BadProof,
    /// A field that must be a string.
    NotAString(String),
    /// Its payload's namespace is not this one.
    ElsewhereNamespace(String),
    UnknownFormat,
    /// Its `drift` settings.
    Drift(SettingsError),
    ManifestsNotAList,
    TooManyManifests,
    /// A manifest of a kind no deploy writes (clipped).
    UnknownKind {
        index: usize,
        api_version: String,
        kind: String,
    },
    /// No integrity key to check its proof with.
    NoKey,
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use RecordError as E;
        match self {
            E::NoProof => f.write_str(
                "it carries no proof (written before 0.5, or not by the Manager; the next deploy of the deployment writes it anew)",
            ),
            E::NoData => f.write_str("no data.payload"),
            E::NotBase64(e) => write!(f, "data.payload is not base64: {e}"),
            E::TooLarge => write!(f, "larger than {MAX_RECORD_BYTES} bytes"),
            E::NotJson(e) => write!(f, "data.payload is not JSON: {e}"),
            E::NoDeploymentName => f.write_str("deployment.name is missing"),
            E::Misnamed(d) => write!(f, "it is not named after its deployment {d}"),
            E::BadProof => f.write_str(
                "its proof is not valid (rewritten, moved, or not written by the Manager)",
            ),
            E::NotAString(what) => write!(f, "{what} is missing or not a string"),
            E::ElsewhereNamespace(ns) => write!(f, "deployment.namespace is not {ns}"),
            E::UnknownFormat => f.write_str("format is neither crd nor legacy"),
            E::Drift(e) => write!(f, "{e}"),
            E::ManifestsNotAList => f.write_str("manifests is missing or not a list"),
            E::TooManyManifests => write!(f, "more than {MAX_OBJECTS} manifests"),
            E::UnknownKind {
                index,
                api_version,
                kind,
            } => write!(
                f,
                "manifests[{index}]: {api_version} {kind} is not a kind a deploy writes"
            ),
            E::NoKey => f.write_str("no integrity key to check it with"),
        }
    }
}

impl std::error::Error for RecordError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RecordError::NotJson(e) => Some(e),
            RecordError::Drift(e) => Some(e),
            _ => None,
        }
    }
}

impl From<SettingsError> for RecordError {
    fn from(e: SettingsError) -> RecordError {
        RecordError::Drift(e)
    }
}
