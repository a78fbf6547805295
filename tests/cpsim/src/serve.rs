//! The server side: one connection served request by request (faults
//! injected, the request logged, the answer written), the protocol's
//! endpoints routed to [`crate::protocol`], and the admin API.

use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};

use crate::http::{self, Response};
use crate::inventory::Confirming;
use crate::protocol;
use crate::{Endpoint, FaultAction, LoggedRequest, Shared, lock};

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

pub(crate) fn log_dump(log: &[LoggedRequest]) -> String {
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

pub(crate) fn serve_connection(
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
        ("POST", "/_sim/inventory") => {
            // `confirm=never|always|late`, `lose=N`, `resync=true`.
            let mut state = lock(&shared.state);
            let inventory = &mut state.inventory;
            for kv in query.split('&') {
                match kv.split_once('=') {
                    Some(("confirm", "never")) => inventory.confirming = Confirming::Never,
                    Some(("confirm", "always")) => inventory.confirming = Confirming::Always,
                    Some(("confirm", "late")) => inventory.confirming = Confirming::Late,
                    Some(("lose", n)) => inventory.lose = n.parse().unwrap_or(0),
                    Some(("resync", "true")) => inventory.resync = true,
                    _ => {
                        return protocol::error(
                            400,
                            "bad_query",
                            "confirm=never|always|late, lose=N, resync=true",
                        );
                    }
                }
            }
            Response::text(204, "")
        }
        ("GET", "/_sim/inventory") => {
            let state = lock(&shared.state);
            let i = &state.inventory;
            Response::json(
                200,
                &json!({"deployments": i.last(), "releaseContract": i.last_contract(),
                        "deltas": i.deltas, "compared": i.compared, "mismatches": i.mismatches}),
            )
        }
        _ => protocol::error(404, "not_found", "no such admin endpoint"),
    }
}
