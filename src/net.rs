//! The TCP transport of the Control Plane client, whose waits go through
//! the process's one `poll(2)` instead of blocking in `read(2)`.
//!
//! A held heartbeat (protocol.md, "Held heartbeat") leaves the CP
//! connection waiting for up to a heartbeat interval. ureq's own TCP
//! transport would block in `read(2)` for all that time: no probe
//! answered, no stop seen, no lease renewed. This transport is the
//! bottom link of the CP client's connector chain (under TLS and any
//! CONNECT proxy): whenever a layer above needs bytes, it asks the loop to
//! wait until the socket is readable ([`Readiness::readable`]), and the
//! loop serves its probes, its signals and its timers meanwhile, in the
//! same `poll(2)`, on the same thread. Only then does it `read(2)`, which
//! returns at once.
//!
//! ureq's transports must be `Send + Sync`; the loop (`wait.rs`) is not.
//! The loop is therefore found through a thread-local ([`install`]), set
//! once at start-up: the process has one thread. Without one (tests, tools)
//! the transport polls the socket alone.

use std::cell::{Cell, RefCell};
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::time::{Duration, Instant};

use ureq::unversioned::transport::{
    Buffers, ConnectionDetails, Connector, Either, LazyBuffers, NextTimeout, Transport,
};

/// How a wait for a readable socket ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ready {
    /// The socket has bytes (or its end) to read.
    Readable,
    /// The timeout passed first.
    TimedOut,
    /// A stop was requested, and the wait was [`stoppable`].
    Stop,
}

/// The loop's side: wait until `fd` is readable, serving everything else
/// the process waits for meanwhile.
pub trait Readiness {
    /// Waits up to `timeout` for `fd` to be readable. [`Ready::Stop`] only
    /// when `stoppable`.
    fn readable(&self, fd: RawFd, timeout: Duration, stoppable: bool) -> io::Result<Ready>;
}

thread_local! {
    static LOOP: RefCell<Option<Rc<dyn Readiness>>> = const { RefCell::new(None) };
    static STOPPABLE: Cell<bool> = const { Cell::new(false) };
}

/// Makes `readiness` the wait of every socket of this thread's CP client.
pub fn install(readiness: Rc<dyn Readiness>) {
    LOOP.with(|l| *l.borrow_mut() = Some(readiness));
}

/// Runs `f` (a call whose answer may be abandoned: a heartbeat) so that a
/// stop request ends its waits: the call then fails with an I/O error
/// ("stop requested"; not `Interrupted`, which readers retry), and the
/// caller sees the stop in the loop. Acks and connects are never run so: a
/// stop lets them finish.
pub fn stoppable<T>(f: impl FnOnce() -> T) -> T {
    let before = STOPPABLE.with(|s| s.replace(true));
    let out = f();
    STOPPABLE.with(|s| s.set(before));
    out
}

const STOPPED: &str = "stop requested";

fn await_readable(fd: RawFd, timeout: Duration) -> io::Result<Ready> {
    let stoppable = STOPPABLE.with(Cell::get);
    let installed = LOOP.with(|l| l.borrow().clone());
    match installed {
        Some(readiness) => readiness.readable(fd, timeout, stoppable),
        None => poll_one(fd, timeout),
    }
}

/// `poll(2)` on one descriptor until it is readable: the wait when no
/// loop is installed.
pub fn poll_one(fd: RawFd, timeout: Duration) -> io::Result<Ready> {
    poll_for(fd, libc::POLLIN, timeout)
}

