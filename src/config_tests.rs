use super::*;
use std::collections::HashMap;

const TOKEN: &str = "nexo_ct_env-prod-eu_abcdefghijklmnopqrstuvwxyz0123456789";

fn parse(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Config::from_lookup(|k| map.get(k).cloned())
}

fn base() -> Vec<(&'static str, &'static str)> {
    vec![
        ("NEXO_CONTROL_PLANE_URL", "https://cp.example.com/"),
        ("NEXO_PROXY_IMAGE", "registry.example.com/nexo/proxy:1.4.2"),
    ]
}

#[test]
fn defaults() {
    let c = parse(&base()).unwrap();
    assert_eq!(c.control_plane_url, "https://cp.example.com");
    assert_eq!(c.token_source, TokenSource::File(DEFAULT_TOKEN_FILE.into()));
    assert_eq!(c.heartbeat_interval, Duration::from_secs(15));
    assert_eq!(c.progress_deadline, Duration::from_secs(600));
    assert_eq!(c.self_upgrade_deadline, Duration::from_secs(600));
    assert_eq!(c.drift_interval, Duration::from_secs(300));
    assert_eq!(
        (c.cp_connect_timeout, c.cp_request_timeout),
        (Duration::from_secs(10), Duration::from_secs(30))
    );
    assert_eq!(c.listen_addr, Some("0.0.0.0:8080".parse().unwrap()));
    assert_eq!(c.state_secret, "nexo-manager-state");
    assert_eq!(c.lease_name, "nexo-manager");
    assert_eq!(c.self_deployment, "nexo-manager");
    assert_eq!(c.log_format, LogFormat::Text);
    assert!(!c.allow_legacy_adoption && !c.insecure_allow_http);
    assert_eq!(c.managed_namespaces("nexo-system"), vec!["nexo-system"]);
}

/// Variables to override, the variable the error must name, and a part of its message.
type Case = (
    Vec<(&'static str, &'static str)>,
    &'static str,
    &'static str,
);

