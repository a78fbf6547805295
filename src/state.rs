//! The Manager's state, in one Secret of its own namespace: the binding and
//! the ledger of finished commands.
//!
//! The Secret holds one key, `state.json`, written with optimistic
//! concurrency: an update carries the `resourceVersion` it was read at, a
//! 409 re-reads and re-applies it a bounded number of times, and a Secret
//! deleted under the Manager is created again. A finished command costs one
//! write: the delivery flags of the acks sent since go with the next write
//! (see `agent::state_store`); a delivered entry keeps no resources.
//!
//! Budget (docs/protocol.md, "State budget"): the document stays under
//! [`STATE_BUDGET`] bytes whatever the commands were. A message is cut to
//! [`MESSAGE_MAX`] bytes and resources to [`RESOURCES_MAX`] (the rest counted
//! by action); past the budget the oldest delivered entries leave first,
//! then undelivered ones lose their resource lists.

use k8s_openapi::ByteString;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::cp::wire::{AckResource, Plan};
use crate::kube::client::{Body, Method};
use crate::kube::{self, Client};
use crate::ownership;
use crate::resource;
use crate::words::{AckResult, ResourceAction, SelfUpgradePhase};

/// The key of the state document in the Secret's `data`.
pub const KEY: &str = "state.json";

/// Entries the ledger keeps at least (the oldest delivered ones go first).
pub const LEDGER_MIN: usize = 256;

/// Update attempts on 409 Conflict.
pub const CONFLICT_RETRIES: usize = 5;

/// Largest state document, bytes of JSON: under the protocol's 900 KiB
/// (the Secret's limit is 1 MiB).
pub const STATE_BUDGET: usize = 896 * 1024;

/// Longest message kept in a ledger entry, bytes.
pub const MESSAGE_MAX: usize = 1024;

/// Most resources kept in a ledger entry; the rest are counted by action.
pub const RESOURCES_MAX: usize = 64;

/// Largest plan a ledger entry keeps, bytes of JSON: past it the last
/// objects' fields, then the objects, are only counted.
pub const PLAN_MAX: usize = 64 * 1024;

/// The binding of this Manager to its environment and cluster.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Binding {
    /// From the connect response (equal to the token's).
    pub environment_id: String,
    /// From the connect response.
    pub manager_id: String,
    /// `metadata.uid` of `kube-system` at binding time.
    pub cluster_uid: String,
}

/// One finished command.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LedgerEntry {
    /// The command id.
    pub command_id: String,
    /// The command class (`invalid` for a command refused before it was
    /// parsed); empty in entries written before it was recorded.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub class: String,
    /// Applied or failed.
    pub result: AckResult,
    /// The ack message.
    pub message: String,
    /// The ack resources.
    #[serde(default)]
    pub resources: Vec<AckResource>,
    /// When it finished, RFC 3339.
    pub completed_at: String,
    /// Whether its ack was delivered.
    pub delivered: bool,
    /// Delivery attempts made so far.
    #[serde(default)]
    pub attempts: u32,
    /// Resources past [`RESOURCES_MAX`], counted by action.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub more_resources: BTreeMap<ResourceAction, u64>,
    /// A verified signed command's entry stays until then (RFC 3339, its
    /// `notAfter` plus 5 minutes), whatever the ledger's count or budget,
    /// so that its signature never counts twice (docs/protocol.md, "Command trust").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_until: Option<String>,
    /// A plan's answer (docs/protocol.md, `command.plan.v1`), kept like
    /// the resources until its ack is delivered, within [`PLAN_MAX`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Plan>,
}

impl LedgerEntry {
    /// Whether the entry must stay at `now`.
    pub fn pinned(&self, now: std::time::SystemTime) -> bool {
        self.keep_until
            .as_deref()
            .and_then(|t| humantime::parse_rfc3339_weak(t).ok())
            .is_some_and(|until| until > now)
    }
}

/// The size of `value`'s JSON, counted without writing it anywhere.
fn json_size(value: &impl Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
    }
}

/// `s` cut to at most `max` bytes, on a character boundary, with `…` when cut.
pub fn cut(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s.push('…');
}

impl LedgerEntry {
    /// The entry within its budget: message cut to `message_max` bytes,
    /// resources to `resources_max` (the rest counted by action).
    pub fn bounded(mut self, message_max: usize, resources_max: usize) -> LedgerEntry {
        cut(&mut self.message, message_max);
        if self.resources.len() > resources_max {
            for r in self.resources.drain(resources_max..) {
                *self.more_resources.entry(r.action).or_default() += 1;
            }
        }
        if let Some(plan) = &mut self.plan {
            cut(&mut plan.message, message_max);
            let budget = if resources_max == 0 { 0 } else { PLAN_MAX };
            fit_plan(plan, budget);
        }
        self
    }

