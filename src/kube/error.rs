//! Errors of the Kubernetes boundary.
//!
//! The HTTP status and the `Status` object's `reason` stay typed, so callers
//! decide on retries (429, 409, 5xx) and on ownership refusals without parsing
//! strings.

use std::fmt;
use std::time::Duration;

/// The `Status` object the API server returns with every error, reduced to the
/// fields the Manager uses. All fields are optional on the wire.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// Machine-readable reason: `NotFound`, `AlreadyExists`, `Conflict`,
    /// `Invalid`, `Forbidden`, `Gone`, `TooManyRequests`, ...
    #[serde(default)]
    pub reason: Option<String>,
    /// Human-readable description.
    #[serde(default)]
    pub message: Option<String>,
    /// Extra details (`name`, `kind`, `causes`), kept as JSON.
    #[serde(default)]
    pub details: Option<serde_json::Value>,
}

/// A failed Kubernetes API call.
#[derive(Debug)]
pub enum Error {
    /// The API server answered with a non-success status.
    Api {
        /// HTTP status code.
        status: u16,
        /// The decoded `Status` object, or an empty one when the body was not a
        /// `Status` (a proxy's HTML page, for instance).
        body: Status,
        /// `Retry-After` of a 429 or 503, when present.
        retry_after: Option<Duration>,
    },
    /// The request never got a complete answer: connect, TLS, read or timeout.
    Transport(ureq::Error),
    /// A 2xx body that is not what was expected.
    Decode {
        /// What was being decoded.
        what: &'static str,
        /// The JSON error.
        source: serde_json::Error,
    },
    /// The client could not be configured (kubeconfig, in-cluster files).
    Config(String),
    /// A 2xx body over the client's limit (bytes): not read, not retried.
    TooLarge(u64),
    /// Not sent: the request may change the cluster and the client's fence
    /// (the leader's lease) may no longer hold.
    Fenced,
}

