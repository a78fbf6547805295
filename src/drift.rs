//! Drift (docs/protocol.md, `drift.v1`), decided from plain values: a deploy's
//! `drift` settings, the record of what was last applied (kept in a Secret
//! owned by the deployment, `record.rs`), what differs between an applied
//! manifest and the object now, and the report. The lists, the record's
//! writes and the enforcement are the agent's (`agent/drift.rs`,
//! `agent/record.rs`, `agent/enforce.rs`).

mod record;

pub use record::{
    Kept, KeptManifest, OverBound, claimed_deployment, is_record, proven_payload, record_name,
    record_secret,
};

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value, json};

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

/// At most this many `ignore` pointers.
pub const MAX_IGNORE: usize = 32;
/// At most this long, each.
pub const MAX_POINTER: usize = 256;
/// At most this many fields named per drifted object.
pub const MAX_FIELDS: usize = 32;
/// The record's size limit (a Secret holds 1 MiB).
pub const MAX_RECORD_BYTES: usize = 512 * 1024;
/// At most this many objects a record (a deploy's manifests at most).
pub const MAX_OBJECTS: usize = 64;
/// `nexo.io/role` of a record Secret: the Manager's own, never a target.
pub const RECORD_ROLE: &str = "applied-record";

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

/// A path segment, escaped for a JSON pointer.
fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

/// Whether `path` is `ignored` or under one of them.
fn is_ignored(path: &str, ignore: &[String]) -> bool {
    ignore
        .iter()
        .any(|p| path == p || (path.starts_with(p.as_str()) && path.as_bytes()[p.len()] == b'/'))
}

/// What of `applied` (a manifest the Manager applied) differs in `live`
/// (the object now), as JSON pointers: a value changed or gone (only the
/// fields the manifest sets count: defaults and others' fields are not the
/// Manager's business), and a field another field manager has taken
/// (`managedFields`, subresources aside). `ignore`d pointers never count.
/// At most [`MAX_FIELDS`], in order.
pub fn differences(applied: &Value, live: &Value, ignore: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut path = String::new();
    if let Value::Object(m) = applied {
        for (k, v) in m {
            if matches!(k.as_str(), "apiVersion" | "kind" | "status") {
                continue;
            }
            let live_k = live.get(k);
            if k == "metadata" {
                for part in ["labels", "annotations"] {
                    path.clear();
                    path.push_str("/metadata/");
                    path.push_str(part);
                    if let Some(a) = v.get(part) {
                        walk(
                            &mut path,
                            a,
                            live_k.and_then(|l| l.get(part)),
                            ignore,
                            &mut out,
                        );
                    }
                }
                continue;
            }
            if k == "stringData" {
                // Written as data, base64.
                path.clear();
                path.push_str("/data");
                let encoded: Map<String, Value> = v
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter_map(|(k, v)| Some((k.clone(), json!(STANDARD.encode(v.as_str()?)))))
                    .collect();
                walk(
                    &mut path,
                    &Value::Object(encoded),
                    live.get("data"),
                    ignore,
                    &mut out,
                );
                continue;
            }
            path.clear();
            path.push('/');
            path.push_str(&escape(k));
            walk(&mut path, v, live_k, ignore, &mut out);
        }
    }
    for taken in taken(applied, live) {
        if !is_ignored(&taken, ignore)
            && !out
                .iter()
                .any(|p| p == &taken || p.starts_with(&format!("{taken}/")))
        {
            out.push(taken);
        }
    }
    out.truncate(MAX_FIELDS);
    out
}

fn walk(path: &mut String, a: &Value, l: Option<&Value>, ignore: &[String], out: &mut Vec<String>) {
    if is_ignored(path, ignore) || out.len() >= MAX_FIELDS {
        return;
    }
    match a {
        Value::Null => {}
        Value::Object(m) => {
            let Some(Value::Object(lm)) = l else {
                if !m.is_empty() {
                    out.push(path.clone());
                }
                return;
            };
            for (k, v) in m {
                let len = path.len();
                path.push('/');
                path.push_str(&escape(k));
                walk(path, v, lm.get(k), ignore, out);
                path.truncate(len);
            }
        }
        Value::Array(items) => match l {
            Some(Value::Array(li)) if li.len() == items.len() => {
                for (i, (v, lv)) in items.iter().zip(li).enumerate() {
                    let len = path.len();
                    path.push('/');
                    path.push_str(&i.to_string());
                    walk(path, v, Some(lv), ignore, out);
                    path.truncate(len);
                }
            }
            _ => out.push(path.clone()),
        },
        scalar => {
            if !l.is_some_and(|l| same_scalar(scalar, l)) {
                out.push(path.clone());
            }
        }
    }
}