    /// Its JSON size, bytes.
    fn size(&self) -> usize {
        json_size(self)
    }
}

/// `plan` brought under `budget` bytes of JSON: the fields of its last
/// objects are counted instead of listed, then its last objects.
fn fit_plan(plan: &mut Plan, budget: usize) {
    let mut size = json_size(plan);
    for i in (0..plan.objects.len()).rev() {
        if size <= budget {
            return;
        }
        let o = &mut plan.objects[i];
        if o.fields.is_empty() {
            continue;
        }
        o.more_fields += o.fields.len();
        o.fields = Vec::new();
        size = json_size(plan);
    }
    while size > budget && plan.objects.pop().is_some() {
        plan.more_objects += 1;
        size = json_size(plan);
    }
}

/// The state document.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct State {
    /// Format version, 1.
    #[serde(default = "one")]
    pub version: u32,
    /// The binding, once connected.
    #[serde(default)]
    pub binding: Option<Binding>,
    /// Finished commands, oldest first.
    #[serde(default)]
    pub ledger: Vec<LedgerEntry>,
    /// Signatures were required once: they stay required, keys or not,
    /// until the operator sets `NEXO_COMMAND_SIGNATURES=off` (docs/protocol.md,
    /// "Fail closed").
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub signatures_required: bool,
    /// The key of the proofs the Manager's writes carry (SECURITY.md,
    /// "Integrity the namespace cannot forge"), base64; made once, by the
    /// first leader that finds none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub integrity_key: Option<crate::secret::Secret>,
    /// The last upgrade of the Manager itself (docs/protocol.md,
    /// `rollback.v1`): reported until the next one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_upgrade: Option<SelfUpgrade>,
}

/// An upgrade of the Manager itself, as the state keeps it: what it
/// changed (so that it can be written back), who applied it, where it
/// stands.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SelfUpgrade {
    pub command_id: String,
    /// The bundle before (empty: unknown).
    pub from: String,
    /// The bundle after.
    pub to: String,
    /// The manager container's image before and after.
    pub from_image: String,
    pub to_image: String,
    /// The container's `NEXO_BUNDLE_VERSION` before (absent: it had none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_bundle_env: Option<String>,
    /// `onFailure: rollback` (the upgrade's default).
    pub rollback: bool,
    /// The instance (pod uid) that applied it: the only one that may roll
    /// it back.
    pub applied_by: String,
    pub phase: Option<SelfUpgradePhase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl SelfUpgrade {
    /// `selfUpgrade` in the heartbeat.
    pub fn report(&self) -> crate::cp::wire::SelfUpgradeReport {
        crate::cp::wire::SelfUpgradeReport {
            command_id: self.command_id.clone(),
            from: self.from.clone(),
            to: self.to.clone(),
            phase: self.phase.unwrap_or(SelfUpgradePhase::Progressing),
            reason: self.reason.clone(),
        }
    }
}

fn one() -> u32 {
    1
}

/// A failure to read or write the state.
#[derive(Debug)]
pub enum StateError {
    /// The API call failed.
    Kube(kube::Error),
    /// The Secret exists but its `state.json` is unreadable.
    Corrupt(String),
    /// The Secret exists and is not this Manager's (no `managed-by`
    /// label, or another environment's owner id).
    NotOurs(String),
    /// Still conflicting after [`CONFLICT_RETRIES`] attempts.
    Conflict,
    /// The Secret is a Manager's state of another environment than the
    /// connect token's: a Manager never switches environments.
    OtherEnvironment {
        /// Its `nexo.io/owner-id` (or its binding's environment).
        bound: String,
        /// The connect token's.
        token: String,
    },
}

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateError::Kube(e) => write!(f, "state secret: {e}"),
            StateError::Corrupt(why) => write!(f, "state secret is corrupt: {why}"),
            StateError::NotOurs(name) => write!(
                f,
                "secret {name} exists but is not this Manager's (it needs the labels app.kubernetes.io/managed-by=nexo-manager and nexo.io/owner-id of this environment); refusing to use it as state"
            ),
            StateError::OtherEnvironment { bound, token } => write!(
                f,
                "the state secret is bound to environment {bound}, not the connect token's {token}"
            ),
            StateError::Conflict => write!(
                f,
                "state secret kept changing under us ({CONFLICT_RETRIES} conflicts in a row)"
            ),
        }
    }
}

impl std::error::Error for StateError {}

impl From<kube::Error> for StateError {
    fn from(e: kube::Error) -> Self {
        StateError::Kube(e)
    }
}

