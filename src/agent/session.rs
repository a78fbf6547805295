//! The session with the Control Plane: connect with the connect token, get
//! a session token and the binding, connect again when it expires.
//!
//! What an answer to connect means is decided by [`decide`], a pure
//! function of the answer, what this Manager expects and its backoff:
//! [`Step::Ready`], [`Step::RetryIn`] or [`Step::Fatal`]. The I/O around it
//! (`Agent::connect`) sends the request, records the binding and re-reads
//! the connect token after a 401.

use std::time::{Duration, SystemTime};

use super::Agent;
use super::shared::round_ms;
use crate::backoff::Backoff;
use crate::cp::wire::{self, ConnectRequest, ConnectResponse, ManagerInfo};
use crate::cp::{CpError, Retry};
use crate::fatal::Fatal;
use crate::secret::Secret;
use crate::state::Binding;
use crate::token::TokenSource;

/// A session is renewed this long before the CP says it expires.
pub const SESSION_MARGIN: Duration = Duration::from_secs(30);

/// The current session with the CP.
#[derive(Debug)]
pub struct Session {
    /// The bearer of heartbeats and acks.
    pub token: Secret,
    /// The CP's id of this Manager.
    pub manager_id: String,
    expires_at: Option<SystemTime>,
}

impl Session {
    /// Whether it should be renewed before the next heartbeat.
    pub fn stale(&self) -> bool {
        self.expires_at
            .is_some_and(|at| SystemTime::now() + SESSION_MARGIN >= at)
    }
}

/// What this Manager expects of a connect answer.
#[derive(Debug, Clone, Copy)]
pub struct Expected<'a> {
    /// The connect token's environment.
    pub environment_id: &'a str,
    /// `metadata.uid` of `kube-system`.
    pub cluster_uid: &'a str,
}

/// A session and the binding it comes with.
#[derive(Debug)]
pub struct Ready {
    /// The session.
    pub session: Session,
    /// The binding to record.
    pub binding: Binding,
    /// The CP's `heartbeatIntervalSeconds`, if any.
    pub interval_seconds: Option<u64>,
}

/// Why a connect is tried again.
#[derive(Debug)]
pub enum RetryCause {
    /// The answer's `sessionToken` is not a `b64token` of at most 4096
    /// characters (its length).
    UnusableSessionToken(usize),
    /// 401: the connect token is unknown, expired or revoked; it is read
    /// again from its file before the next try.
    TokenRefused(CpError),
    /// Unreachable, 5xx, 429 and the like.
    Failed(CpError),
}

/// What a connect answer means.
#[derive(Debug)]
pub enum Step {
    /// Connected.
    Ready(Ready),
    /// Try again after `delay`.
    RetryIn {
        /// The wait.
        delay: Duration,
        /// Why.
        cause: RetryCause,
    },
    /// Stop: the binding is refused, or the CP and this Manager disagree
    /// on the protocol.
    Fatal(Fatal),
}

/// Decides what a connect `answer` means. Advances `backoff` on every
/// retry; `interval` is the wait of a failure not worth retrying sooner.
pub fn decide(
    answer: Result<ConnectResponse, CpError>,
    expected: Expected<'_>,
    backoff: &mut Backoff,
    interval: Duration,
) -> Step {
    let resp = match answer {
        Ok(resp) => resp,
        Err(e) => return refused(e, expected, backoff, interval),
    };
    // Never put an unusable token in a header (a CR or LF there would
    // abort the request builder): a failed connect, retried with backoff.
    if !wire::valid_session_token(&resp.session_token) {
        return Step::RetryIn {
            delay: backoff.next_delay(),
            cause: RetryCause::UnusableSessionToken(resp.session_token.len()),
        };
    }
    if resp.environment_id != expected.environment_id {
        return Step::Fatal(Fatal::EnvironmentMismatch {
            answered: resp.environment_id,
            token: expected.environment_id.to_owned(),
        });
    }
    let expires_at = resp.session_expires_at.as_deref().and_then(|t| {
        humantime::parse_rfc3339(t)
            .inspect_err(|_| crate::warn!(value:? = t; "ignoring an unparsable sessionExpiresAt"))
            .ok()
    });
    backoff.reset();
    Step::Ready(Ready {
        binding: Binding {
            environment_id: resp.environment_id,
            manager_id: resp.manager_id.clone(),
            cluster_uid: expected.cluster_uid.to_owned(),
        },
        session: Session {
            token: Secret::new(resp.session_token),
            manager_id: resp.manager_id,
            expires_at,
        },
        interval_seconds: resp.heartbeat_interval_seconds,
    })
}

