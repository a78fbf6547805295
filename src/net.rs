//! The TCP transport of the Control Plane and Kubernetes clients, whose
//! waits go through the process's one `poll(2)` instead of blocking in
//! `connect(2)`, `read(2)` or `write(2)`.
//!
//! A held heartbeat (docs/protocol.md, "Held heartbeat") leaves the CP
//! connection waiting for up to a heartbeat interval, and a peer may stop
//! reading (a full send buffer) or answering at any time. ureq's own TCP
//! transport would block in the system call for all that time: no probe
//! answered, no stop seen, no lease renewed. This transport is the bottom
//! link of every connector chain of the process (the CP's, the Kubernetes
//! client's, its watches', the standby's handshake check; under TLS and any
//! CONNECT proxy): whenever a layer above needs bytes or room to write, it asks
//! the loop to wait until the socket is ready ([`Readiness::ready`]), and
//! the loop serves its probes, its signals and (for the CP's calls) its
//! timers meanwhile, in the same `poll(2)`, on the same thread. Only then
//! does it `read(2)` or `write(2)`, which return at once.
//!
//! ureq's transports must be `Send + Sync`; the loop (`wait.rs`) is not.
//! The loop is therefore found through a thread-local ([`install`]), set
//! once at start-up: the process has one thread. Without one (tests, tools)
//! the transport polls the socket alone.

pub mod body;
mod slot;

pub use slot::{Opened, WatchSlot};
use std::cell::{Cell, RefCell};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ureq::unversioned::transport::{
    Buffers, ConnectionDetails, Connector, Either, LazyBuffers, NextTimeout, Transport,
};

/// The input and output buffers of each layer of a connection (TCP, then
/// TLS), and the largest response head read: ureq's default is 128 KiB
/// each, zero-filled when first used, and every open watch is a
/// connection of its own (BENCHMARKS.md, "The compact status"). A
/// response's body streams through them whatever its size; request and
/// response heads of either peer are a few hundred bytes.
pub const BUFFER_BYTES: usize = 8 * 1024;

/// `config` with the buffers of [`BUFFER_BYTES`].
pub fn buffers(
    config: ureq::config::ConfigBuilder<ureq::typestate::AgentScope>,
) -> ureq::config::ConfigBuilder<ureq::typestate::AgentScope> {
    config
        .input_buffer_size(BUFFER_BYTES)
        .output_buffer_size(BUFFER_BYTES)
        .max_response_header_size(BUFFER_BYTES)
}

/// What a wait on a socket waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interest {
    /// Bytes (or the end) to read.
    Read,
    /// Room to write (or, after a non-blocking connect, its outcome).
    Write,
}

impl Interest {
    /// Its `poll(2)` events.
    pub fn events(self) -> libc::c_short {
        match self {
            Interest::Read => libc::POLLIN,
            Interest::Write => libc::POLLOUT,
        }
    }
}

/// How a wait on a socket ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ready {
    /// The socket is ready for what was asked (or has an error to tell).
    Now,
    /// The timeout passed first.
    TimedOut,
    /// A stop was requested, and the wait was [`stoppable`].
    Stop,
}

/// How a wait in the loop behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode {
    /// A stop request ends it ([`Ready::Stop`]).
    pub stoppable: bool,
    /// The loop's duty (the lease renewal, the watches) may run in it:
    /// true for the CP's calls; never for the Kubernetes client's, whose
    /// callers may hold what the duty borrows (the lease).
    pub duties: bool,
}

/// The loop's side: wait until `fd` is ready, serving everything else the
/// process waits for meanwhile.
pub trait Readiness {
    /// Waits up to `timeout` for `fd` to be ready for `interest`.
    fn ready(
        &self,
        fd: RawFd,
        interest: Interest,
        timeout: Duration,
        mode: Mode,
    ) -> io::Result<Ready>;
}

thread_local! {
    static LOOP: RefCell<Option<Rc<dyn Readiness>>> = const { RefCell::new(None) };
    static STOPPABLE: Cell<bool> = const { Cell::new(false) };
    static FINISHING: Cell<bool> = const { Cell::new(false) };
}

/// The process is stopping: from now on no call is [`stoppable`], so that
/// what it does on its way out (the state's last write, the lease's
/// release) is not cut short by the stop it is answering.
pub fn finish() {
    FINISHING.with(|f| f.set(true));
}

/// Makes `readiness` the wait of every socket of this thread's CP client.
pub fn install(readiness: Rc<dyn Readiness>) {
    LOOP.with(|l| *l.borrow_mut() = Some(readiness));
}

