//! The heartbeat's answer: commands (each read once, bounded), the
//! interval, the held flag.

use serde::Deserialize;
use serde_json::value::RawValue;

/// A command's fields as slices of its text, read once: every field the
/// Manager reads, of an unsigned command, of a signed envelope and of the
/// command it signs; `None` when absent. Nothing is built from them before
/// the command's size budget is checked.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommandFields<'a> {
    #[serde(default, borrow)]
    pub id: Option<&'a RawValue>,
    #[serde(default, borrow)]
    pub class: Option<&'a RawValue>,
    #[serde(default, borrow)]
    pub requires: Option<&'a RawValue>,
    #[serde(default, borrow)]
    pub payload: Option<&'a RawValue>,
    /// A signed envelope's key id.
    #[serde(default, borrow)]
    pub key_id: Option<&'a RawValue>,
    /// A signed envelope's signed bytes, base64url.
    #[serde(default, borrow)]
    pub signed: Option<&'a RawValue>,
    /// A signed envelope's signature, base64url.
    #[serde(default, borrow)]
    pub signature: Option<&'a RawValue>,
    /// A signed command's environment.
    #[serde(default, borrow)]
    pub environment_id: Option<&'a RawValue>,
    /// A signed command's end of validity.
    #[serde(default, borrow)]
    pub not_after: Option<&'a RawValue>,
}

impl<'a> CommandFields<'a> {
    /// The fields of `text`, a JSON object (a duplicate field is an error).
    pub fn read(text: &'a str) -> Result<CommandFields<'a>, serde_json::Error> {
        serde_json::from_str(text)
    }
}

/// Most commands taken from one heartbeat answer; the rest are skipped
/// unacknowledged (the CP sends them again).
pub const MAX_COMMANDS: usize = 1000;

/// Largest command, as raw JSON (docs/protocol.md, "Hostile and buggy values").
pub const MAX_COMMAND_BYTES: usize = 2 * 1024 * 1024;

/// `POST /api/v2/manager/heartbeat` 200 body; every field optional,
/// borrowed from the answer's bytes. A `commands` that is not a list fails
/// to decode: a failed heartbeat.
#[derive(Debug, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatResponse<'a> {
    /// Interval override, whole seconds (clamped to 5..=600 by the
    /// caller); anything but a non-negative integer is ignored.
    #[serde(default, deserialize_with = "lenient_seconds")]
    pub heartbeat_interval_seconds: Option<u64>,
    /// Commands, kept as slices of the answer and decoded one by one, so
    /// that one bad command (too deep, a lone surrogate) cannot spoil the
    /// batch and the batch is never copied.
    #[serde(default, borrow)]
    pub commands: Option<Commands<'a>>,
    /// `held: true`: the CP held the request (`heartbeat.wait.v1`), so it
    /// was the wait and the next heartbeat goes at once. Anything but
    /// `true` is not held.
    #[serde(default, deserialize_with = "lenient_true")]
    pub held: bool,
    /// `inventory` (`inventory.delta.v1`): a confirmation or a resync,
    /// kept raw: a malformed one is ignored, never a failed heartbeat.
    #[serde(default, borrow)]
    pub inventory: Option<&'a RawValue>,
}

/// What the CP said of the inventory (docs/protocol.md,
/// `inventory.delta.v1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InventoryAnswer {
    /// It holds `revision` of `epoch`.
    Confirmed { epoch: String, revision: u64 },
    /// Send the full form next.
    Resync,
}

impl InventoryAnswer {
    /// The answer's `inventory`, when it is one of the two shapes.
    pub fn read(raw: &RawValue) -> Option<InventoryAnswer> {
        #[derive(Deserialize)]
        struct Shape {
            #[serde(default)]
            epoch: Option<String>,
            #[serde(default)]
            revision: Option<u64>,
            #[serde(default)]
            resync: Option<bool>,
        }
        let s: Shape = serde_json::from_str(raw.get()).ok()?;
        match s {
            Shape {
                resync: Some(true), ..
            } => Some(InventoryAnswer::Resync),
            Shape {
                epoch: Some(epoch),
                revision: Some(revision),
                ..
            } => Some(InventoryAnswer::Confirmed { epoch, revision }),
            _ => None,
        }
    }
}

/// `true` only for the JSON `true`; any other value (absent, `false`,
/// `"true"`, `1`) is false.
fn lenient_true<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    let raw = <&RawValue>::deserialize(d)?;
    Ok(raw.get().trim() == "true")
}

/// The first [`MAX_COMMANDS`] commands of an answer, and how many followed.
#[derive(Debug, Default)]
pub struct Commands<'a> {
    /// The commands taken, raw.
    pub taken: Vec<&'a RawValue>,
    /// Commands past the limit, skipped without being read into memory.
    pub skipped: usize,
}

impl<'de: 'a, 'a> Deserialize<'de> for Commands<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Commands<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a list of commands")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut out = Commands::default();
                loop {
                    if out.taken.len() < MAX_COMMANDS {
                        match seq.next_element::<&'de RawValue>()? {
                            Some(c) => out.taken.push(c),
                            None => break,
                        }
                    } else {
                        match seq.next_element::<serde::de::IgnoredAny>()? {
                            Some(_) => out.skipped += 1,
                            None => break,
                        }
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_seq(Visit(std::marker::PhantomData))
    }
}

fn lenient_seconds<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let raw = <&RawValue>::deserialize(d)?;
    Ok(crate::backoff::whole_number(raw.get()))
}
