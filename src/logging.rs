//! Log output in the shape of Kubernetes structured logging: a constant
//! message and the values as fields of their own, text or one JSON object
//! a line (agent.md, "Operating it"), on stderr, filtered by `RUST_LOG`.
//!
//! A call site names its values as fields, with this crate's macros
//! ([`crate::info!`] and its siblings): `warn!(err:% = e, lease = name;
//! "cannot renew the lease")`, the message a literal. `k = v` takes an
//! integer, a bool or a string as it is; `k:% = v` displays `v`, `k:? = v`
//! debugs it; `k` alone is `k = k`. A call site passes its values as
//! `&dyn LogValue` (a few pointers each), and [`log()`] hands them to the
//! logger beside the record ([`FIELDS`]; the process has one thread), not
//! through `log`'s key-values: their value type links float formatting,
//! and their captures cost code at every call site (both measured:
//! BENCHMARKS.md, "Structured logs").
//!
//! JSON lines are klog's: `ts` in seconds since the epoch (milliseconds),
//! `v` the verbosity (0 for error to info, 4 debug, 6 trace), `level`
//! (klog's JSON has none; a query selects warnings by it), `logger` (the
//! module), `msg`, then the fields. Text lines say the same:
//! `<RFC 3339 ms> <LEVEL> <module>: <msg> key=value key="a value"`.
//! While a command runs ([`CommandScope`]), every line carries its
//! `commandId`, `class`, and the `namespace` and `deployment` it names.
//!
//! Values from the CP and the cluster reach log lines (ids, names,
//! Kubernetes messages); a line is always one line: control characters in
//! text are escaped (`crate::text::escape`) and quoted values escape their
//! quotes, and JSON escapes them anyway.
//!
//! No level reaches the HTTP and TLS libraries' wire: at `trace`, ureq-proto
//! dumps every byte it sends and receives in hex (an `Authorization` header
//! with it) and ureq writes whole URIs. Their records above `debug` are
//! dropped whatever `RUST_LOG` says ([`wire_capped`]); their `debug` lines
//! redact headers themselves.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::text::escape;

/// The log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines, `key=value` fields.
    Text,
    /// One JSON object a line.
    Json,
}

/// The command a line is written for.
#[derive(Debug)]
struct Scope {
    id: String,
    class: &'static str,
    deployment: Option<(String, String)>,
}

/// A field's name and value.
pub type Field = (&'static str, FieldValue);

thread_local! {
    /// The command being handled (the process has one thread).
    static COMMAND: RefCell<Option<Scope>> = const { RefCell::new(None) };
    /// The fields of the record being logged, set by the macros around
    /// their `log` call and taken by the logger.
    pub static FIELDS: RefCell<Vec<Field>> = const { RefCell::new(Vec::new()) };
}

/// Marks the log lines written while it lives as those of one command.
#[derive(Debug)]
pub struct CommandScope(());

impl CommandScope {
    /// Starts the scope of command `id` of `class`, of the deployment
    /// (namespace, name) it names, if any.
    pub fn enter(id: &str, class: &'static str, deployment: Option<(&str, &str)>) -> CommandScope {
        let scope = Scope {
            id: id.to_owned(),
            class,
            deployment: deployment.map(|(ns, name)| (ns.to_owned(), name.to_owned())),
        };
        COMMAND.with(|c| *c.borrow_mut() = Some(scope));
        CommandScope(())
    }
}

impl Drop for CommandScope {
    fn drop(&mut self) {
        COMMAND.with(|c| *c.borrow_mut() = None);
    }
}

/// A field's value: JSON keeps numbers and booleans as such.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldValue {
    /// A string (anything displayed).
    Text(String),
    /// An integer.
    Int(i64),
    /// An unsigned integer.
    UInt(u64),
    /// A boolean.
    Bool(bool),
}

impl std::fmt::Display for FieldValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FieldValue::Text(s) => f.write_str(s),
            FieldValue::Int(n) => write!(f, "{n}"),
            FieldValue::UInt(n) => write!(f, "{n}"),
            FieldValue::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// A field's value at a call site, turned into a [`FieldValue`] only when
