//! A small, typed Kubernetes REST client over ureq.
//!
//! Every call has a timeout (10 s connect, 30 s in all). Errors keep the HTTP
//! status and the decoded `Status`. A 401 with a file token re-reads the file
//! and retries once. The CP's egress proxy settings are not used here: the API
//! server is reached directly.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;
pub use ureq::http::Method;
use ureq::http::Request;
use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig};

use super::config::{Auth, KubeConfig};
use super::error::{Error, Status};
use super::pause::{Pause, Wake};
use crate::backoff::{Backoff, Jitter};
use crate::net::body::{BodyError, Over, read_body};

pub use super::limits::{MAX_BODY, MAX_ERROR_BODY, MAX_PAGE_BODY, SCRATCH_KEEP};
use super::limits::{read_limit, within};
pub use super::query::{Query, percent_encode};
/// Connect timeout of every call.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Whole-call timeout of every call.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The media type of JSON, asked for and sent by every call.
pub const JSON: &str = "application/json";
/// A list of the objects' metadata alone ([`Client::metadata_only`]), else
/// JSON.
pub const METADATA_LIST: &str =
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
/// A watch's events with the object's metadata alone. (Asked as a list, a
/// watch ends at its first event, with nothing sent: the API server cannot
/// make a list of one event's object.)
pub const METADATA_WATCH: &str =
    "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";

/// Content type of a server-side apply patch. JSON is valid YAML.
pub const APPLY_PATCH: &str = "application/apply-patch+yaml";
/// Content type of a JSON merge patch.
pub const MERGE_PATCH: &str = "application/merge-patch+json";

/// Whole-call timeout of a best-effort call ([`Client::request_quick`]).
pub const QUICK_TIMEOUT: Duration = Duration::from_secs(2);

/// Retries of a transient failure.
pub const RETRIES: u32 = 3;
/// First backoff step of a retried call.
pub const RETRY_BASE: Duration = Duration::from_millis(200);
/// Longest wait between retries (also caps `Retry-After`, so one call stays bounded).
pub const RETRY_CAP: Duration = Duration::from_secs(10);

/// Whether and when to retry a failed call, from plain values. 429 waits
/// `Retry-After` (capped) or backs off, for any method: the server did not
/// process the request. 5xx and transport errors retry methods whose repeat
/// is harmless (GET, PUT with its resourceVersion, server-side-apply PATCH,
/// DELETE), not POST. Nothing else is retried here; 409 conflicts are the
/// read-modify-write caller's to retry.
pub fn retry_delay(
    method: &Method,
    err: &Error,
    attempt: u32,
    backoff: &mut Backoff,
) -> Option<Duration> {
    if attempt > RETRIES {
        return None;
    }
    let idempotent = method != Method::POST;
    match err {
        // Retry-After within [1 s, RETRY_CAP] (the process-wide rule, capped
        // lower so that one call stays bounded).
        Error::Api {
            status: 429,
            retry_after,
            ..
        } => Some(crate::backoff::retry_after_wait(
            *retry_after,
            backoff,
            RETRY_CAP,
        )),
        Error::Api {
            status,
            retry_after,
            ..
        } if *status >= 500 && idempotent => Some(match retry_after {
            Some(_) => crate::backoff::retry_after_wait(*retry_after, backoff, RETRY_CAP),
            None => backoff.next_delay(),
        }),
        Error::Transport(_) if idempotent => Some(backoff.next_delay()),
        _ => None,
    }
}

/// `value` as a JSON request body; `what` names it in the error.
pub fn to_json(what: &'static str, value: &impl serde::Serialize) -> Result<Vec<u8>, Error> {
    serde_json::to_vec(value).map_err(|source| Error::Decode { what, source })
}

/// Content type of a strategic merge patch (built-in kinds only).
pub const STRATEGIC_MERGE_PATCH: &str = "application/strategic-merge-patch+json";
/// Content type of a JSON patch (RFC 6902): its `test` operation guards a
/// write by a value read before.
pub const JSON_PATCH: &str = "application/json-patch+json";
/// The field manager of every write.
pub const FIELD_MANAGER: &str = "nexo-manager";

