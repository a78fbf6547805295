//! Watches, read without blocking from the loop's `poll(2)`.
//!
//! A watch is an ordinary ureq call on an agent of its own: the request
//! and the response head are read as any call's (bounded by the call
//! timeout), then its TCP transport turns non-blocking, and the body, a
//! stream of JSON lines, is read only when the socket is readable, until
//! a read would block ([`WatchStream::pump`]). Every layer above the socket
//! (TLS, the chunked decoding) keeps its state across a read that would
//! block: it returns before consuming anything. Each watch has its own
//! connection, never pooled.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ureq::unversioned::transport::{
    Buffers, ConnectionDetails, Connector, Either, LazyBuffers, NextTimeout, RustlsConnector,
    Transport,
};

pub use super::limits::MAX_EVENT;

/// The connection a watch call opened last: its socket, and the switch
/// that makes its reads non-blocking.
pub(super) type Opened = (RawFd, Arc<AtomicBool>);

/// The agent watches are made with: TCP (non-blocking once the head is
/// read), then TLS; no whole-call timeout, no idle connection kept.
pub(super) fn agent(config: ureq::config::Config) -> (ureq::Agent, Arc<Mutex<Option<Opened>>>) {
    let opened = Arc::new(Mutex::new(None));
    let connector = ().chain(WatchConnector {
        opened: Arc::clone(&opened),
    });
    (
        crate::resolve::agent_with(config, connector.chain(RustlsConnector::default())),
        opened,
    )
}

#[derive(Debug)]
struct WatchConnector {
    opened: Arc<Mutex<Option<Opened>>>,
}

impl<In: Transport> Connector<In> for WatchConnector {
    type Out = Either<In, WatchTransport>;

    fn connect(
        &self,
        details: &ConnectionDetails,
        chained: Option<In>,
    ) -> Result<Option<Self::Out>, ureq::Error> {
        if let Some(transport) = chained {
            return Ok(Some(Either::A(transport)));
        }
        let (stream, buffers) = crate::net::connect_tcp(details, false)?;
        let nonblocking = Arc::new(AtomicBool::new(false));
        if let Ok(mut slot) = self.opened.lock() {
            *slot = Some((stream.as_raw_fd(), Arc::clone(&nonblocking)));
        }
        Ok(Some(Either::B(WatchTransport {
            stream,
            buffers,
            nonblocking,
            switched: false,
        })))
    }
}

#[derive(Debug)]
struct WatchTransport {
    stream: TcpStream,
    buffers: LazyBuffers,
    /// Set once the response head is read: reads no longer wait.
    nonblocking: Arc<AtomicBool>,
    /// Whether the socket itself was made non-blocking.
    switched: bool,
}

impl Transport for WatchTransport {
    fn buffers(&mut self) -> &mut dyn Buffers {
        &mut self.buffers
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), ureq::Error> {
        if !self.switched {
            self.stream
                .set_write_timeout(timeout.for_write().not_zero().map(|d| *d))?;
        }
        let output = &self.buffers.output()[..amount];
        let mut written = 0;
        while written < output.len() {
            match self.stream.write(&output[written..]) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero).into()),
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // A TLS record while reading: wait for room, briefly.
                    crate::net::poll_for(
                        self.stream.as_raw_fd(),
                        libc::POLLOUT,
                        Duration::from_secs(1),
                    )?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        if self.nonblocking.load(Ordering::Relaxed) {
            if !self.switched {
                self.stream.set_nonblocking(true)?;
                self.switched = true;
            }
            // WouldBlock goes up as it is: the caller reads again when
            // the socket is readable.
        } else {
            let timeout = timeout.for_read();
            let limit = crate::net::wait_limit(&timeout);
            if crate::net::poll_one(self.stream.as_raw_fd(), limit)? == crate::net::Ready::TimedOut
            {
                return Err(ureq::Error::Timeout(timeout.reason));
            }
        }
        let input = self.buffers.input_append_buf();
        let n = loop {
            match self.stream.read(input) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            }
        };
        self.buffers.input_appended(n);
        Ok(n > 0)
    }

    fn is_open(&mut self) -> bool {
        false // never pooled
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
        opened.1.store(true, Ordering::Relaxed);
        WatchStream {
            reader: body.into_reader(),
            fd: opened.0,
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
