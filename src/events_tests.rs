use super::*;

fn regarding(uid: &str) -> Regarding {
    Regarding {
        kind: crate::resource::Kind::NexoProxy,
        namespace: "shop".into(),
        name: "orders".into(),
        uid: uid.into(),
    }
}

fn event(uid: &str, reason: Reason) -> Event {
    Event {
        regarding: regarding(uid),
        reason,
        action: "Deploy",
        note: "deploy cmd-1 applied: 2 created".into(),
    }
}

fn created(w: Option<Write>) -> Value {
    match w {
        Some(Write::Create { body, .. }) => body,
        other => panic!("expected a creation, got {other:?}"),
    }
}

#[test]
fn an_event_is_created_with_its_controller_reason_type_and_regarding() {
    let mut r = Recorder::new("nexo-manager-abc");
    let t = Instant::now();
    r.record(event("u1", Reason::Refused), t, SystemTime::now())
        .unwrap();
    let body = created(r.next(t));
    assert_eq!(body["reportingController"], "nexo.io/manager");
    assert_eq!(body["reportingInstance"], "nexo-manager-abc");
    assert_eq!(body["reason"], "Refused");
    assert_eq!(body["type"], "Warning");
    assert_eq!(body["action"], "Deploy");
    assert_eq!(body["regarding"]["uid"], "u1");
    assert_eq!(body["regarding"]["apiVersion"], "nexo.io/v1alpha1");
    assert!(body.get("series").is_none());
    assert!(
        body["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with("orders.")
    );
    assert_eq!(r.next(t), None);
}

#[test]
fn repeats_within_ten_minutes_are_one_series_and_coalesce_while_queued() {
    let mut r = Recorder::new("p");
    let t = Instant::now();
    let w = SystemTime::now();
    r.record(event("u1", Reason::Applied), t, w).unwrap();
    r.record(event("u1", Reason::Applied), t, w).unwrap();
    r.record(event("u1", Reason::Applied), t, w).unwrap();
    assert_eq!(r.queued(), 1, "repeats go with the queued creation");
    let body = created(r.next(t));
    assert_eq!(body["series"]["count"], 3);
    let name = body["metadata"]["name"].as_str().unwrap().to_owned();
    // Written: the next repeat is a count update of the same Event.
    r.record(event("u1", Reason::Applied), t + Duration::from_secs(60), w)
        .unwrap();
    match r.next(t + Duration::from_secs(60)) {
        Some(Write::Count {
            name: n, body: b, ..
        }) => {
            assert_eq!(n, name);
            assert_eq!(b["series"]["count"], 4);
        }
        other => panic!("expected a count, got {other:?}"),
    }
    // Another reason about the same object is another Event.
    r.record(event("u1", Reason::Failed), t, w).unwrap();
    assert_eq!(created(r.next(t))["reason"], "Failed");
    // Past the window from the last repeat: a new Event.
    let later = t + Duration::from_secs(60) + SERIES_WINDOW;
    r.record(event("u1", Reason::Applied), later, w).unwrap();
    let body = created(r.next(later));
    assert_ne!(body["metadata"]["name"], name.as_str());
    assert!(body.get("series").is_none());
}

#[test]
fn at_most_thirty_writes_a_minute_the_rest_wait_and_a_full_queue_drops() {
    let mut r = Recorder::new("p");
    let t = Instant::now();
    let w = SystemTime::now();
    for i in 0..QUEUE {
        r.record(event(&format!("u{i}"), Reason::Applied), t, w)
            .unwrap();
    }
    assert_eq!(
        r.record(event("one-more", Reason::Applied), t, w),
        Err(Dropped::QueueFull)
    );
    let mut sent = 0;
    while r.next(t).is_some() {
        sent += 1;
    }
    assert_eq!(sent, PER_MINUTE);
    assert_eq!(r.queued(), QUEUE - PER_MINUTE);
    assert!(r.next(t + Duration::from_secs(59)).is_none());
    assert!(r.next(t + Duration::from_secs(60)).is_some());
}

#[test]
fn a_failed_creation_forgets_the_series_and_the_next_repeat_creates_again() {
    let mut r = Recorder::new("p");
    let t = Instant::now();
    let w = SystemTime::now();
    r.record(event("u1", Reason::Applied), t, w).unwrap();
    created(r.next(t));
    r.failed();
    r.record(event("u1", Reason::Applied), t, w).unwrap();
    assert!(created(r.next(t)).get("series").is_none());
}

#[test]
fn the_note_is_clipped_to_the_api_servers_limit_at_a_character() {
    let mut r = Recorder::new("p");
    let t = Instant::now();
    let mut e = event("u1", Reason::Failed);
    e.note = "é".repeat(1000);
    r.record(e, t, SystemTime::now()).unwrap();
    let body = created(r.next(t));
    let note = body["note"].as_str().unwrap();
    assert!(note.len() <= 1024 && note.len() >= 1022, "{}", note.len());
}

#[test]
fn every_drop_cause_is_a_known_label_of_the_dropped_counter() {
    let causes: Vec<&str> = [Dropped::QueueFull, Dropped::Denied, Dropped::Error]
        .iter()
        .map(|d| d.as_str())
        .collect();
    assert_eq!(causes, crate::metrics::EVENT_DROP_CAUSES);
}
