//! A simulator of the Nexo Control Plane, protocol version 2: the server
//! side of the contract the Manager speaks, for the project's tests and its
//! sandbox.
//!
//! What it is: environments and connect tokens, the cluster binding rule,
//! sessions, scripted command queues, acknowledgements, fault injection
//! (error statuses with `Retry-After`, delays, resets, malformed and
//! oversized bodies) and a log of every request, in the order the requests
//! arrived. HTTPS with a generated CA,
//! keep-alive, one thread per connection. Runs in-process ([`Simulator`]) or
//! as the `nexo-cpsim` binary.
//!
//! What it is not: the hosted Control Plane. It is never linked into the
//! Manager's production binary, keeps everything in memory, and listens on
//! loopback only.

#![forbid(unsafe_code)]

pub mod http;
pub mod protocol;
pub mod signing;
pub mod tls;

use std::collections::VecDeque;
use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use crate::http::Response;
use crate::protocol::State;

/// How the simulator runs.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// HTTPS with the generated certificate (default); plain HTTP when false.
    pub tls: bool,
    /// Sent as `heartbeatIntervalSeconds` in connect and heartbeat answers when set.
    pub heartbeat_interval_seconds: Option<u64>,
    /// Session lifetime (default 1 hour).
    pub session_ttl: Duration,
    /// Serve the `/_sim/...` admin endpoints (default false; the binary turns them on).
    pub admin: bool,
    /// Hold heartbeats that carry `waitSeconds` (`heartbeat.wait.v1`)
    /// until a command is queued or the wait has passed, and answer
    /// `held: true` (default false: a CP that never holds).
    pub hold: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            tls: true,
            heartbeat_interval_seconds: None,
            session_ttl: Duration::from_secs(3600),
            admin: false,
            hold: false,
        }
    }
}

/// Which requests a fault applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /api/v2/manager/connect`.
    Connect,
    /// `POST /api/v2/manager/heartbeat`.
    Heartbeat,
    /// `POST /api/v2/manager/commands/{id}/ack`.
    Ack,
    /// Any protocol request.
    Any,
}

/// A scripted failure, consumed by the next matching request(s).
#[derive(Clone, Debug)]
pub struct Fault {
    /// Where it applies.
    pub endpoint: Endpoint,
    /// How many requests it affects.
    pub times: usize,
    /// What happens.
    pub action: FaultAction,
}

impl Fault {
    /// A fault for one request.
    pub fn new(endpoint: Endpoint, action: FaultAction) -> Fault {
        Fault {
            endpoint,
            times: 1,
            action,
        }
    }

    /// The same fault for `n` requests.
    pub fn times(mut self, n: usize) -> Fault {
        self.times = n;
        self
    }
}

/// What a fault does. Apart from `Delay`, a faulted request has no effect.
#[derive(Clone, Debug)]
pub enum FaultAction {
    /// An error status with protocol.md's error body, and `Retry-After` when set.
    Status {
        /// HTTP status.
        status: u16,
        /// `error.code`.
        code: String,
        /// `error.message`.
        message: String,
        /// `Retry-After`, verbatim.
        retry_after: Option<String>,
    },
    /// Sleeps, then answers normally.
    Delay(Duration),
    /// Closes the connection without an answer.
    Reset,
    /// 200 with a truncated JSON body.
    MalformedBody,
    /// 200 with a valid JSON body of about this many bytes.
    OversizedBody(usize),
    /// 200 with `commands` that is not a list.
    CommandsNotList,
    /// Any status and body.
    Raw {
        /// HTTP status.
        status: u16,
        /// The body.
        body: String,
    },
}

