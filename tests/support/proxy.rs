//! A minimal HTTP CONNECT proxy on loopback that counts the tunnels it opens:
//! enough to prove `HTTPS_PROXY` and `NO_PROXY` are honoured.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A running proxy.
pub struct ConnectProxy {
    /// Its address.
    pub addr: SocketAddr,
    tunnels: Arc<AtomicUsize>,
}

impl ConnectProxy {
    /// Starts on a free loopback port.
    pub fn start() -> ConnectProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let tunnels = Arc::new(AtomicUsize::new(0));
        let count = tunnels.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let count = count.clone();
                std::thread::spawn(move || tunnel(client, &count));
            }
        });
        ConnectProxy { addr, tunnels }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Tunnels opened so far.
    pub fn tunnels(&self) -> usize {
        self.tunnels.load(Ordering::SeqCst)
    }
}

fn tunnel(client: TcpStream, count: &AtomicUsize) {
    let _ = client.set_read_timeout(Some(Duration::from_secs(120)));
    let mut reader = BufReader::new(client.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let mut parts = line.split(' ');
    let (Some("CONNECT"), Some(target)) = (parts.next(), parts.next()) else {
        return;
    };
    let target = target.to_owned();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
            break;
        }
    }
    let Ok(upstream) = TcpStream::connect(&target) else {
        let _ = (&client).write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n");
        return;
    };
    count.fetch_add(1, Ordering::SeqCst);
    let _ = (&client).write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n");
    let (mut c2, mut u2) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut reader, &mut u2);
        let _ = u2.shutdown(std::net::Shutdown::Write);
    });
    let _ = std::io::copy(&mut &upstream, &mut c2);
    let _ = c2.shutdown(std::net::Shutdown::Write);
    let _ = up.join();
}
