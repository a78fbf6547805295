use super::*;
use base64::engine::general_purpose::STANDARD;
use ring::signature::{Ed25519KeyPair, KeyPair};
use serde_json::json;

const ENV: &str = "env-a";

/// A key pair from a fixed seed: tests only, never a secret of anyone's.
fn pair(seed: u8) -> Ed25519KeyPair {
    Ed25519KeyPair::from_seed_unchecked(&[seed; 32]).unwrap()
}

fn keys_of(pairs: &[(&str, &Ed25519KeyPair)]) -> Keys {
    let text: Vec<String> = pairs
        .iter()
        .map(|(id, p)| format!("{id} {}", STANDARD.encode(p.public_key().as_ref())))
        .collect();
    Keys::parse(&text.join("\n")).unwrap()
}

fn now() -> SystemTime {
    humantime::parse_rfc3339("2026-12-03T12:00:00Z").unwrap()
}

fn inner(id: &str) -> serde_json::Value {
    json!({"id": id, "class": "uninstall", "environmentId": ENV, "notAfter": "2026-12-03T12:05:00Z",
           "payload": {"deployment": {"name": "orders", "namespace": "shop"}}})
}

fn envelope(id: &str, key_id: &str, signer: &Ed25519KeyPair, body: &serde_json::Value) -> String {
    let bytes = serde_json::to_vec(body).unwrap();
    let signature = signer.sign(&bytes);
    json!({"id": id, "keyId": key_id, "signed": URL_SAFE_NO_PAD.encode(&bytes),
           "signature": URL_SAFE_NO_PAD.encode(signature.as_ref())})
    .to_string()
}

#[test]
fn a_signed_command_verifies_and_yields_its_signed_bytes() {
    let k1 = pair(1);
    let keys = keys_of(&[("k1", &k1)]);
    let raw = envelope("cmd-1", "k1", &k1, &inner("cmd-1"));
    let verified = verify(&raw, "cmd-1", Some(&keys), ENV, now()).unwrap();
    let parsed: serde_json::Value = serde_json::from_str(verified.text()).unwrap();
    assert_eq!(parsed, inner("cmd-1"));
}

#[test]
fn every_refusal_has_its_own_reason() {
    let (k1, k2) = (pair(1), pair(2));
    let keys = keys_of(&[("k1", &k1)]);
    let mut other_env = inner("cmd-1");
    other_env["environmentId"] = json!("env-b");
    let mut no_env = inner("cmd-1");
    no_env.as_object_mut().unwrap().remove("environmentId");
    let mut stale = inner("cmd-1");
    stale["notAfter"] = json!("2026-12-03T11:54:59Z");
    let mut garbled = inner("cmd-1");
    garbled["notAfter"] = json!("yesterday");
    let tampered = {
        let mut e: serde_json::Value =
            serde_json::from_str(&envelope("cmd-1", "k1", &k1, &inner("cmd-1"))).unwrap();
        let mut body = inner("cmd-1");
        body["class"] = json!("deploy");
        e["signed"] = json!(URL_SAFE_NO_PAD.encode(serde_json::to_vec(&body).unwrap()));
        e.to_string()
    };
    let cases: Vec<(String, Untrusted)> = vec![
        (inner("cmd-1").to_string(), Untrusted::Unsigned),
        (
            envelope("cmd-1", "k9", &k1, &inner("cmd-1")),
            Untrusted::UnknownKey("k9".into()),
        ),
        (
            envelope("cmd-1", "k1", &k2, &inner("cmd-1")),
            Untrusted::BadSignature,
        ),
        (tampered, Untrusted::BadSignature),
        (
            envelope("cmd-1", "k1", &k1, &inner("cmd-2")),
            Untrusted::IdMismatch("cmd-2".into()),
        ),
        (
            envelope("cmd-1", "k1", &k1, &other_env),
            Untrusted::Environment(Some("env-b".into())),
        ),
        (
            envelope("cmd-1", "k1", &k1, &no_env),
            Untrusted::Environment(None),
        ),
        (
            envelope("cmd-1", "k1", &k1, &stale),
            Untrusted::Expired("notAfter 2026-12-03T11:54:59Z is more than 5 minutes past".into()),
        ),
        (
            json!({"id": "cmd-1", "keyId": "k1", "signed": "!!", "signature": "AA"}).to_string(),
            Untrusted::Envelope("signed is not base64url"),
        ),
        (
            json!({"id": "cmd-1", "keyId": "k1", "signed": "e30", "signature": "AAAA"}).to_string(),
            Untrusted::Envelope("signature is not 64 bytes"),
        ),
        (
            json!({"id": "cmd-1", "keyId": "k1", "signed": "A".repeat(MAX_SIGNED + 4), "signature": "AAAA"})
                .to_string(),
            Untrusted::Envelope("signed is over the 2 MiB command limit"),
        ),
    ];
    let mut messages = Vec::new();
    for (raw, want) in cases {
        let got = verify(&raw, "cmd-1", Some(&keys), ENV, now()).unwrap_err();
        assert_eq!(got, want, "{raw}");
        messages.push(got.to_string());
    }
    let garbled = envelope("cmd-1", "k1", &k1, &garbled);
    let got = verify(&garbled, "cmd-1", Some(&keys), ENV, now()).unwrap_err();
    assert!(matches!(got, Untrusted::Expired(_)), "{got:?}");
    assert!(messages.contains(&"bad signature".to_owned()));
    assert!(messages.iter().any(|m| m.starts_with("unsigned command")));
}

