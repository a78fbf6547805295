//! Signed commands (protocol.md, "Command trust", capability
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
//! [`crate::commands::parse`], on the verified bytes), and it does not
//! decide what a refusal does to the ledger (the batch does).

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use serde::Deserialize;
use serde_json::value::RawValue;

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

/// One command-verification key.
#[derive(Clone, PartialEq, Eq)]
struct Key {
    id: String,
    public: [u8; 32],
}

/// The command keys: none means commands are accepted unsigned.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Keys {
    keys: Vec<Key>,
}

impl fmt::Debug for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|k| k.id.as_str()).collect();
        f.debug_struct("Keys").field("ids", &ids).finish()
    }
}

/// A key file that cannot be used.
#[derive(Debug)]
pub enum KeysError {
    /// It exists but cannot be read.
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A line is not `<keyId> <base64 of 32 bytes>`.
    Line {
        /// Its number, from 1.
        line: usize,
        /// What is wrong.
        problem: &'static str,
    },
    /// It holds no key, or more than [`MAX_KEYS`], or is over [`MAX_KEY_FILE`].
    Size(&'static str),
}

impl fmt::Display for KeysError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeysError::Read { path, source } => {
                write!(f, "cannot read {}: {source}", path.display())
            }
            KeysError::Line { line, problem } => write!(f, "line {line}: {problem}"),
            KeysError::Size(problem) => f.write_str(problem),
        }
    }
}

impl std::error::Error for KeysError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            KeysError::Read { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl Keys {
    /// Parses a key file: one `<keyId> <base64 of a raw 32-byte Ed25519
    /// public key>` a line; blank lines and `#` comments are skipped.
    pub fn parse(text: &str) -> Result<Keys, KeysError> {
        let mut keys: Vec<Key> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |problem| KeysError::Line {
                line: n + 1,
                problem,
            };
            let mut parts = line.split_whitespace();
            let (Some(id), Some(key), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(bad("not `<keyId> <base64 public key>`"));
            };
            if !crate::cp::wire::valid_command_id(id) {
                return Err(bad("the key id is not [A-Za-z0-9][A-Za-z0-9._-]{0,127}"));
            }
            let bytes = decode(key).ok_or_else(|| bad("the key is not base64"))?;
            let public: [u8; 32] = bytes
                .try_into()
                .map_err(|_| bad("the key is not 32 bytes (a raw Ed25519 public key)"))?;
            if !strict::canonical_point(&public) || strict::small_order(&public) {
                return Err(bad(
                    "the key is not a usable Ed25519 public key (non-canonical or small-order point)",
                ));
            }
            if keys.iter().any(|k| k.id == id) {
                return Err(bad("the key id appears twice"));
            }
            keys.push(Key {
                id: id.to_owned(),
                public,
            });
        }
        if keys.is_empty() {
            return Err(KeysError::Size("it holds no key"));
        }
        if keys.len() > MAX_KEYS {
            return Err(KeysError::Size("it holds more than 64 keys"));
        }
        Ok(Keys { keys })
    }

    /// The key ids, for logs.
    pub fn ids(&self) -> Vec<&str> {
        self.keys.iter().map(|k| k.id.as_str()).collect()
    }

    fn get(&self, id: &str) -> Option<&[u8; 32]> {
        self.keys.iter().find(|k| k.id == id).map(|k| &k.public)
    }
}

/// Reads a key file: `Ok(None)` when it does not exist (commands are then
/// accepted unsigned).
pub fn read(path: &Path) -> Result<Option<Keys>, KeysError> {
    let read_error = |source| KeysError::Read {
        path: path.to_owned(),
        source,
    };
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(read_error(e)),
    };
    if meta.len() > MAX_KEY_FILE {
        return Err(KeysError::Size("it is over 64 KiB"));
    }
    let text = std::fs::read_to_string(path).map_err(read_error)?;
    Keys::parse(&text).map(Some)
}

/// The key file as last read. It is read again (when it changed) before
/// each batch of commands, so that keys are rotated by rewriting it.
#[derive(Debug)]
pub struct KeyFile {
    path: PathBuf,
    /// Size and modification time when read: a rewrite changes one.
    stamp: Option<(u64, Option<SystemTime>)>,
    keys: Option<Keys>,
    /// Why the file, present, cannot be used: every command is refused
    /// until it can (never a silent fall back to unsigned commands).
    broken: Option<String>,
}

impl KeyFile {
    /// Reads the file at start: a present file that cannot be used is a
    /// configuration error.
    pub fn open(path: &Path) -> Result<KeyFile, KeysError> {
        let mut file = KeyFile {
            path: path.to_owned(),
            stamp: None,
            keys: None,
            broken: None,
        };
        file.stamp = file.current_stamp();
        file.keys = read(path)?;
        Ok(file)
    }

