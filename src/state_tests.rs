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
        keep_until: None,
        class: String::new(),
        plan: None,
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
        s.record_within(big(i, true), BUDGET, std::time::SystemTime::now());
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
        s.record_within(big(i, false), BUDGET, std::time::SystemTime::now());
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
        signatures_required: false,
        integrity_key: Some(crate::secret::Secret::new("a2V5")),
        self_upgrade: None,
    };
    let v = serde_json::to_value(&s).unwrap();
    assert_eq!(v["binding"]["clusterUid"], "u");
    assert_eq!(v["integrityKey"], "a2V5", "stored as the plain string");
    assert!(!format!("{s:?}").contains("a2V5"), "never in Debug");
    assert_eq!(v["ledger"][0]["commandId"], "cmd-1");
    assert_eq!(serde_json::from_value::<State>(v).unwrap(), s);
    assert_eq!(serde_json::from_str::<State>("{}").unwrap().version, 1);
}

#[test]
fn verified_signed_entries_stay_until_their_not_after_whatever_the_count() {
    let now = std::time::SystemTime::now();
    let later = humantime::format_rfc3339(now + std::time::Duration::from_secs(600)).to_string();
    let past = humantime::format_rfc3339(now - std::time::Duration::from_secs(1)).to_string();
    let mut s = State::default();
    let mut signed = entry(0, true);
    signed.command_id = "signed-uninstall".into();
    signed.keep_until = Some(later);
    s.record_within(signed, STATE_BUDGET, now);
    let mut expired = entry(0, true);
    expired.command_id = "signed-long-ago".into();
    expired.keep_until = Some(past);
    s.record_within(expired, STATE_BUDGET, now);
    // A flood of junk, far past the count.
    for i in 1..=(LEDGER_MIN * 3) {
        s.record_within(entry(i, true), STATE_BUDGET, now);
    }
    assert!(
        s.find("signed-uninstall").is_some(),
        "the pinned entry stays"
    );
    assert!(
        s.find("signed-long-ago").is_none(),
        "an entry past its keep-until goes as any other"
    );
    // And under a byte budget too small for everything.
    for i in 1..=LEDGER_MIN {
        s.record_within(big(i + 10_000, true), 64 * 1024, now);
    }
    assert!(
        s.find("signed-uninstall").is_some(),
        "the pinned entry stays past the budget"
    );
    // Once its time is over, it leaves like any other.
    let after = now + std::time::Duration::from_secs(601);
    for i in 1..=(LEDGER_MIN * 2) {
        s.record_within(entry(i + 20_000, true), STATE_BUDGET, after);
    }
    assert!(s.find("signed-uninstall").is_none());
}

#[test]
fn the_signature_ratchet_is_in_the_document() {
    let mut s = State::default();
    assert!(
        !serde_json::to_string(&s)
            .unwrap()
            .contains("signaturesRequired")
    );
    s.signatures_required = true;
    let text = serde_json::to_string(&s).unwrap();
    assert!(text.contains("\"signaturesRequired\":true"), "{text}");
    let back: State = serde_json::from_str(&text).unwrap();
    assert!(back.signatures_required);
}

#[test]
fn a_delivered_entry_keeps_id_class_result_and_message_not_resources() {
    let mut s = State::default();
    let mut e = entry(1, false);
    e.class = "deploy".into();
    e.message = "applied 2 objects".into();
    e.resources = vec![AckResource {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        namespace: "shop".into(),
        name: "c".into(),
        action: ResourceAction::Created,
    }];
    e.more_resources.insert(ResourceAction::Created, 3);
    s.record(e);
    assert_eq!(
        s.find("cmd-1").unwrap().resources.len(),
        1,
        "kept until delivered"
    );
    s.mark_delivered(&["cmd-1".into()]);
    let kept = s.find("cmd-1").unwrap();
    assert!(kept.delivered);
    assert_eq!(
        (kept.class.as_str(), kept.result, kept.message.as_str()),
        ("deploy", AckResult::Applied, "applied 2 objects")
    );
    assert!(kept.resources.is_empty() && kept.more_resources.is_empty());
    // 256 delivered rollouts of 64 resources each, with messages of a
    // hundred bytes, fit in 64 KiB (they took 896 KiB with resources).
    let mut s = State::default();
    for i in 0..LEDGER_MIN {
        let mut e = big(i, false);
        e.class = "rollout".into();
        e.message = "m".repeat(100);
        s.record(e);
        s.mark_delivered(&[format!("cmd-{i}")]);
    }
    let size = serde_json::to_vec(&s).unwrap().len();
    assert!(size < 64 * 1024, "{size} bytes");
}

fn plan_of(objects: usize, fields: usize) -> Plan {
    use crate::cp::wire::PlannedObject;
    Plan {
        would_succeed: true,
        message: "applied".into(),
        objects: (0..objects)
            .map(|i| PlannedObject {
                kind: "ConfigMap".into(),
                namespace: "shop".into(),
                name: format!("config-{i}"),
                action: ResourceAction::Configured,
                fields: (0..fields)
                    .map(|f| format!("/data/a-rather-long-key-name-for-field-{f:04}"))
                    .collect(),
                more_fields: 0,
                message: None,
            })
            .collect(),
        more_objects: 0,
    }
}

#[test]
fn a_ledger_entry_keeps_a_plan_within_its_bound_counting_what_it_leaves_out() {
    let mut e = entry(1, false);
    e.plan = Some(plan_of(64, 64));
    assert!(json_size(e.plan.as_ref().unwrap()) > PLAN_MAX);
    let e = e.bounded(MESSAGE_MAX, RESOURCES_MAX);
    let plan = e.plan.unwrap();
    assert!(json_size(&plan) <= PLAN_MAX, "{}", json_size(&plan));
    assert_eq!(
        plan.objects.len(),
        64,
        "objects stay, their fields are counted"
    );
    let listed: usize = plan.objects.iter().map(|o| o.fields.len()).sum();
    let counted: usize = plan.objects.iter().map(|o| o.more_fields).sum();
    assert_eq!(listed + counted, 64 * 64);
    assert!(counted > 0 && listed > 0);
    // The first objects keep their fields: the last are counted first.
    assert_eq!(plan.objects[0].fields.len(), 64);
    assert_eq!(plan.objects[63].more_fields, 64);
}

#[test]
fn a_squeezed_entry_counts_a_plans_objects_and_a_delivered_one_drops_it() {
    let mut e = entry(1, false);
    e.plan = Some(plan_of(3, 2));
    let squeezed = e.clone().bounded(128, 0);
    let plan = squeezed.plan.unwrap();
    assert!(plan.objects.is_empty());
    assert_eq!(plan.more_objects, 3);
    assert!(plan.would_succeed);
    let mut state = State::default();
    state.record(e);
    assert!(state.find("cmd-1").unwrap().plan.is_some());
    state.mark_delivered(&["cmd-1".to_owned()]);
    assert_eq!(state.find("cmd-1").unwrap().plan, None);
}
