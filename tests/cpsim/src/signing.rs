//! Signed commands (docs/protocol.md, "Command trust"): a key pair generated
//! for the run (never a committed secret), the key line the Manager's
//! `NEXO_COMMAND_KEYS_FILE` takes, and the signed envelope. Tests build the
//! bad cases from the same parts.

use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::rand::SystemRandom;
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde_json::{Value, json};

/// How far ahead a stamped command's `notAfter` is.
pub const VALIDITY: Duration = Duration::from_secs(5 * 60);

/// An Ed25519 key pair and its key id.
pub struct Signer {
    key_id: String,
    pair: Ed25519KeyPair,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("key_id", &self.key_id)
            .finish()
    }
}

impl Signer {
    /// A new key pair from the system's randomness.
    pub fn generate(key_id: &str) -> Signer {
        let pkcs8 =
            Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).expect("generate a key pair");
        Signer {
            key_id: key_id.to_owned(),
            pair: Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("read the key pair back"),
        }
    }

    /// Its key id.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// `<keyId> <base64 public key>`: one line of a key file.
    pub fn key_line(&self) -> String {
        format!(
            "{} {}",
            self.key_id,
            STANDARD.encode(self.pair.public_key().as_ref())
        )
    }

    /// The signature of `bytes`.
    pub fn signature(&self, bytes: &[u8]) -> Vec<u8> {
        self.pair.sign(bytes).as_ref().to_vec()
    }

    /// `command` stamped for `env` (when it has no `environmentId` or
    /// `notAfter` yet) and signed.
    pub fn sign(&self, env: &str, command: &Value) -> Value {
        let mut command = command.clone();
        stamp(&mut command, env, SystemTime::now() + VALIDITY);
        let bytes = serde_json::to_vec(&command).expect("serialize a command");
        let id = command["id"].clone();
        envelope(id, &self.key_id, &bytes, &self.signature(&bytes))
    }
}

/// Adds `environmentId` and `notAfter` where the command has none.
pub fn stamp(command: &mut Value, env: &str, not_after: SystemTime) {
    if let Some(o) = command.as_object_mut() {
        o.entry("environmentId").or_insert_with(|| json!(env));
        o.entry("notAfter")
            .or_insert_with(|| json!(humantime::format_rfc3339_seconds(not_after).to_string()));
    }
}

/// The envelope the protocol carries: `signed` and `signature` base64url.
pub fn envelope(id: Value, key_id: &str, signed: &[u8], signature: &[u8]) -> Value {
    json!({"id": id, "keyId": key_id, "signed": URL_SAFE_NO_PAD.encode(signed),
           "signature": URL_SAFE_NO_PAD.encode(signature)})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_envelope_carries_the_stamped_command() {
        let s = Signer::generate("k1");
        let e = s.sign("env-a", &json!({"id": "cmd-1", "class": "uninstall"}));
        assert_eq!(e["id"], "cmd-1");
        assert_eq!(e["keyId"], "k1");
        let bytes = URL_SAFE_NO_PAD
            .decode(e["signed"].as_str().unwrap())
            .unwrap();
        let inner: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(inner["environmentId"], "env-a");
        assert!(inner["notAfter"].is_string());
        let sig = URL_SAFE_NO_PAD
            .decode(e["signature"].as_str().unwrap())
            .unwrap();
        let public = STANDARD
            .decode(s.key_line().split(' ').nth(1).unwrap())
            .unwrap();
        ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, public)
            .verify(&bytes, &sig)
            .unwrap();
    }
}
