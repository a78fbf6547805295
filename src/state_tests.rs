use super::*;

fn entry(id: usize, delivered: bool) -> LedgerEntry {
    LedgerEntry {
        command_id: format!("cmd-{id}"),
        result: AckResult::Applied,
        message: String::new(),
        resources: vec![],
        completed_at: "2026-12-02T00:00:00Z".into(),
        delivered,
        attempts: 1,
        more_resources: BTreeMap::new(),
    }
}

fn big(id: usize, delivered: bool) -> LedgerEntry {
    let r = |i: usize| AckResource {
        api_version: "nexo.io/v1alpha1".into(),
        kind: "NexoProxy".into(),
        namespace: "shop".into(),
        name: format!("proxy-with-a-long-name-{i:04}"),
        action: if i.is_multiple_of(3) {
            ResourceAction::Unchanged
        } else {
            ResourceAction::Configured
        },
    };
    LedgerEntry {
        message: "é".repeat(10_000),
        resources: (0..1000).map(r).collect(),
        ..entry(id, delivered)
    }
}

fn doc_size(s: &State) -> usize {
    let size = serde_json::to_vec(s).unwrap().len();
    assert_eq!(size, json_size(s));
    size
}

#[test]
fn an_entry_is_cut_to_its_budget() {
    let e = big(1, false).bounded(MESSAGE_MAX, RESOURCES_MAX);
    assert!(e.message.len() <= MESSAGE_MAX, "{}", e.message.len());
    assert!(e.message.ends_with('…'));
    assert_eq!(e.resources.len(), RESOURCES_MAX);
    assert_eq!(
        e.more_resources[&ResourceAction::Configured]
            + e.more_resources[&ResourceAction::Unchanged],
        936
    );
    let ack = crate::acks::ack(&e, "m", 1);
    assert!(
        ack.message
            .ends_with("(936 more resources not listed: 624 configured, 312 unchanged)"),
        "{}",
        &ack.message[ack.message.len() - 80..]
    );
    let mut short = "ab".to_owned();
    cut(&mut short, 5);
    assert_eq!(short, "ab");
}

#[test]
fn the_document_stays_under_budget_whatever_the_commands() {
    // Rollouts of 1000 proxies with long messages: at their cut size,
    // the 256 entries the ledger keeps would be far over the budget.
    assert!(
        big(0, true).bounded(MESSAGE_MAX, RESOURCES_MAX).size() * LEDGER_MIN > 2 * STATE_BUDGET
    );
    // The rule, on a budget of a tenth (the same code, ten times quicker).
    const BUDGET: usize = STATE_BUDGET / 10;
    let mut s = State::default();
    for i in 0..150 {
        s.record_within(big(i, true), BUDGET);
    }
    assert!(doc_size(&s) <= BUDGET, "{}", doc_size(&s));
    assert!(doc_size(&s) > BUDGET * 9 / 10, "{}", doc_size(&s));
    assert!(s.find("cmd-149").is_some(), "the newest entry stays");
    assert!(s.find("cmd-0").is_none(), "the oldest delivered left first");
    assert_eq!(s.find("cmd-149").unwrap().resources.len(), RESOURCES_MAX);
    // Undelivered acks are never dropped: past the budget they keep
    // their counts and a short message.
    let mut s = State::default();
    for i in 0..40 {
        s.record_within(big(i, false), BUDGET);
    }
    assert!(doc_size(&s) <= BUDGET, "{}", doc_size(&s));
    assert_eq!(s.ledger.len(), 40);
    let oldest = s.find("cmd-0").unwrap();
    assert!(oldest.resources.is_empty() && oldest.message.len() <= 128);
    assert_eq!(oldest.more_resources.values().sum::<u64>(), 1000);
    assert_eq!(s.find("cmd-39").unwrap().resources.len(), RESOURCES_MAX);
}

#[test]
fn ledger_keeps_the_last_256_and_every_undelivered_ack() {
    let mut s = State::default();
    s.record(entry(0, false));
    for i in 1..400 {
        s.record(entry(i, true));
    }
    assert_eq!(s.ledger.len(), LEDGER_MIN);
    assert!(
        s.find("cmd-0").is_some(),
        "an undelivered ack is never dropped"
    );
    assert!(s.find("cmd-399").is_some());
    assert!(s.find("cmd-1").is_none());
    // Re-recording an id replaces it.
    s.record(entry(0, true));
    assert!(s.find("cmd-0").unwrap().delivered);
    assert_eq!(
        s.ledger.iter().filter(|e| e.command_id == "cmd-0").count(),
        1
    );
}

#[test]
fn state_document_format() {
    let s = State {
        version: 1,
        binding: Some(Binding {
            environment_id: "env-a".into(),
            manager_id: "m".into(),
            cluster_uid: "u".into(),
        }),
        ledger: vec![entry(1, false)],
    };
    let v = serde_json::to_value(&s).unwrap();
    assert_eq!(v["binding"]["clusterUid"], "u");
    assert_eq!(v["ledger"][0]["commandId"], "cmd-1");
    assert_eq!(serde_json::from_value::<State>(v).unwrap(), s);
    assert_eq!(serde_json::from_str::<State>("{}").unwrap().version, 1);
}
