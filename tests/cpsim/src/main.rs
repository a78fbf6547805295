//! `nexo-cpsim`: the CP simulator as a separate process, for the sandbox.
//!
//! ```text
//! nexo-cpsim [--addr 127.0.0.1:PORT] [--env ID[=TOKEN]]... [--ca-out PATH]
//!            [--plain-http] [--hold] [--heartbeat-interval SECS] [--keys-out PATH]
//!            [--redeliver-after SECS]
//! ```
//! With `--redeliver-after`, a command delivered and not acknowledged for
//! SECS is sent again (docs/protocol.md: the CP sends unacknowledged commands
//! again).
//! With `--keys-out`, every environment signs its commands with a key pair
//! made for this run, whose key line is written to PATH (the Manager's
//! `NEXO_COMMAND_KEYS_FILE`).
//! Prints `url=...`, `token.<ID>=...`, `ca=...`, `keys=...` and `ready`, one per line,
//! then serves until killed. Admin endpoints: `GET /_sim/log`,
//! `GET /_sim/acks`, `GET /_sim/heartbeats`, `POST /_sim/commands?env=ID`,
//! `POST /_sim/expire-sessions`, `POST /_sim/hold?on=true|false`,
//! `POST /_sim/inventory?confirm=never|always|late&lose=N&resync=true`, `GET
//! /_sim/inventory` (the inventory rebuilt from deltas and its checks).

#![forbid(unsafe_code)]

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use nexo_cpsim::{SimConfig, Simulator};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nexo-cpsim: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), String> {
    let mut config = SimConfig {
        admin: true,
        ..SimConfig::default()
    };
    let mut addr: SocketAddr = "127.0.0.1:0".parse().expect("literal");
    let mut envs: Vec<(String, Option<String>)> = Vec::new();
    let mut ca_out: Option<PathBuf> = None;
    let mut keys_out: Option<PathBuf> = None;
    let mut redeliver_after: Option<std::time::Duration> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--addr" => {
                addr = value()?
                    .parse()
                    .map_err(|_| "--addr is not host:port".to_owned())?
            }
            "--env" => {
                let v = value()?;
                match v.split_once('=') {
                    Some((id, token)) => envs.push((id.to_owned(), Some(token.to_owned()))),
                    None => envs.push((v, None)),
                }
            }
            "--ca-out" => ca_out = Some(PathBuf::from(value()?)),
            "--plain-http" => config.tls = false,
            "--hold" => config.hold = true,
            "--keys-out" => keys_out = Some(PathBuf::from(value()?)),
            "--redeliver-after" => {
                let secs: u64 = value()?
                    .parse()
                    .map_err(|_| "--redeliver-after is not a number of seconds".to_owned())?;
                redeliver_after = Some(std::time::Duration::from_secs(secs));
            }
            "--heartbeat-interval" => {
                config.heartbeat_interval_seconds = Some(
                    value()?
                        .parse()
                        .map_err(|_| "--heartbeat-interval is not a number".to_owned())?,
                )
            }
            "--help" | "-h" => {
                println!(
                    "nexo-cpsim [--addr HOST:PORT] [--env ID[=TOKEN]]... [--ca-out PATH] [--plain-http] [--hold] [--heartbeat-interval SECS] [--keys-out PATH] [--redeliver-after SECS]"
                );
                return Ok(());
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let sim =
        Simulator::start_on(config, addr).map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    sim.set_redeliver_after(redeliver_after);
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "url={}", sim.url());
    let mut key_lines = Vec::new();
    for (id, token) in envs {
        let token = match token {
            Some(t) => {
                sim.add_environment_with_token(&id, &t);
                t
            }
            None => sim.add_environment(&id),
        };
        let _ = writeln!(out, "token.{id}={token}");
        if keys_out.is_some() {
            key_lines.push(sim.sign_commands(&id, &format!("sim-{id}")));
        }
    }
    if let Some(path) = keys_out {
        std::fs::write(&path, key_lines.join("\n") + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        let _ = writeln!(out, "keys={}", path.display());
    }
    if let Some(path) = ca_out {
        sim.write_ca(&path);
        let _ = writeln!(out, "ca={}", path.display());
    }
    let _ = writeln!(out, "ready");
    let _ = out.flush();
    drop(out);
    loop {
        std::thread::park();
    }
}
