//! The wire types against the protocol's examples.
use super::*;
use serde_json::json;

#[test]
fn command_ids_start_with_a_letter_or_digit() {
    for ok in ["cmd-01J", "a", "0.1_x-y", &"x".repeat(128)] {
        assert!(valid_command_id(ok), "{ok}");
    }
    for bad in [
        ".",
        "..",
        "-x",
        "_x",
        ".hidden",
        "",
        "a/b",
        "a b",
        &"x".repeat(129),
    ] {
        assert!(!valid_command_id(bad), "{bad:?}");
    }
}

#[test]
fn session_tokens_must_fit_a_bearer_header() {
    for ok in ["s", "abc.DEF-123_~+/", "dG9rZW4=", "x=="] {
        assert!(valid_session_token(ok), "{ok}");
    }
    let long = "x".repeat(4097);
    for bad in [
        "",
        "=",
        "a\r\nX-Evil: 1",
        "a b",
        "tök",
        "a\u{0}",
        "a=b",
        long.as_str(),
    ] {
        assert!(!valid_session_token(bad), "{bad:?}");
    }
}

#[test]
fn held_is_true_only_for_the_json_true() {
    for (body, held) in [
        (r#"{"held": true}"#, true),
        (r#"{"held": false}"#, false),
        (r#"{"held": "true"}"#, false),
        (r#"{"held": 1}"#, false),
        (r#"{"held": null}"#, false),
        (r#"{"held": {"a": true}}"#, false),
        ("{}", false),
    ] {
        let r: HeartbeatResponse = serde_json::from_str(body).unwrap();
        assert_eq!(r.held, held, "{body}");
    }
}

#[test]
fn heartbeat_response_fields_are_optional_and_unknown_ignored() {
    let r: HeartbeatResponse = serde_json::from_str("{}").unwrap();
    assert!(r.heartbeat_interval_seconds.is_none() && r.commands.is_none());
    let deep = format!("{}{}", "[".repeat(500), "]".repeat(500));
    let body = format!(
        r#"{{"heartbeatIntervalSeconds": 30, "commands": [{{"id": "a", "payload": {deep}}}, {{"id": "b\ud800"}}], "future": 1}}"#
    );
    let r: HeartbeatResponse = serde_json::from_slice(body.as_bytes()).unwrap();
    assert_eq!(r.heartbeat_interval_seconds, Some(30));
    assert_eq!(
        r.commands.unwrap().taken.len(),
        2,
        "bad commands do not spoil the batch"
    );
    assert!(serde_json::from_str::<HeartbeatResponse>(r#"{"commands": {"id": "a"}}"#).is_err());
}

#[test]
fn an_answer_gives_at_most_1000_commands_and_counts_the_rest() {
    let one = r#"{"id":"c","class":"deploy","payload":{}}"#;
    let body = format!(
        r#"{{"commands":[{}]}}"#,
        vec![one; MAX_COMMANDS + 234].join(",")
    );
    let r: HeartbeatResponse = serde_json::from_slice(body.as_bytes()).unwrap();
    let c = r.commands.unwrap();
    assert_eq!((c.taken.len(), c.skipped), (MAX_COMMANDS, 234));
    assert_eq!(c.taken[999].get(), one, "a slice of the answer, not a copy");
}

#[test]
fn a_non_integer_interval_is_ignored_not_a_failed_heartbeat() {
    for (raw, want) in [
        ("30", Some(30)),
        ("0", Some(0)),
        ("99999999999999999999999", Some(u64::MAX)),
        ("30.5", None),
        ("-5", None),
        ("\"30\"", None),
        ("null", None),
        ("[30]", None),
        ("1e3", None),
    ] {
        let body = format!(r#"{{"heartbeatIntervalSeconds": {raw}}}"#);
        let r: HeartbeatResponse = serde_json::from_str(&body).unwrap();
        assert_eq!(r.heartbeat_interval_seconds, want, "{raw}");
    }
}

#[test]
fn connect_response_requires_its_fields() {
    let ok =
        json!({"environmentId": "env-a", "managerId": "m", "sessionToken": "s", "extra": true});
    assert!(serde_json::from_value::<ConnectResponse>(ok).is_ok());
    let missing = json!({"environmentId": "env-a", "managerId": "m"});
    assert!(serde_json::from_value::<ConnectResponse>(missing).is_err());
}

#[test]
fn optional_cluster_fields_are_omitted() {
    let c = ClusterInfo {
        uid: "u".into(),
        kubernetes_version: "v1.37.2".into(),
        ..Default::default()
    };
    assert_eq!(
        serde_json::to_value(&c).unwrap(),
        json!({"uid": "u", "kubernetesVersion": "v1.37.2"})
    );
}

#[test]
fn command_ids() {
    assert!(valid_command_id("cmd-01J.x_y"));
    assert!(!valid_command_id(""));
    assert!(!valid_command_id("a/b"));
    assert!(!valid_command_id(&"a".repeat(129)));
}
