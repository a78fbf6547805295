//! The transport against a real socket.
use std::net::TcpListener;

use super::*;

/// Counts the waits by interest; a stoppable one is stopped at once.
#[derive(Default)]
struct Counting {
    reads: Cell<usize>,
    writes: Cell<usize>,
}

impl Readiness for Counting {
    fn ready(
        &self,
        fd: RawFd,
        interest: Interest,
        timeout: Duration,
        mode: Mode,
    ) -> io::Result<Ready> {
        let count = match interest {
            Interest::Read => &self.reads,
            Interest::Write => &self.writes,
        };
        count.set(count.get() + 1);
        if mode.stoppable {
            return Ok(Ready::Stop);
        }
        poll_for(fd, interest.events(), timeout)
    }
}

/// A [`Counting`] loop installed, and an agent whose connections wait
/// in it.
fn installed() -> (Rc<Counting>, ureq::Agent) {
    let counting = Rc::new(Counting::default());
    install(counting.clone());
    let agent = crate::resolve::agent_with(
        ureq::Agent::config_builder()
            .max_idle_connections(0)
            .build(),
        ().chain(PollTcpConnector::CONTROL_PLANE),
    );
    (counting, agent)
}

#[test]
fn a_write_to_a_peer_that_stops_reading_waits_in_the_loop_and_ends_on_stop() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    // Accepts, reads nothing, holds the connection.
    let server = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        std::thread::sleep(Duration::from_secs(2));
        drop(s);
    });
    let (counting, agent) = installed();
    // More than the kernel holds for a peer that does not read.
    let body = vec![b'x'; 64 << 20];
    let url = format!("http://{addr}/");
    let started = Instant::now();
    let err = stoppable(|| agent.post(&url).send(&body[..])).unwrap_err();
    assert!(err.to_string().contains(STOPPED), "{err}");
    assert!(counting.writes.get() >= 1, "the write waited in the loop");
    assert!(started.elapsed() < Duration::from_secs(1), "ended at once");
    LOOP.with(|l| l.borrow_mut().take());
    server.join().unwrap();
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
    let (counting, agent) = installed();
    let url = format!("http://{addr}/");
    let body = agent.get(&url).call().unwrap().body_mut().read_to_string();
    assert_eq!(body.unwrap(), "ok");
    assert!(counting.reads.get() >= 1, "the read waited in the loop");
    let err = stoppable(|| agent.get(&url).call()).unwrap_err();
    assert!(err.to_string().contains(STOPPED), "{err}");
    LOOP.with(|l| l.borrow_mut().take());
    server.join().unwrap();
}
