//! Every wait of the process: one `poll(2)` on the signal self-pipe,
//! the probe listener and the probe connections still sending their
//! request, the CP socket a call waits on, and the duty's descriptors (the
//! inventory's watches). No periodic wake-ups: an idle Manager wakes for a
//! heartbeat's answer or interval, the lease's renewal, a watch's event or
//! bookmark, and a probe request.
//!
//! The heartbeat wait, the start-up and ack retry pauses, the Kubernetes
//! client's retry pauses and the moment between two commands of a batch all
//! go through [`Waiter::wait`], so probes are answered and SIGTERM/SIGINT is
//! seen in each of them.

use std::cell::{Cell, RefCell};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::kube::pause::{CHECKPOINT_EVERY, Pause, Wake};
use crate::net::{Interest, Mode, Readiness, Ready, deadline_after};
use crate::probe::{Health, Probe};

/// The signal self-pipe, the optional probe listener and the status it
/// answers from. Single-threaded: shared with `Rc`, methods take `&self`.
pub struct Waiter {
    signals: UnixStream,
    stop: Cell<bool>,
    probe: Option<Probe>,
    status: Rc<RefCell<Health>>,
    /// When the last `poll(2)` returned.
    polled_at: Cell<Instant>,
    /// What the loop does on its own schedule.
    duty: RefCell<Option<Rc<dyn Duty>>>,
    /// Whether the duty is running (its own waits do not run it again).
    in_duty: Cell<bool>,
}