impl State {
    /// Records a finished command (cut to its budget), trimming the
    /// ledger: beyond [`LEDGER_MIN`] entries, or past [`STATE_BUDGET`]
    /// bytes, the oldest delivered ones are dropped.
    pub fn record(&mut self, entry: LedgerEntry) {
        self.record_within(entry, STATE_BUDGET, std::time::SystemTime::now())
    }

    /// [`State::record`] with another byte budget, at `now`. Entries
    /// pinned at `now` ([`LedgerEntry::pinned`]) never leave.
    pub fn record_within(&mut self, entry: LedgerEntry, budget: usize, now: std::time::SystemTime) {
        self.ledger.retain(|e| e.command_id != entry.command_id);
        self.ledger.push(entry.bounded(MESSAGE_MAX, RESOURCES_MAX));
        let mut excess = self.ledger.len().saturating_sub(LEDGER_MIN);
        self.ledger.retain(|e| {
            if excess > 0 && e.delivered && !e.pinned(now) {
                excess -= 1;
                false
            } else {
                true
            }
        });
        self.fit_at(budget, now);
    }

    /// [`State::fit_at`] now.
    pub fn fit(&mut self, budget: usize) {
        self.fit_at(budget, std::time::SystemTime::now())
    }

    /// Brings the document under `budget` bytes: the oldest delivered
    /// entries leave first (not those pinned at `now`); then the oldest
    /// entries kept keep only their counts and a short message (an ack is
    /// never dropped: it waits in `pendingAcks`); the newest entry is
    /// never touched.
    pub fn fit_at(&mut self, budget: usize, now: std::time::SystemTime) {
        if json_size(self) <= budget {
            return;
        }
        let fixed = json_size(&State {
            version: self.version,
            binding: self.binding.clone(),
            ledger: Vec::new(),
            signatures_required: self.signatures_required,
            integrity_key: self.integrity_key.clone(),
            self_upgrade: self.self_upgrade.clone(),
        });
        let sizes: Vec<usize> = self.ledger.iter().map(|e| e.size() + 1).collect();
        let mut total = fixed + sizes.iter().sum::<usize>();
        let last = self.ledger.len().saturating_sub(1);
        let mut keep = vec![true; self.ledger.len()];
        for (i, e) in self.ledger.iter().enumerate().take(last) {
            if total <= budget {
                break;
            }
            if e.delivered && !e.pinned(now) {
                keep[i] = false;
                total -= sizes[i];
            }
        }
        for (i, e) in self.ledger.iter_mut().enumerate().take(last) {
            if total <= budget {
                break;
            }
            if keep[i] {
                *e = std::mem::take(e).bounded(128, 0);
                total = total - sizes[i] + e.size() + 1;
            }
        }
        let mut keep = keep.into_iter();
        self.ledger.retain(|_| keep.next().unwrap_or(true));
    }

    /// Marks the acks of these commands delivered. A delivered entry keeps
    /// its id, class, result and message, not its resources (docs/protocol.md,
    /// "State"): sent again, it is acknowledged with that result and message.
    pub fn mark_delivered(&mut self, ids: &[String]) {
        for e in self
            .ledger
            .iter_mut()
            .filter(|e| ids.contains(&e.command_id))
        {
            e.delivered = true;
            e.resources = Vec::new();
            e.more_resources.clear();
            e.plan = None;
        }
    }

    /// Records how many delivery attempts a command's ack has had.
    pub fn set_attempts(&mut self, id: &str, attempts: u32) {
        if let Some(e) = self.ledger.iter_mut().find(|e| e.command_id == id) {
            e.attempts = attempts;
        }
    }
    /// The entry of a command id.
    pub fn find(&self, command_id: &str) -> Option<&LedgerEntry> {
        self.ledger.iter().find(|e| e.command_id == command_id)
    }
}

/// The state Secret as read: labels, version and data only (k8s-openapi's
/// `Secret` decodes every `ObjectMeta` field, with a date-time library).
#[derive(Deserialize)]
struct StoredSecret {
    metadata: StoredMeta,
    data: Option<BTreeMap<String, ByteString>>,
}
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredMeta {
    labels: Option<BTreeMap<String, String>>,
    resource_version: Option<String>,
}

/// The state Secret of one Manager.
#[derive(Debug)]
pub struct StateSecret {
    path: String,
    collection: String,
    name: String,
    environment_id: String,
    resource_version: Option<String>,
}

