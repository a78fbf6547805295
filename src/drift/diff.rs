//! What differs between an applied manifest and the object now, as JSON
//! pointers: values (quantities compared by value), and fields another
//! field manager took; and a manifest made to keep what drift ignores.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value, json};

use super::MAX_FIELDS;

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
    differences_at_most(applied, live, ignore, MAX_FIELDS).0
}

/// [`differences`], at most `max` of them, in order, and how many more
/// there are (a plan's fields, docs/protocol.md `command.plan.v1`: one
/// reading of a difference for drift and for a plan).
pub fn differences_at_most(
    applied: &Value,
    live: &Value,
    ignore: &[String],
    max: usize,
) -> (Vec<String>, usize) {
    let mut out = values_changed(applied, live, ignore, max);
    for taken in taken(applied, live) {
        if !is_ignored(&taken, ignore)
            && !out
                .list
                .iter()
                .any(|p| p == &taken || p.starts_with(&format!("{taken}/")))
        {
            out.push(taken);
        }
    }
    (out.list, out.more)
}

/// The values of `desired` that differ in `live`, as [`differences`] reads
/// them, but not the fields other field managers hold: what a write of
/// `desired` (an object as a dry run answered it) would change, at most
/// `max`, and how many more.
pub fn changed_values_at_most(desired: &Value, live: &Value, max: usize) -> (Vec<String>, usize) {
    let out = values_changed(desired, live, &[], max);
    (out.list, out.more)
}

fn values_changed(applied: &Value, live: &Value, ignore: &[String], max: usize) -> Fields {
    let mut out = Fields {
        list: Vec::new(),
        max,
        more: 0,
    };
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
    out
}

/// The pointers found: the first `max`, and a count of the rest.
struct Fields {
    list: Vec<String>,
    max: usize,
    more: usize,
}

impl Fields {
    fn push(&mut self, path: String) {
        if self.list.len() < self.max {
            self.list.push(path);
        } else {
            self.more += 1;
        }
    }
}

fn walk(path: &mut String, a: &Value, l: Option<&Value>, ignore: &[String], out: &mut Fields) {
    if is_ignored(path, ignore) {
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
pub(super) fn quantity(s: &str) -> Option<f64> {
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
