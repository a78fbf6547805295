//! The upgrade's plan: the Manager's container, the patch, the
//! field-ownership hand-back.

use super::*;

#[test]
fn upgrade_picks_the_manager_container() {
    let dep = |cs: Value| json!({"spec": {"template": {"spec": {"containers": cs}}}});
    assert_eq!(
        upgrade_container(&dep(json!([{"name": "x", "image": "i"}])))
            .unwrap()
            .0,
        "x"
    );
    assert_eq!(
        upgrade_container(&dep(json!([{"name": "x"}, {"name": "manager"}])))
            .unwrap()
            .0,
        "manager"
    );
    let two = dep(json!([{"name": "x"}, {"name": "y"}]));
    assert_eq!(
        upgrade_container(&two),
        Err(NoManagerContainer { containers: 2 })
    );
    let (one, other) = (
        format!("m@sha256:{}", "1".repeat(64)),
        format!("m@sha256:{}", "2".repeat(64)),
    );
    let image = |s: &str| ImageRef::parse(s).unwrap();
    let policy = Policy::default();
    let running = dep(json!([{"name": "manager", "image": one}]));
    assert_eq!(
        upgrade(&running, &image(&one), "0.5.0", &policy),
        Ok(UpgradePlan::Unchanged)
    );
    let Ok(UpgradePlan::Patch(patch)) = upgrade(&running, &image(&other), "0.5.0", &policy) else {
        panic!("a new image is a patch");
    };
    assert_eq!(
        patch["spec"]["template"]["spec"]["containers"][0],
        json!({"name": "manager", "image": other,
               "env": [{"name": "NEXO_BUNDLE_VERSION", "value": "0.5.0"}]})
    );
    assert_eq!(
        patch["metadata"]["annotations"]["nexo.io/upgraded-bundle"],
        "0.5.0"
    );
    assert!(upgrade(&two, &image(&other), "0.5.0", &policy).is_err());
    let elsewhere = format!("evil.example.com/m@sha256:{}", "2".repeat(64));
    let refused = upgrade(&running, &image(&elsewhere), "0.5.0", &policy)
        .unwrap_err()
        .to_string();
    assert!(refused.starts_with("policy: managerImage"), "{refused}");
}

#[test]
fn a_self_upgrade_hands_its_fields_back_and_keeps_everyone_elses() {
    let helm = json!({"manager": "helm", "operation": "Apply", "fieldsV1": {"f:spec": {}}});
    let kcm = json!({"manager": "kube-controller-manager", "operation": "Update", "subresource": "status"});
    let mine =
        json!({"manager": "nexo-manager", "operation": "Update", "fieldsV1": {"f:spec": {}}});
    let mine_applied = json!({"manager": "nexo-manager", "operation": "Apply"});
    let dep = json!({"metadata": {"resourceVersion": "42",
        "managedFields": [mine.clone(), helm, kcm, mine, mine_applied]}});
    let test = |i: usize, field: &str, value: &str| json!({"op": "test", "path": format!("/metadata/managedFields/{i}/{field}"), "value": value});
    let remove = |i: usize| json!({"op": "remove", "path": format!("/metadata/managedFields/{i}")});
    assert_eq!(
        hand_back(&dep, "nexo-manager"),
        Some(json!([
            test(3, "manager", "nexo-manager"),
            test(3, "operation", "Update"),
            remove(3),
            test(0, "manager", "nexo-manager"),
            test(0, "operation", "Update"),
            remove(0),
        ])),
        "the last first; its Apply entry (none is made) and everyone else's kept"
    );
    let none_of_mine =
        json!({"metadata": {"managedFields": [{"manager": "helm", "operation": "Apply"}]}});
    assert_eq!(hand_back(&none_of_mine, "nexo-manager"), None);
    assert_eq!(hand_back(&json!({"metadata": {}}), "nexo-manager"), None);
}

#[test]
fn an_upgrade_is_written_back_as_the_template_was() {
    let before = json!({"spec": {"template": {"spec": {"containers": [
        {"name": "manager", "image": "m@old",
         "env": [{"name": "RUST_LOG", "value": "info"}, {"name": "NEXO_BUNDLE_VERSION", "value": "0.4.0"}]},
        {"name": "sidecar", "image": "s"}]}}}});
    let up = Upgraded::of(&before, "m@new").unwrap();
    assert_eq!(
        up,
        Upgraded {
            from_image: "m@old".into(),
            from_bundle_env: Some("0.4.0".into()),
            to_image: "m@new".into(),
        }
    );
    assert_eq!(
        write_back(&before, &up, Some("0.4.0")).unwrap(),
        json!({"metadata": {"annotations": {UPGRADED_BUNDLE_ANNOTATION: "0.4.0"}},
               "spec": {"template": {"spec": {"containers": [{"name": "manager", "image": "m@old",
                 "env": [{"name": "NEXO_BUNDLE_VERSION", "value": "0.4.0"}]}]}}}})
    );
    // A template without the variable gets none back; an unknown own
    // version removes the annotation.
    let bare =
        json!({"spec": {"template": {"spec": {"containers": [{"name": "m", "image": "m@old"}]}}}});
    let up = Upgraded::of(&bare, "m@new").unwrap();
    assert_eq!(up.from_bundle_env, None);
    let patch = write_back(&bare, &up, None).unwrap();
    assert_eq!(
        patch["spec"]["template"]["spec"]["containers"][0]["env"],
        json!([{"name": "NEXO_BUNDLE_VERSION", "$patch": "delete"}])
    );
    assert_eq!(
        patch["metadata"]["annotations"][UPGRADED_BUNDLE_ANNOTATION],
        Value::Null
    );
    let two =
        json!({"spec": {"template": {"spec": {"containers": [{"name": "a"}, {"name": "b"}]}}}});
    assert_eq!(
        write_back(&two, &up, None),
        Err(NoManagerContainer { containers: 2 })
    );
}
