//! Commands: parsed and validated from plain JSON before anything touches the
//! cluster ([`parse`]), planned from what the cluster holds ([`plan`]), and
//! carried out by a thin executor ([`execute`]).
//!
//! A command is refused with a `failed` ack, and nothing is changed, when its
//! class is unknown (`unsupported class: …`), it requires a capability this
//! Manager does not advertise (`unsupported capability: …`), or its payload
//! does not validate (`invalid payload: …`).

pub mod execute;
pub mod plan;

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::config::{is_dns_label, is_dns_subdomain};
use crate::image::{ImageRef, valid_digest, valid_tag};

/// Most manifests in one deploy.
pub const MAX_MANIFESTS: usize = 64;
/// Largest manifest, serialized.
pub const MAX_MANIFEST_BYTES: usize = 256 * 1024;
/// Largest command, as raw JSON (protocol.md, "Hostile and buggy values").
pub const MAX_COMMAND_BYTES: usize = 2 * 1024 * 1024;
/// Most JSON values (objects, arrays, strings, numbers, literals) in one
/// command's payload: its parsed form's budget. A payload of tiny values
/// (`[{},{},…]`: two bytes of raw JSON, tens of bytes parsed, more again
/// once planned and sent) is refused before it is parsed. 64 manifests of
/// 500 values each, a generous legacy Deployment, fit.
pub const MAX_COMMAND_VALUES: usize = 32 * 1024;

/// An upper bound of the number of JSON values in `raw` (valid JSON), from
/// one pass over its bytes with no allocation: one value, plus one for each
/// `,` and for each non-empty `[` or `{` outside strings.
pub fn json_values(raw: &str) -> usize {
    let bytes = raw.as_bytes();
    let (mut n, mut in_string, mut escaped) = (1usize, false, false);
    for (i, &b) in bytes.iter().enumerate() {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b',' => n += 1,
            b'[' | b'{' => {
                let next = bytes[i + 1..].iter().find(|c| !c.is_ascii_whitespace());
                if !matches!(next, Some(b']' | b'}')) {
                    n += 1;
                }
            }
            _ => {}
        }
    }
    n
}

/// A deployment: a name in a namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
}

/// The two deploy formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Nexo custom resources plus runtime ConfigMaps and Secrets.
    Crd,
    /// The 0.2.0 line's Deployment, Services, ConfigMaps and Secrets.
    Legacy,
}

/// A validated deploy.
#[derive(Debug, Clone, PartialEq)]
pub struct Deploy {
    /// The deployment.
    pub deployment: Target,
    /// The format.
    pub format: Format,
    /// Manifests, namespaced into `deployment.namespace`.
    pub manifests: Vec<Value>,
    /// The command's half of the migration gate.
    pub adopt_legacy: bool,
}

/// A validated rollout.
#[derive(Debug, Clone, PartialEq)]
pub struct Rollout {
    /// The new tag or digest; `None`: the configured Proxy image.
    pub image_tag: Option<String>,
    /// Targets; `None`: every owned NexoProxy.
    pub targets: Option<Vec<Target>>,
}

/// A validated upgrade.
#[derive(Debug, Clone, PartialEq)]
pub struct Upgrade {
    /// The bundle version, informational.
    pub bundle_version: String,
    /// The digest-pinned Manager image.
    pub manager_image: ImageRef,
}

/// What a command asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Create or update a deployment.
    Deploy(Deploy),
    /// Set the image of owned NexoProxies.
    Rollout(Rollout),
    /// Patch the Manager's own Deployment.
    Upgrade(Upgrade),
    /// Delete an owned deployment.
    Uninstall(Target),
}

impl Action {
    /// The command class, for metrics.
    pub fn class(&self) -> &'static str {
        match self {
            Action::Deploy(_) => "deploy",
            Action::Rollout(_) => "rollout",
            Action::Upgrade(_) => "upgrade",
            Action::Uninstall(_) => "uninstall",
        }
    }

    /// The one deployment it is about, for log fields: a deploy's or an
    /// uninstall's, a rollout's single target.
    pub fn deployment_name(&self) -> Option<&str> {
        match self {
            Action::Deploy(d) => Some(&d.deployment.name),
            Action::Uninstall(t) => Some(&t.name),
            Action::Rollout(Rollout {
                targets: Some(t), ..
            }) if t.len() == 1 => Some(&t[0].name),
            _ => None,
        }
    }
}

/// A validated command.
#[derive(Debug, Clone, PartialEq)]
pub struct Command {
    /// Its id.
    pub id: String,
    /// What to do.
    pub action: Action,
}

