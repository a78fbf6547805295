//! Every wait of the process: one `poll(2)` on the signal self-pipe and,
//! when enabled, the probe listener and the probe connections still
//! sending their request. No periodic wake-ups: an idle Manager
//! makes one `poll` per heartbeat interval, plus one per probe request.
//!
//! The heartbeat wait, the start-up and ack retry pauses, the Kubernetes
//! client's retry pauses and the moment between two commands of a batch all
//! go through [`Waiter::wait`], so probes are answered and SIGTERM/SIGINT is
//! seen in each of them.

use std::cell::{Cell, RefCell};
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::kube::pause::{CHECKPOINT_EVERY, Pause, Wake};
use crate::probe::{Health, Probe};

/// The signal self-pipe, the optional probe listener and the status it
/// answers from. Single-threaded: shared with `Rc`, methods take `&self`.
#[derive(Debug)]
pub struct Waiter {
    signals: UnixStream,
    stop: Cell<bool>,
    probe: Option<Probe>,
    status: Rc<RefCell<Health>>,
    /// When the last `poll(2)` returned.
    polled_at: Cell<Instant>,
}

impl Waiter {
    /// Routes SIGTERM and SIGINT into a self-pipe. From now on those signals
    /// no longer kill the process: they end the next (or current) wait.
    pub fn new(probe: Option<Probe>, status: Rc<RefCell<Health>>) -> io::Result<Waiter> {
        let (read, write) = UnixStream::pair()?;
        read.set_nonblocking(true)?;
        write.set_nonblocking(true)?;
        for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
            signal_hook::low_level::pipe::register(signal, write.try_clone()?)?;
        }
        Ok(Waiter {
            signals: read,
            stop: Cell::new(false),
            probe,
            status,
            polled_at: Cell::new(Instant::now()),
        })
    }

    /// Whether a stop was requested, without blocking.
    pub fn stop_requested(&self) -> bool {
        self.drain();
        self.stop.get()
    }

    fn drain(&self) {
        let mut buf = [0u8; 16];
        loop {
            match (&self.signals).read(&mut buf) {
                Ok(0) => return,
                Ok(_) => self.stop.set(true),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return, // WouldBlock: drained
            }
        }
    }

    /// Sleeps until `timeout` passes or a stop signal arrives, answering
    /// probe requests as they come. It polls at least once, so a zero
    /// timeout answers the probe requests waiting now.
    pub fn wait(&self, timeout: Duration) -> io::Result<Wake> {
        // No timeout can overflow the clock: at worst, wait a day and loop.
        let now = Instant::now();
        let deadline = now
            .checked_add(timeout)
            .unwrap_or_else(|| now + Duration::from_secs(86_400));
        loop {
            if self.stop_requested() {
                return Ok(Wake::Stop);
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            let pollfd = |fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // The signal pipe, the probe listener, and the probe connections
            // waiting for their request head.
            let mut fds = vec![
                pollfd(self.signals.as_raw_fd()),
                pollfd(self.probe.as_ref().map_or(-1, |p| p.listener().as_raw_fd())),
            ];
            if let Some(probe) = &self.probe {
                fds.extend(probe.pending_fds().into_iter().map(pollfd));
            }
            // Round up so a wait never ends a hair early and spins.
            let ms = remaining.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
            // SAFETY: `fds` is a valid, initialised buffer of pollfd that
            // lives across the call, and its length is passed as nfds. A
            // negative fd (no listener) is ignored by poll(2).
            #[allow(unsafe_code)]
            let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
            self.polled_at.set(Instant::now());
            if n < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue; // a signal: the pipe tells which
                }
                return Err(err);
            }
            let probe_ready = fds[1..].iter().any(|f| f.revents != 0);
            if probe_ready && let Some(probe) = &self.probe {
                probe.serve(&self.status.borrow(), Instant::now());
            }
            if fds[0].revents == 0 && !probe_ready {
                return Ok(Wake::Timeout); // poll timed out
            }
            if fds[0].revents == 0 && remaining.is_zero() {
                return Ok(Wake::Timeout); // probes answered; nothing left to wait
            }
        }
    }
}

impl Pause for Waiter {
    fn pause(&self, timeout: Duration) -> Wake {
        match self.wait(timeout) {
            Ok(wake) => wake,
            Err(e) => {
                // poll(2) on two valid descriptors does not fail; if it ever
                // does, sleep plainly rather than spin.
                log::warn!("wait failed: {e}; sleeping without serving probes");
                std::thread::sleep(timeout);
                Wake::Timeout
            }
        }
    }

    fn checkpoint(&self) {
        if self.polled_at.get().elapsed() >= CHECKPOINT_EVERY
            && let Err(e) = self.wait(Duration::ZERO)
        {
            log::warn!("wait failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::net::TcpStream;

    use super::*;

    fn answered(client: &TcpStream) -> bool {
        client.set_nonblocking(true).unwrap();
        let mut byte = [0u8; 1];
        let got = client.peek(&mut byte).is_ok_and(|n| n > 0);
        client.set_nonblocking(false).unwrap();
        got
    }

    #[test]
    fn a_checkpoint_answers_probes_only_once_the_last_wait_is_old_enough() {
        let probe = Probe::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = probe.local_addr().unwrap();
        let waiter = Waiter::new(Some(probe), Rc::new(RefCell::new(Health::default()))).unwrap();
        let mut client = TcpStream::connect(addr).unwrap();
        client.write_all(b"GET /healthz HTTP/1.1\r\n\r\n").unwrap();
        std::thread::sleep(Duration::from_millis(20));
        waiter.checkpoint();
        assert!(
            !answered(&client),
            "a checkpoint right after a wait costs nothing"
        );
        std::thread::sleep(CHECKPOINT_EVERY);
        waiter.checkpoint();
        assert!(
            answered(&client),
            "a checkpoint after 0.5 s of work answers the probe"
        );
    }

    #[test]
    fn a_zero_wait_answers_the_probes_waiting_now() {
        let probe = Probe::bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = probe.local_addr().unwrap();
        let waiter = Waiter::new(Some(probe), Rc::new(RefCell::new(Health::default()))).unwrap();
        let mut client = TcpStream::connect(addr).unwrap();
        client.write_all(b"GET /readyz HTTP/1.1\r\n\r\n").unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(waiter.wait(Duration::ZERO).unwrap(), Wake::Timeout);
        assert!(answered(&client));
    }
}
