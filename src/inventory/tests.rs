//! The inventory's shaping, as plain values.

use std::rc::Rc;

use serde_json::{Value, json};

use super::*;
use crate::cp::wire::DeploymentEntry;
use crate::ownership::Ownership;

#[test]
fn entries_from_objects() {
    let p: ProxyItem = serde_json::from_value(json!({"metadata": {"name": "orders", "namespace": "shop",
        "managedFields": [{"manager": "x"}]}, "spec": {"replicas": 3, "image": "p:1", "port": 27017}}))
    .unwrap();
    assert_eq!(
        proxy_entry(p, &mut Interner::default()).unwrap().entry(),
        DeploymentEntry {
            namespace: "shop".into(),
            name: "orders".into(),
            kind: crate::cp::wire::EntryKind::NexoProxy,
            replicas: 3,
            image: Some("p:1".into()),
            status: None,
        }
    );
    let d: DeploymentItem = serde_json::from_value(
        json!({"metadata": {"name": "billing", "namespace": "shop"}, "spec": {
        "selector": {}, "template": {"spec": {"containers": [
        {"name": "sidecar", "image": "s:1"}, {"name": "proxy", "image": "p:0.9"}]}}}}),
    )
    .unwrap();
    let e = deployment_entry(d, &mut Interner::default())
        .unwrap()
        .entry();
    assert_eq!(
        (e.kind.as_str(), e.replicas, e.image.as_deref()),
        ("Deployment", 1, Some("p:0.9"))
    );
    let d: DeploymentItem = serde_json::from_value(json!({"metadata": {"name": "one", "namespace": "shop"},
        "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "main", "image": "m:1"}]}}}}))
    .unwrap();
    let e = deployment_entry(d, &mut Interner::default())
        .unwrap()
        .entry();
    assert_eq!((e.replicas, e.image.as_deref()), (2, Some("m:1")));
    let d: DeploymentItem =
        serde_json::from_value(json!({"metadata": {"name": "bare", "namespace": "shop"}})).unwrap();
    assert_eq!(
        deployment_entry(d, &mut Interner::default()).unwrap().image,
        None
    );
    let nameless: ProxyItem = serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap();
    assert!(proxy_entry(nameless, &mut Interner::default()).is_none());
}

#[test]
fn ownership_from_projected_labels_and_the_proof() {
    let key =
        crate::integrity::Key::from_stored("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=").unwrap();
    let trust = Trust {
        environment_id: "env-a".into(),
        key: Some(key.clone()),
        adopt_unproven: false,
    };
    let proof = crate::ownership::Verifier {
        environment_id: "env-a",
        key: &key,
        adopt_unproven: false,
    }
    .proof("NexoProxy", "n", "x", "u1", "x");
    let meta = |labels: Value, proof: &str| {
        serde_json::from_value::<ProxyItem>(json!({"metadata": {"name": "x", "namespace": "n",
            "uid": "u1", "labels": labels, "annotations": {"nexo.io/proof": proof}}}))
        .unwrap()
        .metadata
    };
    let owned = json!({"app.kubernetes.io/managed-by": "nexo-manager", "nexo.io/owner-id": "env-a", "nexo.io/deployment": "x", "app": "y"});
    assert_eq!(
        meta(owned.clone(), &proof).ownership("NexoProxy", &trust),
        Ownership::Owned
    );
    // The labels without the proof, with another object's, or of another kind.
    assert_eq!(
        meta(owned.clone(), "").ownership("NexoProxy", &trust),
        Ownership::Unproven
    );
    assert_eq!(
        meta(owned.clone(), &proof).ownership("Deployment", &trust),
        Ownership::Unproven
    );
    let mut relabelled = owned.clone();
    relabelled["nexo.io/deployment"] = json!("y");
    assert_eq!(
        meta(relabelled, &proof).ownership("NexoProxy", &trust),
        Ownership::Unproven
    );
    let keyless = Trust {
        key: None,
        ..trust.clone()
    };
    assert_eq!(
        meta(owned, &proof).ownership("NexoProxy", &keyless),
        Ownership::Unproven
    );
    let other =
        json!({"app.kubernetes.io/managed-by": "nexo-manager", "nexo.io/owner-id": "env-b"});
    assert_eq!(
        meta(other, &proof).ownership("NexoProxy", &trust),
        Ownership::OtherEnvironment("env-b".into())
    );
    let legacy = json!({"app.kubernetes.io/part-of": "nexo"});
    assert_eq!(
        meta(legacy, "").ownership("NexoProxy", &trust),
        Ownership::Legacy
    );
    let half = json!({"app.kubernetes.io/managed-by": "nexo-manager"});
    assert_eq!(
        meta(half, "").ownership("NexoProxy", &trust),
        Ownership::Unrelated
    );
}

#[test]
fn equal_namespaces_and_images_are_shared() {
    let mut shared = Interner::default();
    let item = |name: &str, image: &str| -> ProxyItem {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "shop"},
            "spec": {"image": image}}))
        .unwrap()
    };
    let a = proxy_entry(item("a", "p:1"), &mut shared).unwrap();
    let b = proxy_entry(item("b", "p:1"), &mut shared).unwrap();
    let c = proxy_entry(item("c", "p:2"), &mut shared).unwrap();
    assert!(Rc::ptr_eq(&a.namespace, &b.namespace));
    assert!(Rc::ptr_eq(
        a.image.as_ref().unwrap(),
        b.image.as_ref().unwrap()
    ));
    assert_eq!(c.image.as_deref(), Some("p:2"));
    // Past the bound, values are still right, only no longer shared.
    for i in 0..Interner::MAX {
        shared.get(&format!("v{i}"));
    }
    let x = shared.get("late");
    let y = shared.get("late");
    assert_eq!((&*x, &*y), ("late", "late"));
    assert!(!Rc::ptr_eq(&x, &y));
}

#[test]
fn entries_sort_by_namespace_then_name() {
    let e = |ns: &str, n: &str| Owned {
        namespace: ns.into(),
        name: n.into(),
        kind: crate::cp::wire::EntryKind::NexoProxy,
        image: None,
        observed: status::Observed::default(),
        judged: None,
    };
    let mut v = [e("shop", "b"), e("billing", "z"), e("shop", "a")];
    v.sort();
    let keys: Vec<(String, String)> = v
        .iter()
        .map(|o| (o.namespace.to_string(), o.name.to_string()))
        .collect();
    assert_eq!(
        keys,
        [("billing", "z"), ("shop", "a"), ("shop", "b")].map(|(n, m)| (n.to_owned(), m.to_owned()))
    );
}
