//! Runs the real `nexo-manager` binary and reports everything useful when a
//! test fails: the command, the environment (secrets redacted), the exit
//! status, stdout, stderr and the CP simulator's request log.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use nexo_cpsim::Simulator;

static RUN: AtomicU32 = AtomicU32::new(0);

/// How long a test waits for the Manager to exit after a signal. Generous:
/// a clean stop finishes the request or command in hand and releases the
/// lease. A test whose subject is how soon the stop comes says so beside
/// its own bound.
pub const STOP_WAIT: Duration = Duration::from_secs(30);

/// How long a test waits for the Manager to announce its probe listener
/// (bound before anything is read from the cluster or sent to the CP).
pub const PROBE_WAIT: Duration = Duration::from_secs(30);

/// The Manager binary under test.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_nexo-manager"))
}

/// The static release binary the image ships (`$NEXO_STATIC_BINARY`, built
/// by tests/build-static.sh); panics with what to do when it is missing.
pub fn static_binary() -> PathBuf {
    binary_named_by(
        "NEXO_STATIC_BINARY",
        "the static binary",
        "tests/build-static.sh (tests/run.sh and tests/bench.sh do)",
    )
}

/// The static arm64 release binary (`$NEXO_STATIC_BINARY_ARM64`, built by
/// `tests/build-static.sh arm64`); panics with what to do when it is missing.
pub fn arm64_binary() -> PathBuf {
    binary_named_by(
        "NEXO_STATIC_BINARY_ARM64",
        "the arm64 binary",
        "`bash tests/build-static.sh arm64` (tests/run.sh does)",
    )
}

/// The file that the environment variable `var` names, which must exist;
/// panics saying how to build `what` with `how` when it is not set.
fn binary_named_by(var: &str, what: &str, how: &str) -> PathBuf {
    let path = std::env::var_os(var).unwrap_or_else(|| {
        panic!(
            "{var} is not set: build {what} first with {how} and point {var} at the path it prints"
        )
    });
    let path = PathBuf::from(path);
    assert!(path.is_file(), "{var}={} does not exist", path.display());
    path
}

/// qemu-user's aarch64 emulator (`qemu-aarch64-static`, from Debian's
/// qemu-user-static), found on `PATH`; panics with what to install when it
/// is missing.
pub fn qemu_aarch64() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("qemu-aarch64-static"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "qemu-aarch64-static is not on PATH: install Debian's qemu-user-static \
                 (apt-get install qemu-user-static; .ci/run does)"
            )
        })
}

/// A Manager process, its output captured in files.
pub struct Manager {
    /// The command line it was started with (an emulator's included).
    command: String,
    child: Option<Child>,
    status: Option<ExitStatus>,
    env: BTreeMap<String, String>,
    stdout: PathBuf,
    stderr: PathBuf,
    /// Its probe address, once read from its log.
    probe: Option<SocketAddr>,
    /// The simulator it talks to, for reports.
    pub sim_log: Option<Box<dyn Fn() -> String + Send>>,
    /// The bearer tokens the simulator was sent (connect and session
    /// tokens), searched for in the log.
    sim_tokens: Option<Box<dyn Fn() -> Vec<String> + Send>>,
}

impl Manager {
    /// Starts the binary with exactly `env` (plus `PATH`).
    pub fn spawn(env: &BTreeMap<String, String>) -> Manager {
        Manager::spawn_binary(&binary(), env)
    }

    /// Starts `binary` (the static release binary, say) with exactly `env`
    /// (plus `PATH`).
    pub fn spawn_binary(binary: &std::path::Path, env: &BTreeMap<String, String>) -> Manager {
        Manager::spawn_command(Command::new(binary), env)
    }

    /// Starts `binary` under the user-mode emulator `emulator`
    /// (`qemu-aarch64-static BINARY`) with exactly `env` (plus `PATH`):
    /// signals sent to the process reach the emulated program.
    pub fn spawn_emulated(
        emulator: &std::path::Path,
        binary: &std::path::Path,
        env: &BTreeMap<String, String>,
    ) -> Manager {
        let mut command = Command::new(emulator);
        command.arg(binary);
        Manager::spawn_command(command, env)
    }

    fn spawn_command(mut command: Command, env: &BTreeMap<String, String>) -> Manager {
        let line = std::iter::once(command.get_program())
            .chain(command.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(" ");
        let n = RUN.fetch_add(1, Ordering::Relaxed);
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let stdout = dir.join(format!("manager-{}-{n}.out", std::process::id()));
        let stderr = dir.join(format!("manager-{}-{n}.err", std::process::id()));
        let child = command
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(env)
            .stdin(Stdio::null())
            .stdout(File::create(&stdout).unwrap())
            .stderr(File::create(&stderr).unwrap())
            .spawn()
            .expect("spawn nexo-manager");
        Manager {
            command: line,
            child: Some(child),
            status: None,
            env: env.clone(),
            stdout,
            stderr,
            probe: None,
            sim_log: None,
            sim_tokens: None,
        }
    }

    /// Attaches the simulator whose log goes into failure reports.
    pub fn with_sim(mut self, sim: &std::sync::Arc<Simulator>) -> Manager {
        let log = sim.clone();
        self.sim_log = Some(Box::new(move || log.log_dump()));
        let sim = sim.clone();
        self.sim_tokens = Some(Box::new(move || {
            sim.requests()
                .iter()
                .flat_map(|r| r.headers.iter())
                .filter(|(name, _)| name == "authorization")
                .filter_map(|(_, v)| v.strip_prefix("Bearer ").map(str::to_owned))
                .collect()
        }));
        self
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).expect("running")
    }

