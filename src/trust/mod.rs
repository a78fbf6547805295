//! Signed commands (docs/protocol.md, "Command trust", capability
//! `command.signature.ed25519.v1`): the command keys a cluster owner gives
//! the Manager, and the verification of a command's Ed25519 signature
//! before anything else is done with it.
//!
//! With keys, every command must be the envelope
//! `{"id", "keyId", "signed": base64url(bytes), "signature": base64url(64 bytes)}`
//! whose `signed` bytes are the command itself, with the same `id`, this
//! environment's `environmentId` and a `notAfter` not more than
//! [`NOT_AFTER_GRACE`] in the past. Without keys, commands are taken as
//! they come (a signed envelope is unwrapped, not verified).
//!
//! What this module does not do: it does not parse the command (that is
//! [`crate::commands::receive`], which calls [`unwrap`] and
//! [`check_signed`] on its one reading of each text), and it does not
//! decide what a refusal does to the ledger (`Refusal::recorded` does).
//! [`verify`] is the two in one call, on a raw text.

use std::fmt;
use std::time::{Duration, SystemTime};

use serde_json::value::RawValue;

use crate::cp::wire::CommandFields;

/// How far in the past a signed command's `notAfter` may be.
pub const NOT_AFTER_GRACE: Duration = Duration::from_secs(5 * 60);

/// How far ahead of the Manager's clock a signed command's `notAfter` may
/// be: one hour, plus skew. A signature is a single order, not a standing one.
pub const MAX_VALIDITY: Duration = Duration::from_secs(65 * 60);

/// Longest `signed` field: the base64url of a command of
/// [`crate::cp::wire::MAX_COMMAND_BYTES`].
pub const MAX_SIGNED: usize = crate::cp::wire::MAX_COMMAND_BYTES.div_ceil(3) * 4;

/// Most keys in a key file.
pub const MAX_KEYS: usize = 64;

/// Largest key file read, bytes.
pub const MAX_KEY_FILE: u64 = 64 * 1024;

/// Whether commands must be signed (docs/protocol.md, "Fail closed"): when the
/// operator says `required`, or, unless the operator says `off`, when keys
/// are configured or the state records that they were once required.
pub fn signatures_required(
    mode: crate::config::Signatures,
    keys_configured: bool,
    recorded: bool,
) -> bool {
    use crate::config::Signatures;
    match mode {
        Signatures::Required => true,
        Signatures::Off => false,
        Signatures::Auto => keys_configured || recorded,
    }
}

/// Why a command was refused before it was parsed (each its own ack message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Untrusted {
    /// Keys are configured and the command is not signed.
    Unsigned,
    /// Its `keyId` is not among the keys.
    UnknownKey(String),
    /// The envelope is malformed: `keyId`, `signed` or `signature` missing
    /// or not base64url, a signature not 64 bytes.
    Envelope(&'static str),
    /// The signature does not verify.
    BadSignature,
    /// The signed bytes are not a JSON object with an `id`.
    Inner(&'static str),
    /// The signed `id` is not the outer one.
    IdMismatch(String),
    /// The signed `environmentId` is missing or not this environment.
    Environment(Option<String>),
    /// The signed `notAfter` is missing, not RFC 3339, or too long past.
    Expired(String),
    /// The key file is present and unusable.
    KeyFile(String),
    /// Signatures are required and there are no keys to verify with.
    NoKeys,
    /// The signed `notAfter` is more than [`MAX_VALIDITY`] ahead.
    ValidityTooLong(String),
}

impl Untrusted {
    /// Whether the refusal came before any signature was verified: such
    /// a command is acknowledged `failed` and never recorded, so that
    /// unsigned or badly signed traffic cannot push a signed entry out of
    /// the ledger (refusing it again gives the same answer).
    pub fn before_verification(&self) -> bool {
        matches!(
            self,
            Untrusted::Unsigned
                | Untrusted::UnknownKey(_)
                | Untrusted::Envelope(_)
                | Untrusted::BadSignature
                | Untrusted::KeyFile(_)
                | Untrusted::NoKeys
        )
    }
}

impl fmt::Display for Untrusted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let clip = |s: &str| crate::text::clip(s, 64);
        match self {
            Untrusted::Unsigned => f.write_str("unsigned command: command keys are configured"),
            Untrusted::UnknownKey(id) => write!(f, "unknown keyId {:?}", clip(id)),
            Untrusted::Envelope(why) => write!(f, "malformed signed command: {why}"),
            Untrusted::BadSignature => f.write_str("bad signature"),
            Untrusted::Inner(why) => write!(f, "malformed signed command: {why}"),
            Untrusted::IdMismatch(inner) => {
                write!(
                    f,
                    "signed id {:?} differs from the command's id",
                    clip(inner)
                )
            }
            Untrusted::Environment(None) => f.write_str("signed command has no environmentId"),
            Untrusted::Environment(Some(other)) => {
                write!(f, "signed for environment {:?}, not this one", clip(other))
            }
            Untrusted::Expired(why) => write!(f, "expired signed command: {why}"),
            Untrusted::KeyFile(why) => write!(f, "command keys unusable, nothing accepted: {why}"),
            Untrusted::NoKeys => f.write_str(
                "no command keys: signatures are required and no key file is there to verify them",
            ),
            Untrusted::ValidityTooLong(why) => write!(f, "validity too long: {why}"),
        }
    }
}

