//! The index's sets and events, as plain values.
use super::*;
use crate::inventory::set::Watch;
use crate::kube::watch::HEALTHY;

/// Applies one event to `s` as its open watch would, keeping the version
/// it moves to in the set.
fn apply(s: &mut Set, line: &[u8], trust: &Trust, shared: &mut Interner, now: Instant) -> Applied {
    let mut version = s.version().unwrap_or_default().to_owned();
    let applied = s.apply(line, trust, shared, now, &mut version);
    if !version.is_empty() {
        s.watch = Watch::Closed {
            version,
            retry_at: None,
        };
    }
    applied
}

/// An index of the one set `s`, started, env-1's.
fn index_of(s: Set) -> Index {
    Index {
        trust: trust(false),
        selector: String::new(),
        sets: vec![s],
        shared: Interner::default(),
        started: true,
        commands: BTreeMap::new(),
        rollbacks: Vec::new(),
        generation: 0,
        sorted: std::rc::Rc::default(),
    }
}

fn set() -> (Set, Interner) {
    (Set::new(Watched::Proxies, "shop"), Interner::default())
}

fn key() -> crate::integrity::Key {
    crate::integrity::Key::from_stored("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=").unwrap()
}

fn trust(adopt_unproven: bool) -> Trust {
    Trust {
        environment_id: "env-1".into(),
        key: Some(key()),
        adopt_unproven,
    }
}