/// One request as received. It is logged when it arrives, so the log is in
/// the order the client sent its requests; its status is filled in when the
/// simulator has decided the answer (before writing it, and for a request
/// that changes the simulator's state, before the change can be seen).
#[derive(Clone, Debug)]
pub struct LoggedRequest {
    /// Connection number, from 1.
    pub connection: u64,
    /// Method.
    pub method: String,
    /// Path with query.
    pub path: String,
    /// Headers, names lowercased.
    pub headers: Vec<(String, String)>,
    /// Body bytes.
    pub body: Vec<u8>,
    /// The body as JSON, when it is JSON.
    pub json: Option<Value>,
    /// Status answered; 0 for a reset, or while [`LoggedRequest::done`] is false.
    pub status: u16,
    /// Whether the simulator is done with it: answered, or the connection
    /// reset. False while its answer is pending (an injected delay, say).
    pub done: bool,
    /// When it arrived.
    pub at: SystemTime,
    /// The Manager instance that sent it: the `instance.id` of a connect,
    /// or of the connect that issued the session token it carries. `None`
    /// when the simulator cannot tell (no or unknown token).
    pub instance: Option<String>,
}

/// One request without its body: cheap to take often (benchmarks poll it
/// while heartbeats of megabytes go by).
#[derive(Clone, Debug)]
pub struct Brief {
    /// Connection number, from 1.
    pub connection: u64,
    /// Method.
    pub method: String,
    /// Path with query.
    pub path: String,
    /// Status answered; 0 for a reset or while the answer is pending.
    pub status: u16,
    /// When it arrived.
    pub at: SystemTime,
    /// Body length in bytes.
    pub body_len: usize,
}

impl LoggedRequest {
    /// The first header of that name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }
}

struct Shared {
    state: Mutex<State>,
    /// Wakes held heartbeats: a command queued, sessions expired, a stop.
    wake: Condvar,
    /// Whether heartbeats are held.
    hold: AtomicBool,
    faults: Mutex<VecDeque<Fault>>,
    log: Mutex<Vec<LoggedRequest>>,
    connections: AtomicU64,
    stop: AtomicBool,
    admin: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A running simulator.
pub struct Simulator {
    shared: Arc<Shared>,
    addr: SocketAddr,
    url: String,
    ca_pem: String,
}

impl Simulator {
    /// Starts on a free loopback port; panics with the reason on failure.
    pub fn start(config: SimConfig) -> Simulator {
        Simulator::start_on(config, SocketAddr::from(([127, 0, 0, 1], 0)))
            .unwrap_or_else(|e| panic!("cannot start the CP simulator: {e}"))
    }

