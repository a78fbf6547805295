//! `/healthz`, `/readyz` and `/metrics`, answered from every wait's
//! `poll(2)` on the same thread (see `wait.rs`). Connections are accepted
//! and read without blocking: each waits, with what it sent so far, in the
//! same `poll(2)` as everything else until its request head is complete
//! (then it is answered and closed), it has waited [`PENDING_TIMEOUT`], or
//! room is needed for a newer one ([`MAX_PENDING`]). A silent or slow client
//! costs no time at all; the answers of one wake-up share one budget
//! ([`SERVE_BUDGET`]), however many clients there are.
//!
//! Readiness ([`Health::readiness`]) is a pure function of the status the
//! loop keeps and the clock:
//! - a leader is ready when bound and its last heartbeat succeeded, or has
//!   been failing for less than [`FAILING_GRACE`] intervals;
//! - a standby is ready when it could take over: its configuration is valid
//!   (it runs), and its last standby check (the Lease read with its
//!   credentials, a TLS handshake with the Control Plane) succeeded within
//!   the last interval, plus the time a check may take
//!   ([`Health::check_time`]). So the new pod of a rolling update becomes
//!   Ready while the old one still leads, and the update can proceed.

use std::cell::RefCell;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::words::AckResult;

/// The time all probe connections of one wake-up may take together.
pub const SERVE_BUDGET: Duration = Duration::from_millis(250);
/// Largest request head read.
pub const MAX_REQUEST: usize = 4096;
/// Connections accepted per wake-up, so a flood cannot hold the loop.
pub const MAX_PER_WAKE: usize = 64;
/// Connections waiting for their request head at once; the oldest is
/// closed to make room for a newer one, so silent clients cannot keep a
/// kubelet's probe out.
pub const MAX_PENDING: usize = 128;
/// How long a connection may take to send its request head.
pub const PENDING_TIMEOUT: Duration = Duration::from_secs(2);
/// A leader whose heartbeats have been failing for this many intervals is
/// no longer ready.
pub const FAILING_GRACE: u32 = 3;

/// What this process is doing, for readiness.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Reading the cluster identity and state; not yet in the loop.
    #[default]
    Starting,
    /// Another pod holds the lease (or it could not be read).
    Standby,
    /// This pod holds the lease.
    Leader,
}

/// What the loop reports to the probes: readiness inputs, and the counters
/// and gauges of `/metrics`.
#[derive(Debug, Default, Clone)]
pub struct Health {
    /// Leader, standby, or still starting.
    pub role: Role,
    /// The heartbeat interval in force.
    pub interval: Duration,
    /// The longest one standby check may take (the CP request timeout): a
    /// standby is ready while its last check succeeded within the interval
    /// plus this.
    pub check_time: Duration,
    /// When the last standby check succeeded.
    pub standby_ok_at: Option<Instant>,
    /// When the first of the heartbeats failing now failed; `None` while
    /// they succeed.
    pub heartbeat_failing_since: Option<Instant>,
    /// Heartbeats answered 200.
    pub heartbeats_ok: u64,
    /// Heartbeats that failed.
    pub heartbeats_failed: u64,
    /// Finished commands by (class, result).
    pub commands: Vec<((String, String), u64)>,
    /// Ack delivery attempts.
    pub ack_attempts: u64,
    /// Acks waiting in `pendingAcks`.
    pub pending_acks: usize,
    /// Managed deployments in the last inventory.
    pub managed_proxies: usize,
    /// Unix time of the last successful heartbeat.
    pub last_heartbeat_ok: Option<SystemTime>,
    /// Connected to the CP with a session.
    pub bound: bool,
    /// A heartbeat is out, which the CP may hold for an interval: a leader
    /// bound and waiting on its first answer is ready.
    pub heartbeat_out: bool,
}