/// the line is written: the macros pass `&dyn LogValue`s, so a call site
/// costs a few pointers, whatever its values' types.
pub trait LogValue {
    /// The field's value.
    fn field(&self) -> FieldValue;
}

macro_rules! unsigned_field {
    ($($t:ty),*) => {$(
        impl LogValue for $t {
            fn field(&self) -> FieldValue {
                FieldValue::UInt(u64::try_from(*self).unwrap_or(u64::MAX))
            }
        }
    )*};
}
unsigned_field!(u8, u16, u32, u64, usize);

impl LogValue for i64 {
    fn field(&self) -> FieldValue {
        FieldValue::Int(*self)
    }
}

impl LogValue for i32 {
    fn field(&self) -> FieldValue {
        FieldValue::Int((*self).into())
    }
}

impl LogValue for bool {
    fn field(&self) -> FieldValue {
        FieldValue::Bool(*self)
    }
}

impl LogValue for str {
    fn field(&self) -> FieldValue {
        FieldValue::Text(self.to_owned())
    }
}

impl LogValue for String {
    fn field(&self) -> FieldValue {
        FieldValue::Text(self.clone())
    }
}

impl<T: LogValue + ?Sized> LogValue for &T {
    fn field(&self) -> FieldValue {
        (**self).field()
    }
}

impl<T: LogValue + ?Sized> LogValue for std::rc::Rc<T> {
    fn field(&self) -> FieldValue {
        (**self).field()
    }
}

/// A value displayed (`k:% = v`).
pub struct Disp<'a>(pub &'a dyn std::fmt::Display);

impl LogValue for Disp<'_> {
    fn field(&self) -> FieldValue {
        FieldValue::Text(self.0.to_string())
    }
}

/// A value debugged (`k:? = v`).
pub struct Dbg<'a>(pub &'a dyn std::fmt::Debug);

impl LogValue for Dbg<'_> {
    fn field(&self) -> FieldValue {
        FieldValue::Text(format!("{:?}", self.0))
    }
}

