//! The heartbeat body, written while it is sent. At 10,000 proxies the
//! body is 1.3 MB of JSON; built whole first, it was the largest
//! allocation of the process and set its peak memory (BENCHMARKS.md).
//! Here the fields other than `deployments` are written first (about a
//! kilobyte), then the entries a few kilobytes at a time as the transport
//! reads them. The length is counted before (one pass that writes
//! nothing), so the request keeps its `Content-Length`.
//!
//! Pure: a [`Read`] over plain values, tested without a socket.

use super::wire::{Entries, HeartbeatRequest};
use std::io::{self, Read, Write};

/// What is written between the other fields and the entries.
const OPEN: &[u8] = b",\"deployments\":[";
/// What closes the entries and the body.
const CLOSE: &[u8] = b"]}";
/// The entries are encoded in steps of about this many bytes.
const STEP: usize = 8 * 1024;

/// A heartbeat body as a reader of its JSON.
#[derive(Debug)]
pub struct HeartbeatBody<'a> {
    entries: &'a Entries,
    /// The next entry to encode.
    next: usize,
    /// Entries encoded so far.
    written: usize,
    /// Bytes encoded, not yet read; `pos` is where reading is.
    pending: Vec<u8>,
    pos: usize,
    closed: bool,
    len: u64,
}

impl<'a> HeartbeatBody<'a> {
    /// The body of `req`. Fails only when a field cannot be written as
    /// JSON, which the wire types rule out.
    pub fn new(req: &'a HeartbeatRequest) -> serde_json::Result<HeartbeatBody<'a>> {
        let mut pending = Vec::with_capacity(STEP + 1024);
        serde_json::to_writer(&mut pending, req)?;
        if req.inventory.as_ref().is_some_and(|i| i.is_delta()) {
            // A delta (`inventory.delta.v1`): no `deployments`; what
            // changed is in `inventory`.
            let len = pending.len() as u64;
            return Ok(HeartbeatBody {
                entries: &req.deployments,
                next: 0,
                written: 0,
                pending,
                pos: 0,
                closed: true,
                len,
            });
        }
        // `{…}`: the entries go in before the closing brace.
        debug_assert_eq!(pending.last(), Some(&b'}'));
        pending.pop();
        let comma_free = pending.len() == 1; // `{` alone: no field before
        if comma_free {
            pending.extend_from_slice(&OPEN[1..]);
        } else {
            pending.extend_from_slice(OPEN);
        }
        let entries = &req.deployments;
        let mut counter = Counter(0);
        let mut count = 0u64;
        for e in entries.iter() {
            serde_json::to_writer(&mut counter, &e)?;
            count += 1;
        }
        let commas = count.saturating_sub(1);
        let len = pending.len() as u64 + counter.0 + commas + CLOSE.len() as u64;
        Ok(HeartbeatBody {
            entries,
            next: 0,
            written: 0,
            pending,
            pos: 0,
            closed: false,
            len,
        })
    }

    /// The body's length in bytes, for `Content-Length`.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the body is empty (never: it is a JSON object).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Encodes the next step of entries (or the close) into `pending`.
    fn refill(&mut self) -> io::Result<()> {
        self.pending.clear();
        self.pos = 0;
        while self.pending.len() < STEP && self.next < self.entries.len() {
            if let Some(e) = self.entries.get(self.next) {
                if self.written > 0 {
                    self.pending.push(b',');
                }
                serde_json::to_writer(&mut self.pending, &e)?;
                self.written += 1;
            }
            self.next += 1;
        }
        if self.next == self.entries.len() && self.pending.len() < STEP && !self.closed {
            self.pending.extend_from_slice(CLOSE);
            self.closed = true;
        }
        Ok(())
    }
}

impl Read for HeartbeatBody<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos == self.pending.len() {
            if self.closed {
                return Ok(0);
            }
            self.refill()?;
        }
        let n = buf.len().min(self.pending.len() - self.pos);
        buf[..n].copy_from_slice(&self.pending[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Counts what is written, keeps nothing.
struct Counter(u64);

impl Write for Counter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    use crate::cp::wire::{ClusterInfo, DeploymentEntry, HeartbeatManager};

    fn request(n: usize) -> HeartbeatRequest {
        let shop: Rc<str> = Rc::from("shop");
        let image: Rc<str> = Rc::from("registry.example/proxy:1.2");
        HeartbeatRequest {
            manager_id: "m-1".into(),
            sequence: 7,
            sent_at: "2026-12-05T00:00:00Z".into(),
            manager: HeartbeatManager {
                version: "0.3.0".into(),
                build: "b".into(),
                protocol_version: 2,
                capabilities: vec!["heartbeat.wait.v1".into()],
            },
            proxy_image: "registry.example/proxy:1.2".into(),
            managed_proxy_count: n,
            deployments: (0..n)
                .map(|i| DeploymentEntry {
                    namespace: shop.clone(),
                    name: Rc::from(format!("proxy-{i:05}")),
                    kind: crate::cp::wire::EntryKind::NexoProxy,
                    replicas: 2,
                    image: (i % 3 != 0).then(|| image.clone()),
                    status: None,
                })
                .collect::<Vec<_>>()
                .into(),
            cluster: ClusterInfo::default(),
            pending_acks: Vec::new(),
            inventory_errors: vec!["a \"quoted\" problem".into()],
            release_contract: None,
            trust: None,
            wait_seconds: Some(15),
            self_upgrade: None,
            inventory: None,
            drift: Vec::new(),
        }
    }

    /// Reads the whole body through reads of `chunk` bytes.
    fn read_all(body: &mut HeartbeatBody<'_>, chunk: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = vec![0; chunk];
        loop {
            let n = body.read(&mut buf).unwrap();
            if n == 0 {
                return out;
            }
            out.extend_from_slice(&buf[..n]);
        }
    }

    #[test]
    fn the_body_is_the_request_as_json_with_its_length() {
        for n in [0, 1, 2, 700] {
            let req = request(n);
            for chunk in [1, 7, 4096, 64 * 1024] {
                let mut body = HeartbeatBody::new(&req).unwrap();
                let len = body.len();
                let bytes = read_all(&mut body, chunk);
                assert_eq!(bytes.len() as u64, len, "{n} entries, reads of {chunk}");
                let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
                let got = v["deployments"].as_array().unwrap();
                assert_eq!(got.len(), n);
                for (i, e) in got.iter().enumerate() {
                    assert_eq!(e["name"], format!("proxy-{i:05}"));
                    assert_eq!(e["namespace"], "shop");
                    assert_eq!(e["kind"], "NexoProxy");
                    assert_eq!(e["replicas"], 2);
                    assert_eq!(e.get("image").is_some(), i % 3 != 0);
                }
                // The other fields are all there, once.
                assert_eq!(v["managerId"], "m-1");
                assert_eq!(v["managedProxyCount"], n);
                assert_eq!(v["waitSeconds"], 15);
                assert_eq!(v["inventoryErrors"][0], "a \"quoted\" problem");
                assert_eq!(v.as_object().unwrap().len(), 11, "{v}");
            }
        }
    }

    #[test]
    fn what_is_held_at_once_stays_small() {
        let req = request(10_000);
        let mut body = HeartbeatBody::new(&req).unwrap();
        let mut buf = vec![0; 16 * 1024];
        let mut most = 0;
        while body.read(&mut buf).unwrap() > 0 {
            most = most.max(body.pending.capacity());
        }
        assert!(body.len() > 500_000, "{}", body.len());
        assert!(most < 2 * STEP, "the pending bytes grew to {most}");
    }
}
