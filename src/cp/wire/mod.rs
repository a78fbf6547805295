//! The Control Plane's wire types (protocol version 2), as serde structs.
//!
//! Unknown response fields are ignored; missing required fields fail to
//! decode. Optional request fields are omitted when absent, never sent as null.

use serde::Deserialize;

/// Largest response body accepted from the CP.
pub const MAX_BODY: u64 = 8 * 1024 * 1024;

/// The protocol version this Manager speaks.
pub const PROTOCOL_VERSION: u32 = 2;

mod ack;
mod answer;
mod connect;
mod heartbeat;

pub use crate::words::{AckResult, Phase, ResourceAction};
pub use ack::*;
pub use answer::*;
pub use connect::*;
pub use heartbeat::*;

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
#[path = "tests.rs"]
mod tests;