/// A connect the CP answered with an error (or did not answer).
fn refused(e: CpError, expected: Expected<'_>, backoff: &mut Backoff, interval: Duration) -> Step {
    match (e.status(), e.code()) {
        (Some(403), Some("environment_bound_elsewhere")) => Step::Fatal(Fatal::BoundElsewhere {
            environment: expected.environment_id.to_owned(),
            cluster: expected.cluster_uid.to_owned(),
            source: e,
        }),
        (Some(403), Some("protocol_unsupported")) => Step::Fatal(Fatal::ProtocolUnsupported(e)),
        (Some(400 | 422), _) => Step::Fatal(Fatal::ConnectMalformed(e)),
        (Some(401), _) => Step::RetryIn {
            delay: backoff.next_delay(),
            cause: RetryCause::TokenRefused(e),
        },
        _ => Step::RetryIn {
            delay: match e.retry(backoff) {
                Retry::After(d) => d,
                Retry::NextInterval => interval,
            },
            cause: RetryCause::Failed(e),
        },
    }
}

/// What a CP call's answer did to the session ([`Agent::renew_if_expired`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Renewal {
    /// Not a 401, or the call renewed the session once already: the
    /// answer stands.
    NotExpired,
    /// The session expired and a new one is open: send again.
    Renewed,
    /// The session expired and connecting again did not open one yet:
    /// wait this long.
    NotConnected(Duration),
}

/// How a connect ended, when not fatally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Connected {
    /// A session is open.
    Ready,
    /// Not yet: wait this long.
    RetryIn(Duration),
}

impl Agent {
    /// When the CP answered `what` with a 401 (the session expired) and
    /// the caller has not renewed the session for it yet (`renewed`),
    /// connects again: the one place a 401 renews the session. The caller
    /// sends again on [`Renewal::Renewed`].
    pub(super) fn renew_if_expired<T>(
        &mut self,
        answer: &Result<T, CpError>,
        renewed: &mut bool,
        what: impl std::fmt::Display,
    ) -> Result<Renewal, Fatal> {
        match answer {
            Err(e) if e.session_expired() && !*renewed => {
                *renewed = true;
                crate::info!(resending:% = what; "session expired; connecting again");
                self.session = None;
                Ok(match self.connect()? {
                    Connected::Ready => Renewal::Renewed,
                    Connected::RetryIn(delay) => Renewal::NotConnected(delay),
                })
            }
            _ => Ok(Renewal::NotExpired),
        }
    }

    /// Connects, records the binding when it changed, and opens a session.
    pub(super) fn connect(&mut self) -> Result<Connected, Fatal> {
        let body = ConnectRequest {
            protocol_version: wire::PROTOCOL_VERSION,
            manager: ManagerInfo {
                version: crate::VERSION.into(),
                build: crate::BUILD.into(),
                capabilities: self.me.capabilities.iter().map(|c| c.to_string()).collect(),
            },
            instance: self.me.instance.clone(),
            cluster: self.me.cluster.clone(),
        };
        let answer = self.link.cp.connect(self.me.token.secret(), &body);
        let expected = Expected {
            environment_id: self.me.token.environment_id(),
            cluster_uid: &self.me.cluster.uid,
        };
        match decide(answer, expected, &mut self.pace.backoff, self.pace.interval) {
            Step::Fatal(fatal) => Err(fatal),
            Step::RetryIn { delay, cause } => {
                self.connect_failed(&cause, delay)?;
                Ok(Connected::RetryIn(delay))
            }
            Step::Ready(ready) => {
                self.store.bind(&self.link.kube, ready.binding)?;
                crate::info!(
                    environment = self.me.token.environment_id(),
                    managerId = ready.session.manager_id.as_str();
                    "connected"
                );
                self.link.status().bound = true;
                let note = format!(
                    "bound to the Control Plane: environment {}, manager {}",
                    self.me.token.environment_id(),
                    ready.session.manager_id
                );
                self.own_event(crate::events::Reason::Bound, "Connect", note);
                self.session = Some(ready.session);
                if let Some(secs) = ready.interval_seconds {
                    self.set_interval(secs);
                }
                Ok(Connected::Ready)
            }
        }
    }

    fn connect_failed(&mut self, cause: &RetryCause, delay: Duration) -> Result<(), Fatal> {
        let retry = humantime::format_duration(round_ms(delay));
        match cause {
            RetryCause::UnusableSessionToken(len) => crate::error!(
                bytes = len, retryIn:% = retry;
                "the Control Plane answered connect with an unusable sessionToken (not an RFC 6750 b64token of at most 4096 characters)"
            ),
            RetryCause::TokenRefused(e) => {
                crate::error!(
                    environment = self.me.token.environment_id(), err:% = e;
                    "connect refused: the connect token is unknown, expired or revoked; re-reading it"
                );
                return self.reread_token();
            }
            RetryCause::Failed(e) => crate::warn!(err:% = e, retryIn:% = retry; "connect failed"),
        }
        Ok(())
    }

