//! Proofs the namespace cannot forge (SECURITY.md, "Integrity the
//! namespace cannot forge"): HMAC-SHA256 under a key only the Manager
//! holds (the state document's `integrityKey`), over what a record or an
//! object claims. Labels say who claims an object; a proof says that the
//! Manager wrote it. Pure, but for the key's random bytes.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ring::hmac;

/// The annotation that carries a proof.
pub const ANNOTATION: &str = "nexo.io/proof";
/// The annotation of a drift record's history proof.
pub const HISTORY_ANNOTATION: &str = "nexo.io/history-proof";

/// The proof format's prefix.
const VERSION: &str = "v1:";

/// The key's length in bytes.
const KEY_BYTES: usize = 32;

/// The integrity key. Its `Debug` never shows it.
#[derive(Clone)]
pub struct Key(hmac::Key, [u8; 8]);

impl PartialEq for Key {
    /// The same key: the same tag of a fixed message (the key itself is
    /// never compared).
    fn eq(&self, other: &Key) -> bool {
        self.1 == other.1
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("integrity::Key(<redacted>)")
    }
}

/// Why a key could not be made or read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// The system's random source failed.
    Random,
    /// The stored key is not base64 of 32 bytes.
    Malformed,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::Random => f.write_str("the system's random source failed"),
            KeyError::Malformed => {
                write!(f, "the integrity key is not base64 of {KEY_BYTES} bytes")
            }
        }
    }
}

impl std::error::Error for KeyError {}

/// What a proof vouches for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordClaim<'a> {
    /// The environment.
    pub environment_id: &'a str,
    /// The record's namespace.
    pub namespace: &'a str,
    /// The deployment it is the record of.
    pub deployment: &'a str,
    /// The uid of the NexoProxy or Deployment that owns it.
    pub owner_uid: &'a str,
    /// The exact bytes of its payload.
    pub payload: &'a [u8],
}

/// What an object's proof vouches for: that the Manager wrote this one
/// object (by uid) for this environment's deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectClaim<'a> {
    /// The environment.
    pub environment_id: &'a str,
    /// The deployment it was written for.
    pub deployment: &'a str,
    /// Its kind (`ConfigMap`, `NexoProxy`, ...).
    pub kind: &'a str,
    /// Its namespace.
    pub namespace: &'a str,
    /// Its name.
    pub name: &'a str,
    /// Its uid, as the API server gave it.
    pub uid: &'a str,
}

impl Key {
    /// A new key from the system's random source, and its stored form.
    pub fn generate() -> Result<(Key, String), KeyError> {
        use ring::rand::SecureRandom as _;
        let mut bytes = [0u8; KEY_BYTES];
        ring::rand::SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| KeyError::Random)?;
        let stored = STANDARD.encode(bytes);
        Ok((Key::from_bytes(&bytes), stored))
    }

    /// The key from its stored form (base64 of 32 bytes).
    pub fn from_stored(stored: &str) -> Result<Key, KeyError> {
        let bytes = STANDARD.decode(stored).map_err(|_| KeyError::Malformed)?;
        if bytes.len() != KEY_BYTES {
            return Err(KeyError::Malformed);
        }
        Ok(Key::from_bytes(&bytes))
    }

    fn from_bytes(bytes: &[u8]) -> Key {
        let key = hmac::Key::new(hmac::HMAC_SHA256, bytes);
        let mut id = [0u8; 8];
        id.copy_from_slice(&hmac::sign(&key, b"nexo.io/key-id").as_ref()[..8]);
        Key(key, id)
    }

    /// The proof of a drift record's history (docs/protocol.md,
    /// `rollback.v1`): `history`'s exact bytes, bound to the record's claim
    /// (its payload's bytes among it), so that it cannot be moved to
    /// another record nor kept beside another payload.
    pub fn history_proof(&self, claim: &RecordClaim<'_>, history: &[u8]) -> String {
        self.sign(&history_message(claim, history))
    }

    /// Whether `proof` is this key's proof of `history` beside `claim`.
    pub fn verify_history(&self, claim: &RecordClaim<'_>, history: &[u8], proof: &str) -> bool {
        self.verify(&history_message(claim, history), proof)
    }

    /// The proof of a drift record.
    pub fn record_proof(&self, claim: &RecordClaim<'_>) -> String {
        self.sign(&record_message(claim))
    }

    /// Whether `proof` is this key's proof of `claim` (compared in
    /// constant time).
    pub fn verify_record(&self, claim: &RecordClaim<'_>, proof: &str) -> bool {
        self.verify(&record_message(claim), proof)
    }

    /// The proof of an object the Manager wrote.
    pub fn object_proof(&self, claim: &ObjectClaim<'_>) -> String {
        self.sign(&object_message(claim))
    }

    /// Whether `proof` is this key's proof of `claim` (compared in
    /// constant time).
    pub fn verify_object(&self, claim: &ObjectClaim<'_>, proof: &str) -> bool {
        self.verify(&object_message(claim), proof)
    }

    fn sign(&self, message: &[u8]) -> String {
        let tag = hmac::sign(&self.0, message);
        let mut out = String::with_capacity(VERSION.len() + 64);
        out.push_str(VERSION);
        for b in tag.as_ref() {
            out.push_str(&format!("{b:02x}"));
        }
        out
    }

    fn verify(&self, message: &[u8], proof: &str) -> bool {
        let Some(tag) = proof.strip_prefix(VERSION).and_then(from_hex) else {
            return false;
        };
        hmac::verify(&self.0, message, &tag).is_ok()
    }
}