/// Runs `f` (a call whose answer may be abandoned: a heartbeat, a
/// Kubernetes read) so that a stop request ends its waits: the call then
/// fails with an I/O error ("stop requested"; not `Interrupted`, which
/// readers retry), and the caller sees the stop in the loop. Acks,
/// connects and Kubernetes writes are never run so: a stop lets them
/// finish. Once the process is stopping ([`finish`]), nothing is.
pub fn stoppable<T>(f: impl FnOnce() -> T) -> T {
    let stoppable = !FINISHING.with(Cell::get);
    let before = STOPPABLE.with(|s| s.replace(stoppable));
    let out = f();
    STOPPABLE.with(|s| s.set(before));
    out
}

const STOPPED: &str = "stop requested";

/// The error of a call a stop ended ("stop requested"; not `Interrupted`,
/// which readers retry).
fn stop_error() -> io::Error {
    io::Error::other(STOPPED)
}

/// Whether `e` is [`stop_error`]'s.
fn is_stop(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Other && e.to_string() == STOPPED
}

/// The longest any wait lasts, for "no timeout": the loop's timers still
/// run meanwhile.
const LONGEST_WAIT: Duration = Duration::from_secs(86_400);

/// `timeout` from now; no timeout can overflow the clock: at worst,
/// [`LONGEST_WAIT`].
pub fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .unwrap_or_else(|| now + LONGEST_WAIT)
}

/// How long a wait under ureq's `timeout` may last: its time, or
/// [`LONGEST_WAIT`] when it has none.
pub fn wait_limit(timeout: &NextTimeout) -> Duration {
    timeout.not_zero().map_or(LONGEST_WAIT, |d| *d)
}

/// Waits in the loop (or alone, without one) for `fd` to be ready for
/// `interest`; `duties`: whether the loop's duty may run meanwhile.
fn await_ready(
    fd: RawFd,
    interest: Interest,
    timeout: Duration,
    duties: bool,
) -> io::Result<Ready> {
    let mode = Mode {
        stoppable: STOPPABLE.with(Cell::get),
        duties,
    };
    let installed = LOOP.with(|l| l.borrow().clone());
    match installed {
        Some(readiness) => readiness.ready(fd, interest, timeout, mode),
        None => poll_for(fd, interest.events(), timeout),
    }
}

/// `poll(2)` on one descriptor for `events`; [`Ready::Now`] when they
/// (or an error or hang-up) came.
pub fn poll_for(fd: RawFd, events: libc::c_short, timeout: Duration) -> io::Result<Ready> {
    let deadline = deadline_after(timeout);
    loop {
        let mut fds = [libc::pollfd {
            fd,
            events,
            revents: 0,
        }];
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
        // SAFETY: `fds` is a valid one-element pollfd array living across
        // the call; its length is passed as nfds.
        #[allow(unsafe_code)]
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 1, ms) };
        match n {
            n if n > 0 => return Ok(Ready::Now),
            0 => return Ok(Ready::TimedOut),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

/// A TCP connection to the first of `details.addrs` that answers, all of
/// them within the call's connect budget, each connect waiting in the loop
/// ([`connect_one`]; `duties`: whether the loop's duty may run
/// meanwhile); `TCP_NODELAY` set, and the buffers its transport reads and
/// writes through. The transport's connects.
pub fn connect_tcp(
    details: &ConnectionDetails,
    duties: bool,
) -> Result<(TcpStream, LazyBuffers), ureq::Error> {
    let budget = *details.timeout.after;
    let started = Instant::now();
    let mut last = None;
    for addr in details.addrs.iter() {
        let left = budget.saturating_sub(started.elapsed());
        if left.is_zero() {
            break;
        }
        match connect_one(addr, left, duties) {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                let config = details.config;
                let buffers =
                    LazyBuffers::new(config.input_buffer_size(), config.output_buffer_size());
                return Ok((stream, buffers));
            }
            Err(e) if is_stop(&e) => return Err(e.into()),
            Err(e) => last = Some(e),
        }
    }
    match last {
        Some(e) if e.kind() == io::ErrorKind::TimedOut => {
            Err(ureq::Error::Timeout(details.timeout.reason))
        }
        Some(e) => Err(ureq::Error::Io(e)),
        None => Err(ureq::Error::Timeout(details.timeout.reason)),
    }
}

