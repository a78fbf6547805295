//! Watches, read without blocking from the loop's `poll(2)`.
//!
//! A watch is an ordinary ureq call on an agent of its own: the request
//! and the response head are read as any call's (bounded by the call
//! timeout, waiting in the loop), then its TCP transport (`net.rs`, in its
//! watch mode) turns non-blocking, and the body, a
//! stream of JSON lines, is read only when the socket is readable, until
//! a read would block ([`WatchStream::pump`]). Every layer above the socket
//! (TLS, the chunked decoding) keeps its state across a read that would
//! block: it returns before consuming anything. Each watch has its own
//! connection, never pooled.

use std::io::{self, Read};
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use crate::backoff::Backoff;

use ureq::unversioned::transport::{Connector, RustlsConnector};

pub use super::limits::MAX_EVENT;
use crate::net::{Opened, PollTcpConnector, WatchSlot};

/// The agent watches are made with: the process's TCP transport in its
/// watch mode (waiting in the loop until the head is read, non-blocking
/// after), then TLS; no whole-call timeout, no idle connection kept. Each
/// connection it opens is left in the slot returned with it.
pub(super) fn agent(config: ureq::config::Config) -> (ureq::Agent, WatchSlot) {
    let slot = WatchSlot::default();
    let chain = ().chain(PollTcpConnector::watches(slot.clone()));
    (
        crate::resolve::agent_with(config, chain.chain(RustlsConnector::default())),
        slot,
    )
}

/// Where a watch stands: each state holds what only it has (a
/// version to watch from, an open stream, when to try again).
#[derive(Debug)]
pub enum Watch {
    /// No version to watch from (never listed, a 410 Gone, a new key):
    /// listed first, then watched; not before `retry_at`.
    List { retry_at: Option<Instant> },
    /// Listed or watched up to `version`, the watch not open: opened again
    /// from it, not before `retry_at`.
    Closed {
        version: String,
        retry_at: Option<Instant>,
    },
    /// Open since `opened_at`; its events are read as they arrive.
    Open {
        version: String,
        stream: WatchStream,
        opened_at: Instant,
    },
}

/// A watch open this long was healthy: its backoff starts again from the
/// beginning, and when it ends it is opened again at once.
pub const HEALTHY: Duration = Duration::from_secs(60);

/// When a watch opened at `opened_at` and ended by the server at `now` is
/// opened again: at once if it was open for [`HEALTHY`] (its backoff then
/// starts again), else after the backoff: a watch that ends as soon as it
/// is opened is not opened again as fast as it ends.
pub fn again_after_end(opened_at: Instant, now: Instant, backoff: &mut Backoff) -> Option<Instant> {
    if now.saturating_duration_since(opened_at) >= HEALTHY {
        backoff.reset();
        None
    } else {
        Some(now + backoff.next_delay_at_least_half())
    }
}

/// An open watch: its body, read a little at a time.
pub struct WatchStream {
    reader: ureq::BodyReader<'static>,
    fd: RawFd,
    /// Bytes of a line not complete yet.
    partial: Vec<u8>,
}

impl std::fmt::Debug for WatchStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchStream").field("fd", &self.fd).finish()
    }
}

/// Whether a watch goes on after a [`WatchStream::pump`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Everything that had arrived was read; more may come.
    Open,
    /// The server ended it (its `timeoutSeconds`, or a restart).
    Ended,
}

impl WatchStream {
    /// Wraps the body of a watch call whose connection is `opened`.
    pub(super) fn new(body: ureq::Body, opened: Opened) -> WatchStream {
        opened.stop_waiting();
        WatchStream {
            reader: body.into_reader(),
            fd: opened.fd(),
            partial: Vec::new(),
        }
    }

    /// The socket, for the loop's `poll(2)`.
    pub fn fd(&self) -> RawFd {
        self.fd
    }

    /// Reads everything that has arrived, without waiting, and hands each
    /// complete line (one event) to `event`.
    pub fn pump(&mut self, mut event: impl FnMut(&[u8])) -> io::Result<Flow> {
        let mut chunk = [0u8; 16 * 1024];
        loop {
            match self.reader.read(&mut chunk) {
                Ok(0) => return Ok(Flow::Ended),
                Ok(n) => {
                    self.partial.extend_from_slice(&chunk[..n]);
                    let mut start = 0;
                    while let Some(end) = self.partial[start..].iter().position(|b| *b == b'\n') {
                        let line = &self.partial[start..start + end];
                        if !line.iter().all(u8::is_ascii_whitespace) {
                            event(line);
                        }
                        start += end + 1;
                    }
                    self.partial.drain(..start);
                    if self.partial.len() > MAX_EVENT {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            format!("a watch event over {} MiB", MAX_EVENT >> 20),
                        ));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Flow::Open),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}