#[test]
fn not_after_allows_five_minutes_of_clock_skew() {
    let k1 = pair(1);
    let keys = keys_of(&[("k1", &k1)]);
    let mut body = inner("cmd-1");
    body["notAfter"] = json!("2026-12-03T11:55:00Z");
    let raw = envelope("cmd-1", "k1", &k1, &body);
    assert!(verify(&raw, "cmd-1", Some(&keys), ENV, now()).is_ok());
}

#[test]
fn without_keys_commands_are_accepted_as_they_come() {
    let raw = inner("cmd-1").to_string();
    assert_eq!(
        verify(&raw, "cmd-1", None, ENV, now()),
        Ok(Verified::Plain(&raw))
    );
    // A signed one is unwrapped; its id and environment are still checked.
    let k1 = pair(1);
    let signed = envelope("cmd-1", "k1", &k1, &inner("cmd-1"));
    assert!(matches!(
        verify(&signed, "cmd-1", None, ENV, now()),
        Ok(Verified::Signed(_))
    ));
    let other = envelope("cmd-1", "k1", &k1, &inner("cmd-2"));
    assert!(verify(&other, "cmd-1", None, ENV, now()).is_err());
}

#[test]
fn several_keys_allow_rotation() {
    let (old, new) = (pair(1), pair(2));
    let both = keys_of(&[("old", &old), ("new", &new)]);
    for (id, signer) in [("old", &old), ("new", &new)] {
        let raw = envelope("cmd-1", id, signer, &inner("cmd-1"));
        assert!(
            verify(&raw, "cmd-1", Some(&both), ENV, now()).is_ok(),
            "{id}"
        );
    }
    let only_new = keys_of(&[("new", &new)]);
    let raw = envelope("cmd-1", "old", &old, &inner("cmd-1"));
    assert_eq!(
        verify(&raw, "cmd-1", Some(&only_new), ENV, now()),
        Err(Untrusted::UnknownKey("old".into()))
    );
}

#[test]
fn key_files_are_checked_line_by_line() {
    let key = STANDARD.encode([7u8; 32]);
    let ok = format!(
        "# rotation: both\nk1 {key}\n\nk2 {}\n",
        URL_SAFE_NO_PAD.encode([8u8; 32])
    );
    assert_eq!(Keys::parse(&ok).unwrap().ids(), ["k1", "k2"]);
    for (text, line) in [
        (format!("k1 {key} extra"), 1),
        ("k1 not-base64!".to_owned(), 1),
        (format!("k1 {}", STANDARD.encode([7u8; 31])), 1),
        (format!("k1 {key}\nk1 {key}"), 2),
        (format!("bad/id {key}"), 1),
    ] {
        match Keys::parse(&text) {
            Err(KeysError::Line { line: n, .. }) => assert_eq!(n, line, "{text}"),
            other => panic!("{text}: {other:?}"),
        }
    }
    assert!(matches!(Keys::parse("# none\n"), Err(KeysError::Size(_))));
    let keys = Keys::parse(&ok).unwrap();
    assert!(!format!("{keys:?}").contains(&key), "Debug shows ids only");
}