impl std::error::Error for Untrusted {}

/// The command to parse: the raw command itself, or the verified bytes
/// of a signed one.
#[derive(Debug, PartialEq, Eq)]
pub enum Verified<'a> {
    /// As received (not signed, and signatures not required).
    Plain(&'a str),
    /// The signed bytes.
    Signed {
        /// The command's JSON text.
        text: String,
        /// Its `notAfter`.
        not_after: SystemTime,
        /// Whether its signature was verified (keys were there).
        verified: bool,
    },
}

impl Verified<'_> {
    /// The command's JSON text.
    pub fn text(&self) -> &str {
        match self {
            Verified::Plain(s) => s,
            Verified::Signed { text, .. } => text,
        }
    }

    /// How long its ledger entry must stay ([`keep_until`]).
    pub fn keep_until(&self) -> Option<SystemTime> {
        match self {
            Verified::Signed {
                not_after,
                verified,
                ..
            } => keep_until(*not_after, *verified),
            Verified::Plain(_) => None,
        }
    }
}

/// How long the ledger entry of a signed command must stay, so that the
/// signature never counts twice: until `notAfter` plus
/// [`NOT_AFTER_GRACE`], when its signature was `verified`.
pub fn keep_until(not_after: SystemTime, verified: bool) -> Option<SystemTime> {
    verified.then(|| not_after + NOT_AFTER_GRACE)
}

/// A field that must be a string; `None` when absent or anything else.
fn string_field(raw: Option<&RawValue>) -> Option<String> {
    crate::strict_json::raw_string(raw).ok().flatten()
}

/// What command trust is judged against.
#[derive(Debug, Clone, Copy)]
pub struct Trust<'a> {
    /// The keys; `None` when none are configured.
    pub keys: Option<&'a Keys>,
    /// Whether signatures are required ([`signatures_required`]).
    pub required: bool,
    /// This environment.
    pub environment_id: &'a str,
    /// The time the validity window is judged at.
    pub now: SystemTime,
}

/// What the signature check lets through: the command as it came, or the
/// bytes of a signed one (their fields not read yet).
#[derive(Debug, PartialEq, Eq)]
pub enum Unwrapped {
    /// Not signed, and signatures not required.
    Plain,
    /// Signed.
    Signed {
        /// The signed bytes, UTF-8.
        text: String,
        /// Whether its signature was verified (keys were there).
        verified: bool,
    },
}

/// Checks the signature of a command whose fields are `outer`. When
/// signatures are `required` an unsigned command is refused, and so is
/// every command without keys; when not, an unsigned command is taken as
/// it comes, and a signed one is verified when there are keys (unwrapped,
/// not verified, when there are none). The signature is checked before the
/// signed bytes are read; [`check_signed`] then reads their fields.
pub fn unwrap(outer: &CommandFields<'_>, trust: &Trust<'_>) -> Result<Unwrapped, Untrusted> {
    if trust.required && trust.keys.is_none() {
        return Err(Untrusted::NoKeys);
    }
    let Some(signed) = outer.signed else {
        return match trust.required {
            true => Err(Untrusted::Unsigned),
            false => Ok(Unwrapped::Plain),
        };
    };
    // The command inside is held to the same budget as an unsigned one:
    // nothing larger is decoded.
    if signed.get().len() > MAX_SIGNED + 2 {
        return Err(Untrusted::Envelope(
            "signed is over the 2 MiB command limit",
        ));
    }
    let signed = string_field(Some(signed)).ok_or(Untrusted::Envelope("signed is not a string"))?;
    let bytes = decode(&signed).ok_or(Untrusted::Envelope("signed is not base64url"))?;
    if let Some(keys) = trust.keys {
        let key_id = string_field(outer.key_id).ok_or(Untrusted::Envelope("keyId is missing"))?;
        let public = keys
            .get(&key_id)
            .ok_or_else(|| Untrusted::UnknownKey(key_id.clone()))?;
        let signature = string_field(outer.signature)
            .and_then(|s| decode(&s))
            .ok_or(Untrusted::Envelope("signature is missing or not base64url"))?;
        let Ok(signature) = <[u8; 64]>::try_from(signature) else {
            return Err(Untrusted::Envelope("signature is not 64 bytes"));
        };
        if !strict::signature_acceptable(&signature) {
            return Err(Untrusted::BadSignature);
        }
        ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, public)
            .verify(&bytes, &signature)
            .map_err(|_| Untrusted::BadSignature)?;
    }
    let text =
        String::from_utf8(bytes).map_err(|_| Untrusted::Inner("the signed bytes are not UTF-8"))?;
    Ok(Unwrapped::Signed {
        text,
        verified: trust.keys.is_some(),
    })
}