impl Health {
    /// Counts one finished command.
    pub fn command(&mut self, class: &str, result: AckResult) {
        let key = (class.to_owned(), result.as_str().to_owned());
        match self.commands.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n += 1,
            None => self.commands.push((key, 1)),
        }
    }

    /// Whether `/readyz` answers 200 at `now`, and if not, why.
    pub fn readiness(&self, now: Instant) -> Result<(), &'static str> {
        match self.role {
            Role::Starting => Err("starting: reading the cluster identity and state"),
            Role::Standby => match self.standby_ok_at {
                Some(at)
                    if now.saturating_duration_since(at) <= self.interval + self.check_time =>
                {
                    Ok(())
                }
                Some(_) => Err(
                    "standby: no successful lease read and control plane handshake within the last interval",
                ),
                None => Err(
                    "standby: the lease read and control plane handshake have not succeeded yet",
                ),
            },
            Role::Leader if !self.bound => Err("leader: not bound to the control plane"),
            Role::Leader => match self.heartbeat_failing_since {
                None if self.heartbeats_ok > 0 || self.heartbeat_out => Ok(()),
                None => Err("leader: no heartbeat has succeeded yet"),
                Some(since)
                    if now.saturating_duration_since(since) < self.interval * FAILING_GRACE =>
                {
                    Ok(())
                }
                Some(_) => Err("leader: heartbeats have been failing for 3 intervals"),
            },
        }
    }

    /// Records a heartbeat's outcome.
    pub fn heartbeat(&mut self, ok: bool, now: Instant) {
        if ok {
            self.heartbeats_ok += 1;
            self.last_heartbeat_ok = Some(SystemTime::now());
            self.heartbeat_failing_since = None;
        } else {
            self.heartbeats_failed += 1;
            self.heartbeat_failing_since.get_or_insert(now);
        }
    }

    /// The Prometheus text exposition: one block per metric family, in
    /// the order `/metrics` lists them; long, flat on purpose.
    pub fn render(&self) -> String {
        use crate::metrics::Type;
        let mut out = crate::metrics::Exposition::default();
        let build = "nexo_manager_build_info";
        out.header(build, Type::Gauge, "Version and build of this Manager.");
        out.sample(
            build,
            &[("version", crate::VERSION), ("build", crate::BUILD)],
            1,
        );
        let heartbeats = "nexo_manager_heartbeats_total";
        out.header(heartbeats, Type::Counter, "Heartbeats sent, by outcome.");
        out.sample(heartbeats, &[("outcome", "ok")], self.heartbeats_ok);
        out.sample(heartbeats, &[("outcome", "failed")], self.heartbeats_failed);
        let commands = "nexo_manager_commands_total";
        out.header(
            commands,
            Type::Counter,
            "Finished commands, by class and result.",
        );
        let have: Vec<((&str, &str), u64)> = self
            .commands
            .iter()
            .map(|((c, r), n)| ((c.as_str(), r.as_str()), *n))
            .collect();
        let known = crate::metrics::COMMAND_CLASSES.iter().flat_map(|c| {
            crate::metrics::COMMAND_RESULTS
                .iter()
                .map(move |r| (*c, *r))
        });
        for ((class, result), n) in crate::metrics::with_known(known, &have) {
            out.sample(commands, &[("class", class), ("result", result)], n);
        }
        out.single(
            "nexo_manager_ack_attempts_total",
            Type::Counter,
            "Ack delivery attempts.",
            self.ack_attempts,
        );
        out.single(
            "nexo_manager_pending_acks",
            Type::Gauge,
            "Acks waiting for a heartbeat to carry them.",
            self.pending_acks,
        );
        out.single(
            "nexo_manager_managed_proxies",
            Type::Gauge,
            "Managed deployments in the last inventory.",
            self.managed_proxies,
        );
        let last = self
            .last_heartbeat_ok
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        out.single(
            "nexo_manager_last_heartbeat_timestamp_seconds",
            Type::Gauge,
            "Unix time of the last successful heartbeat.",
            last,
        );
        out.single(
            "nexo_manager_leader",
            Type::Gauge,
            "1 while this process holds the lease and acts, else 0.",
            u8::from(self.role == Role::Leader),
        );
        crate::metrics::render(&mut out);
        out.into_string()
    }
}

/// A connection waiting for its request head.
#[derive(Debug)]
struct Pending {
    stream: TcpStream,
    head: Vec<u8>,
    since: Instant,
}

/// The probe listener and the connections waiting for their request head.
#[derive(Debug)]
pub struct Probe {
    listener: TcpListener,
    pending: RefCell<Vec<Pending>>,
}

