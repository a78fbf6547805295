use super::*;
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
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
    let verified = verify(&raw, "cmd-1", Some(&keys), true, ENV, now()).unwrap();
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
        let got = verify(&raw, "cmd-1", Some(&keys), true, ENV, now()).unwrap_err();
        assert_eq!(got, want, "{raw}");
        messages.push(got.to_string());
    }
    let garbled = envelope("cmd-1", "k1", &k1, &garbled);
    let got = verify(&garbled, "cmd-1", Some(&keys), true, ENV, now()).unwrap_err();
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
    assert!(verify(&raw, "cmd-1", Some(&keys), true, ENV, now()).is_ok());
}

#[test]
fn without_keys_commands_are_accepted_as_they_come() {
    let raw = inner("cmd-1").to_string();
    assert_eq!(
        verify(&raw, "cmd-1", None, false, ENV, now()),
        Ok(Verified::Plain(&raw))
    );
    // A signed one is unwrapped; its id and environment are still checked.
    let k1 = pair(1);
    let signed = envelope("cmd-1", "k1", &k1, &inner("cmd-1"));
    assert!(matches!(
        verify(&signed, "cmd-1", None, false, ENV, now()),
        Ok(Verified::Signed {
            verified: false,
            ..
        })
    ));
    let other = envelope("cmd-1", "k1", &k1, &inner("cmd-2"));
    assert!(verify(&other, "cmd-1", None, false, ENV, now()).is_err());
}

