//! Commands: parsed and validated from plain JSON before anything touches the
//! cluster ([`parse`]) into a typed [`Command`]; `crate::apply` permits,
//! plans and executes it.
//!
//! A command is refused with a `failed` ack, and nothing is changed, when its
//! class is unknown (`unsupported class: …`), it requires a capability this
//! Manager does not advertise (`unsupported capability: …`), or its payload
//! does not validate (`invalid payload: …`).

pub mod format;
mod payload;
mod payload_error;

use crate::resource::{Kind, Manifest, ObjectRef};
pub use format::Format;
pub use payload_error::PayloadError;

use serde_json::Value;
use serde_json::value::RawValue;

use std::time::SystemTime;

use crate::cp::wire::CommandFields;
use crate::refusal::Refusal;
use crate::text::clip;
use crate::trust::{self, Trust, Untrusted, Unwrapped};

use crate::image::ImageRef;

/// Most manifests in one deploy.
pub const MAX_MANIFESTS: usize = 64;
/// Largest manifest, serialized.
pub const MAX_MANIFEST_BYTES: usize = 256 * 1024;
use crate::cp::wire::MAX_COMMAND_BYTES;
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
    pub name: String,
    pub namespace: String,
}

/// A validated deploy.
#[derive(Debug, Clone, PartialEq)]
pub struct Deploy {
    /// The deployment.
    pub deployment: Target,
    /// The format.
    pub format: Format,
    /// Manifests, namespaced into `deployment.namespace`.
    pub manifests: Vec<Manifest>,
    /// The command's half of the migration gate.
    pub adopt_legacy: bool,
    /// What drift leads to (docs/protocol.md, `drift.v1`).
    pub drift: crate::drift::Settings,
    /// What a failure of this change leads to (docs/protocol.md,
    /// `rollback.v1`).
    pub on_failure: OnFailure,
}

/// What a change that fails leads to (docs/protocol.md, `rollback.v1`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnFailure {
    /// Left as it is (the version 2 behaviour).
    #[default]
    Stay,
    /// The previous change restored.
    Rollback,
}

impl OnFailure {
    pub fn as_str(self) -> &'static str {
        match self {
            OnFailure::Stay => "stay",
            OnFailure::Rollback => "rollback",
        }
    }
}

impl Deploy {
    /// Whether `r` is the deployment's NexoProxy (`crd`) or Deployment
    /// (`legacy`) itself.
    pub fn is_primary(&self, r: &ObjectRef) -> bool {
        r.kind == self.format.primary() && r.name == self.deployment.name
    }

    /// The payload its drift record keeps (docs/protocol.md, `drift.v1`): a
    /// deploy's, so that applying it again passes [`deploy_payload`].
    pub fn record_payload(&self) -> Value {
        serde_json::json!({
            "deployment": {"name": self.deployment.name, "namespace": self.deployment.namespace},
            "format": self.format.to_string(),
            "manifests": self.manifests.iter().map(|m| &m.object).collect::<Vec<_>>(),
            "drift": self.drift.to_json(),
            "onFailure": self.on_failure.as_str(),
        })
    }
}

/// A deploy's payload validated as a command's is: a drift record applied
/// again passes every check a deploy does.
pub fn deploy_payload(
    payload: &Value,
    capabilities: &[&str],
    managed: &[String],
) -> Result<Deploy, PayloadError> {
    payload::deploy(payload, capabilities, managed)
}

/// A validated rollout.
#[derive(Debug, Clone, PartialEq)]
pub struct Rollout {
    /// The new tag or digest; `None`: the configured Proxy image.
    pub image_tag: Option<String>,
    /// Targets; `None`: every owned NexoProxy.
    pub targets: Option<Vec<Target>>,
    /// What a failure of this change leads to.
    pub on_failure: OnFailure,
}