impl std::fmt::Debug for Waiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiter")
            .field("stop", &self.stop.get())
            .field("probe", &self.probe)
            .finish()
    }
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
            duty: RefCell::new(None),
            in_duty: Cell::new(false),
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
    /// timeout answers the probe requests waiting now. The loop's
    /// [`Duty`] does not run here (start-up, ack and state-write retry
    /// pauses); the Kubernetes client's pauses and checkpoints wait in
    /// [`Waiter::idle`], where it does.
    pub fn wait(&self, timeout: Duration) -> io::Result<Wake> {
        match self.wait_for(deadline_after(timeout), None, true, false)? {
            Event::Stop => Ok(Wake::Stop),
            Event::Timeout | Event::Readable => Ok(Wake::Timeout),
        }
    }

    /// The loop's wait between two heartbeats: [`Waiter::wait`], and the
    /// [`Duty`] runs when it is due.
    pub fn idle(&self, timeout: Duration) -> io::Result<Wake> {
        match self.wait_for(deadline_after(timeout), None, true, true)? {
            Event::Stop => Ok(Wake::Stop),
            Event::Timeout | Event::Readable => Ok(Wake::Timeout),
        }
    }

    /// Sets the work done on its own schedule in the loop's waits.
    pub fn set_duty(&self, duty: Rc<dyn Duty>) {
        *self.duty.borrow_mut() = Some(duty);
    }

    /// Whether the duty is due now (and not running): no system call.
    fn duty_due(&self) -> bool {
        if self.in_duty.get() {
            return false;
        }
        let now = Instant::now();
        self.duty
            .borrow()
            .as_ref()
            .is_some_and(|d| d.due(now).is_some_and(|at| at <= now))
    }

    /// Runs the duty if it is due or its descriptors are readable
    /// (`ready`), unless one is running already (its own requests wait
    /// here too); when it is next due.
    fn run_duty(&self, now: Instant, ready: bool) -> Option<Instant> {
        if self.in_duty.get() {
            return None;
        }
        let duty = self.duty.borrow().clone()?;
        if ready || duty.due(now).is_some_and(|at| at <= now) {
            self.in_duty.set(true);
            duty.run();
            self.in_duty.set(false);
        }
        duty.due(Instant::now())
    }

    /// The one `poll(2)`: the signal pipe, the probe listener and its
    /// pending connections, and `socket` (a descriptor and the events
    /// awaited) when given. Ends at `deadline`, when `socket` is ready, or
    /// (when `stoppable`) on a stop request; runs the duty when `duties`
    /// and it is due.
    fn wait_for(
        &self,
        deadline: Instant,
        socket: Option<(RawFd, libc::c_short)>,
        stoppable: bool,
        duties: bool,
    ) -> io::Result<Event> {
        let mut duty_ready = false;
        let mut duty_fds = Vec::new();
        loop {
            // A stop seen while a call that must finish (an ack) waited
            // is kept, and ends the next stoppable wait.
            if self.stop_requested() && stoppable {
                return Ok(Event::Stop);
            }
            let mut wake_at = deadline;
            duty_fds.clear();
            if duties && let Some(due) = self.run_duty(Instant::now(), duty_ready) {
                wake_at = wake_at.min(due);
            }
            if duties
                && !self.in_duty.get()
                && let Some(duty) = self.duty.borrow().as_ref()
            {
                duty.fds(&mut duty_fds);
            }
            let remaining = wake_at.saturating_duration_since(Instant::now());
            let pollfd = |fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // The signal pipe, the socket (or nothing), the probe
            // listener, and the probe connections waiting for their
            // request head.
            let (fd, events) = socket.unwrap_or((-1, libc::POLLIN));
            let mut fds = vec![
                pollfd(self.signals.as_raw_fd()),
                libc::pollfd {
                    fd,
                    events,
                    revents: 0,
                },
                pollfd(self.probe.as_ref().map_or(-1, |p| p.listener().as_raw_fd())),
            ];
            if let Some(probe) = &self.probe {
                fds.extend(probe.pending_fds().into_iter().map(pollfd));
            }
            // Last, the duty's (open watches).
            let duty_from = fds.len();
            fds.extend(duty_fds.iter().copied().map(pollfd));
            // Round up so a wait never ends a hair early and spins.
            let ms = remaining.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
            // SAFETY: `fds` is a valid, initialised buffer of pollfd that
            // lives across the call, and its length is passed as nfds. A
            // negative fd (no socket, no listener) is ignored by poll(2).
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
            duty_ready = fds[duty_from..].iter().any(|f| f.revents != 0);
            let probe_ready = fds[2..duty_from].iter().any(|f| f.revents != 0);
            if probe_ready && let Some(probe) = &self.probe {
                probe.serve(&self.status.borrow(), Instant::now());
            }
            if fds[1].revents != 0 {
                return Ok(Event::Readable);
            }
            let signalled = fds[0].revents != 0;
            if signalled && !stoppable {
                self.drain(); // kept in `stop`; the wait goes on
            }
            if !signalled && !duty_ready && Instant::now() >= deadline {
                return Ok(Event::Timeout);
            }
        }
    }
}

/// Why [`Waiter::wait_for`] returned.
enum Event {
    Stop,
    Timeout,
    Readable,
}

/// Work the loop does on its own schedule, in whichever wait it is in
/// (between heartbeats, or while a held heartbeat waits for its answer):
/// the lease renewal, and the watches' events.
pub trait Duty {
    /// When it is next due, seen at `now` (at most `now` when it is due
    /// already); `None`: nothing scheduled.
    fn due(&self, now: Instant) -> Option<Instant>;
    /// The descriptors it reads (open watches): when one is readable, it
    /// runs.
    fn fds(&self, _out: &mut Vec<RawFd>) {}
    /// Does what is due, and reads what arrived.
    fn run(&self);
}

impl Readiness for Waiter {
    fn ready(
        &self,
        fd: RawFd,
        interest: Interest,
        timeout: Duration,
        mode: Mode,
    ) -> io::Result<Ready> {
        let socket = Some((fd, interest.events()));
        Ok(
            match self.wait_for(deadline_after(timeout), socket, mode.stoppable, mode.duties)? {
                Event::Readable => Ready::Now,
                Event::Timeout => Ready::TimedOut,
                Event::Stop => Ready::Stop,
            },
        )
    }
}