/// Reads the fields of signed bytes; the refusal when they are not a
/// command object.
pub fn signed_fields(text: &str) -> Result<CommandFields<'_>, Untrusted> {
    CommandFields::read(text)
        .map_err(|_| Untrusted::Inner("the signed bytes are not a JSON object"))
}

/// Checks the fields of a signed command (`inner`) against the outer id
/// `id`: the same id, this environment, a `notAfter` inside the window.
/// Returns the `notAfter`.
pub fn check_signed(
    inner: &CommandFields<'_>,
    id: &str,
    trust: &Trust<'_>,
) -> Result<SystemTime, Untrusted> {
    let string = |raw| {
        crate::strict_json::raw_string(raw)
            .map_err(|_| Untrusted::Inner("the signed bytes are not a JSON object"))
    };
    match string(inner.id)? {
        Some(inner_id) if inner_id == id => {}
        Some(inner_id) => return Err(Untrusted::IdMismatch(inner_id)),
        None => return Err(Untrusted::Inner("the signed command has no id")),
    }
    match string(inner.environment_id)? {
        Some(env) if env == trust.environment_id => {}
        other => return Err(Untrusted::Environment(other)),
    }
    check_not_after(string(inner.not_after)?.as_deref(), trust.now)
}

/// Checks a raw command whose outer id is `id`, against `keys`, for
/// environment `environment_id` at `now`: [`unwrap`], then
/// [`check_signed`], each text read once.
pub fn verify<'a>(
    raw: &'a str,
    id: &str,
    keys: Option<&Keys>,
    required: bool,
    environment_id: &str,
    now: SystemTime,
) -> Result<Verified<'a>, Untrusted> {
    let outer = CommandFields::read(raw).map_err(|_| Untrusted::Envelope("not an object"))?;
    let trust = Trust {
        keys,
        required,
        environment_id,
        now,
    };
    match unwrap(&outer, &trust)? {
        Unwrapped::Plain => Ok(Verified::Plain(raw)),
        Unwrapped::Signed { text, verified } => {
            let not_after = check_signed(&signed_fields(&text)?, id, &trust)?;
            Ok(Verified::Signed {
                text,
                not_after,
                verified,
            })
        }
    }
}

/// `notAfter` must be RFC 3339, at most [`NOT_AFTER_GRACE`] past and at
/// most [`MAX_VALIDITY`] ahead.
fn check_not_after(not_after: Option<&str>, now: SystemTime) -> Result<SystemTime, Untrusted> {
    let Some(text) = not_after else {
        return Err(Untrusted::Expired("it has no notAfter".into()));
    };
    let at = humantime::parse_rfc3339_weak(text).map_err(|_| {
        Untrusted::Expired(format!(
            "notAfter {:?} is not RFC 3339",
            crate::text::clip(text, 40)
        ))
    })?;
    if at + NOT_AFTER_GRACE < now {
        return Err(Untrusted::Expired(format!(
            "notAfter {text} is more than 5 minutes past"
        )));
    }
    if at > now + MAX_VALIDITY {
        return Err(Untrusted::ValidityTooLong(format!(
            "notAfter {text} is more than 65 minutes ahead; a signed command is valid for at most an hour"
        )));
    }
    Ok(at)
}

mod keys;
mod strict;

use keys::decode;
pub use keys::{KeyFile, Keys, KeysError, read};

#[cfg(test)]
mod tests;