/// Equal, or the same number, or the same Kubernetes quantity written
/// another way (`500m` and `0.5`: the API server normalizes them).
fn same_scalar(a: &Value, l: &Value) -> bool {
    if a == l {
        return true;
    }
    let number = |v: &Value| match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => quantity(s),
        _ => None,
    };
    match (number(a), number(l)) {
        (Some(x), Some(y)) => (x - y).abs() <= f64::EPSILON * x.abs().max(y.abs()).max(1.0),
        _ => false,
    }
}

/// A Kubernetes quantity's value (`1Gi`, `500m`, `1e3`, `2`).
fn quantity(s: &str) -> Option<f64> {
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let n: f64 = number.parse().ok()?;
    let scale = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e if e.starts_with(['e', 'E']) => 10f64.powi(e[1..].parse().ok()?),
        _ => return None,
    };
    Some(n * scale)
}

/// The fields of `applied` that another field manager now holds and the
/// Manager no longer does: paths to a map's member, a list standing for
/// all its elements.
fn taken(applied: &Value, live: &Value) -> Vec<String> {
    let mut ours = Vec::new();
    leaves(&mut String::new(), applied, &mut ours, 0);
    ours.retain(|p| !p.starts_with("/apiVersion") && !p.starts_with("/kind"));
    let overlap = |a: &str, b: &str| {
        a == b
            || (a.starts_with(b) && a.as_bytes().get(b.len()) == Some(&b'/'))
            || (b.starts_with(a) && b.as_bytes().get(a.len()) == Some(&b'/'))
    };
    let entries = live["metadata"]["managedFields"].as_array();
    let main = entries
        .into_iter()
        .flatten()
        .filter(|e| e.get("subresource").is_none_or(|s| s.is_null() || s == ""));
    // Held still (perhaps shared, at the same value): not taken.
    let mut held = Vec::new();
    let mut theirs = Vec::new();
    for e in main {
        if e["manager"] == crate::kube::client::FIELD_MANAGER {
            fields_v1(&mut String::new(), &e["fieldsV1"], &mut held, 0);
        } else {
            fields_v1(&mut String::new(), &e["fieldsV1"], &mut theirs, 0);
        }
    }
    ours.retain(|p| theirs.iter().any(|t| overlap(p, t)) && !held.iter().any(|h| overlap(p, h)));
    ours
}

/// The leaves of a manifest: map members' paths, a list a leaf itself.
fn leaves(path: &mut String, v: &Value, out: &mut Vec<String>, depth: usize) {
    match v {
        Value::Object(m) if !m.is_empty() && depth < 64 => {
            for (k, v) in m {
                let len = path.len();
                path.push('/');
                path.push_str(&escape(if k == "stringData" && depth == 0 {
                    "data"
                } else {
                    k
                }));
                leaves(path, v, out, depth + 1);
                path.truncate(len);
            }
        }
        Value::Null => {}
        _ => out.push(path.clone()),
    }
}

/// The leaves of a `fieldsV1` set: `f:` members; a list element (`k:`,
/// `v:`, `i:`) stands for its list.
fn fields_v1(path: &mut String, v: &Value, out: &mut Vec<String>, depth: usize) {
    let Value::Object(m) = v else { return };
    if depth >= 64 {
        return;
    }
    let mut leaf = true;
    for (k, child) in m {
        if k == "." {
            continue;
        }
        leaf = false;
        if let Some(name) = k.strip_prefix("f:") {
            let len = path.len();
            path.push('/');
            path.push_str(&escape(name));
            fields_v1(path, child, out, depth + 1);
            path.truncate(len);
        } else if !out.contains(path) {
            // An element of the list at `path`.
            out.push(path.clone());
        }
    }
    if leaf && !path.is_empty() && !out.contains(path) {
        out.push(path.clone());
    }
}