/// A command that was refused before anything ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No usable id: it cannot be acknowledged; logged and skipped.
    NoId(String),
    /// Refused with a `failed` ack carrying `message`.
    Failed {
        /// The command id.
        id: String,
        /// Starts with `unsupported class`, `unsupported capability` or `invalid payload`.
        message: String,
    },
}

/// The command's fields as slices of its raw text: nothing is built from
/// them before the size budget is checked.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope<'a> {
    #[serde(default, borrow)]
    id: Option<&'a RawValue>,
    #[serde(default, borrow)]
    class: Option<&'a RawValue>,
    #[serde(default, borrow)]
    requires: Option<&'a RawValue>,
    #[serde(default, borrow)]
    payload: Option<&'a RawValue>,
}

/// A field's raw JSON as a string, if it is one (`null` counts as absent).
fn raw_string(raw: Option<&RawValue>) -> Result<Option<String>, String> {
    match raw.map(RawValue::get) {
        None | Some("null") => Ok(None),
        Some(text) if text.starts_with('"') => serde_json::from_str(text)
            .map(Some)
            .map_err(|_| clip(text, 64)),
        Some(text) => Err(clip(text, 64)),
    }
}

fn invalid(why: impl std::fmt::Display) -> String {
    format!("invalid payload: {why}")
}

/// Cuts `s` to at most `max` characters for a message.
pub fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// Parses and validates one raw command (its JSON text) against the
/// advertised `capabilities` and the `managed` namespaces.
pub fn parse(raw: &str, capabilities: &[&str], managed: &[String]) -> Result<Command, Refusal> {
    // serde's message would quote the offending value: a whole command's
    // text, which may hold Secret data. Only where and what kind of error.
    let env: Envelope = serde_json::from_str(raw).map_err(|e| {
        Refusal::NoId(format!(
            "not a command object ({:?} error at column {})",
            e.classify(),
            e.column()
        ))
    })?;
    let id = match raw_string(env.id) {
        Ok(Some(id)) if crate::cp::wire::valid_command_id(&id) => id,
        Ok(Some(id)) => {
            return Err(Refusal::NoId(format!("invalid id {:?}", clip(&id, 140))));
        }
        Err(text) => return Err(Refusal::NoId(format!("invalid id {text}"))),
        Ok(None) => return Err(Refusal::NoId("no id".into())),
    };
    let fail = |message: String| Refusal::Failed {
        id: id.clone(),
        message,
    };
    // The budget first: nothing below builds more than it allows.
    if raw.len() > MAX_COMMAND_BYTES {
        return Err(fail(invalid(format!(
            "too large: {} bytes, more than {} MiB",
            raw.len(),
            MAX_COMMAND_BYTES >> 20
        ))));
    }
    let values = json_values(raw);
    if values > MAX_COMMAND_VALUES {
        return Err(fail(invalid(format!(
            "too large: about {values} JSON values, more than {MAX_COMMAND_VALUES}"
        ))));
    }
    let class = match raw_string(env.class) {
        Ok(Some(c)) => c,
        Err(text) => return Err(fail(format!("unsupported class: {text}"))),
        Ok(None) => return Err(fail("unsupported class: (missing)".into())),
    };
    let class = class.as_str();
    if !matches!(class, "deploy" | "rollout" | "upgrade" | "uninstall") {
        return Err(fail(format!("unsupported class: {}", clip(class, 64))));
    }
    let requires: Option<Value> = match env.requires {
        None => None,
        Some(r) => Some(serde_json::from_str(r.get()).map_err(|e| fail(invalid(e)))?),
    };
    match &requires {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            for cap in list {
                match cap.as_str() {
                    Some(c) if capabilities.contains(&c) => {}
                    Some(c) => {
                        return Err(fail(format!("unsupported capability: {}", clip(c, 128))));
                    }
                    None => {
                        return Err(fail(invalid(format!(
                            "requires holds a non-string {}",
                            clip(&cap.to_string(), 64)
                        ))));
                    }
                }
            }
        }
        Some(_) => return Err(fail(invalid("requires is not a list"))),
    }
    let payload: Value = match env.payload {
        Some(raw) => serde_json::from_str(raw.get()).map_err(|e| fail(invalid(e)))?,
        None => return Err(fail(invalid("payload is missing"))),
    };
    if !payload.is_object() {
        return Err(fail(invalid("payload is not an object")));
    }
    let action = match class {
        "deploy" => deploy(&payload, capabilities, managed).map(Action::Deploy),
        "rollout" => rollout(&payload, managed).map(Action::Rollout),
        "upgrade" => upgrade(&payload).map(Action::Upgrade),
        _ => target(&payload["deployment"], "deployment", managed).map(Action::Uninstall),
    }
    .map_err(|why| fail(invalid(why)))?;
    Ok(Command { id, action })
}

