//! A TLS proxy in front of the test bed's API server that injects the
//! faults a flapping load balancer or a struggling API server makes: in
//! the namespaces it is told, every watch ends at once (`End`), or
//! answers 410 Gone (`Gone`); and, when told, every Event write answers
//! 504 after a delay (`slow_events`). Every other request, watches
//! included, goes to the API server as the test bed's administrator. It
//! counts the watches and lists it was asked, by namespace.

use std::collections::BTreeMap;
use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use nexo_cpsim::http::{Response, read_request, write_response};
use nexo_manager::kube::client::{Body, Method};
use serde_json::json;

use super::Testbed;

/// What the proxy does to the watches of a namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchFault {
    /// The watch answers 200 and ends at once, with no event.
    End,
    /// The watch answers one `ERROR` event, 410 Gone, and ends.
    Gone,
}

/// A running proxy.
pub struct ApiProxy {
    /// Its address.
    pub addr: SocketAddr,
    ca_pem: String,
    /// (namespace, "watch" | "list" | "event") → requests.
    counts: Arc<Mutex<BTreeMap<(String, &'static str), usize>>>,
}

/// What the proxy does wrong.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// To the watches of a namespace.
    pub watches: BTreeMap<String, WatchFault>,
    /// Every Event write waits this long, then answers 504.
    pub slow_events: Option<std::time::Duration>,
    /// The first create (a POST, not a dry run) in a collection whose path
    /// ends with this answers 500, as an API server failing mid-deploy
    /// does (a create is not retried); the next ones pass.
    pub fail_create_once: Option<String>,
}

impl ApiProxy {
    /// Starts on a free loopback port, with watch `faults` by namespace.
    pub fn start(tb: &'static Testbed, faults: BTreeMap<String, WatchFault>) -> ApiProxy {
        ApiProxy::with(
            tb,
            Faults {
                watches: faults,
                ..Faults::default()
            },
        )
    }

    /// Starts on a free loopback port, with `faults`.
    pub fn with(tb: &'static Testbed, faults: Faults) -> ApiProxy {
        let tls = nexo_cpsim::tls::generate(&[]);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let counts = Arc::new(Mutex::new(BTreeMap::new()));
        let faults = Arc::new(faults);
        let failed_once = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (config, c) = (tls.config.clone(), counts.clone());
        std::thread::spawn(move || {
            for tcp in listener.incoming().flatten() {
                let (config, counts, faults) = (config.clone(), c.clone(), faults.clone());
                let failed_once = failed_once.clone();
                std::thread::spawn(move || {
                    if let Some(stream) = nexo_cpsim::tls::server_stream(&config, tcp) {
                        serve(tb, stream, &faults, &counts, &failed_once);
                    }
                });
            }
        });
        ApiProxy {
            addr,
            ca_pem: tls.ca_pem,
            counts,
        }
    }

    /// A kubeconfig that reaches the API server through the proxy.
    pub fn kubeconfig(&self, dir: &std::path::Path) -> PathBuf {
        let ca = dir.join("apiproxy-ca.pem");
        std::fs::write(&ca, &self.ca_pem).unwrap();
        let path = dir.join("apiproxy.kubeconfig");
        let kc = json!({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "proxy", "cluster": {"server": format!("https://{}", self.addr),
                          "certificate-authority": ca}}],
            "users": [{"name": "proxied", "user": {"token": "through-the-proxy"}}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxied"}}],
            "current-context": "proxy"
        });
        std::fs::write(&path, serde_json::to_vec_pretty(&kc).unwrap()).unwrap();
        path
    }

    /// How many requests of `what` (`watch` or `list`) in `namespace`.
    pub fn count(&self, namespace: &str, what: &'static str) -> usize {
        let counts = self.counts.lock().unwrap();
        counts
            .get(&(namespace.to_owned(), what))
            .copied()
            .unwrap_or(0)
    }
}

/// The namespace a path names, if any.
fn namespace_of(path: &str) -> Option<&str> {
    let path = path.split('?').next()?;
    let mut segments = path.split('/');
    segments.find(|s| *s == "namespaces")?;
    segments.next()
}

