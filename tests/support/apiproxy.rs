//! A TLS proxy in front of the test bed's API server that injects the
//! faults a flapping load balancer makes: in the namespaces it is told,
//! every watch ends at once (`End`), or answers 410 Gone (`Gone`). Every
//! other request goes to the API server as the test bed's administrator.
//! It counts the watches and lists it was asked, by namespace.

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
    /// (namespace, "watch" | "list") → requests.
    counts: Arc<Mutex<BTreeMap<(String, &'static str), usize>>>,
}

impl ApiProxy {
    /// Starts on a free loopback port, with `faults` by namespace.
    pub fn start(tb: &'static Testbed, faults: BTreeMap<String, WatchFault>) -> ApiProxy {
        let tls = nexo_cpsim::tls::generate(&[]);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let counts = Arc::new(Mutex::new(BTreeMap::new()));
        let faults = Arc::new(faults);
        let (config, c) = (tls.config.clone(), counts.clone());
        std::thread::spawn(move || {
            for tcp in listener.incoming().flatten() {
                let (config, counts, faults) = (config.clone(), c.clone(), faults.clone());
                std::thread::spawn(move || {
                    if let Some(stream) = nexo_cpsim::tls::server_stream(&config, tcp) {
                        serve(tb, stream, &faults, &counts);
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
    faults: &BTreeMap<String, WatchFault>,
    counts: &Mutex<BTreeMap<(String, &'static str), usize>>,
) {
    let admin = tb.admin();
    let mut reader = BufReader::new(stream);
    while let Ok(Some(req)) = read_request(&mut reader) {
        let namespace = namespace_of(&req.path).unwrap_or_default().to_owned();
        let watch = req.path.contains("watch=1") || req.path.contains("watch=true");
        let collection = req.method == "GET" && !watch && req.path.contains("labelSelector=");
        let what = if watch {
            Some("watch")
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
        match (watch, faults.get(&namespace)) {
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
            // Not a faulty namespace: a watch that ends at once would be
            // a fault of its own; the tests give every watched one a fault.
            let resp = Response::json(500, &json!({"message": "the proxy streams no watch"}));
            let _ = write_response(stream, &resp, true);
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
                        "reason": body.reason, "message": body.message, "code": status}),
            ),
            Err(e) => Response::json(502, &json!({"message": e.to_string()})),
        };
        if write_response(reader.get_mut(), &resp, false).is_err() {
            return;
        }
    }
}