fn string<'a>(v: &'a Value, field: &str) -> Result<&'a str, String> {
    match v {
        Value::String(s) => Ok(s),
        Value::Null => Err(format!("{field} is missing")),
        _ => Err(format!("{field} is not a string")),
    }
}

fn target(v: &Value, field: &str, managed: &[String]) -> Result<Target, String> {
    if !v.is_object() {
        return Err(format!("{field} is missing or not an object"));
    }
    let name = string(&v["name"], &format!("{field}.name"))?;
    let namespace = string(&v["namespace"], &format!("{field}.namespace"))?;
    if !is_dns_label(name) {
        return Err(format!(
            "{field}.name {:?} is not a valid name",
            clip(name, 64)
        ));
    }
    if !is_dns_label(namespace) {
        return Err(format!(
            "{field}.namespace {:?} is not a valid namespace",
            clip(namespace, 64)
        ));
    }
    if !managed.iter().any(|m| m == namespace) {
        return Err(format!(
            "namespace {namespace} is not managed by this Manager (managed: {})",
            managed.join(",")
        ));
    }
    Ok(Target {
        name: name.to_owned(),
        namespace: namespace.to_owned(),
    })
}

/// The kinds each format accepts: (apiVersion, kind).
pub fn allowed_kinds(format: Format) -> &'static [(&'static str, &'static str)] {
    match format {
        Format::Crd => &[
            ("nexo.io/v1alpha1", "NexoProxy"),
            ("nexo.io/v1alpha1", "NexoPipeline"),
            ("v1", "ConfigMap"),
            ("v1", "Secret"),
        ],
        Format::Legacy => &[
            ("apps/v1", "Deployment"),
            ("v1", "Service"),
            ("v1", "ConfigMap"),
            ("v1", "Secret"),
        ],
    }
}

/// Kinds that exist only cluster-wide, named in the refusal.
const CLUSTER_SCOPED: &[&str] = &[
    "Namespace",
    "Node",
    "PersistentVolume",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "StorageClass",
    "PriorityClass",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
    "APIService",
    "IngressClass",
    "RuntimeClass",
    "CSIDriver",
    "VolumeAttachment",
];

