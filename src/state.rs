//! The Manager's state, in one Secret of its own namespace: the binding and
//! the ledger of finished commands.
//!
//! The Secret holds one key, `state.json`. It is written with optimistic
//! concurrency: every update carries the `resourceVersion` it was read at,
//! and a 409 re-reads and re-applies the change a bounded number of times.

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use crate::cp::wire::AckResource;
use crate::kube::{self, Client};
use crate::ownership;

/// The key of the state document in the Secret's `data`.
pub const KEY: &str = "state.json";

/// Entries the ledger keeps at least (the oldest delivered ones go first).
pub const LEDGER_MIN: usize = 256;

/// Update attempts on 409 Conflict.
pub const CONFLICT_RETRIES: usize = 5;

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
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LedgerEntry {
    /// The command id.
    pub command_id: String,
    /// `applied` or `failed`.
    pub result: String,
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
    /// The Secret exists and is not the Manager's (no ownership label).
    NotOurs(String),
    /// Still conflicting after [`CONFLICT_RETRIES`] attempts.
    Conflict,
}

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateError::Kube(e) => write!(f, "state secret: {e}"),
            StateError::Corrupt(why) => write!(f, "state secret is corrupt: {why}"),
            StateError::NotOurs(name) => write!(
                f,
                "secret {name} exists but is not managed by nexo-manager; refusing to use it as state"
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
    /// Records a finished command, trimming the ledger: beyond
    /// [`LEDGER_MIN`] entries the oldest delivered ones are dropped; an
    /// undelivered ack is never dropped.
    pub fn record(&mut self, entry: LedgerEntry) {
        self.ledger.retain(|e| e.command_id != entry.command_id);
        self.ledger.push(entry);
        let mut excess = self.ledger.len().saturating_sub(LEDGER_MIN);
        self.ledger.retain(|e| {
            if excess > 0 && e.delivered {
                excess -= 1;
                false
            } else {
                true
            }
        });
    }

    /// Marks the acks of these commands delivered.
    pub fn mark_delivered(&mut self, ids: &[String]) {
        for e in self
            .ledger
            .iter_mut()
            .filter(|e| ids.contains(&e.command_id))
        {
            e.delivered = true;
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

/// The state Secret of one Manager.
#[derive(Debug)]
pub struct Store {
    path: String,
    collection: String,
    name: String,
    resource_version: Option<String>,
}

impl Store {
    /// The Secret `name` in `namespace`.
    pub fn new(namespace: &str, name: &str) -> Store {
        let collection = format!("/api/v1/namespaces/{namespace}/secrets");
        Store {
            path: format!("{collection}/{name}"),
            collection,
            name: name.to_owned(),
            resource_version: None,
        }
    }

    /// Reads the state; an absent Secret is the empty state.
    pub fn load(&mut self, client: &Client) -> Result<State, StateError> {
        let secret = match client.get_opt::<Secret>(&self.path) {
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
        if labels
            .and_then(|l| l.get(ownership::MANAGED_BY))
            .map(String::as_str)
            != Some(ownership::MANAGER)
        {
            return Err(StateError::NotOurs(self.name.clone()));
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
                Err(e) if e.status() == Some(409) => {
                    log::info!("state secret changed concurrently ({}); re-reading", e);
                    state = self.load(client)?;
                    change(&mut state);
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(StateError::Conflict)
    }

    fn write(&mut self, client: &Client, state: &State) -> Result<(), kube::Error> {
        let doc = serde_json::to_vec(state).expect("state always serializes");
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some(
                    [(
                        ownership::MANAGED_BY.to_owned(),
                        ownership::MANAGER.to_owned(),
                    )]
                    .into(),
                ),
                resource_version: self.resource_version.clone(),
                ..ObjectMeta::default()
            },
            type_: Some("Opaque".into()),
            data: Some([(KEY.to_owned(), ByteString(doc))].into()),
            ..Secret::default()
        };
        let mut body = serde_json::to_value(&secret).expect("a Secret always serializes");
        body["apiVersion"] = "v1".into();
        body["kind"] = "Secret".into();
        let written = match &self.resource_version {
            None => client.create(&self.collection, &body)?,
            Some(_) => client.replace(&self.path, &body)?,
        };
        self.resource_version = written["metadata"]["resourceVersion"]
            .as_str()
            .map(str::to_owned);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: usize, delivered: bool) -> LedgerEntry {
        LedgerEntry {
            command_id: format!("cmd-{id}"),
            result: "applied".into(),
            message: String::new(),
            resources: vec![],
            completed_at: "2026-12-02T00:00:00Z".into(),
            delivered,
            attempts: 1,
        }
    }

    #[test]
    fn ledger_keeps_the_last_256_and_every_undelivered_ack() {
        let mut s = State::default();
        s.record(entry(0, false));
        for i in 1..400 {
            s.record(entry(i, true));
        }
        assert_eq!(s.ledger.len(), LEDGER_MIN);
        assert!(
            s.find("cmd-0").is_some(),
            "an undelivered ack is never dropped"
        );
        assert!(s.find("cmd-399").is_some());
        assert!(s.find("cmd-1").is_none());
        // Re-recording an id replaces it.
        s.record(entry(0, true));
        assert!(s.find("cmd-0").unwrap().delivered);
        assert_eq!(
            s.ledger.iter().filter(|e| e.command_id == "cmd-0").count(),
            1
        );
    }

    #[test]
    fn state_document_format() {
        let s = State {
            version: 1,
            binding: Some(Binding {
                environment_id: "env-a".into(),
                manager_id: "m".into(),
                cluster_uid: "u".into(),
            }),
            ledger: vec![entry(1, false)],
        };
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["binding"]["clusterUid"], "u");
        assert_eq!(v["ledger"][0]["commandId"], "cmd-1");
        assert_eq!(serde_json::from_value::<State>(v).unwrap(), s);
        assert_eq!(serde_json::from_str::<State>("{}").unwrap().version, 1);
    }
}
