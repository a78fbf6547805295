//! `/healthz`, `/readyz` and `/metrics`, answered from the wait's `poll(2)`
//! on the same thread. Each request is read with a short timeout and a size
//! limit, answered and closed, so a slow or hostile client costs the loop at
//! most [`READ_TIMEOUT`] per connection.

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long a probe client may take to send its request.
pub const READ_TIMEOUT: Duration = Duration::from_millis(250);
/// Largest request head read.
pub const MAX_REQUEST: usize = 4096;
/// Connections answered per wake-up, so a flood cannot hold the loop.
pub const MAX_PER_WAKE: usize = 16;

/// Counters and gauges of `/metrics`.
#[derive(Debug, Default, Clone)]
pub struct Metrics {
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
    /// The last heartbeat succeeded.
    pub last_heartbeat_succeeded: bool,
}

impl Metrics {
    /// Counts one finished command.
    pub fn command(&mut self, class: &str, result: &str) {
        let key = (class.to_owned(), result.to_owned());
        match self.commands.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n += 1,
            None => self.commands.push((key, 1)),
        }
    }

    /// Whether `/readyz` answers 200.
    pub fn ready(&self) -> bool {
        self.bound && self.last_heartbeat_succeeded
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, lines: &[(String, String)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, value) in lines {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        let one = |v: String| vec![(String::new(), v)];
        metric(
            "nexo_manager_build_info",
            "gauge",
            "Version and build of this Manager.",
            &[(
                format!(
                    "{{version=\"{}\",build=\"{}\"}}",
                    crate::VERSION,
                    crate::BUILD
                ),
                "1".into(),
            )],
        );
        metric(
            "nexo_manager_heartbeats_total",
            "counter",
            "Heartbeats sent, by outcome.",
            &[
                ("{outcome=\"ok\"}".into(), self.heartbeats_ok.to_string()),
                (
                    "{outcome=\"failed\"}".into(),
                    self.heartbeats_failed.to_string(),
                ),
            ],
        );
        let commands: Vec<(String, String)> = self
            .commands
            .iter()
            .map(|((class, result), n)| {
                (
                    format!("{{class=\"{}\",result=\"{result}\"}}", escape(class)),
                    n.to_string(),
                )
            })
            .collect();
        metric(
            "nexo_manager_commands_total",
            "counter",
            "Finished commands, by class and result.",
            &commands,
        );
        metric(
            "nexo_manager_ack_attempts_total",
            "counter",
            "Ack delivery attempts.",
            &one(self.ack_attempts.to_string()),
        );
        metric(
            "nexo_manager_pending_acks",
            "gauge",
            "Acks waiting for a heartbeat to carry them.",
            &one(self.pending_acks.to_string()),
        );
        metric(
            "nexo_manager_managed_proxies",
            "gauge",
            "Managed deployments in the last inventory.",
            &one(self.managed_proxies.to_string()),
        );
        let last = self
            .last_heartbeat_ok
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_secs());
        metric(
            "nexo_manager_last_heartbeat_timestamp_seconds",
            "gauge",
            "Unix time of the last successful heartbeat.",
            &one(last.to_string()),
        );
        out
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The probe listener.
#[derive(Debug)]
pub struct Probe {
    listener: TcpListener,
}

impl Probe {
    /// Binds `addr`, non-blocking.
    pub fn bind(addr: SocketAddr) -> io::Result<Probe> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        Ok(Probe { listener })
    }

    /// The listener, for the wait's `poll(2)`.
    pub fn listener(&self) -> &TcpListener {
        &self.listener
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Answers the connections waiting now (at most [`MAX_PER_WAKE`]).
    pub fn serve(&self, metrics: &Metrics) {
        for _ in 0..MAX_PER_WAKE {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if let Err(e) = answer(stream, metrics) {
                        log::debug!("probe request: {e}");
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    log::debug!("probe accept: {e}");
                    return;
                }
            }
        }
    }
}

/// The status and body for a request line's path.
pub fn route(path: &str, metrics: &Metrics) -> (u16, &'static str, String) {
    match path {
        "/healthz" => (200, "text/plain", "ok\n".into()),
        "/readyz" if metrics.ready() => (200, "text/plain", "ready\n".into()),
        "/readyz" => (
            503,
            "text/plain",
            "not ready: not bound or the last heartbeat failed\n".into(),
        ),
        "/metrics" => (200, "text/plain; version=0.0.4", metrics.render()),
        _ => (404, "text/plain", "not found\n".into()),
    }
}

fn answer(mut stream: TcpStream, metrics: &Metrics) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(READ_TIMEOUT))?;
    stream.set_write_timeout(Some(READ_TIMEOUT))?;
    let mut buf = [0u8; MAX_REQUEST];
    let mut len = 0;
    // Read until the end of the request head, the size limit, or the timeout.
    while len < buf.len() && !buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) => return Err(e),
        }
        if buf[..len].contains(&b'\n')
            && !buf[..len].starts_with(b"GET ")
            && !buf[..len].starts_with(b"HEAD ")
        {
            break;
        }
    }
    let head = String::from_utf8_lossy(&buf[..len]);
    let mut parts = head.split(' ');
    let (status, content_type, body) = match (parts.next(), parts.next()) {
        (Some("GET" | "HEAD"), Some(path)) => route(path.split('?').next().unwrap_or(""), metrics),
        _ => (400, "text/plain", "bad request\n".to_owned()),
    };
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        503 => "Service Unavailable",
        _ => "Bad Request",
    };
    let head_only = head.starts_with("HEAD ");
    write!(
        stream,
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    if !head_only {
        stream.write_all(body.as_bytes())?;
    }
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let mut m = Metrics::default();
        assert_eq!(route("/healthz", &m).0, 200);
        assert_eq!(route("/readyz", &m).0, 503);
        m.bound = true;
        m.last_heartbeat_succeeded = true;
        assert_eq!(route("/readyz", &m).0, 200);
        assert_eq!(route("/nope", &m).0, 404);
    }

    #[test]
    fn metrics_text() {
        let mut m = Metrics {
            heartbeats_ok: 3,
            managed_proxies: 2,
            ..Metrics::default()
        };
        m.command("deploy", "applied");
        m.command("deploy", "applied");
        m.command("rollout", "failed");
        let text = m.render();
        assert!(
            text.contains("nexo_manager_heartbeats_total{outcome=\"ok\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("nexo_manager_commands_total{class=\"deploy\",result=\"applied\"} 2\n")
        );
        assert!(
            text.contains("nexo_manager_commands_total{class=\"rollout\",result=\"failed\"} 1\n")
        );
        assert!(text.contains("nexo_manager_managed_proxies 2\n"));
        assert!(text.contains("# TYPE nexo_manager_pending_acks gauge\n"));
    }

    #[test]
    fn a_silent_client_costs_at_most_the_read_timeout() {
        let probe = Probe::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = probe.local_addr().unwrap();
        let _silent = TcpStream::connect(addr).unwrap();
        let mut ok = TcpStream::connect(addr).unwrap();
        ok.write_all(b"GET /healthz HTTP/1.1\r\n\r\n").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let start = std::time::Instant::now();
        probe.serve(&Metrics::default());
        assert!(start.elapsed() < READ_TIMEOUT * 3, "{:?}", start.elapsed());
        let mut reply = String::new();
        ok.read_to_string(&mut reply).unwrap();
        assert!(
            reply.starts_with("HTTP/1.1 200 OK") && reply.ends_with("ok\n"),
            "{reply}"
        );
    }
}
