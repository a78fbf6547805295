//! JSON parsed into a `serde_json::Value` with duplicate keys refused: a
//! command's payload is judged as the API server will read it, and
//! `{"privileged": false, "privileged": true}` must not mean one thing to
//! the policy and another to someone else (docs/protocol.md, "Command trust":
//! "a duplicate key hides nothing"); and a field's raw JSON read as a
//! string ([`raw_string`]). A leaf module: it imports only `text`.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::text::clip;

/// Parses `text`, refusing an object with the same key twice.
pub fn parse(text: &str) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = Strict.deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

struct Strict;

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::from(n))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::from(n))
    }

    fn visit_f64<E>(self, n: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(n).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }

    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut list = Vec::new();
        while let Some(v) = seq.next_element_seed(Strict)? {
            list.push(v);
        }
        Ok(Value::Array(list))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                // The key only, at most 64 characters: never the value (it
                // may be a secret). No import of `commands`, which uses this.
                let shown: String = key.chars().take(64).collect();
                let more = if shown.len() < key.len() { "…" } else { "" };
                return Err(de::Error::custom(format_args!(
                    "duplicate key {shown:?}{more}"
                )));
            }
            let value = map.next_value_seed(Strict)?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

/// A field's raw JSON as a string, if it is one (`null` counts as absent).
pub fn raw_string(raw: Option<&RawValue>) -> Result<Option<String>, NotAString> {
    match raw.map(RawValue::get) {
        None | Some("null") => Ok(None),
        Some(text) if text.starts_with('"') => serde_json::from_str(text)
            .map(Some)
            .map_err(|_| NotAString(clip(text, 64))),
        Some(text) => Err(NotAString(clip(text, 64))),
    }
}

/// A raw field that is not a JSON string: its text, cut to 64 characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotAString(pub String);

impl std::fmt::Display for NotAString {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotAString {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        for text in [
            r#"{"a": 1, "a": 1}"#,
            r#"{"x": {"privileged": false, "privileged": true}}"#,
            r#"[{"k": null, "k": null}]"#,
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.to_string().contains("duplicate key"), "{text}: {e}");
        }
    }

    #[test]
    fn everything_else_parses_as_serde_json_does() {
        for text in [
            r#"{"a": [1, -2, 3.5, "s", true, null, {"b": {}}], "c": 18446744073709551615}"#,
            r#""\u00e9""#,
            "[]",
        ] {
            assert_eq!(
                parse(text).unwrap(),
                serde_json::from_str::<Value>(text).unwrap()
            );
        }
        assert!(parse("{} trailing").is_err());
    }
}