/// Logs `message` at `level` from `target` with `fields`: what the
/// macros expand to, one function for every call site.
pub fn log(
    level: log::Level,
    target: &'static str,
    message: &'static str,
    fields: &[(&'static str, &dyn LogValue)],
) {
    if !log::logger().enabled(&log::Metadata::builder().level(level).target(target).build()) {
        return;
    }
    let fields = fields.iter().map(|(k, v)| (*k, v.field())).collect();
    FIELDS.with(|f| *f.borrow_mut() = fields);
    log::log!(target: target, level, "{message}");
    FIELDS.with(|f| f.borrow_mut().clear());
}

/// A field of a macro call: `k = v`, `k:% = v`, `k:? = v` or `k`.
#[doc(hidden)]
#[macro_export]
macro_rules! __log_field {
    ($key:ident) => {
        &$key
    };
    ($key:ident = $value:expr) => {
        &$value
    };
    ($key:ident :% = $value:expr) => {
        &$crate::logging::Disp(&$value)
    };
    ($key:ident :? = $value:expr) => {
        &$crate::logging::Dbg(&$value)
    };
}

/// Logs at `level`: fields (`k = v`, `k:% = v`, `k:? = v`, `k`), then a
/// constant message; or the message alone.
#[doc(hidden)]
#[macro_export]
macro_rules! __log {
    ($level:expr, $msg:literal) => {
        $crate::__log!($level,; $msg)
    };
    ($level:expr, $($key:ident $(:$cap:tt)? $(= $value:expr)?),* ; $msg:literal) => {
        if $level <= ::log::max_level() {
            $crate::logging::log(
                $level,
                ::std::module_path!(),
                $msg,
                &[$((
                    ::std::stringify!($key),
                    $crate::__log_field!($key $(:$cap)? $(= $value)?) as &dyn $crate::logging::LogValue,
                )),*],
            );
        }
    };
}

/// Logs at error level (see [`crate::logging`]).
#[macro_export]
macro_rules! error {
    ($($t:tt)*) => { $crate::__log!(::log::Level::Error, $($t)*) };
}

/// Logs at warn level (see [`crate::logging`]).
#[macro_export]
macro_rules! warn {
    ($($t:tt)*) => { $crate::__log!(::log::Level::Warn, $($t)*) };
}

/// Logs at info level (see [`crate::logging`]).
#[macro_export]
macro_rules! info {
    ($($t:tt)*) => { $crate::__log!(::log::Level::Info, $($t)*) };
}

/// Logs at debug level (see [`crate::logging`]).
#[macro_export]
macro_rules! debug {
    ($($t:tt)*) => { $crate::__log!(::log::Level::Debug, $($t)*) };
}

/// klog's verbosity of a level.
fn verbosity(level: log::Level) -> u8 {
    match level {
        log::Level::Error | log::Level::Warn | log::Level::Info => 0,
        log::Level::Debug => 4,
        log::Level::Trace => 6,
    }
}

/// The fields of the command scope, if one is open.
fn scope_fields() -> Vec<Field> {
    COMMAND.with(|c| {
        let mut out = Vec::new();
        if let Some(scope) = &*c.borrow() {
            out.push(("commandId", FieldValue::Text(scope.id.clone())));
            out.push(("class", FieldValue::Text(scope.class.to_owned())));
            if let Some((ns, name)) = &scope.deployment {
                out.push(("namespace", FieldValue::Text(ns.clone())));
                out.push(("deployment", FieldValue::Text(name.clone())));
            }
        }
        out
    })
}

/// A text value: bare when it is one plain word, else quoted with its
/// quotes and backslashes escaped; control characters always escaped.
fn text_value(out: &mut String, value: &FieldValue) {
    let s = value.to_string();
    let plain = !s.is_empty()
        && !s
            .chars()
            .any(|c| c.is_whitespace() || c == '"' || c == '=' || c == '\\');
    if plain {
        out.push_str(&escape(&s));
    } else {
        out.push('"');
        out.push_str(&escape(&s.replace('\\', "\\\\").replace('"', "\\\"")));
        out.push('"');
    }
}

/// `s` as a JSON string.
fn json_string(out: &mut String, s: &str) {
    // A &str always serializes.
    out.push_str(&serde_json::to_string(s).unwrap_or_default());
}

/// One log line, without its newline: `at` its time, `fields` the call
/// site's (the command scope's are added).
pub fn line(
    format: LogFormat,
    at: SystemTime,
    level: log::Level,
    target: &str,
    message: &str,
    fields: &[Field],
) -> String {
    let scope = scope_fields();
    // A call site's own field wins over the scope's of the same key.
    let all = scope
        .iter()
        .filter(|(k, _)| !fields.iter().any(|(f, _)| f == k))
        .chain(fields.iter());
    match format {
        LogFormat::Text => {
            let ts = humantime::format_rfc3339_millis(at);
            let mut out = format!("{ts} {level:<5} {target}: {}", escape(message));
            for (key, value) in all {
                let _ = write!(out, " {key}=");
                text_value(&mut out, value);
            }
            out
        }
        LogFormat::Json => {
            let since = at.duration_since(UNIX_EPOCH).unwrap_or_default();
            let mut out = format!(
                "{{\"ts\":{}.{:03},\"v\":{},\"level\":\"{}\",\"logger\":",
                since.as_secs(),
                since.subsec_millis(),
                verbosity(level),
                level.as_str().to_ascii_lowercase()
            );
            json_string(&mut out, target);
            out.push_str(",\"msg\":");
            json_string(&mut out, message);
            for (key, value) in all {
                out.push(',');
                json_string(&mut out, key);
                out.push(':');
                match value {
                    FieldValue::Text(s) => json_string(&mut out, s),
                    other => {
                        let _ = write!(out, "{other}");
                    }
                }
            }
            out.push('}');
            out
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
        let message = record.args().to_string();
        let fields = FIELDS.with(|f| std::mem::take(&mut *f.borrow_mut()));
        writeln!(
            buf,
            "{}",
            line(
                format,
                SystemTime::now(),
                record.level(),
                record.target(),
                &message,
                &fields
            )
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

    fn text(message: &str, fields: &[Field]) -> String {
        line(
            LogFormat::Text,
            UNIX_EPOCH,
            log::Level::Info,
            "x",
            message,
            fields,
        )
    }

    fn json(level: log::Level, message: &str, fields: &[Field]) -> serde_json::Value {
        let at = UNIX_EPOCH + std::time::Duration::from_millis(1_765_117_357_123);
        let l = line(LogFormat::Json, at, level, "x::y", message, fields);
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}"))
    }

    #[test]
    fn a_value_cannot_forge_a_line() {
        let forged = "a\n1970-01-01T00:00:00.000Z INFO  forged";
        let line = text(forged, &[("name", FieldValue::Text(forged.into()))]);
        assert_eq!(line.lines().count(), 1, "{line}");
        let quoted = text("m", &[("name", FieldValue::Text("a\" b=c".into()))]);
        assert!(quoted.ends_with(r#" name="a\" b=c""#), "{quoted}");
        let j = json(
            log::Level::Warn,
            "a\nb",
            &[("k", FieldValue::Text("c\nd".into()))],
        );
        assert_eq!(j.to_string().lines().count(), 1);
    }

    #[test]
    fn json_lines_have_klogs_shape_and_keep_value_types() {
        let j = json(
            log::Level::Debug,
            "heartbeat accepted",
            &[
                ("sequence", FieldValue::UInt(7)),
                ("held", FieldValue::Bool(true)),
                ("err", FieldValue::Text("timed out".into())),
            ],
        );
        assert_eq!(j["ts"], 1_765_117_357.123);
        assert_eq!(j["v"], 4);
        assert_eq!(j["level"], "debug");
        assert_eq!(j["logger"], "x::y");
        assert_eq!(j["msg"], "heartbeat accepted");
        assert_eq!(j["sequence"], 7);
        assert_eq!(j["held"], true);
        assert_eq!(j["err"], "timed out");
        assert_eq!(json(log::Level::Error, "m", &[])["v"], 0);
        let t = text(
            "heartbeat accepted",
            &[
                ("sequence", FieldValue::UInt(7)),
                ("err", FieldValue::Text("timed out".into())),
            ],
        );
        assert_eq!(
            t,
            r#"1970-01-01T00:00:00.000Z INFO  x: heartbeat accepted sequence=7 err="timed out""#
        );
    }

    #[test]
    fn the_macros_capture_values_as_their_kind_says() {
        let name = "nexo-manager";
        let term = 3_u64;
        let err = std::io::Error::other("timed out");
        let wait = std::time::Duration::from_millis(1500);
        let given: [(&str, &dyn LogValue); 4] = [
            ("name", crate::__log_field!(name)),
            ("term", crate::__log_field!(term = term)),
            ("err", crate::__log_field!(err :% = err)),
            ("wait", crate::__log_field!(wait :? = wait)),
        ];
        let fields: Vec<Field> = given.iter().map(|(k, v)| (*k, v.field())).collect();
        assert_eq!(
            fields,
            [
                ("name", FieldValue::Text("nexo-manager".into())),
                ("term", FieldValue::UInt(3)),
                ("err", FieldValue::Text("timed out".into())),
                ("wait", FieldValue::Text("1.5s".into())),
            ]
        );
        // Taken by the logger once: a line's fields are never another's.
        FIELDS.with(|f| *f.borrow_mut() = fields);
        let taken = FIELDS.with(|f| std::mem::take(&mut *f.borrow_mut()));
        assert_eq!(taken.len(), 4);
        assert!(FIELDS.with(|f| f.borrow().is_empty()));
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
    fn lines_carry_the_command_while_it_runs() {
        let outside = json(log::Level::Info, "m", &[]);
        assert!(outside.get("commandId").is_none(), "{outside}");
        {
            let _scope = CommandScope::enter("cmd-1", "deploy", Some(("shop", "orders")));
            let inside = json(log::Level::Info, "m", &[]);
            assert_eq!(inside["commandId"], "cmd-1");
            assert_eq!(inside["class"], "deploy");
            assert_eq!(inside["namespace"], "shop");
            assert_eq!(inside["deployment"], "orders");
            let t = text("m", &[]);
            assert!(
                t.ends_with(" m commandId=cmd-1 class=deploy namespace=shop deployment=orders"),
                "{t}"
            );
        }
        let after = json(log::Level::Info, "m", &[]);
        assert!(after.get("commandId").is_none(), "{after}");
    }
}