/// A Kubernetes API client bound to one server and one identity.
pub struct Client {
    agent: ureq::Agent,
    /// Short timeouts, for best-effort calls on the way out.
    quick: ureq::Agent,
    /// Watches: no whole-call timeout, a connection each, read without
    /// blocking once the head is in (`watch.rs`).
    watch: ureq::Agent,
    /// The connection the last watch call opened.
    watch_opened: crate::net::WatchSlot,
    server: String,
    /// Shared with the executor's client ([`Client::executor`]).
    auth: Rc<Auth>,
    /// The executor ServiceAccount: every request that may change the
    /// cluster is sent as `system:serviceaccount:<namespace>:<executor>`
    /// of the namespace its path names (impersonation), so that the API
    /// server decides it with that namespace's RBAC; reads are sent as
    /// the Manager.
    executor: Option<Rc<str>>,
    /// The buffer response bodies are read into, kept between calls (up to
    /// [`SCRATCH_KEEP`]) so that reading a page does not grow a new buffer
    /// from nothing, through the allocator and `mmap`, every time.
    scratch: RefCell<Vec<u8>>,
    /// The `Accept` of the next requests: JSON, or the objects' metadata
    /// alone ([`Client::metadata_only`]).
    accept: Cell<&'static str>,
    /// Where the pause between two attempts of a call is spent: the
    /// process's waiter, so probes are answered and a stop is seen; a
    /// plain sleep when none is set (tests, tools).
    pause: Option<Rc<dyn Pause>>,
    /// Asked before every request that may change the cluster: the
    /// leader's lease, so that a process that may have lost it writes
    /// nothing (see `lease.rs`). None: every request is sent.
    fence: Option<Rc<dyn Fence>>,
}

/// A gate in front of every request that may change the cluster (every
/// method but GET).
pub trait Fence {
    /// Whether `method` `path` may be sent now.
    fn may_write(&self, method: &Method, path: &str) -> bool;
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("server", &self.server)
            .field("auth", &self.auth)
            .field("executor", &self.executor)
            .finish()
    }
}

/// A body to send, with its content type.
pub struct Body<'a> {
    /// `Content-Type` header.
    pub content_type: &'static str,
    /// The bytes.
    pub bytes: &'a [u8],
}

impl Client {
    /// Builds a client from a validated configuration.
    pub fn new(config: KubeConfig) -> Result<Client, Error> {
        let roots = match &config.ca_pem {
            Some(pem) => certs_from_pem(pem, "certificate authority")?,
            None => crate::tls::public_roots(),
        };
        let mut tls = TlsConfig::builder().root_certs(RootCerts::Specific(Arc::new(roots)));
        if let Auth::ClientCert { cert_pem, key_pem } = &config.auth {
            let chain = certs_from_pem(cert_pem, "client certificate")?;
            let key = PrivateKey::from_pem(key_pem.expose().as_bytes())
                .map_err(|_| Error::Config("client key is not a PEM private key".into()))?;
            tls = tls.client_cert(Some(ClientCert::new_with_certs(&chain, key)));
        }
        let tls = tls.build();
        let config_with = |call: Option<Duration>| {
            crate::net::buffers(ureq::Agent::config_builder())
                .http_status_as_error(false)
                .timeout_connect(Some(CONNECT_TIMEOUT.min(call.unwrap_or(CALL_TIMEOUT))))
                .timeout_global(call)
                .timeout_recv_response(Some(CALL_TIMEOUT))
                .proxy(None)
                .max_redirects(0)
                .user_agent(crate::USER_AGENT)
                .tls_config(tls.clone())
        };
        // Connects, reads and writes wait in the loop (`net.rs`): probes
        // are answered and a stop is seen while the API server is slow.
        let agent_with = |call| {
            use ureq::unversioned::transport::{Connector as _, RustlsConnector};
            let chain =
                ().chain(crate::net::PollTcpConnector::KUBERNETES)
                    .chain(RustlsConnector::default());
            crate::resolve::agent_with(config_with(Some(call)).build(), chain)
        };
        let (watch, watch_opened) = super::watch::agent(
            config_with(None)
                .max_idle_connections(0)
                .max_idle_connections_per_host(0)
                .build(),
        );
        Ok(Client {
            agent: agent_with(CALL_TIMEOUT),
            quick: agent_with(QUICK_TIMEOUT),
            watch,
            watch_opened,
            server: config.server,
            auth: Rc::new(config.auth),
            executor: None,
            scratch: RefCell::new(Vec::new()),
            accept: Cell::new(JSON),
            pause: None,
            fence: None,
        })
    }