/// A validated upgrade.
#[derive(Debug, Clone, PartialEq)]
pub struct Upgrade {
    /// The bundle version, as sent.
    pub bundle_version: String,
    /// The bundle version, parsed: compared with the running one.
    pub bundle: crate::semver::Version,
    /// `allowDowngrade`: an older bundle than the running one is accepted.
    pub allow_downgrade: bool,
    /// The digest-pinned Manager image.
    pub manager_image: ImageRef,
    /// Whether an upgrade whose new pods never become Ready is rolled back
    /// (the default) or left.
    pub on_failure: OnFailure,
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

    /// The deployments it names: a deploy's, an uninstall's, a rollout's
    /// targets (none for a rollout of every owned NexoProxy, or an upgrade).
    pub fn targets(&self) -> &[Target] {
        match self {
            Action::Deploy(d) => std::slice::from_ref(&d.deployment),
            Action::Uninstall(t) => std::slice::from_ref(t),
            Action::Rollout(Rollout {
                targets: Some(t), ..
            }) => t,
            _ => &[],
        }
    }

    /// The one deployment it is about, for log fields: a deploy's or an
    /// uninstall's, a rollout's single target.
    pub fn deployment(&self) -> Option<&Target> {
        match self.targets() {
            [one] => Some(one),
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
    /// A `plan` of `action` (docs/protocol.md, `command.plan.v1`): planned
    /// as it would run, nothing written.
    pub plan: bool,
}

impl Command {
    /// Its class: `plan`, or its action's.
    pub fn class(&self) -> &'static str {
        if self.plan {
            "plan"
        } else {
            self.action.class()
        }
    }
}

/// The capability of the `plan` class.
pub const PLAN_CAPABILITY: &str = "command.plan.v1";

/// Refuses a command over [`MAX_COMMAND_BYTES`] or [`MAX_COMMAND_VALUES`].
fn budget(raw: &str) -> Result<(), Refusal> {
    if raw.len() > MAX_COMMAND_BYTES {
        return Err(Refusal::TooLarge(format!(
            "{} bytes, more than {} MiB",
            raw.len(),
            MAX_COMMAND_BYTES >> 20
        )));
    }
    let values = json_values(raw);
    if values > MAX_COMMAND_VALUES {
        return Err(Refusal::TooLarge(format!(
            "about {values} JSON values, more than {MAX_COMMAND_VALUES}"
        )));
    }
    Ok(())
}

/// Checks `requires`: every capability it lists must be advertised.
fn requires(raw: Option<&RawValue>, capabilities: &[&str]) -> Result<(), Refusal> {
    let Some(raw) = raw else { return Ok(()) };
    let list = match serde_json::from_str::<Value>(raw.get()).map_err(invalid)? {
        Value::Null => return Ok(()),
        Value::Array(list) => list,
        _ => return Err(invalid("requires is not a list")),
    };
    for cap in &list {
        match cap.as_str() {
            Some(c) if capabilities.contains(&c) => {}
            Some(c) => return Err(Refusal::UnsupportedCapability(clip(c, 128))),
            None => {
                return Err(invalid(format!(
                    "requires holds a non-string {}",
                    clip(&cap.to_string(), 64)
                )));
            }
        }
    }
    Ok(())
}

fn invalid(why: impl std::fmt::Display) -> Refusal {
    Refusal::InvalidPayload(why.to_string())
}

/// A command's id, checked: without a usable one a command cannot be
/// acknowledged, and is logged and skipped ([`Refusal::NoId`]).
pub fn command_id(raw: &str) -> Result<String, Refusal> {
    id_of(raw, CommandFields::read(raw).as_ref())
}

/// The id of `raw`, as its fields were read (an error: not a command
/// object, whose id may still be found).
pub fn id_of(
    raw: &str,
    fields: Result<&CommandFields<'_>, &serde_json::Error>,
) -> Result<String, Refusal> {
    match checked_id(raw, fields) {
        Ok(id) | Err((Some(id), _)) => Ok(id),
        Err((None, no_id)) => Err(no_id),
    }
}

/// The `id` of a top-level object that is not a well-formed command, when
/// it has exactly one and it is a valid id.
fn lone_id(raw: &str) -> Option<String> {
    use serde::de::{Deserializer as _, IgnoredAny, MapAccess, Visitor};

    struct Ids;
    impl<'de> Visitor<'de> for Ids {
        type Value = Vec<&'de RawValue>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut ids = Vec::new();
            while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                if key == "id" {
                    ids.push(map.next_value::<&'de RawValue>()?);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(ids)
        }
    }
    if raw.len() > MAX_COMMAND_BYTES {
        return None;
    }
    let ids = serde_json::Deserializer::from_str(raw)
        .deserialize_map(Ids)
        .ok()?;
    match ids[..] {
        [one] => crate::strict_json::raw_string(Some(one))
            .ok()
            .flatten()
            .filter(|id| crate::cp::wire::valid_command_id(id)),
        _ => None,
    }
}

/// The command's checked id, from its fields; refused with the id when one
/// could be read anyway.
fn checked_id(
    raw: &str,
    fields: Result<&CommandFields<'_>, &serde_json::Error>,
) -> Result<String, (Option<String>, Refusal)> {
    let env = fields.map_err(|e| not_a_command(raw, e))?;
    let no_id = |why: String| (None, Refusal::NoId(why));
    let id = match crate::strict_json::raw_string(env.id) {
        Ok(Some(id)) if crate::cp::wire::valid_command_id(&id) => id,
        Ok(Some(id)) => return Err(no_id(format!("invalid id {:?}", clip(&id, 140)))),
        Err(text) => return Err(no_id(format!("invalid id {text}"))),
        Ok(None) => return Err(no_id("no id".into())),
    };
    Ok(id)
}

/// The refusal of a text that is not a command object, with its id when it
/// has exactly one.
fn not_a_command(raw: &str, e: &serde_json::Error) -> (Option<String>, Refusal) {
    // serde's message would quote the offending value: a whole command's
    // text, which may hold Secret data. Only where and what kind of error.
    let why = format!(
        "not a command object ({:?} error at column {})",
        e.classify(),
        e.column()
    );
    // An object with one usable id (a field given twice, say) can be
    // acknowledged: refused, not skipped.
    match lone_id(raw) {
        Some(id) => (Some(id), invalid(why)),
        None => (None, Refusal::NoId(why)),
    }
}

/// A command received: verified, then parsed, each text read once.
#[derive(Debug)]
pub struct Received {
    /// The command.
    pub command: Command,
    /// How long its ledger entry must stay ([`trust::keep_until`]).
    pub keep_until: Option<SystemTime>,
}

/// Receives the raw command `raw`, of id `id` and fields `outer` (as read
/// once for its id): command trust first ([`trust::unwrap`], then the
/// signed command's own fields, [`trust::check_signed`]), then the
/// command itself against the advertised `capabilities` and the `managed`
/// namespaces. The batch makes its commands here only; [`parse`] is the
/// same path for an unsigned command.
pub fn receive(
    raw: &str,
    outer: Result<CommandFields<'_>, serde_json::Error>,
    id: &str,
    trust: &Trust<'_>,
    capabilities: &[&str],
    managed: &[String],
) -> Result<Received, Refusal> {
    let outer = outer.map_err(|_| Refusal::Untrusted(Untrusted::Envelope("not an object")))?;
    match trust::unwrap(&outer, trust).map_err(Refusal::Untrusted)? {
        Unwrapped::Plain => Ok(Received {
            command: from_fields(raw, &outer, id.to_owned(), capabilities, managed)?,
            keep_until: None,
        }),
        Unwrapped::Signed { text, verified } => {
            let inner = trust::signed_fields(&text).map_err(Refusal::Untrusted)?;
            let not_after = trust::check_signed(&inner, id, trust).map_err(Refusal::Untrusted)?;
            Ok(Received {
                command: from_fields(&text, &inner, id.to_owned(), capabilities, managed)?,
                keep_until: trust::keep_until(not_after, verified),
            })
        }
    }
}

/// Parses and validates one unsigned command (its JSON text), as
/// [`receive`] does when signatures are not required. The id of a refused
/// command is [`command_id`]'s.
pub fn parse(raw: &str, capabilities: &[&str], managed: &[String]) -> Result<Command, Refusal> {
    let fields = CommandFields::read(raw).map_err(|e| not_a_command(raw, &e).1)?;
    let id = checked_id(raw, Ok(&fields)).map_err(|(_, refusal)| refusal)?;
    from_fields(raw, &fields, id, capabilities, managed)
}

/// The command of `text`, whose fields are `env` and checked id `id`.
fn from_fields(
    text: &str,
    env: &CommandFields<'_>,
    id: String,
    capabilities: &[&str],
    managed: &[String],
) -> Result<Command, Refusal> {
    // The budget first: nothing below builds more than it allows.
    budget(text)?;
    let class = match crate::strict_json::raw_string(env.class) {
        Ok(Some(c)) => c,
        Err(text) => return Err(Refusal::UnsupportedClass(text.0)),
        Ok(None) => return Err(Refusal::UnsupportedClass("(missing)".into())),
    };
    let class = class.as_str();
    if !matches!(
        class,
        "deploy" | "rollout" | "upgrade" | "uninstall" | "plan"
    ) {
        return Err(Refusal::UnsupportedClass(clip(class, 64)));
    }
    requires(env.requires, capabilities)?;
    capable(class, capabilities)?;
    let payload: Value = match env.payload {
        // Duplicate keys refused: the policy judges what the API server reads.
        Some(raw) => crate::strict_json::parse(raw.get()).map_err(invalid)?,
        None => return Err(invalid("payload is missing")),
    };
    if !payload.is_object() {
        return Err(invalid("payload is not an object"));
    }
    if class != "plan" {
        let action = action(class, &payload, capabilities, managed).map_err(invalid)?;
        return Ok(Command {
            id,
            action,
            plan: false,
        });
    }
    // A plan: its payload is the planned command's class and payload,
    // validated as that command's (docs/protocol.md, `command.plan.v1`).
    let inner = match &payload["class"] {
        Value::String(c)
            if matches!(c.as_str(), "deploy" | "rollout" | "upgrade" | "uninstall") =>
        {
            c.as_str()
        }
        Value::String(c) => return Err(invalid(PayloadError::PlanClass(clip(c, 64)))),
        Value::Null => return Err(invalid(PayloadError::Missing("class".into()))),
        _ => return Err(invalid(PayloadError::NotAString("class".into()))),
    };
    capable(inner, capabilities)?;
    if !payload["payload"].is_object() {
        return Err(invalid(PayloadError::MissingOrNotObject("payload".into())));
    }
    let action = action(inner, &payload["payload"], capabilities, managed)
        .map_err(|e| invalid(PayloadError::Planned(Box::new(e))))?;
    Ok(Command {
        id,
        action,
        plan: true,
    })
}

/// Refuses a class whose capability is not advertised (an upgrade with
/// self-upgrade turned off), as its `requires` would be.
fn capable(class: &str, capabilities: &[&str]) -> Result<(), Refusal> {
    let needs = match class {
        "rollout" => Some("command.rollout"),
        "upgrade" => Some("command.upgrade"),
        "uninstall" => Some("command.uninstall"),
        "plan" => Some(PLAN_CAPABILITY),
        _ => None,
    };
    match needs.filter(|c| !capabilities.contains(c)) {
        Some(needed) => Err(Refusal::UnsupportedCapability(needed.to_owned())),
        None => Ok(()),
    }
}

/// The action of a `class` (not `plan`) from its payload.
fn action(
    class: &str,
    payload: &Value,
    capabilities: &[&str],
    managed: &[String],
) -> Result<Action, PayloadError> {
    match class {
        "deploy" => payload::deploy(payload, capabilities, managed).map(Action::Deploy),
        "rollout" => payload::rollout(payload, managed).map(Action::Rollout),
        "upgrade" => payload::upgrade(payload).map(Action::Upgrade),
        _ => payload::target(&payload["deployment"], "deployment", managed).map(Action::Uninstall),
    }
}

#[cfg(test)]
mod tests;