/// The message of a record's proof.
fn record_message(c: &RecordClaim<'_>) -> Vec<u8> {
    message(&[
        b"nexo.io/record",
        c.environment_id.as_bytes(),
        c.namespace.as_bytes(),
        c.deployment.as_bytes(),
        c.owner_uid.as_bytes(),
        c.payload,
    ])
}

/// The message of a record history's proof.
fn history_message(c: &RecordClaim<'_>, history: &[u8]) -> Vec<u8> {
    message(&[
        b"nexo.io/record-history",
        c.environment_id.as_bytes(),
        c.namespace.as_bytes(),
        c.deployment.as_bytes(),
        c.owner_uid.as_bytes(),
        c.payload,
        history,
    ])
}

/// The message of an object's proof.
fn object_message(c: &ObjectClaim<'_>) -> Vec<u8> {
    message(&[
        b"nexo.io/object",
        c.environment_id.as_bytes(),
        c.deployment.as_bytes(),
        c.kind.as_bytes(),
        c.namespace.as_bytes(),
        c.name.as_bytes(),
        c.uid.as_bytes(),
    ])
}

/// A domain tag, then each field prefixed by its length, so that no two
/// claims (of one kind or of two) share a message.
fn message(fields: &[&[u8]]) -> Vec<u8> {
    let mut m = Vec::with_capacity(fields.iter().map(|f| f.len() + 8).sum());
    for f in fields {
        m.extend_from_slice(&(f.len() as u64).to_be_bytes());
        m.extend_from_slice(f);
    }
    m
}

/// 32 bytes from 64 hex digits.
fn from_hex(s: &str) -> Option<Vec<u8>> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim<'a>(payload: &'a [u8]) -> RecordClaim<'a> {
        RecordClaim {
            environment_id: "env-a",
            namespace: "shop",
            deployment: "orders",
            owner_uid: "uid-1",
            payload,
        }
    }

    #[test]
    fn a_proof_holds_only_for_its_claim_and_its_key() {
        let (key, stored) = Key::generate().unwrap();
        let proof = key.record_proof(&claim(b"{}"));
        assert!(proof.starts_with("v1:") && proof.len() == 67, "{proof}");
        assert!(key.verify_record(&claim(b"{}"), &proof));
        // The same key read back from its stored form.
        assert!(
            Key::from_stored(&stored)
                .unwrap()
                .verify_record(&claim(b"{}"), &proof)
        );
        // Any field changed: no proof.
        let changed = [
            RecordClaim {
                environment_id: "env-b",
                ..claim(b"{}")
            },
            RecordClaim {
                namespace: "other",
                ..claim(b"{}")
            },
            RecordClaim {
                deployment: "billing",
                ..claim(b"{}")
            },
            RecordClaim {
                owner_uid: "uid-2",
                ..claim(b"{}")
            },
            claim(b"{ }"),
        ];
        for c in changed {
            assert!(!key.verify_record(&c, &proof), "{c:?}");
        }
        // Fields cannot trade bytes across their boundary.
        let shifted = RecordClaim {
            namespace: "sho",
            deployment: "porders",
            ..claim(b"{}")
        };
        assert!(!key.verify_record(&shifted, &proof));
        // Another key, a mangled proof.
        let (other, _) = Key::generate().unwrap();
        assert!(!other.verify_record(&claim(b"{}"), &proof));
        for bad in [
            "",
            "v1:",
            "v2:00",
            &proof[..66],
            &proof.replace("v1:", "v0:"),
            "v1:zz",
        ] {
            assert!(!key.verify_record(&claim(b"{}"), bad), "{bad}");
        }
    }

    #[test]
    fn an_object_proof_holds_for_that_one_object() {
        let (key, _) = Key::generate().unwrap();
        let claim = ObjectClaim {
            environment_id: "env-a",
            deployment: "orders",
            kind: "ConfigMap",
            namespace: "shop",
            name: "orders-config",
            uid: "uid-1",
        };
        let proof = key.object_proof(&claim);
        assert!(key.verify_object(&claim, &proof));
        for c in [
            ObjectClaim {
                uid: "uid-2",
                ..claim
            },
            ObjectClaim {
                environment_id: "env-b",
                ..claim
            },
            ObjectClaim {
                deployment: "billing",
                ..claim
            },
            ObjectClaim {
                kind: "Secret",
                ..claim
            },
            ObjectClaim {
                namespace: "other",
                ..claim
            },
            ObjectClaim {
                name: "orders-config2",
                ..claim
            },
        ] {
            assert!(!key.verify_object(&c, &proof), "{c:?}");
        }
        // A record's proof is never an object's, and the other way round.
        let record = RecordClaim {
            environment_id: "env-a",
            namespace: "shop",
            deployment: "orders",
            owner_uid: "uid-1",
            payload: b"",
        };
        assert!(!key.verify_record(&record, &proof));
        assert!(!key.verify_object(&claim, &key.record_proof(&record)));
    }

    #[test]
    fn a_stored_key_is_32_bytes_of_base64_and_never_shown() {
        assert_eq!(Key::from_stored("AAAA").unwrap_err(), KeyError::Malformed);
        assert_eq!(
            Key::from_stored("not base64!").unwrap_err(),
            KeyError::Malformed
        );
        let (key, stored) = Key::generate().unwrap();
        assert!(!format!("{key:?}").contains(&stored));
        assert_ne!(Key::generate().unwrap().1, stored, "random");
    }
}