    /// Runs `f` with its requests answered as `accept` says
    /// ([`METADATA_LIST`] for a list, [`METADATA_WATCH`] for a watch): a
    /// node's or a CRD's name, labels and version, not its status or
    /// schema.
    pub fn metadata_only<R>(&self, accept: &'static str, f: impl FnOnce(&Client) -> R) -> R {
        let before = self.accept.replace(accept);
        let out = f(self);
        self.accept.set(before);
        out
    }

    /// Spends the pauses between retries in `pause` (the process's waiter).
    pub fn with_pause(mut self, pause: Rc<dyn Pause>) -> Client {
        self.pause = Some(pause);
        self
    }

    /// The same client, asking `fence` before every request that may
    /// change the cluster.
    pub fn with_fence(mut self, fence: Rc<dyn Fence>) -> Client {
        self.fence = Some(fence);
        self
    }

    /// A client that sends every request that may change the cluster as
    /// `service_account` of the namespace it writes in (see
    /// `Client::acting_as`), sharing this one's connections,
    /// credentials, pause and fence.
    pub fn executor(&self, service_account: &str) -> Client {
        Client {
            agent: self.agent.clone(),
            quick: self.quick.clone(),
            watch: self.watch.clone(),
            watch_opened: self.watch_opened.clone(),
            server: self.server.clone(),
            auth: Rc::clone(&self.auth),
            executor: Some(Rc::from(service_account)),
            scratch: RefCell::new(Vec::new()),
            accept: Cell::new(JSON),
            pause: self.pause.clone(),
            fence: self.fence.clone(),
        }
    }

    /// Whom `method` `path` is sent as: `None` for this client's own
    /// identity; the executor of the namespace of `path` for a request
    /// that may change the cluster. A write whose path names no namespace
    /// is never sent as the executor, nor as the Manager: an error.
    fn acting_as(&self, method: &Method, path: &str) -> Result<Option<String>, Error> {
        let Some(sa) = &self.executor else {
            return Ok(None);
        };
        if *method == Method::GET {
            return Ok(None);
        }
        let path = path.split('?').next().unwrap_or_default();
        let mut segments = path.split('/');
        let namespace = segments
            .by_ref()
            .find(|s| *s == "namespaces")
            .and(segments.next())
            .filter(|ns| !ns.is_empty());
        match namespace {
            Some(ns) => Ok(Some(format!("system:serviceaccount:{ns}:{sa}"))),
            None => Err(Error::Config(format!(
                "{method} {path} names no namespace, so it cannot be sent as the executor"
            ))),
        }
    }

    /// `Err(Fenced)` when a request may not be sent now.
    fn fenced(&self, method: &Method, path: &str) -> Result<(), Error> {
        match &self.fence {
            Some(f) if *method != Method::GET && !f.may_write(method, path) => Err(Error::Fenced),
            _ => Ok(()),
        }
    }