fn serve(
    tb: &Testbed,
    stream: nexo_cpsim::tls::Stream,
    faults: &Faults,
    counts: &Mutex<BTreeMap<(String, &'static str), usize>>,
    failed_once: &std::sync::atomic::AtomicBool,
) {
    let admin = tb.admin();
    let mut reader = BufReader::new(stream);
    while let Ok(Some(req)) = read_request(&mut reader) {
        let namespace = namespace_of(&req.path).unwrap_or_default().to_owned();
        let watch = req.path.contains("watch=1") || req.path.contains("watch=true");
        let collection = req.method == "GET" && !watch && req.path.contains("labelSelector=");
        let event = req.method != "GET" && req.path.starts_with("/apis/events.k8s.io/");
        let what = if watch {
            Some("watch")
        } else if event {
            Some("event")
        } else if collection {
            Some("list")
        } else {
            None
        };
        if let Some(what) = what {
            *counts
                .lock()
                .unwrap()
                .entry((namespace.clone(), what))
                .or_default() += 1;
        }
        let stream = reader.get_mut();
        if let (true, Some(delay)) = (event, faults.slow_events) {
            std::thread::sleep(delay);
            let resp = Response::json(
                504,
                &json!({"kind": "Status", "apiVersion": "v1",
                "status": "Failure", "reason": "Timeout", "code": 504,
                "message": "the proxy times out every Event write"}),
            );
            if write_response(stream, &resp, false).is_err() {
                return;
            }
            continue;
        }
        let create = req.method == "POST" && !req.path.contains("dryRun=All");
        let collection = req.path.split('?').next().unwrap_or_default();
        if let Some(needle) = &faults.fail_create_once
            && create
            && collection.ends_with(needle.as_str())
            && !failed_once.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            let resp = Response::json(
                500,
                &json!({"kind": "Status", "apiVersion": "v1",
                "status": "Failure", "reason": "InternalError", "code": 500,
                "message": "the proxy fails this write once"}),
            );
            if write_response(stream, &resp, false).is_err() {
                return;
            }
            continue;
        }
        match (watch, faults.watches.get(&namespace)) {
            (true, Some(WatchFault::End)) => {
                let _ = stream.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
                let _ = stream.flush();
                return;
            }
            (true, Some(WatchFault::Gone)) => {
                let event = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
                    "status": "Failure", "reason": "Expired", "code": 410,
                    "message": "too old resource version"}});
                let body = format!("{event}\n");
                let _ = stream.write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                );
                let _ = stream.flush();
                return;
            }
            _ => {}
        }
        if watch {
            // Not a faulty namespace: streamed as the API server sends it.
            stream_watch(&admin, &req.path, stream);
            return;
        }
        let method = Method::from_bytes(req.method.as_bytes()).unwrap_or(Method::GET);
        let content_type = req.header("content-type").unwrap_or("application/json");
        let content_type: &'static str = match content_type {
            "application/apply-patch+yaml" => "application/apply-patch+yaml",
            "application/merge-patch+json" => "application/merge-patch+json",
            "application/strategic-merge-patch+json" => "application/strategic-merge-patch+json",
            "application/json-patch+json" => "application/json-patch+json",
            _ => "application/json",
        };
        let body = (!req.body.is_empty()).then(|| Body {
            content_type,
            bytes: &req.body,
        });
        let resp = match admin.request(method, &req.path, body) {
            Ok(v) => Response::json(200, &v),
            Err(nexo_manager::kube::Error::Api { status, body, .. }) => Response::json(
                status,
                &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                        "reason": body.reason, "message": body.message, "code": status,
                        "details": body.details}),
            ),
            Err(e) => Response::json(502, &json!({"message": e.to_string()})),
        };
        if write_response(reader.get_mut(), &resp, false).is_err() {
            return;
        }
    }
}

/// Streams the watch at `path` to `stream`, one chunk an event, until the
/// API server or the client ends it.
fn stream_watch(admin: &nexo_manager::kube::Client, path: &str, stream: &mut impl Write) {
    let mut watch = match admin.watch(path) {
        Ok(w) => w,
        Err(e) => {
            let resp = Response::json(502, &json!({"message": e.to_string()}));
            let _ = write_response(stream, &resp, true);
            return;
        }
    };
    let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    if stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.flush())
        .is_err()
    {
        return;
    }
    loop {
        let mut lines = Vec::new();
        let flow = watch.pump(|line| lines.push(line.to_vec()));
        for mut line in lines {
            line.push(b'\n');
            let mut chunk = format!("{:x}\r\n", line.len()).into_bytes();
            chunk.extend_from_slice(&line);
            chunk.extend_from_slice(b"\r\n");
            if stream
                .write_all(&chunk)
                .and_then(|()| stream.flush())
                .is_err()
            {
                return;
            }
        }
        match flow {
            Ok(nexo_manager::kube::watch::Flow::Open) => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            _ => {
                let _ = stream.write_all(b"0\r\n\r\n");
                let _ = stream.flush();
                return;
            }
        }
    }
}
