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
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use ureq::SendBody;
use ureq::http::Request;
use ureq::unversioned::transport::{ConnectProxyConnector, Connector, RustlsConnector};

use super::body::HeartbeatBody;
pub use super::error::{CpError, Retry, SetupError};
pub use super::tls::{CaBundle, CaReread, MAX_CA_BUNDLE, read_bounded};
use super::tls::{HANDSHAKE_PATH, HandshakeGate, Tls};
use super::wire::{
    Ack, ConnectRequest, ConnectResponse, ErrorEnvelope, HeartbeatRequest, HeartbeatResponse,
};
use crate::net::body::{BodyError, Over, read_body};
use crate::secret::Secret;

pub use super::wire::MAX_BODY;

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
            CaReread::Changed(n) => crate::info!(
                certificates = n;
                "NEXO_CONTROL_PLANE_CA_FILE changed: now trusting its certificates besides the public roots"
            ),
            CaReread::Kept(why) => {
                crate::warn!(
                    err:% = why;
                    "NEXO_CONTROL_PLANE_CA_FILE not usable: the last bundle read stays trusted"
                )
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
        // The process's transport (its waits in the loop: probes are
        // answered while a CP is slow to answer), without the duty.
        let chain =
            ().chain(ConnectProxyConnector::default())
                .chain(crate::net::PollTcpConnector::KUBERNETES)
                .chain(RustlsConnector::default())
                .chain(gate);
        let agent = crate::resolve::agent_with(config, chain);
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
        let retry_after = crate::backoff::retry_after_of(resp.headers());
        let mut bytes = Vec::new();
        match read_body(resp.body_mut(), MAX_BODY, Over::Refuse, &mut bytes) {
            Ok(()) => {}
            Err(BodyError::TooLarge(_)) => return Err(CpError::TooLarge),
            Err(BodyError::Read(e)) => return Err(CpError::Transport(e)),
        }
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
}
