//! Log output: text or one JSON object a line, on stderr, filtered by `RUST_LOG`.
//!
//! Values from the CP and the cluster reach log messages (ids, names,
//! Kubernetes messages); a line is always one line: control characters in
//! a text message are escaped (`crate::text::escape`), and JSON escapes them anyway.
//! While a command runs ([`CommandScope`]), JSON lines carry its
//! `commandId` and `deploymentName` as fields. Timestamps have milliseconds.
//!
//! No level reaches the HTTP and TLS libraries' wire: at `trace`, ureq-proto
//! dumps every byte it sends and receives in hex (an `Authorization` header
//! with it) and ureq writes whole URIs. Their records above `debug` are
//! dropped whatever `RUST_LOG` says ([`wire_capped`]); their `debug` lines
//! redact headers themselves.

use std::cell::RefCell;
use std::io::Write;
use std::time::SystemTime;

use crate::text::escape;

/// The log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object a line.
    Json,
}

thread_local! {
    /// The command being handled (the process has one thread).
    static COMMAND: RefCell<Option<(String, Option<String>)>> = const { RefCell::new(None) };
}

/// Marks the log lines written while it lives as those of one command.
#[derive(Debug)]
pub struct CommandScope(());

impl CommandScope {
    /// Starts the scope of command `id`, of deployment `deployment` if it names one.
    pub fn enter(id: &str, deployment: Option<&str>) -> CommandScope {
        COMMAND.with(|c| *c.borrow_mut() = Some((id.to_owned(), deployment.map(str::to_owned))));
        CommandScope(())
    }
}

impl Drop for CommandScope {
    fn drop(&mut self) {
        COMMAND.with(|c| *c.borrow_mut() = None);
    }
}

/// One log line, without its newline.
pub fn line(format: LogFormat, ts: &str, level: log::Level, target: &str, message: &str) -> String {
    match format {
        LogFormat::Text => format!("{ts} {level:<5} {target}: {}", escape(message)),
        LogFormat::Json => {
            let mut line = serde_json::json!({
                "ts": ts,
                "level": level.as_str(),
                "target": target,
                "msg": message,
            });
            COMMAND.with(|c| {
                if let Some((id, deployment)) = &*c.borrow() {
                    line["commandId"] = id.as_str().into();
                    if let Some(d) = deployment {
                        line["deploymentName"] = d.as_str().into();
                    }
                }
            });
            line.to_string()
        }
    }
}

/// The crates whose `trace` records carry the wire (bytes, headers, URIs):
/// a target equal to one of these or under it (`ureq_proto::util`).
const WIRE_CRATES: [&str; 3] = ["ureq", "ureq_proto", "rustls"];

/// Whether a record of `level` from `target` is dropped, whatever the
/// filter: a wire crate's `trace`.
pub fn wire_capped(target: &str, level: log::Level) -> bool {
    level > log::Level::Debug
        && WIRE_CRATES.iter().any(|c| {
            target
                .strip_prefix(c)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
        })
}

/// `RUST_LOG`'s logger, less the wire crates' `trace`.
struct Capped(env_logger::Logger);

impl log::Log for Capped {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        !wire_capped(metadata.target(), metadata.level()) && self.0.enabled(metadata)
    }

    fn log(&self, record: &log::Record<'_>) {
        if !wire_capped(record.target(), record.level()) {
            self.0.log(record);
        }
    }

    fn flush(&self) {
        self.0.flush();
    }
}

/// Installs the logger. `RUST_LOG` filters (default `info`), never past
/// [`wire_capped`].
pub fn init(format: LogFormat) {
    let mut builder =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    builder.format(move |buf, record| {
        let ts = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
        let message = record.args().to_string();
        writeln!(
            buf,
            "{}",
            line(format, &ts, record.level(), record.target(), &message)
        )
    });
    let logger = builder.build();
    let max = logger.filter();
    if log::set_boxed_logger(Box::new(Capped(logger))).is_ok() {
        log::set_max_level(max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_cannot_forge_a_line() {
        let text = line(
            LogFormat::Text,
            "t",
            log::Level::Info,
            "x",
            "command a\n2026-12-03T00:00:00.000Z INFO forged",
        );
        assert_eq!(text.lines().count(), 1, "{text}");
        let json = line(LogFormat::Json, "t", log::Level::Warn, "x", "a\nb");
        assert_eq!(json.lines().count(), 1, "{json}");
    }

    #[test]
    fn the_wire_crates_never_log_at_trace() {
        use log::Level::{Debug, Trace};
        for target in [
            "ureq_proto::util",
            "ureq_proto",
            "ureq::run",
            "rustls::conn",
        ] {
            assert!(wire_capped(target, Trace), "{target}");
            assert!(!wire_capped(target, Debug), "{target}");
        }
        for target in ["nexo_manager::agent", "ureqx", "rustls_pemfile"] {
            assert!(!wire_capped(target, Trace), "{target}");
        }
    }

    #[test]
    fn json_lines_carry_the_command_while_it_runs() {
        let outside = line(LogFormat::Json, "t", log::Level::Info, "x", "m");
        assert!(!outside.contains("commandId"), "{outside}");
        {
            let _scope = CommandScope::enter("cmd-1", Some("orders"));
            let inside: serde_json::Value =
                serde_json::from_str(&line(LogFormat::Json, "t", log::Level::Info, "x", "m"))
                    .unwrap();
            assert_eq!(inside["commandId"], "cmd-1");
            assert_eq!(inside["deploymentName"], "orders");
            let text = line(LogFormat::Text, "t", log::Level::Info, "x", "m");
            assert!(
                !text.contains("cmd-1"),
                "text lines name the command themselves"
            );
        }
        let after = line(LogFormat::Json, "t", log::Level::Info, "x", "m");
        assert!(!after.contains("commandId"), "{after}");
    }
}
