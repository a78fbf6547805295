//! The Control Plane HTTPS client: connect, heartbeat, ack.
//!
//! One ureq agent, so the TLS connection is reused across heartbeats. Every
//! call has a connect and a whole-request timeout (10 s and 30 s unless
//! configured); bodies over 8 MiB are refused without being buffered whole.
//! The extra trust anchors (`NEXO_CONTROL_PLANE_CA_FILE`) are re-read after
//! a call fails to connect, as the connect token is after a 401: a CA
//! bundle rotated in its ConfigMap is taken without a restart.

use std::cell::RefCell;
use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde::de::DeserializeOwned;
use ureq::SendBody;
use ureq::http::Request;
use ureq::tls::{RootCerts, TlsConfig};
use ureq::unversioned::transport::{
    ConnectProxyConnector, ConnectionDetails, Connector, DefaultConnector, RustlsConnector,
    Transport,
};

use super::body::HeartbeatBody;
use super::wire::{
    Ack, ConnectRequest, ConnectResponse, ErrorEnvelope, HeartbeatRequest, HeartbeatResponse,
};
use crate::backoff::{Backoff, retry_after_delay};
use crate::secret::Secret;

/// Largest response body accepted from the CP.
pub const MAX_BODY: u64 = 8 * 1024 * 1024;

/// The path of the URL a handshake check is made for. No request is ever
/// written to it: the check ends once TLS is established.
const HANDSHAKE_PATH: &str = "/.nexo-manager-handshake-check";

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

/// The last link of a handshake check's connector chain: once the default
/// chain (proxy, TCP, TLS) has produced an established transport for the
/// check's URL, it notes the success and ends the call, so no request is
/// written and no token is sent. Connections for any other URL (the proxy's
/// own, for example) pass through.
#[derive(Debug, Default)]
struct HandshakeGate {
    established: Arc<AtomicBool>,
}

impl Connector<Box<dyn Transport>> for HandshakeGate {
    type Out = Box<dyn Transport>;

    fn connect(
        &self,
        details: &ConnectionDetails,
        chained: Option<Box<dyn Transport>>,
    ) -> Result<Option<Self::Out>, ureq::Error> {
        if details.uri.path() != HANDSHAKE_PATH {
            return Ok(chained);
        }
        match chained {
            Some(transport) if transport.is_tls() || !details.needs_tls() => {
                self.established.store(true, Ordering::Relaxed);
                Err(ureq::Error::Io(std::io::Error::other(
                    "handshake check: connection established, no request sent",
                )))
            }
            other => Ok(other),
        }
    }
}

/// How an ack delivery ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckOutcome {
    /// 200 or 204.
    Delivered,
    /// 409 `already_acknowledged`: delivered before.
    AlreadyAcknowledged,
    /// 404: the CP forgot the command; counts as delivered.
    Forgotten,
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

/// The largest CA bundle read: a ConfigMap holds at most 1 MiB.
pub const MAX_CA_BUNDLE: u64 = crate::files::MOUNTED_MAX;

/// A file's bytes, refused when over `max` (1 MiB) or not a regular file
/// (a FIFO would block: `crate::files`).
pub fn read_bounded(path: &std::path::Path, max: u64) -> Result<Vec<u8>, &'static str> {
    crate::files::read(path, max).map_err(|e| match e.kind() {
        std::io::ErrorKind::FileTooLarge => "is over 1 MiB",
        std::io::ErrorKind::InvalidInput => "is not a regular file",
        _ => "cannot be read",
    })
}

impl Tls {
    fn new(
        extra: Vec<ureq::tls::Certificate<'static>>,
        proxy: Option<ureq::Proxy>,
        timeouts: (Duration, Duration),
    ) -> Tls {
        let mut roots = crate::tls::public_roots();
        roots.extend(extra);
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(timeouts.0))
            .timeout_global(Some(timeouts.1))
            .max_redirects(0)
            .proxy(proxy)
            .user_agent(crate::USER_AGENT)
            .tls_config(
                TlsConfig::builder()
                    .root_certs(RootCerts::Specific(Arc::new(roots)))
                    .build(),
            )
            .build();
        // Proxy, then TCP whose reads wait in the loop (net.rs), then TLS.
        let chain =
            ().chain(ConnectProxyConnector::default())
                .chain(crate::net::PollTcpConnector::CONTROL_PLANE)
                .chain(RustlsConnector::default());
        let agent = crate::resolve::agent_with(config.clone(), chain);
        Tls { agent, config }
    }
}