/// Connects to `addr` without blocking: a non-blocking `connect(2)`, then
/// a wait in the loop (up to `timeout`) for its outcome, so that a peer
/// that never answers (a dropped SYN) costs no probe and no stop. The
/// stream stays non-blocking for its life: every read and write returns
/// at once, and the transport waits in the loop (no `ioctl(2)` or
/// `setsockopt(2)` per read or write, BENCHMARKS.md, "The compact
/// status").
fn connect_one(addr: &SocketAddr, timeout: Duration, duties: bool) -> io::Result<TcpStream> {
    let domain = match addr {
        SocketAddr::V4(_) => libc::AF_INET,
        SocketAddr::V6(_) => libc::AF_INET6,
    };
    let kind = libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    // SAFETY: socket(2) with constant arguments, no pointer; the
    // descriptor it returns (when not -1) is owned at once below.
    #[allow(unsafe_code)]
    let fd = unsafe { libc::socket(domain, kind, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns or closes.
    #[allow(unsafe_code)]
    let stream = TcpStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
    if raw_connect(fd, addr) != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(e);
        }
        match await_ready(fd, Interest::Write, timeout, duties)? {
            Ready::Now => {}
            Ready::TimedOut => return Err(io::ErrorKind::TimedOut.into()),
            Ready::Stop => return Err(stop_error()),
        }
        // SO_ERROR: how the connect ended.
        if let Some(e) = stream.take_error()? {
            return Err(e);
        }
    }
    Ok(stream)
}

/// `connect(2)` of `fd` to `addr`: 0, or -1 with `errno` set.
fn raw_connect(fd: RawFd, addr: &SocketAddr) -> libc::c_int {
    match addr {
        SocketAddr::V4(a) => {
            let sa = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            // SAFETY: `sa` is a valid sockaddr_in that lives across the
            // call, and `len` is its size.
            #[allow(unsafe_code)]
            unsafe {
                libc::connect(fd, (&raw const sa).cast(), len)
            }
        }
        SocketAddr::V6(a) => {
            let sa = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            let len = std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t;
            // SAFETY: `sa` is a valid sockaddr_in6 that lives across the
            // call, and `len` is its size.
            #[allow(unsafe_code)]
            unsafe {
                libc::connect(fd, (&raw const sa).cast(), len)
            }
        }
    }
}

/// Opens plain TCP connections whose connects, reads and writes wait in
/// the loop. Chained after ureq's CONNECT proxy connector and before its
/// TLS connector. The one transport of the process: the CP's calls, the
/// Kubernetes calls, the watches and the standby's handshake check.
#[derive(Debug, Default)]
pub struct PollTcpConnector {
    /// Whether the loop's duty may run in its waits ([`Mode::duties`]).
    pub duties: bool,
    /// A watch's connector: each connection it opens is left in this slot
    /// for the caller, which makes its reads stop waiting once the
    /// response head is in ([`Opened::stop_waiting`]).
    pub watch: Option<WatchSlot>,
}

impl PollTcpConnector {
    /// The CP client's: the duty (the lease renewal, the watches) runs in
    /// its waits (a held heartbeat lasts an interval).
    pub const CONTROL_PLANE: PollTcpConnector = PollTcpConnector {
        duties: true,
        watch: None,
    };
    /// The Kubernetes client's: probes and signals only (its callers may
    /// hold what the duty borrows).
    pub const KUBERNETES: PollTcpConnector = PollTcpConnector {
        duties: false,
        watch: None,
    };

    /// A watch agent's: as [`PollTcpConnector::KUBERNETES`] until the head
    /// is in, each connection left in `slot`.
    pub fn watches(slot: WatchSlot) -> PollTcpConnector {
        PollTcpConnector {
            duties: false,
            watch: Some(slot),
        }
    }
}

impl<In: Transport> Connector<In> for PollTcpConnector {
    type Out = Either<In, PollTcpTransport>;

    fn connect(
        &self,
        details: &ConnectionDetails,
        chained: Option<In>,
    ) -> Result<Option<Self::Out>, ureq::Error> {
        if let Some(transport) = chained {
            return Ok(Some(Either::A(transport))); // a proxy's tunnel
        }
        let (stream, buffers) = connect_tcp(details, self.duties)?;
        let watch = self.watch.as_ref().map(|slot| {
            let nonblocking = Arc::new(AtomicBool::new(false));
            slot.put(Opened {
                fd: stream.as_raw_fd(),
                nonblocking: Arc::clone(&nonblocking),
            });
            nonblocking
        });
        Ok(Some(Either::B(PollTcpTransport {
            stream,
            buffers,
            duties: self.duties,
            watch,
            switched: false,
        })))
    }
}

