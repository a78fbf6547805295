//! The CNCF distribution registry (the test bed's `registry`), on a free
//! loopback port, for the chart's OCI tests and the image's supply chain.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The CNCF distribution registry on a free loopback port, stopped on drop.
pub struct Registry {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    log: PathBuf,
}

impl Registry {
    /// Starts `binary` with its storage in `dir`.
    pub fn start(binary: &Path, dir: &Path) -> Registry {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let config = dir.join("registry.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
                dir.join("storage").display()
            ),
        )
        .unwrap();
        let log = dir.join("registry.log");
        let child = Command::new(binary)
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let mut r = Registry { child, addr, log };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if std::net::TcpStream::connect(&r.addr).is_ok() {
                return r;
            }
            if let Ok(Some(status)) = r.child.try_wait() {
                panic!("the registry exited ({status}):\n{}", r.log());
            }
            assert!(
                Instant::now() < deadline,
                "the registry did not listen on {}:\n{}",
                r.addr,
                r.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