/// The Control Plane client.
pub struct CpClient {
    /// The agent and its configuration, rebuilt when the CA bundle changes.
    tls: RefCell<Tls>,
    /// Where the extra trust anchors come from, re-read after a failed
    /// connection; `None`: the public roots only.
    ca: Option<RefCell<CaBundle>>,
    proxy: Option<ureq::Proxy>,
    base: String,
    /// The connect timeout and the whole-request timeout; a held heartbeat
    /// has its hold on top of the second.
    timeouts: (Duration, Duration),
}

/// The agent of every call, and its configuration for the handshake
/// check's own agent.
struct Tls {
    agent: ureq::Agent,
    config: ureq::config::Config,
}

/// `NEXO_CONTROL_PLANE_CA_FILE`: its path and the bytes the agent trusts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaBundle {
    pub path: PathBuf,
    pub pem: Vec<u8>,
}

/// What a re-read of the CA bundle found ([`CpClient::reread_ca`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaReread {
    /// No file is configured, or its bytes are those already trusted.
    Unchanged,
    /// New certificates, now trusted: this many.
    Changed(usize),
    /// The file cannot be read or holds no certificate: the last good
    /// bundle stays trusted.
    Kept(&'static str),
}

impl fmt::Debug for CpClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpClient")
            .field("base", &self.base)
            .finish()
    }
}

impl CpClient {
    /// A client for `base` trusting the public roots plus the certificates
    /// of `ca`, through `https_proxy` when given, with the given timeouts.
    pub fn new(
        base: &str,
        ca: Option<CaBundle>,
        https_proxy: Option<&str>,
        timeouts: (Duration, Duration),
    ) -> Result<CpClient, SetupError> {
        let proxy = match https_proxy {
            Some(p) => Some(ureq::Proxy::new(p).map_err(|_| SetupError::Proxy)?),
            None => None,
        };
        let extra = match &ca {
            Some(ca) if ca.pem.len() as u64 > MAX_CA_BUNDLE => {
                return Err(SetupError::CaFile("is over 1 MiB"));
            }
            Some(ca) => crate::tls::certs_from_pem(&ca.pem).map_err(SetupError::CaFile)?,
            None => Vec::new(),
        };
        let tls = Tls::new(extra, proxy.clone(), timeouts);
        Ok(CpClient {
            tls: RefCell::new(tls),
            ca: ca.map(RefCell::new),
            proxy,
            base: base.to_owned(),
            timeouts,
        })
    }

    /// Reads the CA bundle's file again; when it holds other certificates
    /// than those trusted, the client trusts them from the next call on
    /// (pooled connections are dropped with the old agent). A file that
    /// cannot be read or parsed keeps the last good bundle. Called after
    /// every call that failed to connect (a CP certificate from a new CA
    /// fails the handshake until the bundle has it), and logged there.
    pub fn reread_ca(&self) -> CaReread {
        let Some(ca) = &self.ca else {
            return CaReread::Unchanged;
        };
        let mut ca = ca.borrow_mut();
        let pem = match read_bounded(&ca.path, MAX_CA_BUNDLE) {
            Ok(pem) => pem,
            Err(why) => return CaReread::Kept(why),
        };
        if pem == ca.pem {
            return CaReread::Unchanged;
        }
        let extra = match crate::tls::certs_from_pem(&pem) {
            Ok(certs) => certs,
            Err(why) => return CaReread::Kept(why),
        };
        let n = extra.len();
        *self.tls.borrow_mut() = Tls::new(extra, self.proxy.clone(), self.timeouts);
        ca.pem = pem;
        CaReread::Changed(n)
    }

    /// After a call that could not connect: the CA bundle re-read, and
    /// what came of it logged.
    fn after_failed_connection(&self) {
        match self.reread_ca() {
            CaReread::Unchanged => {}
            CaReread::Changed(n) => log::info!(
                "NEXO_CONTROL_PLANE_CA_FILE changed: now trusting its {n} certificate(s) besides the public roots"
            ),
            CaReread::Kept(why) => {
                log::warn!("NEXO_CONTROL_PLANE_CA_FILE {why}: the last bundle read stays trusted")
            }
        }
    }

    /// `POST /api/v2/manager/connect` with the connect token.
    pub fn connect(
        &self,
        token: &Secret,
        body: &ConnectRequest,
    ) -> Result<ConnectResponse, CpError> {
        let bytes = self.post("/api/v2/manager/connect", token, body)?;
        decode(&bytes)
    }