/// A TCP connection whose reads and writes wait in the loop
/// ([`PollTcpConnector`]).
#[derive(Debug)]
pub struct PollTcpTransport {
    stream: TcpStream,
    buffers: LazyBuffers,
    duties: bool,
    /// A watch's switch ([`Opened::stop_waiting`]); `None`: a call's.
    watch: Option<Arc<AtomicBool>>,
    /// Whether the socket was made non-blocking for good (a watch past its
    /// head).
    switched: bool,
}

impl PollTcpTransport {
    /// Whether reads no longer wait (a watch past its head): once so, it
    /// stays so.
    fn switched_now(&mut self) -> io::Result<bool> {
        if !self.switched
            && self
                .watch
                .as_ref()
                .is_some_and(|w| w.load(Ordering::Relaxed))
        {
            self.switched = true;
        }
        Ok(self.switched)
    }

    /// A switched watch's write (a TLS record while it reads): what the
    /// socket takes, waiting for room on the socket alone, briefly.
    fn write_switched(&mut self, amount: usize) -> Result<(), ureq::Error> {
        let fd = self.stream.as_raw_fd();
        let mut written = 0;
        while written < amount {
            match self.stream.write(&self.buffers.output()[written..amount]) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero).into()),
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if poll_for(fd, libc::POLLOUT, Duration::from_secs(1))? == Ready::TimedOut {
                        return Err(io::Error::from(io::ErrorKind::TimedOut).into());
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Ends the connection after a stop: the call fails with
    /// "stop requested".
    fn stopped(&self) -> ureq::Error {
        let _ = self.stream.shutdown(Shutdown::Both);
        stop_error().into()
    }
}

impl Transport for PollTcpTransport {
    fn buffers(&mut self) -> &mut dyn Buffers {
        &mut self.buffers
    }

    /// Writes without blocking: what the socket takes now, then a wait in
    /// the loop for room (a peer that stops reading fills its window),
    /// within the call's write timeout.
    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), ureq::Error> {
        if self.switched_now()? {
            return self.write_switched(amount);
        }
        let timeout = timeout.for_write();
        let deadline = deadline_after(wait_limit(&timeout));
        let fd = self.stream.as_raw_fd();
        let mut written = 0;
        loop {
            if written >= amount {
                break Ok(());
            }
            let output = &self.buffers.output()[written..amount];
            match self.stream.write(output) {
                Ok(0) => break Err(io::Error::from(io::ErrorKind::WriteZero).into()),
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break Err(ureq::Error::Timeout(timeout.reason));
                    }
                    match await_ready(fd, Interest::Write, left, self.duties) {
                        Ok(Ready::Now) => {}
                        Ok(Ready::TimedOut) => break Err(ureq::Error::Timeout(timeout.reason)),
                        Ok(Ready::Stop) => break Err(self.stopped()),
                        Err(e) => break Err(e.into()),
                    }
                }
                Err(e) => break Err(e.into()),
            }
        }
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        if self.switched_now()? {
            // A switched watch: read what is there; `WouldBlock` goes up as
            // it is, and the loop reads again when the socket is readable.
            let input = self.buffers.input_append_buf();
            let amount = loop {
                match self.stream.read(input) {
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e.into()),
                }
            };
            self.buffers.input_appended(amount);
            return Ok(amount > 0);
        }
        let timeout = timeout.for_read();
        if timeout.after.is_zero() {
            return Err(ureq::Error::Timeout(timeout.reason));
        }
        let deadline = deadline_after(wait_limit(&timeout));
        let fd = self.stream.as_raw_fd();
        let amount = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ureq::Error::Timeout(timeout.reason));
            }
            match await_ready(fd, Interest::Read, left, self.duties)? {
                Ready::Now => {}
                Ready::TimedOut => return Err(ureq::Error::Timeout(timeout.reason)),
                Ready::Stop => return Err(self.stopped()),
            }
            // Readable: the read returns at once (a readiness that was
            // not, `WouldBlock`, waits again).
            match self.stream.read(self.buffers.input_append_buf()) {
                Ok(n) => break n,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                    ) => {}
                Err(e) => return Err(e.into()),
            }
        };
        self.buffers.input_appended(amount);
        Ok(amount > 0)
    }

    fn is_open(&mut self) -> bool {
        if self.watch.is_some() {
            return false; // a watch's connection is never pooled
        }
        // Open when a peek (non-blocking, as the socket is) finds neither
        // the end nor an error.
        let mut byte = [0u8; 1];
        match self.stream.peek(&mut byte) {
            Ok(0) => false,
            Ok(_) => true, // unexpected bytes: ureq will see them
            Err(e) => e.kind() == io::ErrorKind::WouldBlock,
        }
    }
}

#[cfg(test)]
mod tests;
