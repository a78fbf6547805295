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
pub mod inventory;
pub mod plan;
pub mod protocol;
mod serve;
pub mod signing;
pub mod tls;

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

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
    /// An error status with docs/protocol.md's error body, and `Retry-After` when set.
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

pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    /// Wakes held heartbeats: a command queued, sessions expired, a stop.
    pub(crate) wake: Condvar,
    /// Whether heartbeats are held.
    pub(crate) hold: AtomicBool,
    pub(crate) faults: Mutex<VecDeque<Fault>>,
    pub(crate) log: Mutex<Vec<LoggedRequest>>,
    pub(crate) connections: AtomicU64,
    pub(crate) stop: AtomicBool,
    pub(crate) admin: bool,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
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
                            serve::serve_connection(&shared, stream, n, tls_config);
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
    /// (`None`: never, the default), as docs/protocol.md's CP does.
    pub fn set_redeliver_after(&self, after: Option<Duration>) {
        lock(&self.shared.state).redeliver_after = after;
    }

    /// How inventories are answered (`inventory.delta.v1`): never
    /// confirmed (version 2, the default), always, or one heartbeat late.
    pub fn set_confirming(&self, confirming: inventory::Confirming) {
        lock(&self.shared.state).inventory.confirming = confirming;
    }

    /// Loses the confirmations of the next `n` answers.
    pub fn lose_confirmations(&self, n: u32) {
        lock(&self.shared.state).inventory.lose = n;
    }

    /// Sends `answer` as the next answer's `inventory`, instead of a
    /// confirmation (a bogus one, for instance).
    pub fn answer_inventory_with(&self, answer: Value) {
        lock(&self.shared.state).inventory.instead.push_back(answer);
    }

    /// Asks for the full form in the next answer.
    pub fn ask_inventory_resync(&self) {
        lock(&self.shared.state).inventory.resync = true;
    }

    /// The inventory rebuilt from the heartbeats' full forms and deltas,
    /// at the last revision, and its release contract.
    pub fn rebuilt_inventory(&self) -> Option<(Vec<Value>, Value)> {
        let state = lock(&self.shared.state);
        Some((state.inventory.last()?, state.inventory.last_contract()?))
    }

    /// Deltas applied, full forms compared with a revision rebuilt from
    /// deltas, and what differed.
    pub fn inventory_checks(&self) -> (u64, u64, Vec<String>) {
        let state = lock(&self.shared.state);
        let i = &state.inventory;
        (i.deltas, i.compared, i.mismatches.clone())
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
        serve::log_dump(&lock(&self.shared.log))
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

#[cfg(test)]
#[path = "lib_tests.rs"]
mod tests;