    /// Starts on `addr`.
    pub fn start_on(config: SimConfig, addr: SocketAddr) -> std::io::Result<Simulator> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        // The certificate names the address the simulator listens on, when
        // it is not loopback (a test bed's node address, say).
        let extra: Vec<String> = match addr.ip() {
            ip if ip.is_loopback() || ip.is_unspecified() => Vec::new(),
            ip => vec![ip.to_string()],
        };
        let tls = config.tls.then(|| tls::generate(&extra));
        let ca_pem = tls.as_ref().map(|t| t.ca_pem.clone()).unwrap_or_default();
        let scheme = if config.tls { "https" } else { "http" };
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new(
                config.heartbeat_interval_seconds,
                config.session_ttl,
            )),
            wake: Condvar::new(),
            hold: AtomicBool::new(config.hold),
            faults: Mutex::new(VecDeque::new()),
            log: Mutex::new(Vec::new()),
            connections: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            admin: config.admin,
        });
        let server = shared.clone();
        let tls_config = tls.map(|t| t.config);
        std::thread::Builder::new()
            .name("cpsim-accept".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if server.stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(stream) = stream else { continue };
                    let n = server.connections.fetch_add(1, Ordering::SeqCst) + 1;
                    let shared = server.clone();
                    let tls_config = tls_config.clone();
                    let _ = std::thread::Builder::new()
                        .name(format!("cpsim-conn-{n}"))
                        .spawn(move || {
                            serve_connection(&shared, stream, n, tls_config);
                        });
                }
            })?;
        Ok(Simulator {
            shared,
            addr,
            url: format!("{scheme}://{addr}"),
            ca_pem,
        })
    }

    /// The base URL, without a trailing slash.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// PEM of the CA a client must trust (empty for plain HTTP).
    pub fn ca_pem(&self) -> String {
        self.ca_pem.clone()
    }

    /// Writes [`Simulator::ca_pem`] to `path`.
    pub fn write_ca(&self, path: &Path) {
        std::fs::write(path, &self.ca_pem)
            .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    /// Registers an environment and returns its connect token.
    pub fn add_environment(&self, id: &str) -> String {
        let mut state = lock(&self.shared.state);
        let token = format!("nexo_ct_{id}_{}", state.random_alnum(40));
        state.add_environment(id, &token);
        token
    }

    /// Registers an environment with a given token.
    pub fn add_environment_with_token(&self, id: &str, token: &str) {
        lock(&self.shared.state).add_environment(id, token);
    }

    /// Issues a new token; the old one is refused from now on.
    pub fn rotate_token(&self, env: &str) -> String {
        let mut state = lock(&self.shared.state);
        let token = format!("nexo_ct_{env}_{}", state.random_alnum(40));
        state.envs.get_mut(env).expect("known environment").token = token.clone();
        token
    }

    /// Binds `env` to `cluster_uid` ahead of any connect.
    pub fn bind(&self, env: &str, cluster_uid: &str) {
        lock(&self.shared.state)
            .envs
            .get_mut(env)
            .expect("known environment")
            .bound = Some(cluster_uid.to_owned());
    }

    /// The cluster uid `env` is bound to.
    pub fn bound_cluster(&self, env: &str) -> Option<String> {
        lock(&self.shared.state)
            .envs
            .get(env)
            .and_then(|e| e.bound.clone())
    }

    /// The manager id the CP gives `env`'s Manager.
    pub fn manager_id(&self, env: &str) -> String {
        protocol::manager_id(env)
    }

    /// Queues a command for the next heartbeat of `env` (signed, when the
    /// environment signs its commands).
    pub fn enqueue_command(&self, env: &str, command: Value) {
        lock(&self.shared.state)
            .envs
            .get_mut(env)
            .expect("known environment")
            .enqueue(env, command);
        self.shared.wake.notify_all();
    }

    /// Queues a command exactly as given: never signed (for the cases a
    /// test crafts, a bad signature say).
    pub fn enqueue_raw(&self, env: &str, command: Value) {
        lock(&self.shared.state)
            .envs
            .get_mut(env)
            .expect("known environment")
            .queue
            .push_back(command);
        self.shared.wake.notify_all();
    }

    /// Whether heartbeats are held now.
    pub fn holds(&self) -> bool {
        self.shared.hold.load(Ordering::SeqCst)
    }

    /// Sends a command delivered and not acknowledged for `after` again
    /// (`None`: never, the default), as protocol.md's CP does.
    pub fn set_redeliver_after(&self, after: Option<Duration>) {
        lock(&self.shared.state).redeliver_after = after;
    }

    /// Starts or stops holding heartbeats ([`SimConfig::hold`]).
    pub fn set_hold(&self, hold: bool) {
        self.shared.hold.store(hold, Ordering::SeqCst);
        self.shared.wake.notify_all();
    }

    /// Signs every command queued for `env` from now on with a new key pair
    /// of id `key_id`; returns its key-file line.
    pub fn sign_commands(&self, env: &str, key_id: &str) -> String {
        let signer = Arc::new(signing::Signer::generate(key_id));
        let line = signer.key_line();
        self.set_signer(env, signer);
        line
    }

    /// Signs every command queued for `env` from now on with `signer`.
    pub fn set_signer(&self, env: &str, signer: Arc<signing::Signer>) {
        lock(&self.shared.state)
            .envs
            .get_mut(env)
            .expect("known environment")
            .signer = Some(signer);
    }

    /// Sets or clears the interval the CP asks for.
    pub fn set_heartbeat_interval(&self, seconds: Option<u64>) {
        lock(&self.shared.state).interval = seconds;
    }

    /// Invalidates every session: the next heartbeat or ack gets 401.
    pub fn expire_sessions(&self) {
        lock(&self.shared.state).sessions.clear();
        self.shared.wake.notify_all();
    }

    /// Queues a fault.
    pub fn inject(&self, fault: Fault) {
        lock(&self.shared.faults).push_back(fault);
    }

    /// Drops every queued fault.
    pub fn clear_faults(&self) {
        lock(&self.shared.faults).clear();
    }

    /// Every request so far, in the order they arrived.
    pub fn requests(&self) -> Vec<LoggedRequest> {
        lock(&self.shared.log).clone()
    }

    /// The request log without bodies.
    pub fn briefs(&self) -> Vec<Brief> {
        lock(&self.shared.log)
            .iter()
            .map(|r| Brief {
                connection: r.connection,
                method: r.method.clone(),
                path: r.path.clone(),
                status: r.status,
                at: r.at,
                body_len: r.body.len(),
            })
            .collect()
    }

    /// Heartbeats answered 200 so far.
    pub fn heartbeat_count(&self) -> usize {
        lock(&self.shared.state).heartbeats.len()
    }

    /// The last heartbeat body answered 200, without copying the others.
    pub fn last_heartbeat(&self) -> Option<Value> {
        lock(&self.shared.state).heartbeats.last().cloned()
    }

    /// Heartbeat bodies answered 200.
    pub fn heartbeats(&self) -> Vec<Value> {
        lock(&self.shared.state).heartbeats.clone()
    }

    /// Acks accepted, direct or through `pendingAcks`.
    pub fn acks(&self) -> Vec<Value> {
        lock(&self.shared.state).acks.clone()
    }

    /// TCP connections accepted (each one TLS handshake).
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst) as usize
    }

    /// The request log, one line a request, tokens redacted.
    pub fn log_dump(&self) -> String {
        log_dump(&lock(&self.shared.log))
    }

    /// Polls `pred` every 50 ms; panics with `what` and the log after `timeout`.
    pub fn wait_until(&self, timeout: Duration, what: &str, pred: impl Fn(&Simulator) -> bool) {
        let deadline = Instant::now() + timeout;
        while !pred(self) {
            if Instant::now() > deadline {
                panic!(
                    "timed out after {timeout:?} waiting for {what}\n{}",
                    self.log_dump()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops accepting connections.
    pub fn shutdown(&self) {
        if !self.shared.stop.swap(true, Ordering::SeqCst) {
            self.shared.wake.notify_all();
            // Wake the accept loop.
            let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        }
    }
}

impl Drop for Simulator {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn redact(headers: &[(String, String)]) -> String {
    headers
        .iter()
        .filter(|(k, _)| k == "authorization")
        .map(|(_, v)| {
            let tail: String = v
                .chars()
                .rev()
                .take(4)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            format!(" auth=Bearer <redacted:{tail}>")
        })
        .collect()
}

fn log_dump(log: &[LoggedRequest]) -> String {
    let mut out = String::new();
    for r in log {
        let body = String::from_utf8_lossy(&r.body);
        let body: String = body.chars().take(2000).collect();
        out.push_str(&format!(
            "{} conn#{} {} {} -> {}{}{} {}\n",
            humantime::format_rfc3339_millis(r.at),
            r.connection,
            r.method,
            r.path,
            if r.done {
                r.status.to_string()
            } else {
                "(pending)".to_owned()
            },
            r.instance
                .as_deref()
                .map(|i| format!(" from={i}"))
                .unwrap_or_default(),
            redact(&r.headers),
            body
        ));
    }
    if out.is_empty() {
        out.push_str("(no requests)\n");
    }
    out
}

/// Streams to and from one client, TLS or not.
trait Stream: Read + Write {}
impl<T: Read + Write> Stream for T {}

fn serve_connection(
    shared: &Shared,
    tcp: TcpStream,
    n: u64,
    tls: Option<Arc<rustls::ServerConfig>>,
) {
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(120)));
    let _ = tcp.set_write_timeout(Some(Duration::from_secs(30)));
    let _ = tcp.set_nodelay(true);
    let stream: Box<dyn Stream> = match tls {
        Some(config) => match rustls::ServerConnection::new(config) {
            Ok(conn) => Box::new(rustls::StreamOwned::new(conn, tcp)),
            Err(_) => return,
        },
        None => Box::new(tcp),
    };
    let mut reader = BufReader::new(stream);
    while !shared.stop.load(Ordering::SeqCst) {
        let req = match http::read_request(&mut reader) {
            Ok(Some(r)) => r,
            Ok(None) => return,
            Err(e) => {
                if e.kind() == std::io::ErrorKind::InvalidData {
                    let _ = http::write_response(
                        reader.get_mut(),
                        &protocol::error(400, "invalid_request", &e.to_string()),
                        true,
                    );
                }
                return;
            }
        };
        let at = SystemTime::now();
        let close = req.wants_close();
        // Logged as it arrives, so that the log is in the order the client
        // sent its requests whatever each answer takes (a delay, say).
        let json: Option<Value> = serde_json::from_slice(&req.body).ok();
        let instance = lock(&shared.state).sender(&req.headers, json.as_ref());
        let index = {
            let mut log = lock(&shared.log);
            log.push(LoggedRequest {
                connection: n,
                method: req.method.clone(),
                path: req.path.clone(),
                headers: req.headers.clone(),
                body: req.body.clone(),
                json,
                status: 0,
                done: false,
                at,
                instance,
            });
            log.len() - 1
        };
        let reply = answer(shared, &req, index);
        let status = match &reply {
            Reply::Response(r) => r.status,
            Reply::Reset => 0,
            Reply::Oversized(_) => 200,
        };
        // Before the answer is written: a client that has its answer finds
        // its request answered in the log.
        set_status(shared, index, status);
        let written = match reply {
            Reply::Response(r) => http::write_response(reader.get_mut(), &r, close),
            Reply::Reset => return,
            Reply::Oversized(size) => write_oversized(reader.get_mut(), size, close),
        };
        if written.is_err() || close {
            return;
        }
    }
}

/// What to send back.
enum Reply {
    /// A whole response.
    Response(Response),
    /// Close the connection without an answer.
    Reset,
    /// A valid JSON body of about this many bytes, streamed.
    Oversized(usize),
}

fn write_oversized(w: &mut dyn Stream, size: usize, close: bool) -> std::io::Result<()> {
    let pad = size.saturating_sub(14);
    w.write_all(http::head(200, "application/json", pad + 14, &[], close).as_bytes())?;
    w.write_all(b"{\"padding\":\"")?;
    let chunk = vec![b'x'; 64 * 1024];
    let mut left = pad;
    while left > 0 {
        let n = left.min(chunk.len());
        w.write_all(&chunk[..n])?;
        left -= n;
    }
    w.write_all(b"\"}")?;
    w.flush()
}

fn endpoint_of(path: &str) -> Option<(Endpoint, Option<String>)> {
    match path {
        "/api/v2/manager/connect" => Some((Endpoint::Connect, None)),
        "/api/v2/manager/heartbeat" => Some((Endpoint::Heartbeat, None)),
        _ => {
            let id = path
                .strip_prefix("/api/v2/manager/commands/")?
                .strip_suffix("/ack")?;
            Some((Endpoint::Ack, Some(id.to_owned())))
        }
    }
}

fn take_fault(shared: &Shared, endpoint: Endpoint) -> Option<FaultAction> {
    let mut faults = lock(&shared.faults);
    let i = faults
        .iter()
        .position(|f| f.endpoint == endpoint || f.endpoint == Endpoint::Any)?;
    let action = faults[i].action.clone();
    faults[i].times -= 1;
    if faults[i].times == 0 {
        faults.remove(i);
    }
    Some(action)
}

/// Records the status of the logged request `index`: it is done.
fn set_status(shared: &Shared, index: usize, status: u16) {
    if let Some(r) = lock(&shared.log).get_mut(index) {
        r.status = status;
        r.done = true;
    }
}

/// Decides the answer to the request logged at `index` (after any injected
/// delay).
fn answer(shared: &Shared, req: &http::Request, index: usize) -> Reply {
    let path = req.path.split('?').next().unwrap_or("");
    let Some((endpoint, id)) = endpoint_of(path) else {
        return Reply::Response(if path.starts_with("/_sim/") && shared.admin {
            admin(shared, req)
        } else {
            protocol::error(404, "not_found", "no such endpoint")
        });
    };
    if req.method != "POST" {
        return Reply::Response(protocol::error(405, "method_not_allowed", "use POST"));
    }
    let faulted = match take_fault(shared, endpoint) {
        Some(FaultAction::Delay(d)) => {
            std::thread::sleep(d);
            None
        }
        Some(FaultAction::Reset) => return Reply::Reset,
        Some(FaultAction::OversizedBody(size)) => return Reply::Oversized(size),
        Some(FaultAction::Status {
            status,
            code,
            message,
            retry_after,
        }) => {
            let resp = protocol::error(status, &code, &message);
            Some(match retry_after {
                Some(ra) => resp.header("Retry-After", &ra),
                None => resp,
            })
        }
        Some(FaultAction::MalformedBody) => Some(raw(200, "{\"commands\": [")),
        Some(FaultAction::CommandsNotList) => Some(raw(200, "{\"commands\": {\"id\": \"x\"}}")),
        Some(FaultAction::Raw { status, body }) => Some(raw(status, &body)),
        None => None,
    };
    Reply::Response(faulted.unwrap_or_else(|| {
        let body: Value = match serde_json::from_slice(&req.body) {
            Ok(v) => v,
            Err(e) => return not_json(&e),
        };
        let mut state = lock(&shared.state);
        let held = endpoint == Endpoint::Heartbeat && shared.hold.load(Ordering::SeqCst);
        let hold = body["waitSeconds"]
            .as_u64()
            .filter(|w| held && (1..=600).contains(w));
        if let Some(w) = hold {
            // Held until a command is queued for this session's
            // environment, the session ends, or the wait has passed.
            let until = Instant::now() + Duration::from_secs(w);
            loop {
                let now = Instant::now();
                if now >= until
                    || shared.stop.load(Ordering::SeqCst)
                    || !shared.hold.load(Ordering::SeqCst)
                    || state.has_commands(&req.headers) != Some(false)
                {
                    break;
                }
                state = shared
                    .wake
                    .wait_timeout(state, until - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        }
        let resp = match endpoint {
            Endpoint::Connect => state.connect(&req.headers, &body),
            Endpoint::Heartbeat => state.heartbeat(&req.headers, &body, hold.is_some()),
            Endpoint::Ack | Endpoint::Any => {
                state.ack(id.as_deref().unwrap_or(""), &req.headers, &body)
            }
        };
        // While the state is locked: whoever sees what this request changed
        // (a heartbeat counted, an ack accepted) finds it answered in the log.
        set_status(shared, index, resp.status);
        resp
    }))
}

fn not_json(e: &serde_json::Error) -> Response {
    protocol::error(
        400,
        "invalid_request",
        &format!("the body is not JSON: {e}"),
    )
}

fn raw(status: u16, body: &str) -> Response {
    Response {
        status,
        headers: Vec::new(),
        body: body.as_bytes().to_vec(),
        content_type: "application/json",
    }
}

fn admin(shared: &Shared, req: &http::Request) -> Response {
    let (path, query) = req.path.split_once('?').unwrap_or((&req.path, ""));
    match (req.method.as_str(), path) {
        ("GET", "/_sim/log") => Response::text(200, log_dump(&lock(&shared.log))),
        ("GET", "/_sim/acks") => Response::json(200, &json!(lock(&shared.state).acks)),
        ("GET", "/_sim/heartbeats") => Response::json(200, &json!(lock(&shared.state).heartbeats)),
        ("POST", "/_sim/expire-sessions") => {
            lock(&shared.state).sessions.clear();
            shared.wake.notify_all();
            Response::text(204, "")
        }
        ("POST", "/_sim/commands") => {
            let env = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("env="))
                .unwrap_or("");
            let commands = match serde_json::from_slice::<Value>(&req.body) {
                Ok(Value::Array(list)) => list,
                Ok(one) => vec![one],
                Err(e) => return not_json(&e),
            };
            let mut state = lock(&shared.state);
            let Some(e) = state.envs.get_mut(env) else {
                return protocol::error(404, "unknown_environment", "no such environment");
            };
            for command in commands {
                e.enqueue(env, command);
            }
            shared.wake.notify_all();
            Response::text(204, "")
        }
        ("POST", "/_sim/hold") => {
            let on = query.split('&').any(|kv| kv == "on=true");
            shared.hold.store(on, Ordering::SeqCst);
            shared.wake.notify_all();
            Response::text(204, "")
        }
        _ => protocol::error(404, "not_found", "no such admin endpoint"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead;

    /// A minimal keep-alive HTTP client over a plain or TLS stream.
    fn post(
        stream: &mut (impl Read + Write),
        path: &str,
        token: &str,
        body: &Value,
    ) -> (u16, Value) {
        let body = body.to_string();
        write!(stream, "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        stream.flush().unwrap();
        let mut r = BufReader::new(stream);
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        let status: u16 = line.split(' ').nth(1).unwrap().parse().unwrap();
        let mut len = 0;
        loop {
            let mut h = String::new();
            r.read_line(&mut h).unwrap();
            if h.trim().is_empty() {
                break;
            }
            if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
        }
        let mut buf = vec![0; len];
        r.read_exact(&mut buf).unwrap();
        (status, serde_json::from_slice(&buf).unwrap_or(Value::Null))
    }

    fn connect_body() -> Value {
        json!({"protocolVersion": 2, "manager": {"version": "0.3.0", "build": "b", "capabilities": []},
               "instance": {"id": "i", "podName": "p", "namespace": "n"},
               "cluster": {"uid": "c1", "kubernetesVersion": "v1.37.2"}})
    }

    #[test]
    fn plain_http_round_trip_with_faults_over_one_connection() {
        let sim = Simulator::start(SimConfig {
            tls: false,
            ..SimConfig::default()
        });
        let token = sim.add_environment("env-a");
        let mut s = TcpStream::connect(sim.addr()).unwrap();
        sim.inject(Fault::new(
            Endpoint::Connect,
            FaultAction::Status {
                status: 503,
                code: "busy".into(),
                message: "later".into(),
                retry_after: Some("2".into()),
            },
        ));
        let (status, body) = post(&mut s, "/api/v2/manager/connect", &token, &connect_body());
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (503, Some("busy"))
        );
        assert_eq!(
            sim.bound_cluster("env-a"),
            None,
            "a faulted connect has no effect"
        );
        let (status, body) = post(&mut s, "/api/v2/manager/connect", &token, &connect_body());
        assert_eq!(status, 200, "the fault is consumed once");
        assert_eq!(body["managerId"], sim.manager_id("env-a"));
        assert_eq!(sim.bound_cluster("env-a").as_deref(), Some("c1"));
        assert_eq!(sim.connections(), 1, "keep-alive: one connection");
        let log = sim.requests();
        assert_eq!(log.iter().map(|r| r.status).collect::<Vec<_>>(), [503, 200]);
        assert_eq!(log[1].json.as_ref().unwrap()["cluster"]["uid"], "c1");
        let dump = sim.log_dump();
        assert!(
            !dump.contains(&token) && dump.contains("<redacted:"),
            "{dump}"
        );
        let (status, _) = post(&mut s, "/nope", &token, &json!({}));
        assert_eq!(status, 404);
    }

    #[test]
    fn tls_connect_with_the_generated_ca() {
        let sim = Simulator::start(SimConfig::default());
        let token = sim.add_environment("env-tls");
        let mut roots = rustls::RootCertStore::empty();
        use rustls::pki_types::pem::PemObject;
        let ca =
            rustls::pki_types::CertificateDer::from_pem_slice(sim.ca_pem().as_bytes()).unwrap();
        roots.add(ca).unwrap();
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, TcpStream::connect(sim.addr()).unwrap());
        let (status, body) = post(&mut tls, "/api/v2/manager/connect", &token, &connect_body());
        assert_eq!(status, 200, "{body}");
        assert!(sim.url().starts_with("https://127.0.0.1:"));
    }

    #[test]
    fn requests_are_logged_as_they_arrive_and_name_their_sender() {
        let sim = Simulator::start(SimConfig {
            tls: false,
            ..SimConfig::default()
        });
        let token = sim.add_environment("env-o");
        // An ack whose answer waits far longer than this test: logged
        // first, answered never (its thread ends with the test process).
        // Only acks are delayed, so the requests below cannot take the fault.
        sim.inject(Fault::new(
            Endpoint::Ack,
            FaultAction::Delay(Duration::from_secs(600)),
        ));
        let addr = sim.addr();
        std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            post(
                &mut s,
                "/api/v2/manager/commands/c1/ack",
                "unknown",
                &json!({}),
            )
        });
        sim.wait_until(Duration::from_secs(10), "the delayed ack", |s| {
            s.requests().len() == 1
        });
        let mut s = TcpStream::connect(sim.addr()).unwrap();
        let (status, body) = post(&mut s, "/api/v2/manager/connect", &token, &connect_body());
        assert_eq!(status, 200);
        let session = body["sessionToken"].as_str().unwrap().to_owned();
        let (status, _) = post(&mut s, "/api/v2/manager/heartbeat", &session, &json!({}));
        assert_eq!(status, 400, "attributed whatever the answer");
        let (status, _) = post(&mut s, "/api/v2/manager/heartbeat", "unknown", &json!({}));
        assert_eq!(status, 401);
        let log = sim.requests();
        let seen: Vec<(&str, bool, u16, Option<&str>)> = log
            .iter()
            .map(|r| {
                let path = r.path.rsplit('/').next().unwrap();
                (path, r.done, r.status, r.instance.as_deref())
            })
            .collect();
        assert_eq!(
            seen,
            [
                ("ack", false, 0, None),
                ("connect", true, 200, Some("i")),
                ("heartbeat", true, 400, Some("i")),
                ("heartbeat", true, 401, None),
            ]
        );
        assert!(sim.log_dump().contains("/ack -> (pending)"));
    }

    #[test]
    fn reset_closes_without_an_answer_and_is_logged() {
        let sim = Simulator::start(SimConfig {
            tls: false,
            ..SimConfig::default()
        });
        let token = sim.add_environment("env-r");
        sim.inject(Fault::new(Endpoint::Any, FaultAction::Reset));
        let mut s = TcpStream::connect(sim.addr()).unwrap();
        let body = connect_body().to_string();
        write!(s, "POST /api/v2/manager/connect HTTP/1.1\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        let mut buf = Vec::new();
        assert_eq!(s.read_to_end(&mut buf).unwrap_or(0), 0, "no answer");
        sim.wait_until(
            Duration::from_secs(5),
            "the reset request in the log",
            |s| s.requests().len() == 1,
        );
        let logged = &sim.requests()[0];
        assert_eq!((logged.status, logged.done), (0, true));
    }
}