fn deploy(p: &Value, capabilities: &[&str], managed: &[String]) -> Result<Deploy, String> {
    let deployment = target(&p["deployment"], "deployment", managed)?;
    let format = match string(&p["format"], "format")? {
        "crd" => Format::Crd,
        "legacy" => Format::Legacy,
        other => {
            return Err(format!(
                "format {:?} is neither crd nor legacy",
                clip(other, 32)
            ));
        }
    };
    let needed = if format == Format::Crd {
        "command.deploy.crd"
    } else {
        "command.deploy.legacy"
    };
    if !capabilities.contains(&needed) {
        return Err(format!(
            "format {} is not supported by this Manager",
            if format == Format::Crd {
                "crd"
            } else {
                "legacy"
            }
        ));
    }
    let adopt_legacy = match &p["migration"] {
        Value::Null => false,
        Value::Object(m) => match m.get("adoptLegacy") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err("migration.adoptLegacy is not a boolean".into()),
        },
        _ => return Err("migration is not an object".into()),
    };
    let list = p["manifests"]
        .as_array()
        .ok_or("manifests is missing or not a list")?;
    if list.is_empty() {
        return Err("manifests is empty".into());
    }
    if list.len() > MAX_MANIFESTS {
        return Err(format!(
            "{} manifests, more than {MAX_MANIFESTS}",
            list.len()
        ));
    }
    let primary = if format == Format::Crd {
        "NexoProxy"
    } else {
        "Deployment"
    };
    let mut manifests = Vec::with_capacity(list.len());
    let mut seen: Vec<(String, String)> = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let at = |why: String| format!("manifests[{i}]: {why}");
        let size = serde_json::to_vec(m).map(|v| v.len()).unwrap_or(usize::MAX);
        if size > MAX_MANIFEST_BYTES {
            return Err(at(format!(
                "{size} bytes, over the {} KiB limit",
                MAX_MANIFEST_BYTES / 1024
            )));
        }
        if !m.is_object() {
            return Err(at("not an object".into()));
        }
        let api_version = string(&m["apiVersion"], "apiVersion").map_err(at)?;
        let kind = string(&m["kind"], "kind").map_err(at)?;
        if CLUSTER_SCOPED.contains(&kind) {
            return Err(at(format!(
                "{kind} is cluster-scoped; only namespaced objects can be deployed"
            )));
        }
        if !allowed_kinds(format).contains(&(api_version, kind)) {
            let allowed: Vec<String> = allowed_kinds(format)
                .iter()
                .map(|(a, k)| format!("{a} {k}"))
                .collect();
            return Err(at(format!(
                "{api_version} {kind} is not allowed in format {} (allowed: {})",
                if format == Format::Crd {
                    "crd"
                } else {
                    "legacy"
                },
                allowed.join(", ")
            )));
        }
        if !m["metadata"].is_object() {
            return Err(at("metadata is missing or not an object".into()));
        }
        let name = string(&m["metadata"]["name"], "metadata.name").map_err(at)?;
        if !is_dns_subdomain(name) {
            return Err(at(format!(
                "metadata.name {:?} is not a valid name",
                clip(name, 64)
            )));
        }
        match &m["metadata"]["namespace"] {
            Value::Null => {}
            Value::String(ns) if *ns == deployment.namespace => {}
            Value::String(ns) => {
                return Err(at(format!(
                    "namespace {:?} differs from deployment.namespace {}",
                    clip(ns, 64),
                    deployment.namespace
                )));
            }
            _ => return Err(at("metadata.namespace is not a string".into())),
        }
        if !matches!(m["metadata"]["labels"], Value::Null | Value::Object(_)) {
            return Err(at("metadata.labels is not an object".into()));
        }
        if m["metadata"].get("ownerReferences").is_some() {
            return Err(at(
                "metadata.ownerReferences is set by the Manager, not by the command".into(),
            ));
        }
        if seen.iter().any(|(k, n)| k == kind && n == name) {
            return Err(at(format!("{kind} {name} appears twice")));
        }
        seen.push((kind.to_owned(), name.to_owned()));
        let mut m = m.clone();
        m["metadata"]["namespace"] = Value::String(deployment.namespace.clone());
        manifests.push(m);
    }
    let primaries: Vec<&(String, String)> = seen.iter().filter(|(k, _)| k == primary).collect();
    match primaries.as_slice() {
        [(_, name)] if *name == deployment.name => {}
        [(_, name)] => {
            return Err(format!(
                "the {primary} is named {name}, not {}",
                deployment.name
            ));
        }
        [] => return Err(format!("no {primary} among the manifests")),
        _ => return Err(format!("more than one {primary} among the manifests")),
    }
    if format == Format::Legacy && !is_dns_label(&deployment.name) {
        return Err("deployment.name is not a valid Deployment name".into());
    }
    Ok(Deploy {
        deployment,
        format,
        manifests,
        adopt_legacy,
    })
}

fn rollout(p: &Value, managed: &[String]) -> Result<Rollout, String> {
    let image_tag = match &p["imageTag"] {
        Value::Null => None,
        Value::String(t) if valid_tag(t) || valid_digest(t) => Some(t.clone()),
        Value::String(t) => {
            return Err(format!(
                "imageTag {:?} is neither a tag nor sha256:<64 hex>",
                clip(t, 80)
            ));
        }
        _ => return Err("imageTag is not a string".into()),
    };
    let targets = match &p["targets"] {
        Value::Null => None,
        Value::Array(list) => {
            if list.is_empty() {
                return Err("targets is empty (omit it to roll out every owned NexoProxy)".into());
            }
            Some(
                list.iter()
                    .enumerate()
                    .map(|(i, t)| target(t, &format!("targets[{i}]"), managed))
                    .collect::<Result<Vec<_>, _>>()?,
            )
        }
        _ => return Err("targets is not a list".into()),
    };
    Ok(Rollout { image_tag, targets })
}

fn upgrade(p: &Value) -> Result<Upgrade, String> {
    let bundle_version = string(&p["bundleVersion"], "bundleVersion")?;
    if bundle_version.is_empty() || bundle_version.len() > 64 {
        return Err("bundleVersion is empty or too long".into());
    }
    let image = string(&p["managerImage"], "managerImage")?;
    let manager_image = ImageRef::parse(image).map_err(|e| format!("managerImage: {e}"))?;
    if manager_image.digest.is_none() {
        return Err(format!(
            "managerImage {:?} is not pinned by digest (…@sha256:<64 hex>)",
            clip(image, 200)
        ));
    }
    Ok(Upgrade {
        bundle_version: bundle_version.to_owned(),
        manager_image,
    })
}

#[cfg(test)]
mod tests;
