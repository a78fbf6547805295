//! A deploy's `drift` settings: its mode and the JSON pointers it
//! ignores, bounded and checked.

use serde_json::{Value, json};

use super::{MAX_IGNORE, MAX_POINTER};

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
    pub fn parse(v: &Value) -> Result<Settings, String> {
        let m = match v {
            Value::Null => return Ok(Settings::default()),
            Value::Object(m) => m,
            _ => return Err("drift is not an object".into()),
        };
        if let Some(k) = m.keys().find(|k| *k != "mode" && *k != "ignore") {
            return Err(format!(
                "drift.{} is not a field of drift (mode, ignore)",
                crate::text::clip(k, 32)
            ));
        }
        let mode = match m.get("mode") {
            None | Some(Value::Null) => Mode::Report,
            Some(Value::String(s)) => match s.as_str() {
                "report" => Mode::Report,
                "enforce" => Mode::Enforce,
                "off" => Mode::Off,
                other => {
                    return Err(format!(
                        "drift.mode {:?} is not report, enforce or off",
                        crate::text::clip(other, 32)
                    ));
                }
            },
            Some(_) => return Err("drift.mode is not a string".into()),
        };
        let ignore = match m.get("ignore") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(list)) if list.len() > MAX_IGNORE => {
                return Err(format!(
                    "drift.ignore has {} pointers, more than {MAX_IGNORE}",
                    list.len()
                ));
            }
            Some(Value::Array(list)) => list
                .iter()
                .enumerate()
                .map(|(i, p)| pointer(p).map_err(|why| format!("drift.ignore[{i}]: {why}")))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err("drift.ignore is not a list".into()),
        };
        Ok(Settings { mode, ignore })
    }

    /// As the record keeps it.
    pub fn to_json(&self) -> Value {
        json!({"mode": self.mode.as_str(), "ignore": self.ignore})
    }
}

/// A JSON pointer (RFC 6901): `/`-separated, `~` only as `~0` or `~1`.
fn pointer(v: &Value) -> Result<String, String> {
    let p = v.as_str().ok_or("not a string")?;
    if p.len() > MAX_POINTER {
        return Err(format!("longer than {MAX_POINTER} bytes"));
    }
    if !p.starts_with('/') {
        return Err(format!(
            "{:?} is not a JSON pointer (it starts with /)",
            crate::text::clip(p, 32)
        ));
    }
    let bytes = p.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'~' && !matches!(bytes.get(i + 1), Some(b'0' | b'1')) {
            return Err(format!(
                "{:?}: ~ is only ~0 or ~1 in a JSON pointer",
                crate::text::clip(p, 32)
            ));
        }
        if b.is_ascii_control() {
            return Err("a control character".into());
        }
    }
    Ok(p.to_owned())
}
