//! A deploy's `drift` settings: its mode and the JSON pointers it
//! ignores, bounded and checked.

use std::fmt;

use serde_json::{Value, json};

use super::{MAX_IGNORE, MAX_POINTER};
use crate::text::clip;

/// What a deployment's drift leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Reported in the heartbeat.
    #[default]
    Report,
    /// Reported and corrected: applied again.
    Enforce,
    /// Not checked.
    Off,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Report => "report",
            Mode::Enforce => "enforce",
            Mode::Off => "off",
        }
    }
}

/// A deploy's `drift`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Settings {
    pub mode: Mode,
    /// JSON pointers, relative to each object, whose differences are not drift.
    pub ignore: Vec<String>,
}

impl Settings {
    /// Reads `drift` (absent: `report`, nothing ignored); an error names
    /// what is wrong.
    pub fn parse(v: &Value) -> Result<Settings, SettingsError> {
        let m = match v {
            Value::Null => return Ok(Settings::default()),
            Value::Object(m) => m,
            _ => return Err(SettingsError::NotAnObject),
        };
        if let Some(k) = m.keys().find(|k| *k != "mode" && *k != "ignore") {
            return Err(SettingsError::UnknownField(clip(k, 32)));
        }
        let mode = match m.get("mode") {
            None | Some(Value::Null) => Mode::Report,
            Some(Value::String(s)) => match s.as_str() {
                "report" => Mode::Report,
                "enforce" => Mode::Enforce,
                "off" => Mode::Off,
                other => return Err(SettingsError::UnknownMode(clip(other, 32))),
            },
            Some(_) => return Err(SettingsError::ModeNotAString),
        };
        let ignore = match m.get("ignore") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(list)) if list.len() > MAX_IGNORE => {
                return Err(SettingsError::TooManyPointers(list.len()));
            }
            Some(Value::Array(list)) => list
                .iter()
                .enumerate()
                .map(|(index, p)| {
                    pointer(p).map_err(|problem| SettingsError::Pointer { index, problem })
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err(SettingsError::IgnoreNotAList),
        };
        Ok(Settings { mode, ignore })
    }

    /// As the record keeps it.
    pub fn to_json(&self) -> Value {
        json!({"mode": self.mode.as_str(), "ignore": self.ignore})
    }
}

/// Why a deploy's `drift` is invalid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettingsError {
    NotAnObject,
    /// A field other than `mode` and `ignore` (clipped).
    UnknownField(String),
    /// A mode other than `report`, `enforce`, `off` (clipped).
    UnknownMode(String),
    ModeNotAString,
    /// More pointers than [`MAX_IGNORE`].
    TooManyPointers(usize),
    IgnoreNotAList,
    /// `ignore[index]` is not a JSON pointer.
    Pointer {
        index: usize,
        problem: PointerProblem,
    },
}

impl fmt::Display for SettingsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SettingsError::NotAnObject => f.write_str("drift is not an object"),
            SettingsError::UnknownField(k) => {
                write!(f, "drift.{k} is not a field of drift (mode, ignore)")
            }
            SettingsError::UnknownMode(m) => {
                write!(f, "drift.mode {m:?} is not report, enforce or off")
            }
            SettingsError::ModeNotAString => f.write_str("drift.mode is not a string"),
            SettingsError::TooManyPointers(n) => {
                write!(f, "drift.ignore has {n} pointers, more than {MAX_IGNORE}")
            }
            SettingsError::IgnoreNotAList => f.write_str("drift.ignore is not a list"),
            SettingsError::Pointer { index, problem } => {
                write!(f, "drift.ignore[{index}]: {problem}")
            }
        }
    }
}

impl std::error::Error for SettingsError {}

/// Why a value is not a JSON pointer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PointerProblem {
    NotAString,
    TooLong,
    /// It does not start with `/` (clipped).
    NoLeadingSlash(String),
    /// A `~` not followed by `0` or `1` (clipped).
    BadTilde(String),
    ControlCharacter,
}

impl fmt::Display for PointerProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PointerProblem::NotAString => f.write_str("not a string"),
            PointerProblem::TooLong => write!(f, "longer than {MAX_POINTER} bytes"),
            PointerProblem::NoLeadingSlash(p) => {
                write!(f, "{p:?} is not a JSON pointer (it starts with /)")
            }
            PointerProblem::BadTilde(p) => write!(f, "{p:?}: ~ is only ~0 or ~1 in a JSON pointer"),
            PointerProblem::ControlCharacter => f.write_str("a control character"),
        }
    }
}

/// A JSON pointer (RFC 6901): `/`-separated, `~` only as `~0` or `~1`.
fn pointer(v: &Value) -> Result<String, PointerProblem> {
    let p = v.as_str().ok_or(PointerProblem::NotAString)?;
    if p.len() > MAX_POINTER {
        return Err(PointerProblem::TooLong);
    }
    if !p.starts_with('/') {
        return Err(PointerProblem::NoLeadingSlash(clip(p, 32)));
    }
    let bytes = p.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'~' && !matches!(bytes.get(i + 1), Some(b'0' | b'1')) {
            return Err(PointerProblem::BadTilde(clip(p, 32)));
        }
        if b.is_ascii_control() {
            return Err(PointerProblem::ControlCharacter);
        }
    }
    Ok(p.to_owned())
}