/// `manifest` to apply again for an enforcement: each ignored field set to
/// what the object holds now (or left out when it holds none), so that
/// applying it again never changes what drift ignores.
pub fn keeping_ignored(manifest: &Value, live: Option<&Value>, ignore: &[String]) -> Value {
    let mut out = manifest.clone();
    for p in ignore {
        if out.pointer(p).is_none() {
            continue;
        }
        match live.and_then(|l| l.pointer(p)) {
            Some(now) => {
                if let Some(slot) = out.pointer_mut(p) {
                    *slot = now.clone();
                }
            }
            None => remove_pointer(&mut out, p),
        }
    }
    out
}

fn remove_pointer(v: &mut Value, p: &str) {
    let Some((parent, last)) = p.rsplit_once('/') else {
        return;
    };
    let last = last.replace("~1", "/").replace("~0", "~");
    match v.pointer_mut(parent) {
        Some(Value::Object(m)) => {
            m.remove(&last);
        }
        Some(Value::Array(a)) => {
            if let Ok(i) = last.parse::<usize>()
                && i < a.len()
            {
                a.remove(i);
            }
        }
        _ => {}
    }
}

/// What happened to a drifted object (`action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Reported,
    Corrected,
    Recreated,
    Failed,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Reported => "reported",
            Action::Corrected => "corrected",
            Action::Recreated => "recreated",
            Action::Failed => "failed",
        }
    }

    /// Shown once, then gone.
    fn once(self) -> bool {
        matches!(self, Action::Corrected | Action::Recreated)
    }
}

/// One drifted object, as the heartbeat reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub kind: &'static str,
    pub name: String,
    /// Empty when `gone`.
    pub fields: Vec<String>,
    pub gone: bool,
    pub action: Action,
    pub message: Option<String>,
    /// RFC 3339, when first found.
    pub detected_at: String,
}

/// A deployment's drift in the heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Drifted {
    pub mode: Mode,
    pub objects: Vec<Found>,
}

/// What the heartbeat reports, between checks: `reported` and `failed`
/// entries while they last (the next check says), `corrected` and
/// `recreated` ones until a heartbeat carrying them is accepted.
#[derive(Debug, Default)]
pub struct Report {
    /// By (namespace, deployment).
    entries: BTreeMap<(String, String), Drifted>,
}

impl Report {
    /// A deployment's objects as a check found them; `detectedAt` kept
    /// for an object still drifted. Returns the objects newly found.
    pub fn checked(
        &mut self,
        namespace: &str,
        deployment: &str,
        mode: Mode,
        mut found: Vec<Found>,
    ) -> Vec<Found> {
        let key = (namespace.to_owned(), deployment.to_owned());
        let before = self.entries.remove(&key);
        let mut new = Vec::new();
        for f in &mut found {
            let earlier = before.as_ref().and_then(|b| {
                b.objects
                    .iter()
                    .find(|o| o.kind == f.kind && o.name == f.name && !o.action.once())
            });
            match earlier {
                Some(e) => f.detected_at.clone_from(&e.detected_at),
                None => new.push(f.clone()),
            }
        }
        // What was corrected and not yet reported stays until it is.
        if let Some(b) = before {
            for o in b.objects.into_iter().filter(|o| o.action.once()) {
                if !found.iter().any(|f| f.kind == o.kind && f.name == o.name) {
                    found.push(o);
                }
            }
        }
        if !found.is_empty() {
            self.entries.insert(
                key,
                Drifted {
                    mode,
                    objects: found,
                },
            );
        }
        new
    }

    /// A deployment no longer checked (uninstalled, mode `off`).
    pub fn forget(&mut self, namespace: &str, deployment: &str) {
        self.entries
            .remove(&(namespace.to_owned(), deployment.to_owned()));
    }

    /// The deployments reported, by (namespace, name).
    pub fn deployments(&self) -> impl Iterator<Item = (&(String, String), &Drifted)> {
        self.entries.iter()
    }

    /// A heartbeat carrying the report was accepted: what was shown once goes.
    pub fn delivered(&mut self) {
        for d in self.entries.values_mut() {
            d.objects.retain(|o| !o.action.once());
        }
        self.entries.retain(|_, d| !d.objects.is_empty());
    }
}

#[cfg(test)]
mod tests;