    fn current_stamp(&self) -> Option<(u64, Option<SystemTime>)> {
        std::fs::metadata(&self.path)
            .ok()
            .map(|m| (m.len(), m.modified().ok()))
    }

    /// Reads the file again if it changed. Keys that cannot be read
    /// replace nothing: the last good keys stay, or, if there were none,
    /// every command is refused until the file is fixed. A removed file
    /// means unsigned commands again, as configured.
    pub fn refresh(&mut self) {
        let stamp = self.current_stamp();
        if stamp == self.stamp {
            return;
        }
        self.stamp = stamp;
        match read(&self.path) {
            Ok(keys) => {
                match (&self.keys, &keys) {
                    (Some(_), None) => log::warn!(
                        "command keys: {} is gone; signatures stay required (NEXO_COMMAND_SIGNATURES=off turns them off), so every command is refused until keys are back",
                        self.path.display()
                    ),
                    (_, Some(k)) => log::info!(
                        "command keys: {} key(s): {}",
                        k.ids().len(),
                        k.ids().join(", ")
                    ),
                    (None, None) => {}
                }
                self.keys = keys;
                self.broken = None;
            }
            Err(e) => {
                log::error!(
                    "command keys: {} cannot be used: {e}; {}",
                    self.path.display(),
                    if self.keys.is_some() {
                        "keeping the previous keys"
                    } else {
                        "refusing every command until it can"
                    }
                );
                if self.keys.is_none() {
                    self.broken = Some(e.to_string());
                }
            }
        }
    }

    /// The keys to verify with (`None`: no key file), or why no command
    /// can be accepted.
    pub fn keys(&self) -> Result<Option<&Keys>, Untrusted> {
        match &self.broken {
            Some(why) => Err(Untrusted::KeyFile(why.clone())),
            None => Ok(self.keys.as_ref()),
        }
    }

    /// Whether a key file is there, usable or not: keys are configured.
    pub fn configured(&self) -> bool {
        self.keys.is_some() || self.broken.is_some()
    }
}

/// Whether commands must be signed (protocol.md, "Fail closed"): when the
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

/// The envelope's fields, raw.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SignedEnvelope<'a> {
    #[serde(default, borrow)]
    key_id: Option<&'a RawValue>,
    #[serde(default, borrow)]
    signed: Option<&'a RawValue>,
    #[serde(default, borrow)]
    signature: Option<&'a RawValue>,
}

/// The fields of the signed command checked here.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Inner {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    environment_id: Option<String>,
    #[serde(default)]
    not_after: Option<String>,
}

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

    /// How long its ledger entry must stay, so that the signature never
    /// counts twice: until `notAfter` plus [`NOT_AFTER_GRACE`], for a
    /// verified signature.
    pub fn keep_until(&self) -> Option<SystemTime> {
        match self {
            Verified::Signed {
                not_after,
                verified: true,
                ..
            } => Some(*not_after + NOT_AFTER_GRACE),
            _ => None,
        }
    }
}

/// A field that must be a string; `None` when absent or anything else.
fn string_field(raw: Option<&RawValue>) -> Option<String> {
    crate::strict_json::raw_string(raw).ok().flatten()
}

