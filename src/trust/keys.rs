//! The command keys: the key file a cluster owner gives the Manager
//! (strict Ed25519 public keys), read with a size bound and re-read when
//! it changes.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};

use super::strict;
use super::{MAX_KEY_FILE, MAX_KEYS, Untrusted};

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

    pub(super) fn get(&self, id: &str) -> Option<&[u8; 32]> {
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
    // Only a regular file, never waited for (`crate::files`).
    let text = match crate::files::read_to_string(path, MAX_KEY_FILE) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => {
            return Err(KeysError::Size("it is over 64 KiB"));
        }
        Err(e) => return Err(read_error(e)),
    };
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
    /// leaves no keys here; whether commands may then be unsigned is the
    /// ratchet's decision (`signatures_required`: once required, they stay
    /// required, so every command is then refused with `no command keys`).
    pub fn refresh(&mut self) {
        let stamp = self.current_stamp();
        if stamp == self.stamp {
            return;
        }
        self.stamp = stamp;
        match read(&self.path) {
            Ok(keys) => {
                match (&self.keys, &keys) {
                    (Some(_), None) => crate::warn!(
                        file:% = self.path.display();
                        "command keys gone; signatures stay required (NEXO_COMMAND_SIGNATURES=off turns them off), so every command is refused until keys are back"
                    ),
                    (_, Some(k)) => crate::info!(
                        count = k.ids().len(), keys = k.ids().join(",").as_str();
                        "command keys read"
                    ),
                    (None, None) => {}
                }
                self.keys = keys;
                self.broken = None;
            }
            Err(e) => {
                crate::error!(
                    file:% = self.path.display(), err:% = e,
                    then = if self.keys.is_some() {
                    "keeping the previous keys"
                    } else {
                    "refusing every command until it can"
                    };
                    "command keys cannot be used"
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

/// base64url, padded or not (standard alphabet accepted too).
pub(super) fn decode(s: &str) -> Option<Vec<u8>> {
    let trimmed = s.trim_end_matches('=');
    URL_SAFE_NO_PAD
        .decode(trimmed)
        .or_else(|_| STANDARD_NO_PAD.decode(trimmed))
        .ok()
}
