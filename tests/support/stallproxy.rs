//! A TCP relay in front of the CP simulator that can stop reading what the
//! Manager sends, as a Control Plane that stops reading mid-request does.
//! Once stalled, it closes the connections it relays, and relays of each
//! new one only its first few KiB (the TLS handshake), then reads nothing
//! more. Its sockets from the Manager announce small segments and have a
//! small receive buffer, so that on a new connection (whose send buffer
//! the kernel sizes from them) a request of a hundred KiB fills what the
//! kernel holds and the Manager's writes must wait. TLS goes through it
//! untouched.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::FromRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A running relay.
pub struct StallProxy {
    /// Its address.
    pub addr: SocketAddr,
    stalled: Arc<AtomicBool>,
    /// The connections from the Manager relayed so far.
    open: Arc<Mutex<Vec<TcpStream>>>,
}

/// What a connection made while stalled gets through: its TLS handshake
/// (a ClientHello and a Finished, a few hundred bytes).
const HANDSHAKE: usize = 4096;

/// The receive buffer of its sockets from the Manager.
const RECEIVE_BUFFER: libc::c_int = 4096;
/// The segment size they announce.
const SEGMENT: libc::c_int = 536;

impl StallProxy {
    /// Starts on a free loopback port, relaying to `upstream`.
    pub fn start(upstream: SocketAddr) -> StallProxy {
        let listener = small_listener();
        let addr = listener.local_addr().unwrap();
        let stalled = Arc::new(AtomicBool::new(false));
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::new(Mutex::new(Vec::new()));
        let (s, o) = (stalled.clone(), open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                o.lock().unwrap().push(client.try_clone().unwrap());
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                // A connection made while stalled gets its handshake through.
                let allowance = s.load(Ordering::SeqCst).then_some(HANDSHAKE);
                std::thread::spawn(move || relay(client, server, allowance));
                std::thread::spawn(move || relay(s2, c2, None));
            }
        });
        StallProxy {
            addr,
            stalled,
            open,
        }
    }

    /// Stops reading what the Manager sends: the connections relayed so
    /// far are closed, and each new one gets only its TLS handshake
    /// through.
    pub fn stall(&self) {
        self.stalled.store(true, Ordering::SeqCst);
        for c in self.open.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

/// A loopback listener whose connections announce a small segment size
/// and have a small receive buffer, both set before `listen(2)` so that
/// the handshake carries them: the Manager's side then sizes its send
/// buffer from small segments (on loopback, segments of 64 KiB would size
/// it at megabytes), and a few dozen KiB fill what the kernel holds.
fn small_listener() -> TcpListener {
    // SAFETY: socket(2) with constant arguments; the descriptor is owned
    // at once below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
    // SAFETY: a fresh descriptor nothing else owns.
    let listener = unsafe { TcpListener::from_raw_fd(fd) };
    for (level, option, value) in [
        (libc::SOL_SOCKET, libc::SO_RCVBUF, RECEIVE_BUFFER),
        (libc::IPPROTO_TCP, libc::TCP_MAXSEG, SEGMENT),
    ] {
        // SAFETY: a valid descriptor, and a pointer to a c_int that lives
        // across the call with its size.
        let set = unsafe {
            libc::setsockopt(
                fd,
                level,
                option,
                (&raw const value).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(
            set,
            0,
            "setsockopt {option}: {}",
            std::io::Error::last_os_error()
        );
    }
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes([127, 0, 0, 1]),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: `addr` is a valid sockaddr_in living across the call, `len`
    // its size.
    let bound = unsafe { libc::bind(fd, (&raw const addr).cast(), len) };
    assert_eq!(bound, 0, "bind: {}", std::io::Error::last_os_error());
    // SAFETY: a bound socket.
    let listening = unsafe { libc::listen(fd, 64) };
    assert_eq!(listening, 0, "listen: {}", std::io::Error::last_os_error());
    listener
}

/// Copies `from` to `to` until either ends; after `allowance` bytes (when
/// given), reads nothing more (the socket stays open).
fn relay(mut from: TcpStream, mut to: TcpStream, allowance: Option<usize>) {
    let mut buf = [0u8; 1024];
    let mut relayed = 0;
    loop {
        let room = allowance.map_or(buf.len(), |a| a.saturating_sub(relayed).min(buf.len()));
        if room == 0 {
            // Holds the connection, unread, until the other side ends it.
            std::thread::sleep(Duration::from_secs(3600));
            return;
        }
        match from.read(&mut buf[..room]) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                relayed += n;
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
