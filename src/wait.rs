//! The wait between heartbeats: one `poll(2)` on the signal self-pipe and,
//! when enabled, the probe listener. No periodic wake-ups: an idle Manager
//! makes one `poll` per heartbeat interval, plus one per probe request.

use std::io::{self, Read};
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// Why a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// The timeout passed.
    Timeout,
    /// SIGTERM or SIGINT arrived: stop gracefully.
    Stop,
    /// The probe listener has a connection to accept.
    Listener,
}

/// The signal self-pipe and the optional listener.
#[derive(Debug)]
pub struct Waiter {
    signals: UnixStream,
    stop: bool,
}

impl Waiter {
    /// Routes SIGTERM and SIGINT into a self-pipe. From now on those signals
    /// no longer kill the process: they end the next (or current) wait.
    pub fn new() -> io::Result<Waiter> {
        let (read, write) = UnixStream::pair()?;
        read.set_nonblocking(true)?;
        write.set_nonblocking(true)?;
        for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
            signal_hook::low_level::pipe::register(signal, write.try_clone()?)?;
        }
        Ok(Waiter {
            signals: read,
            stop: false,
        })
    }

    /// Whether a stop was requested, without blocking.
    pub fn stop_requested(&mut self) -> bool {
        self.drain();
        self.stop
    }

    fn drain(&mut self) {
        let mut buf = [0u8; 16];
        loop {
            match self.signals.read(&mut buf) {
                Ok(0) => return,
                Ok(_) => self.stop = true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return, // WouldBlock: drained
            }
        }
    }

    /// Sleeps until `timeout` passes, a stop signal arrives, or `listener`
    /// becomes readable.
    pub fn wait(&mut self, timeout: Duration, listener: Option<&TcpListener>) -> io::Result<Wake> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.stop_requested() {
                return Ok(Wake::Stop);
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Ok(Wake::Timeout);
            }
            let mut fds = [
                libc::pollfd {
                    fd: self.signals.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: listener.map_or(-1, AsRawFd::as_raw_fd),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // Round up so a wait never ends a hair early and spins.
            let ms = remaining.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
            // SAFETY: `fds` is a valid, initialised array of two pollfd that
            // lives across the call, and its length is passed as nfds. A
            // negative fd (no listener) is ignored by poll(2).
            #[allow(unsafe_code)]
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
            if n < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue; // a signal: the pipe tells which
                }
                return Err(err);
            }
            if fds[0].revents != 0 {
                continue; // drained at the top of the loop
            }
            if fds[1].revents != 0 {
                return Ok(Wake::Listener);
            }
        }
    }
}