impl Error {
    /// The HTTP status of an API error.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The `Status.reason` of an API error.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Error::Api { body, .. } => body.reason.as_deref(),
            _ => None,
        }
    }

    /// `Retry-After` of a 429 or 503.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::Api { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// True when a write's precondition no longer held: the object
    /// appeared (409 `AlreadyExists`), or changed or was replaced since it
    /// was read (409 `Conflict` on its resourceVersion or uid). A
    /// server-side apply's conflict with another field manager (a 409
    /// `Conflict` with causes) is not one.
    pub fn is_precondition_failure(&self) -> bool {
        match self {
            Error::Api {
                status: 409, body, ..
            } => match body.reason.as_deref() {
                Some("AlreadyExists") => true,
                Some("Conflict") => !body
                    .details
                    .as_ref()
                    .and_then(|d| d["causes"].as_array())
                    .is_some_and(|c| c.iter().any(|c| c["reason"] == "FieldManagerConflict")),
                _ => false,
            },
            _ => false,
        }
    }

    /// True for a 404.
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(404)
    }

    /// True for a 409: the object changed since it was read (or exists).
    pub fn is_conflict(&self) -> bool {
        self.status() == Some(409)
    }

    /// True for a 403: RBAC does not allow it.
    pub fn is_forbidden(&self) -> bool {
        self.status() == Some(403)
    }

    /// True for a 410: a list's continue token or resourceVersion expired.
    pub fn is_gone(&self) -> bool {
        self.status() == Some(410)
    }

    /// True for a 422: the object (or the patch) is invalid.
    pub fn is_unprocessable(&self) -> bool {
        self.status() == Some(422)
    }

    /// True for an answer that refuses the request as such (401, 403,
    /// 422): sending it again would be refused again.
    pub fn is_rejected(&self) -> bool {
        matches!(self.status(), Some(401 | 403 | 422))
    }

    /// A server-side apply's conflict (409 `Conflict`) with other field
    /// managers: the API server's message (empty when it sent none).
    pub fn conflict_message(&self) -> Option<&str> {
        match self {
            Error::Api {
                status: 409, body, ..
            } if body.reason.as_deref() == Some("Conflict") => {
                Some(body.message.as_deref().unwrap_or(""))
            }
            _ => None,
        }
    }

    /// Whether a server-side apply's conflicts are all with `manager`
    /// alone (each cause `conflict with "<manager>"`, none naming a second
    /// manager): taking its own fields over changes nobody else's.
    pub fn is_apply_conflict_only_with(&self, manager: &str) -> bool {
        let Error::Api {
            status: 409, body, ..
        } = self
        else {
            return false;
        };
        if body.reason.as_deref() != Some("Conflict") {
            return false;
        }
        let own = format!("conflict with \"{manager}\"");
        let causes = body.details.as_ref().and_then(|d| d["causes"].as_array());
        causes.is_some_and(|c| {
            !c.is_empty()
                && c.iter().all(|cause| {
                    cause["message"]
                        .as_str()
                        .is_some_and(|m| m.starts_with(&own) && !m.contains("\" with "))
                })
        })
    }

    /// Whether the same request may succeed later: 429, 5xx, transport errors.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Api { status, .. } => *status == 429 || *status >= 500,
            Error::Transport(_) => true,
            _ => false,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Api { status, body, .. } => {
                write!(f, "kubernetes api: http {status}")?;
                if let Some(reason) = &body.reason {
                    write!(f, " {reason}")?;
                }
                if let Some(message) = &body.message {
                    write!(f, ": {message}")?;
                }
                Ok(())
            }
            Error::Transport(e) => write!(f, "kubernetes api unreachable: {e}"),
            Error::Decode { what, source } => write!(f, "kubernetes api: bad {what}: {source}"),
            Error::Config(why) => write!(f, "kubernetes client configuration: {why}"),
            Error::Fenced => f.write_str(
                "kubernetes api: not sent: this Manager may have lost its lease (fenced), so it writes nothing more",
            ),
            Error::TooLarge(limit) => write!(
                f,
                "kubernetes api: response body over the {} MiB limit",
                limit >> 20
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Transport(e) => Some(e),
            Error::Decode { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl From<ureq::Error> for Error {
    fn from(e: ureq::Error) -> Self {
        Error::Transport(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_keeps_status_reason_and_message() {
        let e = Error::Api {
            status: 409,
            body: Status {
                reason: Some("Conflict".into()),
                message: Some("the object has been modified".into()),
                details: None,
            },
            retry_after: None,
        };
        assert_eq!(
            e.to_string(),
            "kubernetes api: http 409 Conflict: the object has been modified"
        );
        assert_eq!(e.reason(), Some("Conflict"));
        assert!(!e.is_transient());
    }

    #[test]
    fn transient_statuses() {
        let api = |status| Error::Api {
            status,
            body: Status::default(),
            retry_after: None,
        };
        assert!(api(429).is_transient());
        assert!(api(503).is_transient());
        assert!(!api(403).is_transient());
        assert!(api(404).is_not_found());
    }

    fn conflict(reason: &str, message: Option<&str>, causes: &[&str]) -> Error {
        Error::Api {
            status: 409,
            body: Status {
                reason: Some(reason.into()),
                message: message.map(Into::into),
                details: Some(serde_json::json!({
                    "causes": causes.iter().map(|m| serde_json::json!({"message": m})).collect::<Vec<_>>()
                })),
            },
            retry_after: None,
        }
    }

    #[test]
    fn an_apply_conflict_is_ours_only_when_every_cause_names_us_alone() {
        let ours = r#"conflict with "nexo-manager" using nexo.io/v1alpha1: .spec.image"#;
        let theirs = r#"conflict with "kubectl" using v1: .data.a"#;
        let both = r#"conflict with "nexo-manager" with "kubectl": .spec.image"#;
        let only = |e: &Error| e.is_apply_conflict_only_with("nexo-manager");
        assert!(only(&conflict("Conflict", None, &[ours, ours])));
        assert!(!only(&conflict("Conflict", None, &[ours, theirs])));
        assert!(!only(&conflict("Conflict", None, &[both])));
        assert!(!only(&conflict("Conflict", None, &[])));
        assert!(!only(&conflict("AlreadyExists", None, &[ours])));
        assert_eq!(
            conflict("Conflict", Some("Apply failed"), &[theirs]).conflict_message(),
            Some("Apply failed")
        );
        assert_eq!(conflict("Conflict", None, &[]).conflict_message(), Some(""));
        assert_eq!(
            conflict("AlreadyExists", None, &[]).conflict_message(),
            None
        );
        let status = |status| Error::Api {
            status,
            body: Status::default(),
            retry_after: None,
        };
        assert!(status(422).is_unprocessable() && status(422).is_rejected());
        assert!(status(401).is_rejected() && status(403).is_rejected());
        assert!(!status(500).is_rejected() && !status(409).is_unprocessable());
    }
}