/// `poll(2)` on one descriptor for `events`; [`Ready::Readable`] when
/// they (or an error or hang-up) came.
pub fn poll_for(fd: RawFd, events: libc::c_short, timeout: Duration) -> io::Result<Ready> {
    let deadline = Instant::now() + timeout;
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
            n if n > 0 => return Ok(Ready::Readable),
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
/// them within the call's connect budget; `TCP_NODELAY` set, and the
/// buffers its transport reads and writes through. Both of the crate's
/// own TCP transports (this one, and the watches') connect with it.
pub fn connect_tcp(details: &ConnectionDetails) -> Result<(TcpStream, LazyBuffers), ureq::Error> {
    let budget = *details.timeout.after;
    let started = Instant::now();
    let mut last = None;
    for addr in details.addrs.iter() {
        let left = budget.saturating_sub(started.elapsed());
        if left.is_zero() {
            break;
        }
        match TcpStream::connect_timeout(addr, left) {
            Ok(stream) => {
                stream.set_nodelay(true)?;
                let config = details.config;
                let buffers =
                    LazyBuffers::new(config.input_buffer_size(), config.output_buffer_size());
                return Ok((stream, buffers));
            }
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

/// Opens plain TCP connections whose reads wait in the loop. Chained after
/// ureq's CONNECT proxy connector and before its TLS connector.
#[derive(Debug, Default)]
pub struct PollTcpConnector;

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
        let (stream, buffers) = connect_tcp(details)?;
        Ok(Some(Either::B(PollTcpTransport { stream, buffers })))
    }
}

/// A TCP connection whose reads wait in the loop ([`PollTcpConnector`]).
#[derive(Debug)]
pub struct PollTcpTransport {
    stream: TcpStream,
    buffers: LazyBuffers,
}

impl Transport for PollTcpTransport {
    fn buffers(&mut self) -> &mut dyn Buffers {
        &mut self.buffers
    }

    fn transmit_output(&mut self, amount: usize, timeout: NextTimeout) -> Result<(), ureq::Error> {
        let timeout = timeout.for_write();
        let limit = timeout.not_zero().map(|d| *d);
        self.stream.set_write_timeout(limit)?;
        let output = &self.buffers.output()[..amount];
        match self.stream.write_all(output) {
            Ok(()) => Ok(()),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(ureq::Error::Timeout(timeout.reason))
            }
            Err(e) => Err(e.into()),
        }
    }

    fn await_input(&mut self, timeout: NextTimeout) -> Result<bool, ureq::Error> {
        let timeout = timeout.for_read();
        if timeout.after.is_zero() {
            return Err(ureq::Error::Timeout(timeout.reason));
        }
        // NotHappening is a day: the loop's timers still run meanwhile.
        let limit = timeout
            .not_zero()
            .map_or(Duration::from_secs(86_400), |d| *d);
        match await_readable(self.stream.as_raw_fd(), limit)? {
            Ready::Readable => {}
            Ready::TimedOut => return Err(ureq::Error::Timeout(timeout.reason)),
            Ready::Stop => {
                let _ = self.stream.shutdown(Shutdown::Both);
                return Err(io::Error::other(STOPPED).into());
            }
        }
        // Readable: this read returns at once. The read timeout only
        // guards against a readiness that was not (it does not happen on
        // Linux TCP, but a read must never block the loop for long).
        self.stream
            .set_read_timeout(Some(Duration::from_secs(1).min(limit)))?;
        let input = self.buffers.input_append_buf();
        let amount = loop {
            match self.stream.read(input) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(ureq::Error::Timeout(timeout.reason));
                }
                Err(e) => return Err(e.into()),
            }
        };
        self.buffers.input_appended(amount);
        Ok(amount > 0)
    }

    fn is_open(&mut self) -> bool {
        // Open when a non-blocking peek finds neither the end nor an error.
        if self.stream.set_nonblocking(true).is_err() {
            return false;
        }
        let mut byte = [0u8; 1];
        let open = match self.stream.peek(&mut byte) {
            Ok(0) => false,
            Ok(_) => true, // unexpected bytes: ureq will see them
            Err(e) => e.kind() == io::ErrorKind::WouldBlock,
        };
        self.stream.set_nonblocking(false).is_ok() && open
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    struct Counting(Cell<usize>);

    impl Readiness for Counting {
        fn readable(&self, fd: RawFd, timeout: Duration, stoppable: bool) -> io::Result<Ready> {
            self.0.set(self.0.get() + 1);
            if stoppable {
                return Ok(Ready::Stop);
            }
            poll_one(fd, timeout)
        }
    }

    #[test]
    fn reads_wait_in_the_installed_loop_and_a_stoppable_call_ends_on_stop() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            for _ in 0..2 {
                let (mut s, _) = listener.accept().unwrap();
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf);
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
            }
        });
        let counting = Rc::new(Counting(Cell::new(0)));
        install(counting.clone());
        let agent = crate::resolve::agent_with(
            ureq::Agent::config_builder()
                .max_idle_connections(0)
                .build(),
            ().chain(PollTcpConnector),
        );
        let url = format!("http://{addr}/");
        let body = agent.get(&url).call().unwrap().body_mut().read_to_string();
        assert_eq!(body.unwrap(), "ok");
        assert!(counting.0.get() >= 1, "the read waited in the loop");
        let err = stoppable(|| agent.get(&url).call()).unwrap_err();
        assert!(err.to_string().contains(STOPPED), "{err}");
        LOOP.with(|l| l.borrow_mut().take());
        server.join().unwrap();
    }
}
