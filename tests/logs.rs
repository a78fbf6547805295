//! No token reaches the log at any level (SECURITY.md, "Tokens in the
//! logs"). Every test that runs the Manager runs it at `trace` and searches
//! its log for every token when it ends (`support::manager::Manager`); this
//! file checks the search itself, and runs one whole scenario as the
//! operator who sets `RUST_LOG=trace` would: a ServiceAccount token for the
//! API server, the connect token, two session tokens, a deploy and its ack.

mod support;

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use serde_json::json;
use support::commands::{command, configmap, proxy, secret, wait_ack};
use support::fixture::Fixture;
use support::secrets::found_in;

const TOKEN: &str = "nexo_ct_0123456789abcdefABCDEF";

#[test]
fn the_search_finds_a_token_plain_in_a_split_hex_dump_and_in_base64() {
    assert_eq!(
        found_in(
            "Authorization: Bearer nexo_ct_0123456789abcdefABCDEF",
            TOKEN
        ),
        Some("plain")
    );
    assert_eq!(found_in("nothing here", TOKEN), None);
    // A wire dump in ureq-proto's rows (16 bytes, hex in pairs, then the
    // ASCII column), the token split over rows, the log's prefix on each.
    let wire = format!("GET / HTTP/1.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n");
    let mut log = String::new();
    for row in wire.as_bytes().chunks(16) {
        let mut hex = String::new();
        for (i, b) in row.iter().enumerate() {
            hex.push_str(&format!("{b:02x}"));
            if i % 2 == 1 {
                hex.push(' ');
            }
        }
        let ascii: String = row
            .iter()
            .map(|b| {
                if b.is_ascii_graphic() {
                    *b as char
                } else {
                    '.'
                }
            })
            .collect();
        log.push_str(&format!(
            "2026-12-06T00:00:00.000Z TRACE ureq_proto::util: {hex} {ascii}\n"
        ));
    }
    assert!(!log.contains(TOKEN), "the rows split it: {log}");
    assert_eq!(found_in(&log, TOKEN), Some("hex"), "{log}");
    for prefix in ["", "a", "ab"] {
        let b64 = STANDARD_NO_PAD.encode(format!("{prefix}{TOKEN}!"));
        assert_eq!(
            found_in(&format!("body {b64}"), TOKEN),
            Some("base64"),
            "after {prefix:?}"
        );
    }
}

#[test]
fn a_trace_log_of_a_whole_scenario_holds_no_token() {
    let f = Fixture::new("logs");
    f.tb.install_crds();
    // The API server through a ServiceAccount's bearer token, as in a pod.
    let admin = f.tb.admin();
    let sa = "nexo-logs";
    admin
        .create(
            &format!("/api/v1/namespaces/{}/serviceaccounts", f.ns.name),
            &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa}}),
        )
        .unwrap();
    admin
        .create(
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                    "metadata": {"name": format!("{}-{sa}", f.ns.name)},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                    "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": f.ns.name}]}),
        )
        .unwrap();
    let sa_token = f.tb.token(&f.ns.name, sa);
    let mut env = f.env();
    assert_eq!(env["RUST_LOG"], "trace", "the tests' Manager logs at trace");
    env.insert(
        "KUBECONFIG".into(),
        f.tb.kubeconfig_for_token(&sa_token, sa)
            .display()
            .to_string(),
    );
    let mut m = f.spawn(&env);
    let name = "logs";
    f.sim.enqueue_command(
        &f.env_id,
        command(
            "logs-deploy",
            "deploy",
            json!({"deployment": {"name": name, "namespace": f.ns.name}, "format": "crd",
                   "manifests": [proxy(name), configmap(&format!("{name}-config")), secret(&format!("{name}-db"))]}),
        ),
    );
    let ack = wait_ack(&f, &mut m, "logs-deploy");
    m.check(ack["result"] == "applied", &format!("deploy: {ack}"));
    // A second session token: the CP ends the session, the Manager
    // connects again.
    f.sim.expire_sessions();
    let before = f.sim.heartbeat_count();
    m.wait_until(
        Duration::from_secs(30),
        "heartbeats on a new session",
        || f.sim.heartbeat_count() > before + 2,
    );
    m.stop_expecting_exit_0();

    let secrets = m.secrets();
    m.check(
        secrets.contains(&f.token) && secrets.contains(&sa_token) && secrets.len() >= 4,
        &format!(
            "the search covers the connect token, the ServiceAccount token and two session tokens ({} tokens)",
            secrets.len()
        ),
    );
    // The libraries did log at this level (the search looked at their
    // lines, not at a quiet log), and the Manager's own debug lines are
    // there.
    let log = m.stderr();
    m.check(
        log.contains(" DEBUG ureq") && log.contains(" DEBUG nexo_manager"),
        "the HTTP library's and the Manager's debug lines are in the log",
    );
    m.check(
        !log.contains(" TRACE ureq_proto") && !log.contains(" TRACE rustls"),
        "no wire dump of the HTTP or TLS library",
    );
    m.check_no_secret_in_log();
}