    /// Checks that a TLS connection to the CP can be established, through
    /// the proxy when one is configured, with the same trust and timeouts as
    /// every call: a standby's readiness. No request is written and no token
    /// is sent. A fresh agent each time, so neither a pooled connection
    /// answers for the check nor does the check leave one behind.
    pub fn handshake(&self) -> Result<(), CpError> {
        let gate = HandshakeGate::default();
        let established = Arc::clone(&gate.established);
        let config = self.tls.borrow().config.clone();
        let agent = crate::resolve::agent_with(config, DefaultConnector::new().chain(gate));
        let result = agent.head(format!("{}{HANDSHAKE_PATH}", self.base)).call();
        if established.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.after_failed_connection();
        match result {
            Err(e) => Err(CpError::Handshake(e)),
            Ok(_) => Err(CpError::Handshake(ureq::Error::ConnectionFailed)),
        }
    }

    /// `POST /api/v2/manager/heartbeat` with the session token. With
    /// `waitSeconds` (`heartbeat.wait.v1`) the CP may hold it that long:
    /// its timeout is then the hold plus the request timeout. Either way a
    /// stop request ends it (its commands, never acknowledged, are sent
    /// again), and its waits serve the loop (`net.rs`).
    pub fn heartbeat(
        &self,
        session: &Secret,
        body: &HeartbeatRequest,
    ) -> Result<HeartbeatAnswer, CpError> {
        let hold = Duration::from_secs(body.wait_seconds.unwrap_or(0));
        // Written as it is sent, never whole in memory (body.rs).
        let mut json = HeartbeatBody::new(body).map_err(|_| CpError::BadRequest)?;
        let len = json.len();
        let timeout = hold.saturating_add(self.timeouts.1);
        let bytes = crate::net::stoppable(|| {
            self.send_within(
                "/api/v2/manager/heartbeat",
                session,
                Payload::Streamed(&mut json, len),
                timeout,
            )
        })?;
        Ok(HeartbeatAnswer(bytes))
    }

    /// `POST /api/v2/manager/commands/{id}/ack`. The id was validated as
    /// `[A-Za-z0-9._-]`, so it needs no escaping.
    pub fn ack(&self, session: &Secret, ack: &Ack) -> Result<AckOutcome, CpError> {
        let path = format!("/api/v2/manager/commands/{}/ack", ack.command_id);
        match self.post(&path, session, ack) {
            Ok(_) => Ok(AckOutcome::Delivered),
            Err(e) if e.already_acknowledged() => Ok(AckOutcome::AlreadyAcknowledged),
            Err(e) if e.not_found() => Ok(AckOutcome::Forgotten),
            Err(e) => Err(e),
        }
    }

    fn post(&self, path: &str, bearer: &Secret, body: &impl Serialize) -> Result<Vec<u8>, CpError> {
        let json = serde_json::to_vec(body).map_err(|_| CpError::BadRequest)?;
        self.send_within(path, bearer, Payload::Whole(json), self.timeouts.1)
    }

    /// POSTs a JSON body within `timeout`; returns the 2xx body.
    fn send_within(
        &self,
        path: &str,
        bearer: &Secret,
        json: Payload<'_>,
        timeout: Duration,
    ) -> Result<Vec<u8>, CpError> {
        // The base URL is validated at start-up, ids and session tokens on
        // arrival; should anything still not fit a request, it is an error,
        // never a panic.
        let req = Request::post(format!("{}{path}", self.base))
            .header("Content-Type", "application/json")
            .header("Accept", "application/json")
            .header("Authorization", format!("Bearer {}", bearer.expose()));
        let mut whole;
        let (reader, len): (&mut dyn io::Read, u64) = match json {
            Payload::Whole(bytes) => {
                let len = bytes.len() as u64;
                whole = io::Cursor::new(bytes);
                (&mut whole, len)
            }
            Payload::Streamed(reader, len) => (reader, len),
        };
        let req = req
            .header("Content-Length", len)
            .body(SendBody::from_reader(reader))
            .map_err(|_| CpError::BadRequest)?;
        let endpoint = match path.rsplit('/').next() {
            Some("connect") => "connect",
            Some("heartbeat") => "heartbeat",
            Some("ack") => "ack",
            _ => "other",
        };
        let agent = self.tls.borrow().agent.clone();
        let req = agent
            .configure_request(req)
            .timeout_global(Some(timeout))
            .build();
        let mut resp = match agent.run(req) {
            Ok(r) => r,
            Err(e) => {
                crate::metrics::request("cp", endpoint, None);
                self.after_failed_connection();
                return Err(CpError::Transport(e));
            }
        };
        let status = resp.status().as_u16();
        crate::metrics::request("cp", endpoint, Some(status));
        if resp.body().content_length().is_some_and(|n| n > MAX_BODY) {
            return Err(CpError::TooLarge);
        }
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| crate::backoff::parse_retry_after(v, SystemTime::now()));
        let bytes = match resp.body_mut().with_config().limit(MAX_BODY).read_to_vec() {
            Ok(b) => b,
            Err(ureq::Error::BodyExceedsLimit(_)) => return Err(CpError::TooLarge),
            Err(e) => return Err(CpError::Transport(e)),
        };
        if (200..300).contains(&status) {
            return Ok(bytes);
        }
        let err = serde_json::from_slice::<ErrorEnvelope>(&bytes)
            .unwrap_or_default()
            .error;
        Err(CpError::Status {
            status,
            code: err.code,
            message: err.message,
            retry_after,
        })
    }
}

