//! What a failed Control Plane call means: [`CpError`] keeps the HTTP
//! status and the CP's error code typed, and its classifiers
//! (`session_expired`, `malformed`, `already_acknowledged`, `not_found`,
//! [`CpError::retry`]) decide what the loop does next. [`SetupError`]: why
//! the client cannot be built.

use std::fmt;
use std::time::Duration;

use super::wire::MAX_BODY;
use crate::backoff::{Backoff, retry_after_delay};

/// A failed CP call.
#[derive(Debug)]
pub enum CpError {
    /// A non-2xx answer, with its decoded error body when there was one.
    Status {
        /// HTTP status.
        status: u16,
        /// `error.code`.
        code: Option<String>,
        /// `error.message`.
        message: Option<String>,
        /// `Retry-After`, when present and valid.
        retry_after: Option<Duration>,
    },
    /// Connect, TLS, read error or timeout.
    Transport(ureq::Error),
    /// The body is over [`MAX_BODY`].
    TooLarge,
    /// A 2xx body that is not what the protocol says.
    Decode(serde_json::Error),
    /// A handshake check could not establish TLS.
    Handshake(ureq::Error),
    /// The request could not be built: a value for its path or a header
    /// that is not valid there. Never sent.
    BadRequest,
}

impl CpError {
    /// The HTTP status, if the CP answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            CpError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The `error.code`, if any.
    pub fn code(&self) -> Option<&str> {
        match self {
            CpError::Status { code, .. } => code.as_deref(),
            _ => None,
        }
    }

    /// `Retry-After` of a 429 or 503.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            CpError::Status {
                status: 429 | 503,
                retry_after,
                ..
            } => *retry_after,
            _ => None,
        }
    }

    /// 401 on a session call: the session expired; connect again.
    pub fn session_expired(&self) -> bool {
        self.status() == Some(401)
    }

    /// 400 or 422: the CP refused the body as malformed; the same body is
    /// not worth sending again.
    pub fn malformed(&self) -> bool {
        matches!(self.status(), Some(400 | 422))
    }

    /// 409 `already_acknowledged`: an ack the CP has.
    pub fn already_acknowledged(&self) -> bool {
        self.status() == Some(409) && self.code() == Some("already_acknowledged")
    }

    /// 404: the CP does not know the thing named.
    pub fn not_found(&self) -> bool {
        self.status() == Some(404)
    }

    /// What to do after this failure: a malformed body waits for the next
    /// interval; a 429 or 503 waits its `Retry-After` (within the protocol's
    /// bounds, advancing `backoff`); anything else waits the backoff.
    pub fn retry(&self, backoff: &mut Backoff) -> Retry {
        if self.malformed() {
            Retry::NextInterval
        } else if matches!(self.status(), Some(429 | 503)) {
            Retry::After(retry_after_delay(self.retry_after(), backoff))
        } else {
            Retry::After(backoff.next_delay())
        }
    }
}

/// What to do after a failed CP call ([`CpError::retry`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Wait this long (a `Retry-After`, or the backoff).
    After(Duration),
    /// Not worth retrying the same body: wait the normal interval.
    NextInterval,
}

impl fmt::Display for CpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CpError::Status {
                status,
                code,
                message,
                ..
            } => {
                write!(f, "control plane answered http {status}")?;
                if let Some(code) = code {
                    write!(f, " {code}")?;
                }
                if let Some(message) = message {
                    write!(f, ": {message}")?;
                }
                Ok(())
            }
            CpError::Transport(e) => write!(f, "control plane unreachable: {e}"),
            CpError::TooLarge => write!(
                f,
                "control plane response is over the {} MiB limit",
                MAX_BODY >> 20
            ),
            CpError::Decode(e) => write!(f, "control plane response is malformed: {e}"),
            CpError::Handshake(e) => write!(f, "no tls handshake with the control plane: {e}"),
            CpError::BadRequest => write!(
                f,
                "request to the control plane not sent: a path or header value is not valid there"
            ),
        }
    }
}

impl std::error::Error for CpError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CpError::Transport(e) | CpError::Handshake(e) => Some(e),
            CpError::Decode(e) => Some(e),
            CpError::Status { .. } | CpError::TooLarge | CpError::BadRequest => None,
        }
    }
}

/// Why the Control Plane client cannot be built from the configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetupError {
    /// `NEXO_CONTROL_PLANE_CA_FILE` is not PEM, or holds no certificate.
    CaFile(&'static str),
    /// `HTTPS_PROXY` is not a proxy URL.
    Proxy,
}

impl fmt::Display for SetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetupError::CaFile(why) => write!(f, "NEXO_CONTROL_PLANE_CA_FILE {why}"),
            SetupError::Proxy => f.write_str("HTTPS_PROXY is not a valid proxy URL"),
        }
    }
}

impl std::error::Error for SetupError {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backoff::Jitter;

    #[test]
    fn retry_decisions() {
        let status = |status, retry_after| CpError::Status {
            status,
            code: None,
            message: None,
            retry_after,
        };
        let mut b = Backoff::new(
            Duration::from_secs(1),
            Duration::from_secs(300),
            Jitter::seeded(3),
        );
        assert_eq!(
            status(429, Some(Duration::from_secs(3))).retry(&mut b),
            Retry::After(Duration::from_secs(3))
        );
        assert_eq!(
            status(503, Some(Duration::from_secs(9))).retry(&mut b),
            Retry::After(Duration::from_secs(9))
        );
        assert_eq!(status(400, None).retry(&mut b), Retry::NextInterval);
        assert_eq!(
            b.failures(),
            2,
            "429 and 503 advance the backoff, even with a Retry-After; 400 does not"
        );
        assert!(
            matches!(status(500, None).retry(&mut b), Retry::After(d) if d <= Duration::from_secs(4))
        );
        assert!(
            matches!(status(429, None).retry(&mut b), Retry::After(d) if d >= Duration::from_secs(1) && d <= Duration::from_secs(8))
        );
        assert_eq!(b.failures(), 4);
    }
}
