//! The loop: connect (or reuse the binding), collect inventory, heartbeat,
//! handle commands, wait. One thread; every blocking call has a timeout;
//! a failed heartbeat or command never ends the loop.

use std::cell::{RefCell, RefMut};
use std::fmt;
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::version::Info;
use serde_json::value::RawValue;

use crate::acks;
use crate::backoff::{Backoff, Jitter, retry_after_delay};
use crate::commands::execute::{self, Outcome};
use crate::commands::{self, Refusal};
use crate::config::{Config, TokenSource};
use crate::cp::AckOutcome;
use crate::cp::wire::{
    self, Ack, ClusterInfo, ClusterRef, ConnectRequest, HeartbeatManager, HeartbeatRequest,
    InstanceInfo, ManagerInfo,
};
use crate::cp::{CpClient, CpError};
use crate::inventory;
use crate::kube::{self, Client, KubeConfig};
use crate::lease::{self, Elector};
use crate::probe::{Probe, Role, Status};
use crate::secret::Secret;
use crate::self_rollout::{self, SelfDeployment};
use crate::state::{self, Binding, LedgerEntry, State, StateError, Store};
use crate::token::ConnectToken;
use crate::wait::{Pause, Waiter, Wake};

/// The capabilities this build advertises: only what is implemented and tested.
pub const CAPABILITIES: &[&str] = &[
    "heartbeat.inventory.v1",
    "command.deploy.crd",
    "command.deploy.legacy",
    "command.rollout",
    "command.upgrade",
    "command.uninstall",
    "ack.retry.v1",
    "ownership.guard.v1",
    "ownership.migration-gate.v1",
    "promotion-contract.v1",
];

/// Bounds of the CP's interval override.
pub const INTERVAL_MIN: Duration = Duration::from_secs(5);
/// Bounds of the CP's interval override.
pub const INTERVAL_MAX: Duration = Duration::from_secs(600);

/// How long region and zone read from the nodes are reused before the
/// nodes are listed again: node labels hardly ever change, and listing
/// every node of a large cluster at every heartbeat would cost the API
/// server and the Manager more than the whole rest of the heartbeat.
pub const TOPOLOGY_REFRESH: Duration = Duration::from_secs(300);

/// A session is renewed this long before the CP says it expires.
const SESSION_MARGIN: Duration = Duration::from_secs(30);

/// Why the Manager stopped, and its exit code.
#[derive(Debug)]
pub enum Fatal {
    /// Exit 2: the configuration is invalid.
    Config(String),
    /// Exit 3: the Control Plane or the persisted state refuses this binding.
    Binding(String),
    /// Exit 1: anything else that cannot be recovered from.
    Other(String),
}

impl Fatal {
    /// The process exit code.
    pub fn exit_code(&self) -> u8 {
        match self {
            Fatal::Other(_) => 1,
            Fatal::Config(_) => 2,
            Fatal::Binding(_) => 3,
        }
    }
}

impl fmt::Display for Fatal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fatal::Config(m) => write!(f, "configuration error: {m}"),
            Fatal::Binding(m) => write!(f, "binding refused: {m}"),
            Fatal::Other(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for Fatal {}

impl From<StateError> for Fatal {
    fn from(e: StateError) -> Self {
        match e {
            // NEXO_STATE_SECRET names a Secret that is not this Manager's.
            StateError::NotOurs(_) => Fatal::Config(e.to_string()),
            _ => Fatal::Other(e.to_string()),
        }
    }
}

/// Clamps the CP's interval override to [`INTERVAL_MIN`]..=[`INTERVAL_MAX`].
pub fn clamp_interval(seconds: u64) -> Duration {
    Duration::from_secs(seconds).clamp(INTERVAL_MIN, INTERVAL_MAX)
}

/// Whether the nodes should be listed for region and zone: never yet, or
/// longer than [`TOPOLOGY_REFRESH`] ago.
pub fn topology_due(listed_at: Option<Instant>, now: Instant) -> bool {
    listed_at.is_none_or(|at| now.saturating_duration_since(at) >= TOPOLOGY_REFRESH)
}

/// What to do after a failed CP call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Wait this long (a `Retry-After`, or the backoff).
    After(Duration),
    /// Not worth retrying the same body: wait the normal interval.
    NextInterval,
}

/// The retry decision for a failed heartbeat (or connect), from plain values.
pub fn retry_decision(err: &CpError, backoff: &mut Backoff) -> Retry {
    match err.status() {
        Some(400 | 422) => Retry::NextInterval,
        Some(429 | 503) => Retry::After(retry_after_delay(err.retry_after(), backoff)),
        _ => Retry::After(backoff.next_delay()),
    }
}

/// The current session with the CP.
struct Session {
    token: Secret,
    manager_id: String,
    expires_at: Option<SystemTime>,
}