    /// The server's base URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Sends one request; `path` includes the query. Returns the decoded
    /// JSON body of a 2xx answer (`Value::Null` when empty).
    ///
    /// A 401 with a file token re-reads the token and retries once. A
    /// transient failure is retried up to [`RETRIES`] times as
    /// [`retry_delay`] decides (honouring `Retry-After` on 429).
    pub fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<Body<'_>>,
    ) -> Result<Value, Error> {
        Ok(self
            .request_as::<Value>(method, path, body)?
            .unwrap_or(Value::Null))
    }

    /// [`Client::request`], decoding a 2xx body straight into `T` (no
    /// intermediate `Value`); `None` for an empty body.
    pub fn request_as<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Body<'_>>,
    ) -> Result<Option<T>, Error> {
        self.request_fenced(method, path, body, true)
    }

    /// [`Client::request_as`], asking the lease fence first when `fence`:
    /// a request that completes a create this process already sent (its
    /// proof and apply fields, each guarded to that one object as made) is
    /// sent whatever the fence says, so that an object it made is never
    /// left half made, unproven, by a lease lost in between.
    pub(super) fn request_fenced<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Body<'_>>,
        fence: bool,
    ) -> Result<Option<T>, Error> {
        let mut backoff = None;
        let mut attempt = 0;
        let mut reloaded = false;
        loop {
            if let Some(pause) = &self.pause {
                pause.checkpoint();
            }
            // Asked right before each attempt: a stop may have come in
            // the checkpoint or the pause before it.
            if fence {
                self.fenced(&method, path)?;
            }
            // A read may be abandoned: a stop ends its waits (a write is
            // never cut short: it finishes or times out).
            let send = || self.send_with(&self.agent, &method, path, body.as_ref(), None);
            let sent = if method == Method::GET {
                crate::net::stoppable(send)
            } else {
                send()
            };
            let err = match sent {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            if let (Some(401), Auth::Bearer(source), false) = (err.status(), &*self.auth, reloaded)
            {
                reloaded = true;
                if source.reload() {
                    crate::info!(
                        method:% = method, path:% = path; "service-account token rotated; retrying"
                    );
                    continue;
                }
            }
            attempt += 1;
            // Seeded only when a call fails: the common path makes no system call for it.
            let backoff = backoff
                .get_or_insert_with(|| Backoff::new(RETRY_BASE, RETRY_CAP, Jitter::from_entropy()));
            match retry_delay(&method, &err, attempt, backoff) {
                Some(delay) => {
                    crate::warn!(
                        method:% = method, path:% = path, err:% = err, attempt, of = RETRIES,
                        retryIn:? = delay; "a Kubernetes request failed; retrying"
                    );
                    match &self.pause {
                        Some(pause) => {
                            if pause.pause(delay) == Wake::Stop {
                                crate::info!(
                                    method:% = method, path:% = path; "stop requested; not retrying"
                                );
                                return Err(err);
                            }
                        }
                        None => std::thread::sleep(delay),
                    }
                }
                None => return Err(err),
            }
        }
    }

    /// One attempt with a [`QUICK_TIMEOUT`] and no retry: for best-effort
    /// calls on the way out (releasing the lease), so a stop is never held
    /// up by an API server that is going away too.
    pub fn request_quick(
        &self,
        method: Method,
        path: &str,
        body: Option<Body<'_>>,
    ) -> Result<Value, Error> {
        self.request_within(method, path, body, QUICK_TIMEOUT)
    }

    /// [`Client::request_quick`] within `timeout` (at most
    /// [`QUICK_TIMEOUT`]), the whole call: for what has a budget of its own
    /// (Kubernetes Events, `events::flush`).
    pub fn request_within(
        &self,
        method: Method,
        path: &str,
        body: Option<Body<'_>>,
        timeout: Duration,
    ) -> Result<Value, Error> {
        self.fenced(&method, path)?;
        let timeout = timeout.min(QUICK_TIMEOUT);
        Ok(self
            .send_with::<Value>(&self.quick, &method, path, body.as_ref(), Some(timeout))?
            .unwrap_or(Value::Null))
    }

    /// Opens a watch: `path` is the collection with its query
    /// (`watch=1`, `resourceVersion`, ...). One attempt: a watch that
    /// cannot be opened is opened again by its owner, with its backoff.
    pub fn watch(&self, path: &str) -> Result<super::watch::WatchStream, Error> {
        if let Some(pause) = &self.pause {
            pause.checkpoint();
        }
        self.watch_opened.clear();
        let resp = self.call(&self.watch, &Method::GET, path, None, None)?;
        let opened = self
            .watch_opened
            .take()
            .ok_or_else(|| Error::Config("a watch without its connection".into()))?;
        Ok(super::watch::WatchStream::new(resp.into_body(), opened))
    }

    fn send_with<T: DeserializeOwned>(
        &self,
        agent: &ureq::Agent,
        method: &Method,
        path: &str,
        body: Option<&Body<'_>>,
        timeout: Option<Duration>,
    ) -> Result<Option<T>, Error> {
        let mut resp = self.call(agent, method, path, body, timeout)?;
        self.decode(&mut resp, read_limit(method, path))
    }

    /// Sends one request; a 2xx response with its body unread, or the
    /// error of any other answer. `timeout`: the whole call's, instead of
    /// `agent`'s.
    fn call(
        &self,
        agent: &ureq::Agent,
        method: &Method,
        path: &str,
        body: Option<&Body<'_>>,
        timeout: Option<Duration>,
    ) -> Result<ureq::http::Response<ureq::Body>, Error> {
        let mut req = Request::builder()
            .method(method.clone())
            .uri(format!("{}{}", self.server, path))
            .header("Accept", self.accept.get());
        if let Auth::Bearer(source) = &*self.auth {
            req = req.header(
                "Authorization",
                format!("Bearer {}", source.token().expose()),
            );
        }
        if let Some(user) = self.acting_as(method, path)? {
            req = req.header("Impersonate-User", user);
        }
        let result = match body {
            Some(b) => {
                let req = req
                    .header("Content-Type", b.content_type)
                    .body(b.bytes.to_vec());
                let req = req.map_err(|e| Error::Config(format!("bad request: {e}")))?;
                agent.run(within(agent, req, timeout))
            }
            None => {
                let req = req
                    .body(())
                    .map_err(|e| Error::Config(format!("bad request: {e}")))?;
                agent.run(within(agent, req, timeout))
            }
        };
        let verb = verb_label(method);
        let mut resp = match result {
            Ok(r) => r,
            Err(e) => {
                crate::metrics::request("kubernetes", verb, None);
                return Err(e.into());
            }
        };
        let status = resp.status().as_u16();
        crate::metrics::request("kubernetes", verb, Some(status));
        if !(200..300).contains(&status) {
            return Err(error_answer(status, &mut resp)?);
        }
        Ok(resp)
    }

    /// Decodes a 2xx body straight into `T`: a page of a list becomes its
    /// projections, never a `Value` tree. The bytes are read whole first:
    /// serde_json parses a slice several times faster than a reader
    /// (BENCHMARKS.md), and one page's bytes are released before the
    /// heartbeat body, which is larger, is built.
    fn decode<T: DeserializeOwned>(
        &self,
        resp: &mut ureq::http::Response<ureq::Body>,
        limit: u64,
    ) -> Result<Option<T>, Error> {
        let mut bytes = self.scratch.take();
        let read = read_body(resp.body_mut(), limit, Over::Refuse, &mut bytes);
        let decoded = match read {
            Err(BodyError::TooLarge(limit)) => Err(Error::TooLarge(limit)),
            Err(BodyError::Read(e)) => Err(Error::Transport(e)),
            Ok(()) if bytes.is_empty() => Ok(None),
            Ok(()) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| Error::Decode {
                    what: "response body",
                    source,
                }),
        };
        bytes.clear();
        bytes.shrink_to(SCRATCH_KEEP);
        self.scratch.replace(bytes);
        decoded
    }
}