/// One case per variable and problem: a table, long on purpose.
#[test]
fn errors_name_the_variable() {
    let cases: Vec<Case> = vec![
        (
            vec![("NEXO_CONTROL_PLANE_URL", "")],
            "NEXO_CONTROL_PLANE_URL",
            "is required",
        ),
        (
            vec![("NEXO_PROXY_IMAGE", " ")],
            "NEXO_PROXY_IMAGE",
            "is required",
        ),
        (
            vec![("NEXO_CONTROL_PLANE_URL", "http://cp.example.com")],
            "NEXO_CONTROL_PLANE_URL",
            "plain http://",
        ),
        (
            vec![("NEXO_CONTROL_PLANE_URL", "ftp://cp")],
            "NEXO_CONTROL_PLANE_URL",
            "not an https://",
        ),
        (
            vec![("NEXO_HEARTBEAT_INTERVAL", "soon")],
            "NEXO_HEARTBEAT_INTERVAL",
            "not a duration",
        ),
        (
            vec![("NEXO_HEARTBEAT_INTERVAL", "2h")],
            "NEXO_HEARTBEAT_INTERVAL",
            "outside 1s..10m",
        ),
        (
            vec![("NEXO_DRIFT_INTERVAL", "0s")],
            "NEXO_DRIFT_INTERVAL",
            "outside 1s..1day",
        ),
        (
            vec![("NEXO_PROGRESS_DEADLINE", "2d")],
            "NEXO_PROGRESS_DEADLINE",
            "outside 1s..1day",
        ),
        (
            vec![("NEXO_SELF_UPGRADE_DEADLINE", "0s")],
            "NEXO_SELF_UPGRADE_DEADLINE",
            "outside 1s..1day",
        ),
        (
            vec![("NEXO_CP_REQUEST_TIMEOUT", "0s")],
            "NEXO_CP_REQUEST_TIMEOUT",
            "outside 1s..5m",
        ),
        (
            vec![("NEXO_NAMESPACES", "shop,Bad_NS")],
            "NEXO_NAMESPACES",
            "Bad_NS",
        ),
        (
            vec![("NEXO_LISTEN_ADDR", "everywhere")],
            "NEXO_LISTEN_ADDR",
            "not host:port",
        ),
        (
            vec![("NEXO_LOG_FORMAT", "xml")],
            "NEXO_LOG_FORMAT",
            "neither",
        ),
        (
            vec![("NEXO_EXECUTOR", "Not A Name")],
            "NEXO_EXECUTOR",
            "is not a Kubernetes object name",
        ),
        (
            vec![("NEXO_ADOPT_UNPROVEN", "maybe")],
            "NEXO_ADOPT_UNPROVEN",
            "not true or false",
        ),
        (
            vec![("NEXO_ALLOW_LEGACY_ADOPTION", "maybe")],
            "NEXO_ALLOW_LEGACY_ADOPTION",
            "not true or false",
        ),
        (
            vec![("NEXO_STATE_SECRET", "Bad Name")],
            "NEXO_STATE_SECRET",
            "not a Kubernetes object name",
        ),
        (
            vec![("NEXO_PROXY_IMAGE", "UPPER/case")],
            "NEXO_PROXY_IMAGE",
            "image",
        ),
        (
            vec![("NEXO_ENVIRONMENT_ID", "X")],
            "NEXO_ENVIRONMENT_ID",
            "not an environment id",
        ),
        (
            vec![("NEXO_CONNECT_TOKEN", "nexo_ct_env-a_short")],
            "NEXO_CONNECT_TOKEN",
            "secret",
        ),
        (
            vec![
                ("NEXO_CONNECT_TOKEN", TOKEN),
                ("NEXO_CONNECT_TOKEN_FILE", "/x"),
            ],
            "NEXO_CONNECT_TOKEN",
            "only one",
        ),
        (
            vec![
                ("NEXO_CONNECT_TOKEN", TOKEN),
                ("NEXO_ENVIRONMENT_ID", "env-other"),
            ],
            "NEXO_CONNECT_TOKEN",
            "env-other",
        ),
        (
            vec![("HTTPS_PROXY", "ftp://proxy")],
            "HTTPS_PROXY",
            "http://",
        ),
    ];
    for (overrides, var, needle) in cases {
        let mut vars = base();
        for (k, v) in &overrides {
            vars.retain(|(bk, _)| bk != k);
            vars.push((k, v));
        }
        let e = parse(&vars).expect_err(var);
        assert_eq!(e.variable, var, "{overrides:?}: {e}");
        assert!(e.to_string().contains(needle), "{overrides:?}: {e}");
        assert!(
            !e.to_string()
                .contains("abcdefghijklmnopqrstuvwxyz0123456789"),
            "secret leaked: {e}"
        );
    }
}

#[test]
fn http_needs_the_switch() {
    let mut vars = base();
    vars[0] = ("NEXO_CONTROL_PLANE_URL", "http://127.0.0.1:8443");
    vars.push(("NEXO_INSECURE_ALLOW_HTTP", "true"));
    assert_eq!(
        parse(&vars).unwrap().control_plane_url,
        "http://127.0.0.1:8443"
    );
}

#[test]
fn token_value_never_in_debug() {
    let mut vars = base();
    vars.push(("NEXO_CONNECT_TOKEN", TOKEN));
    vars.push(("NEXO_ENVIRONMENT_ID", "env-prod-eu"));
    let c = parse(&vars).unwrap();
    assert!(!format!("{c:?}").contains("abcdefghij"));
}

#[test]
fn namespaces_listed_and_deduplicated() {
    let mut vars = base();
    vars.push(("NEXO_NAMESPACES", " shop, billing ,shop,"));
    assert_eq!(
        parse(&vars).unwrap().managed_namespaces("own"),
        vec!["shop", "billing"]
    );
}

#[test]
fn proxy_dropped_when_no_proxy_matches() {
    let mut vars = base();
    vars.push(("HTTPS_PROXY", "http://proxy.corp:3128"));
    assert_eq!(
        parse(&vars).unwrap().https_proxy.as_deref(),
        Some("http://proxy.corp:3128")
    );
    vars.push(("NO_PROXY", "localhost,.example.com"));
    assert_eq!(parse(&vars).unwrap().https_proxy, None);
}

#[test]
fn host_port_of_urls() {
    assert_eq!(
        host_port("https://CP.example.com"),
        ("cp.example.com".into(), 443)
    );
    assert_eq!(
        host_port("https://127.0.0.1:8443/base"),
        ("127.0.0.1".into(), 8443)
    );
    assert_eq!(host_port("https://[::1]:9"), ("::1".into(), 9));
    assert_eq!(host_port("http://h"), ("h".into(), 80));
}