/// The running agent.
pub struct Agent {
    cfg: Config,
    kube: Client,
    cp: CpClient,
    /// Every wait of the process; also the Kubernetes client's retry pause.
    waiter: Rc<Waiter>,
    token: ConnectToken,
    namespaces: Vec<String>,
    instance: InstanceInfo,
    cluster: ClusterRef,
    store: Store,
    state: State,
    /// A state write that failed, reported in heartbeats until one succeeds.
    state_error: Option<String>,
    session: Option<Session>,
    sequence: u64,
    interval: Duration,
    backoff: Backoff,
    /// What the probes answer from; shared with the waiter.
    status: Rc<RefCell<Status>>,
    elector: Elector,
    /// Region and zone from the last node listing, and when it was made.
    topology: Option<(Instant, Option<String>, Option<String>)>,
    /// The rollout of the Manager's own Deployment.
    self_rollout: self_rollout::Watch,
}

/// Reads the connect token from its source and validates it.
pub fn read_connect_token(
    source: &TokenSource,
    expected_env: Option<&str>,
) -> Result<ConnectToken, Fatal> {
    match source {
        TokenSource::Value(v) => ConnectToken::parse(v.expose(), expected_env)
            .map_err(|e| Fatal::Config(format!("NEXO_CONNECT_TOKEN: {e}"))),
        TokenSource::File(path) => {
            let raw = std::fs::read_to_string(path).map_err(|e| {
                Fatal::Config(format!(
                    "NEXO_CONNECT_TOKEN_FILE: cannot read {}: {e}",
                    path.display()
                ))
            })?;
            ConnectToken::parse(&raw, expected_env).map_err(|e| {
                Fatal::Config(format!("NEXO_CONNECT_TOKEN_FILE ({}): {e}", path.display()))
            })
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

impl Agent {
    /// Validates everything that can be checked without the network, then
    /// reads the cluster identity and the persisted state.
    pub fn start(cfg: Config) -> Result<Agent, Fatal> {
        // The probe listener first: the kubelet's probes are answered (not
        // ready: starting) while the cluster identity and state are read.
        let probe = match cfg.listen_addr {
            Some(addr) => Some(Probe::bind(addr).map_err(|e| {
                Fatal::Config(format!("NEXO_LISTEN_ADDR: cannot listen on {addr}: {e}"))
            })?),
            None => None,
        };
        let status = Rc::new(RefCell::new(Status {
            role: Role::Starting,
            interval: cfg.heartbeat_interval,
            // The CP request timeout bounds the handshake of a standby check.
            check_time: cfg.cp_request_timeout,
            ..Status::default()
        }));
        let waiter = Rc::new(
            Waiter::new(probe, Rc::clone(&status))
                .map_err(|e| Fatal::Other(format!("cannot install signal handlers: {e}")))?,
        );
        if cfg.control_plane_url.starts_with("http://") {
            log::warn!(
                "NEXO_INSECURE_ALLOW_HTTP is set: talking to the Control Plane over plain http ({}); never do this outside development",
                cfg.control_plane_url
            );
        }
        let token = read_connect_token(&cfg.token_source, cfg.environment_id.as_deref())?;
        let ca = match &cfg.control_plane_ca_file {
            Some(path) => Some(std::fs::read(path).map_err(|e| {
                Fatal::Config(format!(
                    "NEXO_CONTROL_PLANE_CA_FILE: cannot read {}: {e}",
                    path.display()
                ))
            })?),
            None => None,
        };
        let cp = CpClient::new(
            &cfg.control_plane_url,
            ca.as_deref(),
            cfg.https_proxy.as_deref(),
            (cfg.cp_connect_timeout, cfg.cp_request_timeout),
        )
        .map_err(Fatal::Config)?;

        let kube_cfg = match &cfg.kubeconfig {
            Some(path) => KubeConfig::from_kubeconfig(path),
            None => match (std::env::var("KUBERNETES_SERVICE_HOST"), std::env::var("KUBERNETES_SERVICE_PORT")) {
                (Ok(host), Ok(port)) => {
                    KubeConfig::in_cluster(&host, &port, std::path::Path::new(kube::config::SERVICE_ACCOUNT_DIR))
                }
                _ => Err(kube::Error::Config(
                    "not in a cluster (KUBERNETES_SERVICE_HOST/_PORT unset) and KUBECONFIG is not set".into(),
                )),
            },
        }
        .map_err(|e| Fatal::Config(e.to_string()))?;
        let own_namespace = cfg
            .pod_namespace
            .clone()
            .or_else(|| kube_cfg.namespace.clone())
            .ok_or_else(|| {
                Fatal::Config(
                    "POD_NAMESPACE: not set, and no service-account namespace to fall back on"
                        .into(),
                )
            })?;
        let kube = Client::new(kube_cfg)
            .map_err(|e| Fatal::Config(e.to_string()))?
            .with_pause(Rc::clone(&waiter) as Rc<dyn Pause>);

        let host = hostname();
        let instance = InstanceInfo {
            id: cfg.pod_uid.clone().unwrap_or_else(|| host.clone()),
            pod_name: cfg.pod_name.clone().unwrap_or(host),
            namespace: own_namespace.clone(),
        };
        let namespaces = cfg.managed_namespaces(&own_namespace);
        let mut backoff = Backoff::control_plane();

        let cluster = retry_kube(&waiter, &mut backoff, "read the cluster identity", || {
            let ns: Namespace = kube.get("/api/v1/namespaces/kube-system")?;
            let version: Info = kube.get("/version")?;
            Ok(ClusterRef {
                uid: ns.metadata.uid.unwrap_or_default(),
                kubernetes_version: version.git_version,
            })
        })?;
        if cluster.uid.is_empty() {
            return Err(Fatal::Other(
                "the kube-system namespace has no metadata.uid".into(),
            ));
        }

        let mut store = Store::new(&own_namespace, &cfg.state_secret, token.environment_id());
        let state = retry_kube(
            &waiter,
            &mut backoff,
            "read the state secret",
            || match store.load(&kube) {
                Ok(s) => Ok(Ok(s)),
                Err(StateError::Kube(e)) => Err(e),
                Err(other) => Ok(Err(other)),
            },
        )??;
        if let Some(binding) = &state.binding {
            if binding.cluster_uid != cluster.uid {
                return Err(Fatal::Binding(format!(
                    "the state secret {}/{} is bound to cluster {} but this cluster is {}: the state was copied from another cluster; delete that secret only if this cluster really is a new home for environment {}",
                    own_namespace,
                    cfg.state_secret,
                    binding.cluster_uid,
                    cluster.uid,
                    binding.environment_id
                )));
            }
        }
        backoff.reset();
        log::info!(
            "nexo-manager {} (build {}) starting: environment {}, cluster {} ({}), namespaces {}",
            crate::VERSION,
            crate::BUILD,
            token.environment_id(),
            cluster.uid,
            cluster.kubernetes_version,
            namespaces.join(",")
        );
        let interval = cfg.heartbeat_interval;
        let elector = Elector::new(&instance.namespace, &cfg.lease_name, &instance.id);
        Ok(Agent {
            cfg,
            kube,
            cp,
            waiter,
            token,
            namespaces,
            instance,
            cluster,
            store,
            state,
            state_error: None,
            session: None,
            sequence: 0,
            interval,
            backoff,
            status,
            elector,
            topology: None,
            self_rollout: self_rollout::Watch::default(),
        })
    }

    /// Runs until SIGTERM/SIGINT (Ok) or a fatal error. Between heartbeats
    /// it waits in one `poll(2)`, answering probe requests as they come.
    pub fn run(mut self) -> Result<(), Fatal> {
        loop {
            let Some(delay) = self.cycle()? else {
                return self.stopped();
            };
            match self.waiter.wait(delay) {
                Ok(Wake::Stop) => return self.stopped(),
                Ok(Wake::Timeout) => {}
                Err(e) => return Err(Fatal::Other(format!("wait failed: {e}"))),
            }
        }
    }

    /// The status the probes answer from, for an update.
    fn status(&self) -> RefMut<'_, Status> {
        self.status.borrow_mut()
    }

    /// A standby's readiness check: the lease was just read with this
    /// pod's credentials; a TLS handshake with the Control Plane (no
    /// connect, no token) shows it could reach it.
    fn standby_check(&mut self, lease_read: bool) {
        self.status().role = Role::Standby;
        self.status().bound = false;
        if !lease_read {
            return;
        }
        match self.cp.handshake() {
            Ok(()) => self.status().standby_ok_at = Some(Instant::now()),
            Err(e) => log::warn!("standby check: {e}"),
        }
    }

    fn stopped(&mut self) -> Result<(), Fatal> {
        log::info!("stop requested; exiting");
        self.elector.release(&self.kube);
        Ok(())
    }

    /// One connect-if-needed + heartbeat + commands. Returns how long to wait,
    /// or `None` when a stop was requested.
    fn cycle(&mut self) -> Result<Option<Duration>, Fatal> {
        // Only the lease holder talks to the CP and touches the cluster.
        match self
            .elector
            .try_lead(&self.kube, lease::duration_for(self.interval))
        {
            Ok(true) if self.status.borrow().role != Role::Leader => {
                // Just became the leader: another pod may have finished
                // commands since this one read the state. Read it again
                // before acting, or a finished command would run twice.
                match self.store.load(&self.kube) {
                    Ok(state) => {
                        log::info!(
                            "leading: state read again ({} ledger entries)",
                            state.ledger.len()
                        );
                        self.state = state;
                        self.status().role = Role::Leader;
                    }
                    Err(e) => {
                        log::warn!(
                            "cannot read the state secret after taking the lease: {e}; not acting"
                        );
                        return Ok(Some(self.backoff.next_delay().min(self.interval)));
                    }
                }
            }
            Ok(true) => {}
            Ok(false) => {
                self.standby_check(true);
                return Ok(Some(self.interval));
            }
            Err(e) => {
                let delay = retry_after_delay(e.retry_after(), &mut self.backoff);
                log::warn!("cannot read or renew the lease: {e}; not acting");
                self.standby_check(false);
                return Ok(Some(delay.min(self.interval)));
            }
        }
        let session_stale = self.session.as_ref().is_some_and(|s| {
            s.expires_at
                .is_some_and(|at| SystemTime::now() + SESSION_MARGIN >= at)
        });
        if self.session.is_none() || session_stale {
            match self.connect()? {
                Ok(()) => {}
                Err(delay) => return Ok(Some(delay)),
            }
        }
        let body = self.heartbeat_body();
        // The lease was checked before the inventory was read; a process
        // stopped in between (SIGSTOP, a frozen node) may have lost it
        // since. Past the renew deadline nothing is sent: the lease is read
        // again first.
        if !self.elector.leading() {
            log::warn!(
                "the lease is past its renew deadline; heartbeat {} not sent, reading the lease again",
                body.sequence
            );
            return Ok(Some(Duration::ZERO));
        }
        let body_acks = body.pending_acks.clone();
        let managed = body.managed_proxy_count;
        let sequence = body.sequence;
        let result = match self.send_heartbeat(&body) {
            Err(e) if e.status() == Some(401) => {
                log::info!(
                    "session expired; connecting again and resending heartbeat {}",
                    body.sequence
                );
                self.session = None;
                match self.connect()? {
                    Ok(()) => {
                        let mut body = body;
                        body.manager_id = self
                            .session
                            .as_ref()
                            .map(|s| s.manager_id.clone())
                            .unwrap_or_default();
                        self.send_heartbeat(&body)
                    }
                    Err(delay) => return Ok(Some(delay)),
                }
            }
            other => other,
        };
        // A 200 whose body does not decode is a failed heartbeat too.
        let answer = match result {
            Ok(answer) => answer,
            Err(e) => return Ok(Some(self.heartbeat_failed(&e))),
        };
        match answer.parse() {
            Err(e) => Ok(Some(self.heartbeat_failed(&e))),
            Ok(resp) => {
                self.backoff.reset();
                {
                    let mut status = self.status();
                    status.heartbeat(true, Instant::now());
                    status.managed_proxies = managed;
                }
                log::debug!("heartbeat {sequence} accepted");
                let carried: Vec<String> = body_acks.iter().map(|a| a.command_id.clone()).collect();
                if !carried.is_empty() {
                    log::info!(
                        "{} pending acks delivered with the heartbeat",
                        carried.len()
                    );
                    self.delivered(&carried);
                }
                if let Some(secs) = resp.heartbeat_interval_seconds {
                    self.set_interval(secs);
                }
                let commands = resp.commands.unwrap_or_default();
                if commands.skipped > 0 {
                    log::warn!(
                        "the answer to heartbeat {sequence} holds {} commands; taking the first {}, skipping {} unacknowledged (the Control Plane sends them again)",
                        commands.taken.len() + commands.skipped,
                        wire::MAX_COMMANDS,
                        commands.skipped
                    );
                    crate::metrics::skipped_commands(commands.skipped);
                }
                for command in commands.taken {
                    // Probes are answered between two commands (and between
                    // two Kubernetes requests) once the last wait is 0.5 s old.
                    self.waiter.checkpoint();
                    if self.waiter.stop_requested() {
                        log::info!(
                            "stop requested; leaving the rest of the batch to the next Manager"
                        );
                        return Ok(None);
                    }
                    // A long batch keeps the lease: renewed between commands
                    // once a third of it has passed.
                    if self.elector.renewal_due() {
                        match self
                            .elector
                            .try_lead(&self.kube, lease::duration_for(self.interval))
                        {
                            Ok(true) => {}
                            Ok(false) => {
                                log::warn!("lost the lease; leaving the rest of the batch");
                                break;
                            }
                            Err(e) => log::warn!("cannot renew the lease mid-batch: {e}"),
                        }
                    }
                    if !self.elector.leading() {
                        log::warn!(
                            "the lease is past its renew deadline; leaving the rest of the batch"
                        );
                        break;
                    }
                    self.handle_command(command);
                }
                self.status().pending_acks =
                    self.state.ledger.iter().filter(|e| !e.delivered).count();
                Ok(Some(self.interval))
            }
        }
    }

    /// A failed heartbeat: counted, logged; the wait before the next one.
    fn heartbeat_failed(&mut self, e: &CpError) -> Duration {
        self.status().heartbeat(false, Instant::now());
        let decision = retry_decision(e, &mut self.backoff);
        match e.status() {
            Some(400 | 422) => {
                log::error!("heartbeat refused as malformed ({e}); not resending it")
            }
            _ => log::warn!("heartbeat failed: {e}"),
        }
        match decision {
            Retry::After(d) => {
                log::info!(
                    "next heartbeat in {}",
                    humantime::format_duration(round_ms(d))
                );
                d
            }
            Retry::NextInterval => self.interval,
        }
    }

    fn set_interval(&mut self, secs: u64) {
        let interval = clamp_interval(secs);
        if interval != self.interval {
            log::info!(
                "heartbeat interval is now {} (set by the Control Plane)",
                humantime::format_duration(interval)
            );
            self.interval = interval;
            self.status().interval = interval;
        }
    }

    fn send_heartbeat(
        &mut self,
        body: &HeartbeatRequest,
    ) -> Result<crate::cp::client::HeartbeatAnswer, CpError> {
        let Some(session) = self.session.as_ref() else {
            return Err(CpError::BadRequest);
        };
        self.cp.heartbeat(&session.token, body)
    }

    /// Connects; `Ok(Err(delay))` when it failed in a way worth retrying.
    fn connect(&mut self) -> Result<Result<(), Duration>, Fatal> {
        let body = ConnectRequest {
            protocol_version: wire::PROTOCOL_VERSION,
            manager: ManagerInfo {
                version: crate::VERSION.into(),
                build: crate::BUILD.into(),
                capabilities: CAPABILITIES.iter().map(|c| c.to_string()).collect(),
            },
            instance: self.instance.clone(),
            cluster: self.cluster.clone(),
        };
        match self.cp.connect(self.token.secret(), &body) {
            Ok(resp) if !wire::valid_session_token(&resp.session_token) => {
                // Never put it in a header (a CR or LF there would abort the
                // request builder): a failed connect, retried with backoff.
                let delay = self.backoff.next_delay();
                log::error!(
                    "the Control Plane answered connect with an unusable sessionToken ({} bytes, not an RFC 6750 b64token of at most 4096 characters); retrying in {}",
                    resp.session_token.len(),
                    humantime::format_duration(round_ms(delay))
                );
                Ok(Err(delay))
            }
            Ok(resp) => {
                if resp.environment_id != self.token.environment_id() {
                    return Err(Fatal::Binding(format!(
                        "the Control Plane answered for environment {} but the connect token is for {}",
                        resp.environment_id,
                        self.token.environment_id()
                    )));
                }
                let binding = Binding {
                    environment_id: resp.environment_id.clone(),
                    manager_id: resp.manager_id.clone(),
                    cluster_uid: self.cluster.uid.clone(),
                };
                if self.state.binding.as_ref() != Some(&binding) {
                    if let Some(old) = &self.state.binding {
                        log::warn!(
                            "binding changes from environment {} / manager {} to {} / {}",
                            old.environment_id,
                            old.manager_id,
                            binding.environment_id,
                            binding.manager_id
                        );
                    }
                    let new = binding.clone();
                    self.state = self.store.update(&self.kube, &self.state, move |s| {
                        s.binding = Some(new.clone())
                    })?;
                }
                let expires_at = resp.session_expires_at.as_deref().and_then(|t| {
                    humantime::parse_rfc3339(t)
                        .inspect_err(|_| log::warn!("ignoring unparsable sessionExpiresAt {t:?}"))
                        .ok()
                });
                log::info!(
                    "connected: environment {}, manager {}",
                    resp.environment_id,
                    resp.manager_id
                );
                self.status().bound = true;
                self.session = Some(Session {
                    token: Secret::new(resp.session_token),
                    manager_id: resp.manager_id,
                    expires_at,
                });
                if let Some(secs) = resp.heartbeat_interval_seconds {
                    self.set_interval(secs);
                }
                self.backoff.reset();
                Ok(Ok(()))
            }
            Err(e) => match (e.status(), e.code()) {
                (Some(403), code) => Err(Fatal::Binding(match code {
                    Some("environment_bound_elsewhere") => format!(
                        "environment {} is bound to another Kubernetes cluster (this one is {}); use the connect token issued for this cluster's environment, or release the binding in the Nexo console",
                        self.token.environment_id(),
                        self.cluster.uid
                    ),
                    Some("protocol_unsupported") => format!(
                        "the Control Plane does not accept protocol version {}; upgrade the Manager ({e})",
                        wire::PROTOCOL_VERSION
                    ),
                    _ => format!("the Control Plane refused the connection ({e})"),
                })),
                (Some(401), _) => {
                    log::error!(
                        "connect refused: the connect token of environment {} is unknown, expired or revoked ({e}); re-reading it",
                        self.token.environment_id()
                    );
                    if let TokenSource::File(_) = &self.cfg.token_source {
                        match read_connect_token(
                            &self.cfg.token_source,
                            self.cfg.environment_id.as_deref(),
                        ) {
                            Ok(t) => self.token = t,
                            Err(e) => log::error!("keeping the previous connect token: {e}"),
                        }
                    }
                    Ok(Err(self.backoff.next_delay()))
                }
                (Some(400 | 422), _) => Err(Fatal::Other(format!(
                    "the Control Plane refused the connect body as malformed: {e}"
                ))),
                _ => {
                    let delay = match retry_decision(&e, &mut self.backoff) {
                        Retry::After(d) => d,
                        Retry::NextInterval => self.interval,
                    };
                    log::warn!(
                        "connect failed: {e}; retrying in {}",
                        humantime::format_duration(round_ms(delay))
                    );
                    Ok(Err(delay))
                }
            },
        }
    }

    /// The acks whose delivery exhausted their attempts.
    fn pending_acks(&self) -> Vec<Ack> {
        let manager_id = self
            .session
            .as_ref()
            .map(|s| s.manager_id.as_str())
            .unwrap_or_default();
        self.state
            .ledger
            .iter()
            .filter(|e| !e.delivered)
            .map(|e| acks::ack(e, manager_id, e.attempts.max(1)))
            .collect()
    }

    fn heartbeat_body(&mut self) -> HeartbeatRequest {
        let configured = self.cfg.cluster_region.is_some() && self.cfg.cluster_zone.is_some();
        let listed_at = self.topology.as_ref().map(|(at, _, _)| *at);
        let mut inv = inventory::collect(
            &self.kube,
            &self.namespaces,
            self.token.environment_id(),
            !configured && topology_due(listed_at, Instant::now()),
        );
        if let Some(report) = self.check_self_rollout() {
            inv.errors.push(report);
        }
        if let Some(report) = &self.state_error {
            inv.errors.push(report.clone());
        }
        if inv.topology_read {
            self.topology = Some((Instant::now(), inv.region.clone(), inv.zone.clone()));
        } else if let Some((_, region, zone)) = &self.topology {
            inv.region = region.clone();
            inv.zone = zone.clone();
        }
        self.sequence += 1;
        HeartbeatRequest {
            manager_id: self
                .session
                .as_ref()
                .map(|s| s.manager_id.clone())
                .unwrap_or_default(),
            sequence: self.sequence,
            sent_at: now_rfc3339(),
            manager: HeartbeatManager {
                version: crate::VERSION.into(),
                build: crate::BUILD.into(),
                protocol_version: wire::PROTOCOL_VERSION,
                capabilities: CAPABILITIES.iter().map(|c| c.to_string()).collect(),
            },
            proxy_image: self.cfg.proxy_image.to_string(),
            managed_proxy_count: inv.deployments.len(),
            deployments: inv.deployments,
            cluster: ClusterInfo {
                uid: self.cluster.uid.clone(),
                name: self.cfg.cluster_name.clone(),
                region: self.cfg.cluster_region.clone().or(inv.region),
                zone: self.cfg.cluster_zone.clone().or(inv.zone),
                kubernetes_version: self.cluster.kubernetes_version.clone(),
            },
            pending_acks: self.pending_acks(),
            inventory_errors: inv.errors,
        }
    }

    /// Reads the Manager's own Deployment when due; a stalled upgrade's
    /// report, or why the Deployment could not be read.
    fn check_self_rollout(&mut self) -> Option<String> {
        let now = Instant::now();
        if !self.self_rollout.due(now) {
            return None;
        }
        let (ns, name) = (&self.instance.namespace, &self.cfg.self_deployment);
        let path = format!("/apis/apps/v1/namespaces/{ns}/deployments/{name}");
        match self.kube.get_opt::<SelfDeployment>(&path) {
            Ok(Some(d)) => {
                self.self_rollout
                    .observe(&d, &format!("{ns}/{name}"), now, self.interval)
            }
            Ok(None) => {
                // Not run from a Deployment (development, tests).
                self.self_rollout.unreadable(now);
                None
            }
            Err(e) if e.status() == Some(403) => {
                // RBAC without the shipped `get` on it: the watch is left
                // out, as region and zone are when nodes may not be listed.
                log::debug!("own deployment {ns}/{name} may not be read: {e}");
                self.self_rollout.unreadable(now);
                None
            }
            Err(e) => {
                self.self_rollout.unreadable(now);
                Some(format!("own deployment {ns}/{name}: {e}"))
            }
        }
    }

    /// Validates, executes (once: a recorded id is only acknowledged again),
    /// records and acknowledges one command.
    fn handle_command(&mut self, raw: &RawValue) {
        let started = Instant::now();
        let parsed = commands::parse(raw.get(), CAPABILITIES, &self.namespaces);
        let id = match &parsed {
            Ok(cmd) => cmd.id.clone(),
            Err(Refusal::Failed { id, .. }) => id.clone(),
            Err(Refusal::NoId(why)) => {
                // Not its text: a command may carry Secret data.
                log::error!(
                    "skipping a command without a valid id ({why}; {} bytes)",
                    raw.get().len()
                );
                crate::metrics::refused("no_id");
                return;
            }
        };
        let _scope = crate::logging::CommandScope::enter(
            &id,
            parsed
                .as_ref()
                .ok()
                .and_then(|c| c.action.deployment_name()),
        );
        if let Some(entry) = self.state.find(&id).cloned() {
            log::info!(
                "command {id} already finished ({}); acknowledging its recorded result again",
                entry.result
            );
            self.deliver(entry);
            return;
        }
        let class = match &parsed {
            Ok(cmd) => cmd.action.class(),
            Err(_) => "invalid",
        };
        let outcome = match parsed {
            Ok(cmd) => {
                log::info!("command {id}: executing");
                let ctx = execute::Context {
                    kube: &self.kube,
                    environment_id: self.token.environment_id(),
                    allow_legacy_adoption: self.cfg.allow_legacy_adoption,
                    proxy_image: &self.cfg.proxy_image,
                    namespaces: &self.namespaces,
                    own_namespace: &self.instance.namespace,
                    self_deployment: &self.cfg.self_deployment,
                };
                execute::run(&ctx, &cmd)
            }
            // A NoId refusal returned above; both carry their message.
            Err(Refusal::Failed { message, .. } | Refusal::NoId(message)) => {
                crate::metrics::refused(crate::metrics::refusal_reason(&message));
                Outcome::failed(message, Vec::new())
            }
        };
        if !outcome.applied && outcome.message.starts_with("refused") {
            crate::metrics::refused("ownership");
        }
        let result = if outcome.applied { "applied" } else { "failed" };
        if outcome.applied && class == "upgrade" {
            self.self_rollout.upgrade_applied();
        }
        self.status().command(class, result);
        if outcome.applied {
            log::info!("command {id}: {result}: {}", outcome.message);
        } else {
            log::warn!("command {id}: {result}: {}", outcome.message);
        }
        let entry = LedgerEntry {
            command_id: id.clone(),
            result: result.into(),
            message: outcome.message,
            resources: outcome.resources,
            completed_at: now_rfc3339(),
            delivered: false,
            attempts: 0,
            more_resources: Default::default(),
        };
        // Recorded before the ack: a crash from here on neither re-executes
        // the command nor loses its ack. The ledger keeps the entry cut to
        // its budget; this first ack carries every resource.
        let record = entry
            .clone()
            .bounded(state::MESSAGE_MAX, state::RESOURCES_MAX);
        if let Err(e) = self.store_update(move |s| s.record(record.clone())) {
            log::error!("command {id}: cannot record the result in the state secret: {e}");
            self.state.record(entry.clone());
            self.state_error = Some(format!(
                "state secret: the result of command {id} is not recorded: {e}"
            ));
        }
        self.deliver(entry);
        crate::metrics::command_duration(class, started.elapsed());
    }

    /// Delivers one ack: up to [`acks::ATTEMPTS`] attempts with backoff, then
    /// it waits in `pendingAcks` of the following heartbeats.
    fn deliver(&mut self, entry: LedgerEntry) {
        let id = entry.command_id.clone();
        let mut jitter = Jitter::from_entropy();
        let mut reconnected = false;
        let mut attempt = entry.attempts;
        for n in 1..=acks::ATTEMPTS {
            attempt = entry.attempts + n;
            let Some(session) = self.session.as_ref() else {
                break;
            };
            let ack = acks::ack(&entry, &session.manager_id, attempt);
            self.status().ack_attempts += 1;
            match self.cp.ack(&session.token, &ack) {
                Ok(AckOutcome::Forgotten) => {
                    log::warn!(
                        "command {id}: the Control Plane does not know it (404); its ack counts as delivered"
                    );
                    return self.delivered(&[id]);
                }
                Ok(outcome) => {
                    log::info!("command {id}: ack delivered on attempt {attempt} ({outcome:?})");
                    return self.delivered(&[id]);
                }
                Err(e) if e.status() == Some(401) && !reconnected => {
                    reconnected = true;
                    log::info!(
                        "command {id}: session expired while acknowledging; connecting again"
                    );
                    self.session = None;
                    if !matches!(self.connect(), Ok(Ok(()))) {
                        break;
                    }
                }
                Err(e) if matches!(e.status(), Some(400 | 422)) => {
                    log::error!("command {id}: ack refused as malformed ({e}); not resending it");
                    return self.delivered(&[id]);
                }
                Err(e) if n < acks::ATTEMPTS => {
                    let delay = acks::delay(n, &mut jitter);
                    log::warn!(
                        "command {id}: ack attempt {attempt} failed: {e}; retrying in {delay:?}"
                    );
                    if matches!(self.waiter.wait(delay), Ok(Wake::Stop)) {
                        log::info!(
                            "command {id}: stop requested; the ack goes with the next Manager's heartbeats"
                        );
                        break;
                    }
                }
                Err(e) => log::warn!("command {id}: ack attempt {attempt} failed: {e}"),
            }
        }
        log::warn!(
            "command {id}: ack not delivered after {attempt} attempts; it goes with the next heartbeats"
        );
        let changed = id.clone();
        self.state.set_attempts(&changed, attempt);
        self.persist(move |s| s.set_attempts(&changed, attempt));
    }

    /// Marks acks delivered and persists that.
    fn delivered(&mut self, ids: &[String]) {
        self.state.mark_delivered(ids);
        let ids = ids.to_vec();
        self.persist(move |s| s.mark_delivered(&ids));
    }

    /// Persists a change to the state; a failure is logged and reported
    /// in the next heartbeat, the change stays in memory.
    fn persist(&mut self, change: impl Fn(&mut State)) {
        if let Err(e) = self.store_update(change) {
            log::error!("cannot update the state secret: {e}");
            // A result not recorded, reported already, stays the report.
            self.state_error
                .get_or_insert_with(|| format!("state secret: cannot write it: {e}"));
        }
    }

    /// Writes a change to the state, trying once more after a pause when
    /// the first try (the client's own retries included) fails. On success
    /// the state in memory is the one written and a reported failure is
    /// cleared.
    fn store_update(&mut self, change: impl Fn(&mut State)) -> Result<(), StateError> {
        let mut result = self.store.update(&self.kube, &self.state, &change);
        if let Err(e) = &result {
            log::warn!("cannot write the state secret: {e}; trying again in 1s");
            if matches!(self.waiter.wait(Duration::from_secs(1)), Ok(Wake::Stop)) {
                crate::metrics::state_write_failed();
                return result.map(|_| ());
            }
            result = self.store.update(&self.kube, &self.state, &change);
        }
        match result {
            Ok(state) => {
                self.state = state;
                self.state_error = None;
                Ok(())
            }
            Err(e) => {
                crate::metrics::state_write_failed();
                Err(e)
            }
        }
    }
}

/// Retries a Kubernetes read at start-up while it fails transiently;
/// interruptible by SIGTERM.
fn retry_kube<T>(
    waiter: &Waiter,
    backoff: &mut Backoff,
    what: &str,
    mut f: impl FnMut() -> Result<T, kube::Error>,
) -> Result<T, Fatal> {
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) if e.is_transient() => {
                let delay = retry_after_delay(e.retry_after(), backoff);
                log::warn!(
                    "cannot {what} yet: {e}; retrying in {}",
                    humantime::format_duration(round_ms(delay))
                );
                if let Ok(Wake::Stop) = waiter.wait(delay) {
                    return Err(Fatal::Other(format!("stopped before being able to {what}")));
                }
            }
            Err(e) => return Err(Fatal::Other(format!("cannot {what}: {e}"))),
        }
    }
}

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backoff::Jitter;

    #[test]
    fn nodes_are_listed_first_then_every_five_minutes() {
        let now = Instant::now();
        assert!(topology_due(None, now));
        assert!(!topology_due(Some(now), now));
        assert!(!topology_due(
            Some(now),
            now + TOPOLOGY_REFRESH - Duration::from_secs(1)
        ));
        assert!(topology_due(Some(now), now + TOPOLOGY_REFRESH));
    }

    #[test]
    fn interval_override_is_clamped() {
        assert_eq!(clamp_interval(1), Duration::from_secs(5));
        assert_eq!(clamp_interval(30), Duration::from_secs(30));
        assert_eq!(clamp_interval(100_000), Duration::from_secs(600));
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
            retry_decision(&status(429, Some(Duration::from_secs(3))), &mut b),
            Retry::After(Duration::from_secs(3))
        );
        assert_eq!(
            retry_decision(&status(503, Some(Duration::from_secs(9))), &mut b),
            Retry::After(Duration::from_secs(9))
        );
        assert_eq!(
            retry_decision(&status(400, None), &mut b),
            Retry::NextInterval
        );
        assert_eq!(
            b.failures(),
            2,
            "429 and 503 advance the backoff, even with a Retry-After; 400 does not"
        );
        assert!(
            matches!(retry_decision(&status(500, None), &mut b), Retry::After(d) if d <= Duration::from_secs(4))
        );
        assert!(
            matches!(retry_decision(&status(429, None), &mut b), Retry::After(d) if d >= Duration::from_secs(1) && d <= Duration::from_secs(8))
        );
        assert_eq!(b.failures(), 4);
    }

    #[test]
    fn exit_codes() {
        assert_eq!(Fatal::Config(String::new()).exit_code(), 2);
        assert_eq!(Fatal::Binding(String::new()).exit_code(), 3);
        assert_eq!(Fatal::Other(String::new()).exit_code(), 1);
    }
}