/// The error of a non-2xx answer: its status, its `Status` body (the first
/// [`MAX_ERROR_BODY`] bytes, never an error for a longer body: the status
/// decides what happens next, not the page size) and its `Retry-After`.
fn error_answer(status: u16, resp: &mut ureq::http::Response<ureq::Body>) -> Result<Error, Error> {
    let retry_after = crate::backoff::retry_after_of(resp.headers());
    let mut bytes = Vec::new();
    match read_body(resp.body_mut(), MAX_ERROR_BODY, Over::Cut, &mut bytes) {
        Ok(()) | Err(BodyError::TooLarge(_)) => {}
        Err(BodyError::Read(e)) => return Err(Error::Transport(e)),
    }
    // Not every error body is a Status (a proxy's page, an empty 503).
    let body = serde_json::from_slice::<Status>(&bytes).unwrap_or_else(|_| Status {
        reason: None,
        message: Some(String::from_utf8_lossy(&bytes[..bytes.len().min(512)]).into_owned())
            .filter(|m| !m.trim().is_empty()),
        details: None,
    });
    Ok(Error::Api {
        status,
        body,
        retry_after,
    })
}

/// The metrics label of a method: a closed set.
fn verb_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        _ => "OTHER",
    }
}

fn certs_from_pem(pem: &[u8], what: &str) -> Result<Vec<Certificate<'static>>, Error> {
    crate::tls::certs_from_pem(pem).map_err(|why| Error::Config(format!("{what} {why}")))
}

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;