    /// Waits for the exit, at most `timeout`; panics with a report if it
    /// is still running then.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        if let Some(s) = self.status {
            return s;
        }
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.status = Some(s);
                self.child = None;
                return s;
            }
            if Instant::now() > deadline {
                self.fail(&format!("nexo-manager still running after {timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => match c.try_wait().unwrap() {
                Some(s) => {
                    self.status = Some(s);
                    self.child = None;
                    false
                }
                None => true,
            },
            None => false,
        }
    }

    /// Sends a signal (`TERM`, `INT`, `KILL`).
    pub fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .unwrap();
        assert!(ok.success(), "kill -{name} failed");
    }

    /// Stops it with SIGTERM and checks that it exits 0 within [`STOP_WAIT`].
    pub fn stop_expecting_exit_0(&mut self) {
        self.signal("TERM");
        let status = self.wait_exit(STOP_WAIT);
        self.check(
            status.success(),
            &format!("exit 0 on SIGTERM, got {status:?}"),
        );
        self.check_no_secret_in_log();
    }

    /// Every token this process held or sent: the connect token (its
    /// variable or file), each bearer token the simulator was sent, the
    /// API server's bearer token in its kubeconfig.
    pub fn secrets(&self) -> Vec<String> {
        let mut secrets: Vec<String> = self
            .env
            .get("NEXO_CONNECT_TOKEN")
            .cloned()
            .into_iter()
            .collect();
        if let Some(file) = self.env.get("NEXO_CONNECT_TOKEN_FILE")
            && let Ok(text) = std::fs::read_to_string(file)
        {
            secrets.push(text.trim().to_owned());
        }
        if let Some(tokens) = &self.sim_tokens {
            secrets.extend(tokens());
        }
        if let Some(kubeconfig) = self.env.get("KUBECONFIG") {
            secrets.extend(super::secrets::kubeconfig_tokens(std::path::Path::new(
                kubeconfig,
            )));
        }
        secrets.sort();
        secrets.dedup();
        secrets
    }

    /// Fails, with the report, when any of [`Manager::secrets`] is in the
    /// log, plain, in hex or in base64 (whatever `RUST_LOG` was: the tests
    /// run the Manager at `trace`).
    pub fn check_no_secret_in_log(&self) {
        let log = self.stderr();
        for secret in self.secrets() {
            if let Some(form) = super::secrets::found_in(&log, &secret) {
                // The report prints the log, which holds the secret; a
                // test bed's token is worthless outside it.
                self.fail(&format!(
                    "a token ({} characters, starting {:?}) is in the log, {form}",
                    secret.len(),
                    &secret[..4.min(secret.len())]
                ));
            }
        }
    }

    /// What it wrote to stdout so far.
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    /// What it wrote to stderr so far (the log).
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// A reader of the log that does not borrow the process (for `wait_until`).
    pub fn log_reader(&self) -> impl Fn() -> String + use<> {
        let path = self.stderr.clone();
        move || std::fs::read_to_string(&path).unwrap_or_default()
    }

    /// The address of its probe listener, started with
    /// `NEXO_LISTEN_ADDR=127.0.0.1:0` ([`super::PROBES_ON_ANY_PORT`]): read
    /// from the line it logs once the listener is bound.
    pub fn probe_addr(&mut self) -> SocketAddr {
        if let Some(addr) = self.probe {
            return addr;
        }
        let log = self.log_reader();
        let mut addr = None;
        self.wait_until(
            PROBE_WAIT,
            &format!("the log line `{} address=127.0.0.1:PORT`", super::LISTENING),
            || {
                addr = super::listening_addr(&log());
                addr.is_some()
            },
        );
        let addr = addr.expect("found by the wait");
        self.probe = Some(addr);
        addr
    }

    /// `GET /metrics` on its probe listener.
    pub fn metrics(&mut self) -> String {
        let addr = self.probe_addr();
        let (status, text) = super::http_get(addr, "/metrics");
        self.check(
            status == 200,
            &format!("/metrics answered {status}: {text}"),
        );
        text
    }

    /// One series of its `/metrics` ([`super::sample`]).
    pub fn metric(&mut self, series: &str) -> Option<f64> {
        super::sample(&self.metrics(), series)
    }

    /// Everything a reader of a failed test needs.
    pub fn report(&self) -> String {
        let env: Vec<String> = self
            .env
            .iter()
            .map(|(k, v)| {
                let secret = k.contains("TOKEN") && !k.ends_with("_FILE");
                format!("  {k}={}", if secret { "<redacted>" } else { v })
            })
            .collect();
        let sim = self
            .sim_log
            .as_ref()
            .map(|f| f())
            .unwrap_or_else(|| "(no simulator)".into());
        format!(
            "command: {}\nenvironment:\n{}\nexit status: {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}\n--- simulator request log ---\n{}",
            self.command,
            env.join("\n"),
            self.status,
            self.stdout(),
            self.stderr(),
            sim
        )
    }

    /// Panics with `why` and the report.
    pub fn fail(&self, why: &str) -> ! {
        panic!("{why}\n{}", self.report())
    }

    /// Asserts, with the report on failure.
    pub fn check(&self, cond: bool, why: &str) {
        if !cond {
            self.fail(why);
        }
    }

    /// Waits until `pred` holds, failing with the report after `timeout`.
    pub fn wait_until(&mut self, timeout: Duration, what: &str, mut pred: impl FnMut() -> bool) {
        let deadline = Instant::now() + timeout;
        while !pred() {
            if Instant::now() > deadline {
                self.fail(&format!("timed out after {timeout:?} waiting for {what}"));
            }
            if !self.running() {
                if pred() {
                    return;
                }
                self.fail(&format!("nexo-manager exited while waiting for {what}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Every run is searched for the tokens it held, unless the test
        // already failed (its own report says more).
        if !std::thread::panicking() {
            self.check_no_secret_in_log();
        }
    }
}
