use super::*;

const SEC: Duration = Duration::from_secs(1);

fn status(role: Role) -> Health {
    Health {
        role,
        interval: 15 * SEC,
        check_time: 30 * SEC,
        ..Health::default()
    }
}

#[test]
fn routes() {
    let now = Instant::now();
    let mut m = status(Role::Leader);
    assert_eq!(route("/healthz", &m, now).0, 200);
    assert_eq!(route("/readyz", &m, now).0, 503);
    m.bound = true;
    m.heartbeat(true, now);
    assert_eq!(route("/readyz", &m, now).0, 200);
    assert_eq!(route("/nope", &m, now).0, 404);
}

#[test]
fn a_starting_pod_is_not_ready() {
    let m = status(Role::Starting);
    let (code, _, body) = route("/readyz", &m, Instant::now());
    assert_eq!(code, 503);
    assert!(body.contains("starting"), "{body}");
}

#[test]
fn a_leader_stays_ready_through_failures_shorter_than_three_intervals() {
    let t0 = Instant::now();
    let mut m = status(Role::Leader);
    m.bound = true;
    assert_eq!(
        m.readiness(t0),
        Err("leader: no heartbeat has succeeded yet")
    );
    m.heartbeat(true, t0);
    assert_eq!(m.readiness(t0), Ok(()));
    m.heartbeat(false, t0 + SEC);
    m.heartbeat(false, t0 + 20 * SEC);
    assert_eq!(
        m.heartbeat_failing_since,
        Some(t0 + SEC),
        "the first failure counts"
    );
    assert_eq!(m.readiness(t0 + 45 * SEC), Ok(()));
    assert_eq!(
        m.readiness(t0 + 46 * SEC),
        Err("leader: heartbeats have been failing for 3 intervals")
    );
    m.heartbeat(true, t0 + 50 * SEC);
    assert_eq!(m.readiness(t0 + 50 * SEC), Ok(()));
    m.bound = false;
    assert!(m.readiness(t0 + 50 * SEC).is_err());
}

#[test]
fn a_standby_is_ready_while_its_checks_are_fresh() {
    let t0 = Instant::now();
    let mut m = status(Role::Standby);
    assert!(m.readiness(t0).unwrap_err().contains("not succeeded yet"));
    m.standby_ok_at = Some(t0);
    assert_eq!(m.readiness(t0 + 45 * SEC), Ok(()));
    assert!(
        m.readiness(t0 + 46 * SEC)
            .unwrap_err()
            .contains("within the last interval")
    );
    // Not bound, no heartbeat: a standby does not need either.
    assert!(!m.bound && m.heartbeats_ok == 0);
}

#[test]
fn metrics_text() {
    let mut m = Health {
        heartbeats_ok: 3,
        managed_proxies: 2,
        ..Health::default()
    };
    m.command("deploy", AckResult::Applied);
    m.command("deploy", AckResult::Applied);
    m.command("rollout", AckResult::Failed);
    let text = m.render();
    assert!(
        text.contains("nexo_manager_heartbeats_total{outcome=\"ok\"} 3\n"),
        "{text}"
    );
    assert!(text.contains("nexo_manager_commands_total{class=\"deploy\",result=\"applied\"} 2\n"));
    assert!(text.contains("nexo_manager_commands_total{class=\"rollout\",result=\"failed\"} 1\n"));
    assert!(text.contains("nexo_manager_managed_proxies 2\n"));
    assert!(text.contains("# TYPE nexo_manager_pending_acks gauge\n"));
}

fn read_reply(mut stream: TcpStream) -> String {
    stream.set_read_timeout(Some(2 * SEC)).unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply
}

/// Serves wake-ups until `stream` has its answer (at most 20), checking
/// that no wake-up takes longer than the budget (plus scheduling slack).
fn serve_until_answered(probe: &Probe, ok: TcpStream) -> (String, usize) {
    ok.set_nonblocking(true).unwrap();
    for wake in 1..=20 {
        let start = Instant::now();
        probe.serve(&Health::default(), Instant::now());
        let took = start.elapsed();
        assert!(
            took < SERVE_BUDGET + Duration::from_millis(100),
            "wake-up {wake} took {took:?}"
        );
        let mut peek = [0u8; 1];
        if ok.peek(&mut peek).is_ok_and(|n| n > 0) {
            ok.set_nonblocking(false).unwrap();
            return (read_reply(ok), wake);
        }
    }
    panic!("the probe request was not answered in 20 wake-ups");
}

#[test]
fn sixty_four_silent_clients_cost_nothing_and_do_not_delay_a_probe() {
    let probe = Probe::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = probe.local_addr().unwrap();
    let _silent: Vec<TcpStream> = (0..64).map(|_| TcpStream::connect(addr).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(50));
    let start = Instant::now();
    probe.serve(&Health::default(), Instant::now());
    assert!(
        start.elapsed() < Duration::from_millis(50),
        "silent clients cost no time: {:?}",
        start.elapsed()
    );
    assert_eq!(probe.pending(), 64, "they wait, without blocking the loop");
    let mut ok = TcpStream::connect(addr).unwrap();
    ok.write_all(b"GET /healthz HTTP/1.1\r\n\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let (reply, wake) = serve_until_answered(&probe, ok);
    assert!(
        reply.starts_with("HTTP/1.1 200 OK") && reply.ends_with("ok\n"),
        "{reply}"
    );
    assert_eq!(wake, 1, "answered at the first wake-up");
}

#[test]
fn the_oldest_pending_client_makes_room_for_a_new_one() {
    let probe = Probe::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = probe.local_addr().unwrap();
    let mut silent = Vec::new();
    for _ in 0..MAX_PENDING + 5 {
        silent.push(TcpStream::connect(addr).unwrap());
        if silent.len() % MAX_PER_WAKE == 0 {
            probe.serve(&Health::default(), Instant::now());
        }
    }
    std::thread::sleep(Duration::from_millis(20));
    probe.serve(&Health::default(), Instant::now());
    assert_eq!(probe.pending(), MAX_PENDING, "never more than the cap");
    let mut ok = TcpStream::connect(addr).unwrap();
    ok.write_all(b"GET /healthz HTTP/1.1\r\n\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let (reply, _) = serve_until_answered(&probe, ok);
    assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
    // The first one was closed to make room.
    let mut first = silent.remove(0);
    first.set_read_timeout(Some(SEC)).unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(first.read(&mut buf).unwrap_or(0), 0, "closed");
}

#[test]
fn a_client_dribbling_bytes_costs_nothing_and_is_closed_after_the_timeout() {
    let probe = Probe::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = probe.local_addr().unwrap();
    let mut dribbler = TcpStream::connect(addr).unwrap();
    let started = Instant::now();
    while started.elapsed() < PENDING_TIMEOUT + Duration::from_millis(200) {
        // One byte now and then, never a whole request head.
        let _ = dribbler.write_all(b"G");
        std::thread::sleep(Duration::from_millis(20));
        let start = Instant::now();
        probe.serve(&Health::default(), Instant::now());
        assert!(
            start.elapsed() < Duration::from_millis(50),
            "a wake-up took {:?}",
            start.elapsed()
        );
    }
    assert_eq!(probe.pending(), 0, "closed after {PENDING_TIMEOUT:?}");
}