impl Probe {
    /// Binds `addr`, non-blocking.
    pub fn bind(addr: SocketAddr) -> io::Result<Probe> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        Ok(Probe {
            listener,
            pending: RefCell::new(Vec::new()),
        })
    }

    /// The listener, for the wait's `poll(2)`.
    pub fn listener(&self) -> &TcpListener {
        &self.listener
    }

    /// The connections waiting for their request head, for the wait's
    /// `poll(2)`.
    pub fn pending_fds(&self) -> Vec<RawFd> {
        self.pending
            .borrow()
            .iter()
            .map(|p| p.stream.as_raw_fd())
            .collect()
    }

    /// How many connections wait for their request head.
    pub fn pending(&self) -> usize {
        self.pending.borrow().len()
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accepts the connections waiting now (at most [`MAX_PER_WAKE`]), reads
    /// what every pending connection has sent without blocking, answers
    /// the complete requests within [`SERVE_BUDGET`] together, and closes
    /// the connections that waited [`PENDING_TIMEOUT`].
    pub fn serve(&self, status: &Health, now: Instant) {
        let deadline = Instant::now() + SERVE_BUDGET;
        let mut pending = self.pending.borrow_mut();
        for _ in 0..MAX_PER_WAKE {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    if pending.len() >= MAX_PENDING {
                        // The oldest has had the longest to speak.
                        pending.remove(0);
                    }
                    pending.push(Pending {
                        stream,
                        head: Vec::new(),
                        since: Instant::now(),
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    crate::debug!(err:% = e; "probe accept failed");
                    break;
                }
            }
        }
        pending.retain_mut(|p| match read_head(p) {
            Head::Waiting => p.since.elapsed() < PENDING_TIMEOUT,
            Head::Closed => false,
            Head::Complete => {
                if let Err(e) = answer(&mut p.stream, &p.head, status, now, deadline) {
                    crate::debug!(err:% = e; "probe request failed");
                }
                false
            }
        });
    }
}

/// Where a pending connection's request head stands.
enum Head {
    /// More may come.
    Waiting,
    /// Complete (or as long as allowed, or not a GET/HEAD): answer it.
    Complete,
    /// The client went away, or reading failed.
    Closed,
}

/// Reads what `p`'s client sent, without blocking.
fn read_head(p: &mut Pending) -> Head {
    let mut buf = [0u8; 1024];
    loop {
        let room = (MAX_REQUEST - p.head.len()).min(buf.len());
        match p.stream.read(&mut buf[..room]) {
            Ok(0) => return Head::Closed,
            Ok(n) => {
                p.head.extend_from_slice(&buf[..n]);
                let h = &p.head;
                let done = h.len() >= MAX_REQUEST
                    || h.windows(4).any(|w| w == b"\r\n\r\n")
                    || (h.contains(&b'\n') && !h.starts_with(b"GET ") && !h.starts_with(b"HEAD "));
                if done {
                    return Head::Complete;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Head::Waiting,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return Head::Closed,
        }
    }
}

/// The status and body for a request line's path.
pub fn route(path: &str, status: &Health, now: Instant) -> (u16, &'static str, String) {
    match path {
        "/healthz" => (200, "text/plain", "ok\n".into()),
        "/readyz" => match status.readiness(now) {
            Ok(()) => (200, "text/plain", "ready\n".into()),
            Err(why) => (503, "text/plain", format!("not ready: {why}\n")),
        },
        "/metrics" => (200, "text/plain; version=0.0.4", status.render()),
        _ => (404, "text/plain", "not found\n".into()),
    }
}

fn answer(
    stream: &mut TcpStream,
    head: &[u8],
    status: &Health,
    now: Instant,
    deadline: Instant,
) -> io::Result<()> {
    let head = String::from_utf8_lossy(head);
    let mut parts = head.split(' ');
    let (status, content_type, body) = match (parts.next(), parts.next()) {
        (Some("GET" | "HEAD"), Some(path)) => {
            route(path.split('?').next().unwrap_or(""), status, now)
        }
        _ => (400, "text/plain", "bad request\n".to_owned()),
    };
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        503 => "Service Unavailable",
        _ => "Bad Request",
    };
    let head_only = head.starts_with("HEAD ");
    // The answer is small; a client that does not read it gets what is
    // left of the wake-up's budget, at least 50 ms.
    stream.set_nonblocking(false)?;
    stream.set_write_timeout(Some(
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(50)),
    ))?;
    let mut reply = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if !head_only {
        reply.push_str(&body);
    }
    stream.write_all(reply.as_bytes())?;
    stream.flush()
}

#[cfg(test)]
#[path = "probe_tests.rs"]
mod tests;