#[test]
fn several_keys_allow_rotation() {
    let (old, new) = (pair(1), pair(2));
    let both = keys_of(&[("old", &old), ("new", &new)]);
    for (id, signer) in [("old", &old), ("new", &new)] {
        let raw = envelope("cmd-1", id, signer, &inner("cmd-1"));
        assert!(
            verify(&raw, "cmd-1", Some(&both), true, ENV, now()).is_ok(),
            "{id}"
        );
    }
    let only_new = keys_of(&[("new", &new)]);
    let raw = envelope("cmd-1", "old", &old, &inner("cmd-1"));
    assert_eq!(
        verify(&raw, "cmd-1", Some(&only_new), true, ENV, now()),
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

#[test]
fn a_signature_is_a_single_order_not_a_standing_one() {
    let k1 = pair(1);
    let keys = keys_of(&[("k1", &k1)]);
    let at = |not_after: &str| {
        let mut body = inner("cmd-1");
        body["notAfter"] = json!(not_after);
        verify(
            &envelope("cmd-1", "k1", &k1, &body),
            "cmd-1",
            Some(&keys),
            true,
            ENV,
            now(),
        )
        .map(|v| v.keep_until())
    };
    // now() is 12:00; 65 minutes ahead is the limit.
    let ok = at("2026-12-03T13:05:00Z").unwrap();
    assert_eq!(
        ok,
        Some(humantime::parse_rfc3339("2026-12-03T13:10:00Z").unwrap()),
        "kept until notAfter + 5 minutes"
    );
    let too_long = at("2026-12-03T13:05:01Z").unwrap_err();
    assert!(
        matches!(too_long, Untrusted::ValidityTooLong(_)),
        "{too_long:?}"
    );
    assert!(
        too_long.to_string().starts_with("validity too long"),
        "{too_long}"
    );
    let ten_years = at("2036-12-03T12:00:00Z").unwrap_err();
    assert!(matches!(ten_years, Untrusted::ValidityTooLong(_)));
    // notAfter is required.
    let mut body = inner("cmd-1");
    body.as_object_mut().unwrap().remove("notAfter");
    let raw = envelope("cmd-1", "k1", &k1, &body);
    assert!(matches!(
        verify(&raw, "cmd-1", Some(&keys), true, ENV, now()),
        Err(Untrusted::Expired(_))
    ));
}

#[test]
fn fail_closed_without_keys_when_required() {
    let raw = inner("cmd-1").to_string();
    let got = verify(&raw, "cmd-1", None, true, ENV, now()).unwrap_err();
    assert_eq!(got, Untrusted::NoKeys);
    assert!(got.to_string().starts_with("no command keys"), "{got}");
    assert!(got.before_verification());
    let k1 = pair(1);
    let signed = envelope("cmd-1", "k1", &k1, &inner("cmd-1"));
    assert_eq!(
        verify(&signed, "cmd-1", None, true, ENV, now()),
        Err(Untrusted::NoKeys)
    );
    // With keys and not required (the operator's off), an unsigned command
    // is taken, and a signed one still verified.
    let keys = keys_of(&[("k1", &k1)]);
    assert_eq!(
        verify(&raw, "cmd-1", Some(&keys), false, ENV, now()),
        Ok(Verified::Plain(&raw))
    );
    let forged = envelope("cmd-1", "k1", &pair(2), &inner("cmd-1"));
    assert_eq!(
        verify(&forged, "cmd-1", Some(&keys), false, ENV, now()),
        Err(Untrusted::BadSignature)
    );
}

#[test]
fn the_ratchet_decides_from_mode_keys_and_state() {
    use crate::config::Signatures::*;
    assert!(signatures_required(Required, false, false));
    assert!(!signatures_required(Off, true, true));
    assert!(signatures_required(Auto, true, false));
    assert!(
        signatures_required(Auto, false, true),
        "recorded: the keys going away changes nothing"
    );
    assert!(!signatures_required(Auto, false, false));
}

#[test]
fn refusals_before_verification_are_told_apart() {
    for u in [
        Untrusted::Unsigned,
        Untrusted::UnknownKey("x".into()),
        Untrusted::Envelope("x"),
        Untrusted::BadSignature,
        Untrusted::KeyFile("x".into()),
        Untrusted::NoKeys,
    ] {
        assert!(u.before_verification(), "{u:?}");
    }
    for u in [
        Untrusted::Inner("x"),
        Untrusted::IdMismatch("x".into()),
        Untrusted::Environment(None),
        Untrusted::Expired("x".into()),
        Untrusted::ValidityTooLong("x".into()),
    ] {
        assert!(!u.before_verification(), "{u:?}");
    }
}

#[test]
fn small_order_and_non_canonical_keys_are_refused() {
    let mut p = [0xffu8; 32];
    p[0] = 0xed;
    p[31] = 0x7f;
    let mut one = [0u8; 32];
    one[0] = 1;
    let mut non_canonical = p;
    non_canonical[0] = 0xf0; // y = p + 3: above the prime
    let order8 = URL_SAFE_NO_PAD
        .decode("JuiVj8KyJ7BFw_SJ8u-Y8NXfrAXTxjM5sTgCiG1T_AU")
        .unwrap();
    for (what, key) in [
        ("identity", one.to_vec()),
        ("zero (order 4)", vec![0u8; 32]),
        ("y = p (order 4, non-canonical)", p.to_vec()),
        ("order 8", order8),
        ("above the prime", non_canonical.to_vec()),
    ] {
        let line = format!("k1 {}", STANDARD.encode(&key));
        assert!(
            matches!(Keys::parse(&line), Err(KeysError::Line { .. })),
            "{what}: accepted"
        );
    }
    // A real key passes.
    let k = pair(7);
    let line = format!("k1 {}", STANDARD.encode(k.public_key().as_ref()));
    assert!(Keys::parse(&line).is_ok());
}

#[test]
fn non_canonical_and_small_order_signatures_are_refused() {
    let k1 = pair(1);
    let keys = keys_of(&[("k1", &k1)]);
    let body = inner("cmd-1");
    let bytes = serde_json::to_vec(&body).unwrap();
    let good: [u8; 64] = k1.sign(&bytes).as_ref().try_into().unwrap();
    let with_signature = |sig: &[u8]| {
        let raw = json!({"id": "cmd-1", "keyId": "k1", "signed": URL_SAFE_NO_PAD.encode(&bytes),
                         "signature": URL_SAFE_NO_PAD.encode(sig)})
        .to_string();
        verify(&raw, "cmd-1", Some(&keys), true, ENV, now()).map(|_| ())
    };
    assert!(with_signature(&good).is_ok());
    // S + L: the same signature, malleated; refused.
    let mut malleated = good;
    let mut carry = 0u16;
    for i in 0..32 {
        let sum = u16::from(malleated[32 + i]) + u16::from(strict::GROUP_ORDER[i]) + carry;
        malleated[32 + i] = sum as u8;
        carry = sum >> 8;
    }
    assert_eq!(with_signature(&malleated), Err(Untrusted::BadSignature));
    // R of small order.
    let mut small_r = good;
    small_r[..32].copy_from_slice(&[0u8; 32]);
    small_r[0] = 1;
    assert_eq!(with_signature(&small_r), Err(Untrusted::BadSignature));
}
