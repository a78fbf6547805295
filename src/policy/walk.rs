//! Typed reads of a manifest's values for the allowlist walk: where a value
//! is ([`At`]), the fields an object may have, and a value judged by type,
//! not spelling (`80`, `80.0` and `"80"` are the same integer, a boolean
//! is only `true` or `false`, `null` is the field left out).

use serde_json::{Map, Value};

use super::{Violation, clip};

/// Where a value is: the manifest, and the path inside it.
#[derive(Clone)]
pub(super) struct At<'a> {
    pub(super) manifest: &'a str,
    pub(super) path: String,
}

impl<'a> At<'a> {
    pub(super) fn field(&self, name: &str) -> At<'a> {
        At {
            manifest: self.manifest,
            path: if self.path.is_empty() {
                name.to_owned()
            } else {
                format!("{}.{name}", self.path)
            },
        }
    }

    pub(super) fn index(&self, i: usize) -> At<'a> {
        At {
            manifest: self.manifest,
            path: format!("{}[{i}]", self.path),
        }
    }

    /// A broken rule here.
    pub(super) fn violation(&self, what: impl std::fmt::Display) -> Violation {
        Violation(format!("{} {}: {what}", self.manifest, self.path))
    }

    /// A field outside the allowlist.
    pub(super) fn not_allowed(&self) -> Violation {
        Violation(format!(
            "field not allowed: {} ({})",
            clip(&self.path),
            self.manifest
        ))
    }
}

/// The object's fields, each in `allowed`; `null` counts as absent.
pub(super) fn fields<'v>(
    v: &'v Value,
    at: &At<'_>,
    allowed: &[&str],
) -> Result<Option<&'v Map<String, Value>>, Violation> {
    match v {
        Value::Null => Ok(None),
        Value::Object(map) => {
            for (key, value) in map {
                if !value.is_null() && !allowed.contains(&key.as_str()) {
                    return Err(at.field(key).not_allowed());
                }
            }
            Ok(Some(map))
        }
        _ => Err(at.violation("not an object")),
    }
}

/// A list (`null`: empty).
pub(super) fn list<'v>(v: &'v Value, at: &At<'_>) -> Result<&'v [Value], Violation> {
    match v {
        Value::Null => Ok(&[]),
        Value::Array(a) => Ok(a),
        _ => Err(at.violation("not a list")),
    }
}

/// A boolean: only `true` or `false` (`null`: absent).
pub(super) fn boolean(v: &Value, at: &At<'_>) -> Result<Option<bool>, Violation> {
    match v {
        Value::Null => Ok(None),
        Value::Bool(b) => Ok(Some(*b)),
        _ => Err(at.violation("not a boolean")),
    }
}

/// An integer, however it is spelled: `80`, `80.0`, `"80"` (`null`: absent).
pub(super) fn int(v: &Value, at: &At<'_>) -> Result<Option<i64>, Violation> {
    let n = match v {
        Value::Null => return Ok(None),
        Value::Number(n) => n
            .as_i64()
            .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64)),
        Value::String(s) => s
            .trim()
            .parse::<f64>()
            .ok()
            .and_then(|f| (f.fract() == 0.0 && f.abs() < 9.0e15).then_some(f as i64)),
        _ => None,
    };
    n.map(Some).ok_or_else(|| at.violation("not an integer"))
}

/// A string (`null`: absent).
pub(super) fn string<'v>(v: &'v Value, at: &At<'_>) -> Result<Option<&'v str>, Violation> {
    match v {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s)),
        _ => Err(at.violation("not a string")),
    }
}

/// A value that may be anything of the right JSON type, not looked into
/// further (scheduling, quantities, labels).
pub(super) fn of_type(v: &Value, at: &At<'_>, object: bool) -> Result<(), Violation> {
    match (v, object) {
        (Value::Null, _) | (Value::Object(_), true) | (Value::Array(_), false) => Ok(()),
        (_, true) => Err(at.violation("not an object")),
        (_, false) => Err(at.violation("not a list")),
    }
}

/// A map of strings (labels, annotations); `null` values are absent.
pub(super) fn string_map<'v>(
    v: &'v Value,
    at: &At<'_>,
) -> Result<Vec<(&'v str, &'v str)>, Violation> {
    let map = match v {
        Value::Null => return Ok(Vec::new()),
        Value::Object(m) => m,
        _ => return Err(at.violation("not an object")),
    };
    let mut out = Vec::with_capacity(map.len());
    for (k, value) in map {
        match value {
            Value::String(s) => out.push((k.as_str(), s.as_str())),
            Value::Null => {}
            _ => return Err(at.field(k).violation("not a string")),
        }
    }
    Ok(out)
}
