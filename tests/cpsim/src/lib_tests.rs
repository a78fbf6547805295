//! The simulator over plain HTTP and TLS: requests, faults, the log.
use super::*;
use serde_json::json;
use std::io::BufRead;
use std::io::{BufReader, Read, Write};

/// A minimal keep-alive HTTP client over a plain or TLS stream.
fn post(stream: &mut (impl Read + Write), path: &str, token: &str, body: &Value) -> (u16, Value) {
    let body = body.to_string();
    write!(stream, "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    stream.flush().unwrap();
    let mut r = BufReader::new(stream);
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let status: u16 = line.split(' ').nth(1).unwrap().parse().unwrap();
    let mut len = 0;
    loop {
        let mut h = String::new();
        r.read_line(&mut h).unwrap();
        if h.trim().is_empty() {
            break;
        }
        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap();
        }
    }
    let mut buf = vec![0; len];
    r.read_exact(&mut buf).unwrap();
    (status, serde_json::from_slice(&buf).unwrap_or(Value::Null))
}

fn connect_body() -> Value {
    json!({"protocolVersion": 2, "manager": {"version": "0.3.0", "build": "b", "capabilities": []},
           "instance": {"id": "i", "podName": "p", "namespace": "n"},
           "cluster": {"uid": "c1", "kubernetesVersion": "v1.37.2"}})
}

#[test]
fn plain_http_round_trip_with_faults_over_one_connection() {
    let sim = Simulator::start(SimConfig {
        tls: false,
        ..SimConfig::default()
    });
    let token = sim.add_environment("env-a");
    let mut s = TcpStream::connect(sim.addr()).unwrap();
    sim.inject(Fault::new(
        Endpoint::Connect,
        FaultAction::Status {
            status: 503,
            code: "busy".into(),
            message: "later".into(),
            retry_after: Some("2".into()),
        },
    ));
    let (status, body) = post(&mut s, "/api/v2/manager/connect", &token, &connect_body());
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (503, Some("busy"))
    );
    assert_eq!(
        sim.bound_cluster("env-a"),
        None,
        "a faulted connect has no effect"
    );
    let (status, body) = post(&mut s, "/api/v2/manager/connect", &token, &connect_body());
    assert_eq!(status, 200, "the fault is consumed once");
    assert_eq!(body["managerId"], sim.manager_id("env-a"));
    assert_eq!(sim.bound_cluster("env-a").as_deref(), Some("c1"));
    assert_eq!(sim.connections(), 1, "keep-alive: one connection");
    let log = sim.requests();
    assert_eq!(log.iter().map(|r| r.status).collect::<Vec<_>>(), [503, 200]);
    assert_eq!(log[1].json.as_ref().unwrap()["cluster"]["uid"], "c1");
    let dump = sim.log_dump();
    assert!(
        !dump.contains(&token) && dump.contains("<redacted:"),
        "{dump}"
    );
    let (status, _) = post(&mut s, "/nope", &token, &json!({}));
    assert_eq!(status, 404);
}

#[test]
fn tls_connect_with_the_generated_ca() {
    let sim = Simulator::start(SimConfig::default());
    let token = sim.add_environment("env-tls");
    let mut roots = rustls::RootCertStore::empty();
    use rustls::pki_types::pem::PemObject;
    let ca = rustls::pki_types::CertificateDer::from_pem_slice(sim.ca_pem().as_bytes()).unwrap();
    roots.add(ca).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, TcpStream::connect(sim.addr()).unwrap());
    let (status, body) = post(&mut tls, "/api/v2/manager/connect", &token, &connect_body());
    assert_eq!(status, 200, "{body}");
    assert!(sim.url().starts_with("https://127.0.0.1:"));
}

#[test]
fn requests_are_logged_as_they_arrive_and_name_their_sender() {
    let sim = Simulator::start(SimConfig {
        tls: false,
        ..SimConfig::default()
    });
    let token = sim.add_environment("env-o");
    // An ack whose answer waits far longer than this test: logged
    // first, answered never (its thread ends with the test process).
    // Only acks are delayed, so the requests below cannot take the fault.
    sim.inject(Fault::new(
        Endpoint::Ack,
        FaultAction::Delay(Duration::from_secs(600)),
    ));
    let addr = sim.addr();
    std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        post(
            &mut s,
            "/api/v2/manager/commands/c1/ack",
            "unknown",
            &json!({}),
        )
    });
    sim.wait_until(Duration::from_secs(10), "the delayed ack", |s| {
        s.requests().len() == 1
    });
    let mut s = TcpStream::connect(sim.addr()).unwrap();
    let (status, body) = post(&mut s, "/api/v2/manager/connect", &token, &connect_body());
    assert_eq!(status, 200);
    let session = body["sessionToken"].as_str().unwrap().to_owned();
    let (status, _) = post(&mut s, "/api/v2/manager/heartbeat", &session, &json!({}));
    assert_eq!(status, 400, "attributed whatever the answer");
    let (status, _) = post(&mut s, "/api/v2/manager/heartbeat", "unknown", &json!({}));
    assert_eq!(status, 401);
    let log = sim.requests();
    let seen: Vec<(&str, bool, u16, Option<&str>)> = log
        .iter()
        .map(|r| {
            let path = r.path.rsplit('/').next().unwrap();
            (path, r.done, r.status, r.instance.as_deref())
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("ack", false, 0, None),
            ("connect", true, 200, Some("i")),
            ("heartbeat", true, 400, Some("i")),
            ("heartbeat", true, 401, None),
        ]
    );
    assert!(sim.log_dump().contains("/ack -> (pending)"));
}

#[test]
fn reset_closes_without_an_answer_and_is_logged() {
    let sim = Simulator::start(SimConfig {
        tls: false,
        ..SimConfig::default()
    });
    let token = sim.add_environment("env-r");
    sim.inject(Fault::new(Endpoint::Any, FaultAction::Reset));
    let mut s = TcpStream::connect(sim.addr()).unwrap();
    let body = connect_body().to_string();
    write!(s, "POST /api/v2/manager/connect HTTP/1.1\r\nAuthorization: Bearer {token}\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut buf = Vec::new();
    assert_eq!(s.read_to_end(&mut buf).unwrap_or(0), 0, "no answer");
    sim.wait_until(
        Duration::from_secs(5),
        "the reset request in the log",
        |s| s.requests().len() == 1,
    );
    let logged = &sim.requests()[0];
    assert_eq!((logged.status, logged.done), (0, true));
}