/// The state Secret as written.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SecretBody<'a> {
    api_version: &'static str,
    kind: &'static str,
    metadata: SecretMeta<'a>,
    #[serde(rename = "type")]
    type_: &'static str,
    data: BTreeMap<&'static str, &'a ByteString>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SecretMeta<'a> {
    name: &'a str,
    labels: BTreeMap<&'static str, &'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    resource_version: Option<&'a str>,
}

/// The part of a written Secret the store keeps: its new version (the
/// answer's `data` is skipped, not decoded).
#[derive(Deserialize)]
struct Written {
    metadata: WrittenMeta,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WrittenMeta {
    resource_version: Option<String>,
}

impl StateSecret {
    /// The Secret `name` in `namespace`, of environment `environment_id`.
    pub fn new(namespace: &str, name: &str, environment_id: &str) -> StateSecret {
        let collection = resource::SECRETS.collection(Some(namespace));
        StateSecret {
            path: format!("{collection}/{name}"),
            collection,
            name: name.to_owned(),
            environment_id: environment_id.to_owned(),
            resource_version: None,
        }
    }

    /// Reads the state; an absent Secret is the empty state.
    pub fn load(&mut self, client: &Client) -> Result<State, StateError> {
        let secret = match client.get_opt::<StoredSecret>(&self.path) {
            Ok(Some(secret)) => secret,
            Ok(None) => {
                self.resource_version = None;
                return Ok(State {
                    version: 1,
                    ..State::default()
                });
            }
            Err(kube::Error::Decode { source, .. }) => {
                return Err(StateError::Corrupt(source.to_string()));
            }
            Err(e) => return Err(e.into()),
        };
        let labels = secret.metadata.labels.as_ref();
        let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
        // 0.3 wrote no owner id; it is added by the next write.
        if label(ownership::MANAGED_BY) != Some(ownership::MANAGER) {
            return Err(StateError::NotOurs(self.name.clone()));
        }
        if let Some(owner) = label(ownership::OWNER_ID)
            && owner != self.environment_id
        {
            return Err(StateError::OtherEnvironment {
                bound: owner.to_owned(),
                token: self.environment_id.clone(),
            });
        }
        self.resource_version = secret.metadata.resource_version;
        let Some(doc) = secret.data.as_ref().and_then(|d| d.get(KEY)) else {
            return Ok(State {
                version: 1,
                ..State::default()
            });
        };
        serde_json::from_slice(&doc.0).map_err(|e| StateError::Corrupt(format!("{KEY}: {e}")))
    }

    /// Applies `change` to the stored state and writes it, re-reading and
    /// re-applying on 409 Conflict. Returns the state as written.
    pub fn update(
        &mut self,
        client: &Client,
        current: &State,
        change: impl Fn(&mut State),
    ) -> Result<State, StateError> {
        let mut state = current.clone();
        change(&mut state);
        for _ in 0..CONFLICT_RETRIES {
            match self.write(client, &state) {
                Ok(()) => return Ok(state),
                Err(e) if e.is_conflict() => {
                    crate::info!(err:% = e; "state secret changed concurrently; re-reading");
                    state = self.load(client)?;
                    change(&mut state);
                }
                Err(e) if e.is_not_found() && self.resource_version.is_some() => {
                    crate::warn!(
                        secret = self.name.as_str();
                        "state secret deleted; creating it again from the state in memory"
                    );
                    self.resource_version = None;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(StateError::Conflict)
    }

    fn write(&mut self, client: &Client, state: &State) -> Result<(), kube::Error> {
        let doc = kube::client::to_json("state document", state)?;
        // A body of our own rather than k8s-openapi's `Secret`, whose
        // serializer brings the timestamp formatting of every `ObjectMeta`
        // field into the binary (about 40 KB) for fields never set here.
        let data = ByteString(doc);
        let secret = SecretBody {
            api_version: "v1",
            kind: "Secret",
            metadata: SecretMeta {
                name: &self.name,
                labels: [
                    (ownership::MANAGED_BY, ownership::MANAGER),
                    (ownership::OWNER_ID, self.environment_id.as_str()),
                    (ownership::ROLE, ownership::STATE_ROLE),
                ]
                .into(),
                resource_version: self.resource_version.as_deref(),
            },
            type_: "Opaque",
            data: [(KEY, &data)].into(),
        };
        let body = kube::client::to_json("state secret", &secret)?;
        drop(data);
        let (method, path) = match &self.resource_version {
            None => (Method::POST, self.collection.as_str()),
            Some(_) => (Method::PUT, self.path.as_str()),
        };
        let written = client.request_as::<Written>(
            method,
            path,
            Some(Body {
                content_type: "application/json",
                bytes: &body,
            }),
        )?;
        self.resource_version = written.and_then(|w| w.metadata.resource_version);
        crate::metrics::state_written();
        Ok(())
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