/// A NexoProxy labelled as `owner`'s, with the proof of env-1's key.
fn proxy(name: &str, owner: &str, rv: &str) -> String {
    let proof = crate::ownership::Verifier {
        environment_id: owner,
        key: &key(),
        adopt_unproven: false,
    }
    .proof("NexoProxy", "shop", name, &format!("uid-{name}"), name);
    unproven(name, owner, rv).replace(
        r#""metadata": {"#,
        &format!(r#""metadata": {{"annotations": {{"nexo.io/proof": "{proof}"}}, "#),
    )
}

/// The same NexoProxy without a proof.
fn unproven(name: &str, owner: &str, rv: &str) -> String {
    format!(
        r#"{{"metadata": {{"name": "{name}", "namespace": "shop", "uid": "uid-{name}", "resourceVersion": "{rv}", "labels": {{"app.kubernetes.io/managed-by": "nexo-manager", "nexo.io/owner-id": "{owner}", "nexo.io/deployment": "{name}"}}}}, "spec": {{"image": "proxy:1", "replicas": 2}}}}"#
    )
}

#[test]
fn an_object_labelled_without_the_proof_is_reported_not_listed() {
    let (mut s, mut shared) = set();
    let now = Instant::now();
    for (name, object) in [
        ("a", proxy("a", "env-1", "1")),
        ("b", unproven("b", "env-1", "2")),
        // The proof of another object, copied.
        (
            "c",
            proxy("a", "env-1", "3")
                .replace("uid-a", "uid-c")
                .replace("\"a\"", "\"c\""),
        ),
    ] {
        let event = format!(r#"{{"type": "ADDED", "object": {object}}}"#);
        assert_eq!(
            apply(&mut s, event.as_bytes(), &trust(false), &mut shared, now),
            Applied::Taken,
            "{name}"
        );
    }
    assert_eq!(
        s.entries.iter().map(|s| &*s.owned.name).collect::<Vec<_>>(),
        ["a"]
    );
    let error = s.unproven_error(&trust(false)).unwrap();
    assert!(error.contains("nexoproxies in shop: 2 with this environment's labels but no valid proof (not this Manager's, not listed): b, c"), "{error}");
    // Through the gate they are listed, and still reported.
    let (mut g, mut shared) = set();
    let event = format!(
        r#"{{"type": "ADDED", "object": {}}}"#,
        unproven("b", "env-1", "2")
    );
    apply(&mut g, event.as_bytes(), &trust(true), &mut shared, now);
    assert!(g.entries.get("b").is_some());
    assert!(
        g.unproven_error(&trust(true))
            .unwrap()
            .contains("listed through NEXO_ADOPT_UNPROVEN")
    );
    // Without the key nothing is proven.
    let keyless = Trust {
        key: None,
        ..trust(false)
    };
    let (mut k, mut shared) = set();
    let event = format!(
        r#"{{"type": "ADDED", "object": {}}}"#,
        proxy("a", "env-1", "1")
    );
    apply(&mut k, event.as_bytes(), &keyless, &mut shared, now);
    assert!(k.entries.is_empty());
    // Gone: no longer reported.
    let deleted = format!(
        r#"{{"type": "DELETED", "object": {}}}"#,
        unproven("b", "env-1", "4")
    );
    apply(&mut s, deleted.as_bytes(), &trust(false), &mut shared, now);
    assert!(
        s.unproven_error(&trust(false))
            .unwrap()
            .contains(": 1 with")
    );
}

#[test]
fn events_add_change_and_remove_entries_and_move_the_version() {
    let (mut s, mut shared) = set();
    let added = format!(
        r#"{{"type": "ADDED", "object": {}}}"#,
        proxy("a", "env-1", "10")
    );
    assert_eq!(
        apply(
            &mut s,
            added.as_bytes(),
            &trust(false),
            &mut shared,
            Instant::now()
        ),
        Applied::Taken
    );
    assert_eq!(s.entries.get("a").unwrap().owned.observed.replicas, 2);
    assert_eq!(s.version(), Some("10"));
    let foreign = format!(
        r#"{{"type": "MODIFIED", "object": {}}}"#,
        proxy("a", "env-2", "11")
    );
    assert_eq!(
        apply(
            &mut s,
            foreign.as_bytes(),
            &trust(false),
            &mut shared,
            Instant::now()
        ),
        Applied::Taken
    );
    assert!(
        s.entries.is_empty(),
        "an object no longer owned leaves the inventory"
    );
    let again = format!(
        r#"{{"type": "ADDED", "object": {}}}"#,
        proxy("b", "env-1", "12")
    );
    apply(
        &mut s,
        again.as_bytes(),
        &trust(false),
        &mut shared,
        Instant::now(),
    );
    let deleted = format!(
        r#"{{"type": "DELETED", "object": {}}}"#,
        proxy("b", "env-1", "13")
    );
    apply(
        &mut s,
        deleted.as_bytes(),
        &trust(false),
        &mut shared,
        Instant::now(),
    );
    assert!(s.entries.is_empty());
    let bookmark = r#"{"type": "BOOKMARK", "object": {"kind": "NexoProxy", "metadata": {"resourceVersion": "99"}}}"#;
    assert_eq!(
        apply(
            &mut s,
            bookmark.as_bytes(),
            &trust(false),
            &mut shared,
            Instant::now()
        ),
        Applied::Taken
    );
    assert_eq!(s.version(), Some("99"));
}

#[test]
fn a_410_lists_again_and_other_errors_reopen() {
    let (mut s, mut shared) = set();
    let gone = r#"{"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old resource version"}}"#;
    assert_eq!(
        apply(
            &mut s,
            gone.as_bytes(),
            &trust(false),
            &mut shared,
            Instant::now()
        ),
        Applied::Expired
    );
    let other =
        r#"{"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "boom"}}"#;
    assert!(
        matches!(apply(&mut s, other.as_bytes(), &trust(false), &mut shared, Instant::now()), Applied::Broken(m) if m.to_string().contains("500"))
    );
    assert!(matches!(
        apply(
            &mut s,
            b"{not json",
            &trust(false),
            &mut shared,
            Instant::now()
        ),
        Applied::Broken(_)
    ));
    assert!(matches!(
        apply(
            &mut s,
            br#"{"type": "SURPRISE", "object": {}}"#,
            &trust(false),
            &mut shared,
            Instant::now()
        ),
        Applied::Broken(_)
    ));
}

#[test]
fn a_failed_watch_is_due_after_its_backoff_and_reported_stale() {
    let (mut s, _) = set();
    let now = Instant::now();
    assert_eq!(s.due(now), Some(now), "never opened: due now");
    s.failed(WatchError::Broke(std::io::Error::other("reset")), None, now);
    assert!(s.due(now).is_some_and(|at| at > now));
    let mut index = index_of(s);
    let (_, errors) = index.report(now, "T", Duration::from_secs(600), &mut Vec::new());
    assert_eq!(errors.len(), 1);
    assert!(errors[0].contains("nexoproxies in shop") && errors[0].contains("stale"));
}

#[test]
fn a_watch_that_ends_at_once_waits_its_backoff_and_a_healthy_one_does_not() {
    let (mut s, _) = set();
    let t0 = Instant::now();
    let mut at = t0;
    let mut delays = Vec::new();
    for _ in 0..8 {
        let opened_at = at;
        at += Duration::from_millis(10);
        s.ended(Some("1".into()), opened_at, at);
        let retry = s.retry_at().expect("not at once");
        delays.push(retry - at);
        at = retry;
    }
    // From 1 s doubling to 30 s, each at least half its ceiling.
    let ceilings = [1, 2, 4, 8, 16, 30, 30, 30];
    for (d, c) in delays.iter().zip(ceilings) {
        let c = Duration::from_secs(c);
        assert!(*d >= c / 2 && *d <= c, "{d:?} for a ceiling of {c:?}");
    }
    // In the first minute at most 10 opens, whatever the jitter.
    let mut sum = Duration::ZERO;
    let opens = delays
        .iter()
        .take_while(|d| {
            sum += **d;
            sum <= Duration::from_secs(60)
        })
        .count();
    assert!(opens <= 10, "{opens} opens in a minute: {delays:?}");
    // Open for a healthy minute: opened again at once, the backoff anew.
    s.ended(Some("1".into()), at, at + HEALTHY);
    assert_eq!(s.retry_at(), None);
    s.ended(
        Some("1".into()),
        at + HEALTHY,
        at + HEALTHY + Duration::from_millis(10),
    );
    let d = s.retry_at().unwrap() - (at + HEALTHY + Duration::from_millis(10));
    assert!(
        d <= Duration::from_secs(1),
        "the backoff starts again: {d:?}"
    );
}

/// Events compared as the tests see them: a broken one by its cause.
impl PartialEq for Applied {
    fn eq(&self, other: &Applied) -> bool {
        match (self, other) {
            (Applied::Taken, Applied::Taken) | (Applied::Expired, Applied::Expired) => true,
            (Applied::Broken(a), Applied::Broken(b)) => a.to_string() == b.to_string(),
            _ => false,
        }
    }
}

impl Set {
    /// When the watch is opened again, if it waits for a time.
    fn retry_at(&self) -> Option<Instant> {
        match &self.watch {
            Watch::Open { .. } => None,
            Watch::List { retry_at } | Watch::Closed { retry_at, .. } => *retry_at,
        }
    }

    /// The version to watch from, if any.
    fn version(&self) -> Option<&str> {
        match &self.watch {
            Watch::List { .. } => None,
            Watch::Closed { version, .. } | Watch::Open { version, .. } => Some(version),
        }
    }
}

#[test]
fn the_generation_moves_with_an_added_changed_or_removed_entry_and_not_at_rest() {
    let mut index = index_of(set().0);
    let now = Instant::now();
    let deadline = Duration::from_secs(600);
    let report = |index: &mut Index| {
        index.report(now, "T", deadline, &mut Vec::new());
        (index.generation(), index.hashes())
    };
    let event = |index: &mut Index, kind: &str, object: String| {
        let line = format!(r#"{{"type": "{kind}", "object": {object}}}"#);
        let set = &mut index.sets[0];
        apply(set, line.as_bytes(), &trust(false), &mut index.shared, now);
    };
    let (g0, _) = report(&mut index);
    event(&mut index, "ADDED", proxy("a", "env-1", "10"));
    event(&mut index, "ADDED", proxy("b", "env-1", "11"));
    let (g1, h1) = report(&mut index);
    assert_ne!(g1, g0, "two entries added");
    assert_eq!(h1.len(), 2);
    assert_eq!(report(&mut index).0, g1, "at rest");
    // Changed: replicas 2 → 3.
    event(
        &mut index,
        "MODIFIED",
        proxy("a", "env-1", "12").replace(r#""replicas": 2"#, r#""replicas": 3"#),
    );
    let (g2, h2) = report(&mut index);
    assert_ne!(g2, g1, "an entry changed");
    let a = |h: &[(std::rc::Rc<super::super::Owned>, u64)]| {
        h.iter().find(|(k, _)| &*k.name == "a").map(|(_, v)| *v)
    };
    assert_ne!(a(&h2), a(&h1), "its hash with it");
    // Removed, with nothing added: fewer entries.
    event(&mut index, "DELETED", proxy("b", "env-1", "13"));
    let (g3, h3) = report(&mut index);
    assert_ne!(g3, g2, "an entry removed");
    assert_eq!(h3.len(), 1);
    assert_eq!(report(&mut index).0, g3, "at rest again");
}