    /// A rotated token is picked up from its file without a restart; a
    /// token of another environment is never sent: fatal (exit 2).
    fn reread_token(&mut self) -> Result<(), Fatal> {
        let cfg = &self.me.cfg;
        if let TokenSource::File(_) = &cfg.token_source {
            match crate::token::read(&cfg.token_source, cfg.environment_id.as_deref()) {
                Ok(t) => {
                    let bound = self.me.token.environment_id();
                    if t.environment_id() != bound {
                        return Err(Fatal::EnvironmentSwitch {
                            bound: bound.to_owned(),
                            token: t.environment_id().to_owned(),
                        });
                    }
                    self.me.token = t;
                }
                Err(e) => crate::error!(err:% = e; "keeping the previous connect token"),
            }
        }
        Ok(())
    }

    /// The CP's id of this Manager in the open session (empty without one).
    pub(super) fn manager_id(&self) -> &str {
        self.session
            .as_ref()
            .map(|s| s.manager_id.as_str())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backoff::Jitter;

    const ME: Expected<'static> = Expected {
        environment_id: "env-a",
        cluster_uid: "uid-1",
    };

    fn backoff() -> Backoff {
        Backoff::new(
            Duration::from_secs(1),
            Duration::from_secs(300),
            Jitter::seeded(7),
        )
    }

    fn answer(env: &str, token: &str) -> Result<ConnectResponse, CpError> {
        Ok(serde_json::from_value(serde_json::json!({
            "managerId": "m-1",
            "environmentId": env,
            "sessionToken": token,
            "sessionExpiresAt": "2030-01-01T00:00:00Z",
            "heartbeatIntervalSeconds": 20,
        }))
        .unwrap())
    }

    fn status(status: u16, code: Option<&str>) -> Result<ConnectResponse, CpError> {
        Err(CpError::Status {
            status,
            code: code.map(str::to_owned),
            message: None,
            retry_after: None,
        })
    }

    fn decided(a: Result<ConnectResponse, CpError>, b: &mut Backoff) -> Step {
        decide(a, ME, b, Duration::from_secs(15))
    }

    #[test]
    fn a_good_answer_is_a_session_and_a_binding() {
        let mut b = backoff();
        b.next_delay();
        let Step::Ready(ready) = decided(answer("env-a", "s3ss10n"), &mut b) else {
            panic!("expected Ready");
        };
        assert_eq!(ready.binding.cluster_uid, "uid-1");
        assert_eq!(ready.binding.manager_id, "m-1");
        assert_eq!(ready.session.token.expose(), "s3ss10n");
        assert!(!ready.session.stale());
        assert_eq!(ready.interval_seconds, Some(20));
        assert_eq!(b.failures(), 0, "a session resets the backoff");
    }

    #[test]
    fn bindings_refused_are_fatal_with_exit_3() {
        let mut b = backoff();
        for (a, kind) in [
            (answer("env-b", "s"), "EnvironmentMismatch"),
            (
                status(403, Some("environment_bound_elsewhere")),
                "BoundElsewhere",
            ),
            (
                status(403, Some("protocol_unsupported")),
                "ProtocolUnsupported",
            ),
        ] {
            match decided(a, &mut b) {
                Step::Fatal(f) => {
                    assert_eq!(f.exit_code(), 3, "{f}");
                    assert!(format!("{f:?}").starts_with(kind), "{f:?}");
                }
                other => panic!("{kind}: expected Fatal, got {other:?}"),
            }
        }
        match decided(status(422, None), &mut b) {
            Step::Fatal(f @ Fatal::ConnectMalformed(_)) => assert_eq!(f.exit_code(), 1),
            other => panic!("expected ConnectMalformed, got {other:?}"),
        }
    }

    #[test]
    fn failures_worth_retrying_back_off() {
        let mut b = backoff();
        let cases = [
            (answer("env-a", "bad token\n"), "UnusableSessionToken"),
            (status(401, None), "TokenRefused"),
            (status(503, None), "Failed"),
            // One misrouted answer must not stop a fleet.
            (status(403, None), "Failed"),
            (status(403, Some("forbidden")), "Failed"),
            (Err(CpError::TooLarge), "Failed"),
        ];
        for (n, (a, kind)) in cases.into_iter().enumerate() {
            match decided(a, &mut b) {
                Step::RetryIn { delay, cause } => {
                    assert!(format!("{cause:?}").starts_with(kind), "{cause:?}");
                    assert!(delay <= Duration::from_secs(300), "{delay:?}");
                }
                other => panic!("{kind}: expected RetryIn, got {other:?}"),
            }
            assert_eq!(
                b.failures(),
                n as u32 + 1,
                "each retry advances the backoff"
            );
        }
        let Step::RetryIn { delay, .. } = decided(
            status(429, None).map_err(|_| CpError::Status {
                status: 429,
                code: None,
                message: None,
                retry_after: Some(Duration::from_secs(42)),
            }),
            &mut b,
        ) else {
            panic!("expected RetryIn");
        };
        assert_eq!(delay, Duration::from_secs(42), "Retry-After is honoured");
    }
}