/// A request body: written whole, or written while it is sent (the
/// heartbeat's, with its length counted first).
enum Payload<'a> {
    Whole(Vec<u8>),
    Streamed(&'a mut dyn io::Read, u64),
}

/// A heartbeat's 2xx answer, as bytes: its commands are decoded from it in
/// place ([`HeartbeatAnswer::parse`]), never copied.
#[derive(Debug)]
pub struct HeartbeatAnswer(pub Vec<u8>);

impl HeartbeatAnswer {
    /// The answer's fields, borrowing its bytes; an empty body has none.
    pub fn parse(&self) -> Result<HeartbeatResponse<'_>, CpError> {
        if self.0.iter().all(u8::is_ascii_whitespace) {
            return Ok(HeartbeatResponse::default());
        }
        serde_json::from_slice(&self.0).map_err(CpError::Decode)
    }
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CpError> {
    serde_json::from_slice(bytes).map_err(CpError::Decode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backoff::Jitter;

    /// A PEM bundle of the first `n` public roots (real certificates).
    fn pem_of_roots(n: usize) -> Vec<u8> {
        use base64::Engine as _;
        let mut pem = String::new();
        for der in webpki_root_certs::TLS_SERVER_ROOT_CERTS.iter().take(n) {
            let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
            pem.push_str("-----BEGIN CERTIFICATE-----\n");
            for line in b64.as_bytes().chunks(64) {
                pem.push_str(std::str::from_utf8(line).unwrap());
                pem.push('\n');
            }
            pem.push_str("-----END CERTIFICATE-----\n");
        }
        pem.into_bytes()
    }

    #[test]
    fn the_ca_bundle_is_taken_again_when_its_file_changes_and_kept_when_it_breaks() {
        let dir = std::env::temp_dir().join(format!("nexo-ca-reread-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ca.crt");
        let one = pem_of_roots(1);
        std::fs::write(&path, &one).unwrap();
        let timeouts = (Duration::from_secs(1), Duration::from_secs(1));
        let bundle = CaBundle {
            path: path.clone(),
            pem: one.clone(),
        };
        let cp = CpClient::new("https://cp.example", Some(bundle), None, timeouts).unwrap();
        assert_eq!(cp.reread_ca(), CaReread::Unchanged);
        std::fs::write(&path, pem_of_roots(3)).unwrap();
        assert_eq!(cp.reread_ca(), CaReread::Changed(3));
        assert_eq!(cp.reread_ca(), CaReread::Unchanged);
        // A broken or missing file keeps the last good bundle.
        std::fs::write(&path, b"not pem").unwrap();
        assert_eq!(cp.reread_ca(), CaReread::Kept("holds no PEM certificate"));
        std::fs::remove_file(&path).unwrap();
        assert_eq!(cp.reread_ca(), CaReread::Kept("cannot be read"));
        let trusted = cp.ca.as_ref().unwrap().borrow().pem.clone();
        assert_eq!(trusted, pem_of_roots(3));
        // No file configured: nothing to re-read.
        let plain = CpClient::new("https://cp.example", None, None, timeouts).unwrap();
        assert_eq!(plain.reread_ca(), CaReread::Unchanged);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_oversized_ca_bundle_is_refused() {
        let dir = std::env::temp_dir().join(format!("nexo-ca-big-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ca.crt");
        let big = vec![b'a'; MAX_CA_BUNDLE as usize + 1];
        std::fs::write(&path, &big).unwrap();
        assert_eq!(read_bounded(&path, MAX_CA_BUNDLE), Err("is over 1 MiB"));
        let timeouts = (Duration::from_secs(1), Duration::from_secs(1));
        let at_start = CpClient::new(
            "https://cp.example",
            Some(CaBundle { path, pem: big }),
            None,
            timeouts,
        );
        assert_eq!(at_start.err(), Some(SetupError::CaFile("is over 1 MiB")));
        std::fs::remove_dir_all(&dir).unwrap();
    }

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