/// Checks a raw command whose outer id is `id`, against `keys`, for
/// environment `environment_id` at `now`. When signatures are `required`
/// an unsigned command is refused, and so is every command without keys;
/// when not, an unsigned command is taken as it comes, and a signed one is
/// verified when there are keys (unwrapped, not verified, when there are
/// none). The signature is checked before the signed bytes are read.
pub fn verify<'a>(
    raw: &'a str,
    id: &str,
    keys: Option<&Keys>,
    required: bool,
    environment_id: &str,
    now: SystemTime,
) -> Result<Verified<'a>, Untrusted> {
    let envelope: SignedEnvelope =
        serde_json::from_str(raw).map_err(|_| Untrusted::Envelope("not an object"))?;
    if required && keys.is_none() {
        return Err(Untrusted::NoKeys);
    }
    let Some(signed) = envelope.signed else {
        return match required {
            true => Err(Untrusted::Unsigned),
            false => Ok(Verified::Plain(raw)),
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
    if let Some(keys) = keys {
        let key_id =
            string_field(envelope.key_id).ok_or(Untrusted::Envelope("keyId is missing"))?;
        let public = keys
            .get(&key_id)
            .ok_or_else(|| Untrusted::UnknownKey(key_id.clone()))?;
        let signature = string_field(envelope.signature)
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
    let inner: Inner = serde_json::from_str(&text)
        .map_err(|_| Untrusted::Inner("the signed bytes are not a JSON object"))?;
    match inner.id {
        Some(inner_id) if inner_id == id => {}
        Some(inner_id) => return Err(Untrusted::IdMismatch(inner_id)),
        None => return Err(Untrusted::Inner("the signed command has no id")),
    }
    match inner.environment_id {
        Some(env) if env == environment_id => {}
        other => return Err(Untrusted::Environment(other)),
    }
    let not_after = check_not_after(inner.not_after.as_deref(), now)?;
    Ok(Verified::Signed {
        text,
        not_after,
        verified: keys.is_some(),
    })
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

/// Strict Ed25519 (the checks ring's verification leaves out): no
/// small-order or non-canonical public key or `R`, and a canonical `S`
/// (below the group order), so that one signature has one meaning.
mod strict {
    /// The field prime 2^255 - 19, little-endian.
    const P: [u8; 32] = {
        let mut p = [0xff; 32];
        p[0] = 0xed;
        p[31] = 0x7f;
        p
    };

    /// The group order L = 2^252 + 27742317777372353535851937790883648493,
    /// little-endian.
    const L: [u8; 32] = [
        0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9, 0xde,
        0x14, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
    ];

    /// The y coordinates of the points of small order (1, 2, 4, 8), and
    /// their non-canonical spellings y + p, compared without the sign bit.
    const SMALL_ORDER: [[u8; 32]; 7] = {
        let zero = [0u8; 32];
        let mut one = [0u8; 32];
        one[0] = 1;
        let order8_a = [
            0x26, 0xe8, 0x95, 0x8f, 0xc2, 0xb2, 0x27, 0xb0, 0x45, 0xc3, 0xf4, 0x89, 0xf2, 0xef,
            0x98, 0xf0, 0xd5, 0xdf, 0xac, 0x05, 0xd3, 0xc6, 0x33, 0x39, 0xb1, 0x38, 0x02, 0x88,
            0x6d, 0x53, 0xfc, 0x05,
        ];
        let order8_b = [
            0xc7, 0x17, 0x6a, 0x70, 0x3d, 0x4d, 0xd8, 0x4f, 0xba, 0x3c, 0x0b, 0x76, 0x0d, 0x10,
            0x67, 0x0f, 0x2a, 0x20, 0x53, 0xfa, 0x2c, 0x39, 0xcc, 0xc6, 0x4e, 0xc7, 0xfd, 0x77,
            0x92, 0xac, 0x03, 0x7a,
        ];
        let mut p_minus_1 = P;
        p_minus_1[0] = 0xec;
        let p = P;
        let mut p_plus_1 = P;
        p_plus_1[0] = 0xee;
        [zero, one, order8_a, order8_b, p_minus_1, p, p_plus_1]
    };

    /// Little-endian `a < b`.
    fn less(a: &[u8; 32], b: &[u8; 32]) -> bool {
        for i in (0..32).rev() {
            if a[i] != b[i] {
                return a[i] < b[i];
            }
        }
        false
    }

    /// Whether the encoding's y (the sign bit cleared) is below p.
    pub(super) fn canonical_point(encoded: &[u8; 32]) -> bool {
        let mut y = *encoded;
        y[31] &= 0x7f;
        less(&y, &P)
    }

    /// Whether the encoded point has a small order (1, 2, 4 or 8).
    pub(super) fn small_order(encoded: &[u8; 32]) -> bool {
        let mut y = *encoded;
        y[31] &= 0x7f;
        SMALL_ORDER.contains(&y)
    }

    /// `R` canonical and not of small order, `S` below L.
    pub(super) fn signature_acceptable(signature: &[u8; 64]) -> bool {
        let (r, s) = signature.split_at(32);
        let r: [u8; 32] = r.try_into().unwrap_or([0; 32]);
        let s: [u8; 32] = s.try_into().unwrap_or(L);
        canonical_point(&r) && !small_order(&r) && less(&s, &L)
    }

    #[cfg(test)]
    pub(super) const GROUP_ORDER: [u8; 32] = L;
}

/// base64url, padded or not (standard alphabet accepted too).
fn decode(s: &str) -> Option<Vec<u8>> {
    let trimmed = s.trim_end_matches('=');
    URL_SAFE_NO_PAD
        .decode(trimmed)
        .or_else(|_| STANDARD_NO_PAD.decode(trimmed))
        .ok()
}

#[cfg(test)]
#[path = "trust_tests.rs"]
mod tests;