/// A Kubernetes call's pauses and checkpoints run the duty too: a command
/// longer than the lease's renew deadline (a big deploy through a slow API
/// server) keeps the lease on its schedule instead of tripping the fence.
impl Pause for Waiter {
    fn pause(&self, timeout: Duration) -> Wake {
        match self.idle(timeout) {
            Ok(wake) => wake,
            Err(e) => {
                // poll(2) on two valid descriptors does not fail; if it ever
                // does, sleep plainly rather than spin.
                crate::warn!(err:% = e; "wait failed; sleeping without serving probes");
                std::thread::sleep(timeout);
                Wake::Timeout
            }
        }
    }

    fn checkpoint(&self) {
        // The duty when it is due: a long command's requests each wait in
        // a `poll(2)` of their own (which keeps `polled_at` fresh, and
        // runs no duty), and the lease must still be renewed on its
        // schedule, not lost mid-command to the fence.
        if (self.polled_at.get().elapsed() >= CHECKPOINT_EVERY || self.duty_due())
            && let Err(e) = self.idle(Duration::ZERO)
        {
            crate::warn!(err:% = e; "wait failed");
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

    /// Due once, at `at`; counts its runs.
    struct Once {
        at: Instant,
        runs: Cell<u32>,
        polls: Cell<u32>,
    }

    impl Duty for Once {
        fn due(&self, _now: Instant) -> Option<Instant> {
            self.polls.set(self.polls.get() + 1);
            (self.runs.get() == 0).then_some(self.at)
        }
        fn run(&self) {
            self.runs.set(self.runs.get() + 1);
        }
    }

    #[test]
    fn the_duty_runs_once_when_due_in_the_loops_wait_and_never_in_a_pause() {
        let waiter = Waiter::new(None, Rc::new(RefCell::new(Health::default()))).unwrap();
        let duty = Rc::new(Once {
            at: Instant::now() + Duration::from_millis(50),
            runs: Cell::new(0),
            polls: Cell::new(0),
        });
        waiter.set_duty(duty.clone());
        waiter.wait(Duration::from_millis(100)).unwrap();
        assert_eq!(duty.runs.get(), 0, "a pause does not run the duty");
        let started = Instant::now();
        let at = Instant::now() + Duration::from_millis(50);
        let duty = Rc::new(Once {
            at,
            runs: Cell::new(0),
            polls: Cell::new(0),
        });
        waiter.set_duty(duty.clone());
        assert_eq!(
            waiter.idle(Duration::from_millis(200)).unwrap(),
            Wake::Timeout
        );
        assert_eq!(duty.runs.get(), 1);
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert!(
            duty.polls.get() < 10,
            "woke for the duty, not in a spin ({} looks)",
            duty.polls.get()
        );
    }

    #[test]
    fn a_checkpoint_runs_a_due_duty_even_right_after_a_wait() {
        let waiter = Waiter::new(None, Rc::new(RefCell::new(Health::default()))).unwrap();
        let duty = Rc::new(Once {
            at: Instant::now(),
            runs: Cell::new(0),
            polls: Cell::new(0),
        });
        waiter.set_duty(duty.clone());
        // A request's own wait (a pause runs no duty) has just polled.
        waiter.wait(Duration::ZERO).unwrap();
        assert_eq!(duty.runs.get(), 0);
        waiter.checkpoint();
        assert_eq!(duty.runs.get(), 1, "the due duty ran at the checkpoint");
        // Not due any more: a checkpoint right after a wait costs nothing.
        waiter.wait(Duration::ZERO).unwrap();
        let looks = duty.polls.get();
        waiter.checkpoint();
        assert_eq!(duty.runs.get(), 1);
        assert_eq!(duty.polls.get(), looks + 1, "one look at the duty, no wait");
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
