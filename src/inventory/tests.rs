//! The inventory's shaping and Table reading, as plain values.

use std::rc::Rc;

use serde_json::{Value, json};

use super::*;
use crate::kube::Table;

#[test]
fn entries_from_objects() {
    let p: ProxyItem = serde_json::from_value(json!({"metadata": {"name": "orders", "namespace": "shop",
        "managedFields": [{"manager": "x"}]}, "spec": {"replicas": 3, "image": "p:1", "port": 27017}}))
    .unwrap();
    assert_eq!(
        proxy_entry(p, &mut Interner::default()).unwrap(),
        DeploymentEntry {
            namespace: "shop".into(),
            name: "orders".into(),
            kind: "NexoProxy",
            replicas: 3,
            image: Some("p:1".into())
        }
    );
    let d: DeploymentItem = serde_json::from_value(
        json!({"metadata": {"name": "billing", "namespace": "shop"}, "spec": {
        "selector": {}, "template": {"spec": {"containers": [
        {"name": "sidecar", "image": "s:1"}, {"name": "proxy", "image": "p:0.9"}]}}}}),
    )
    .unwrap();
    let e = deployment_entry(d, &mut Interner::default()).unwrap();
    assert_eq!(
        (e.kind, e.replicas, e.image.as_deref()),
        ("Deployment", 1, Some("p:0.9"))
    );
    let d: DeploymentItem = serde_json::from_value(json!({"metadata": {"name": "one", "namespace": "shop"},
        "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "main", "image": "m:1"}]}}}}))
    .unwrap();
    let e = deployment_entry(d, &mut Interner::default()).unwrap();
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
fn ownership_from_projected_labels() {
    let meta = |labels: Value| {
        serde_json::from_value::<ProxyItem>(
            json!({"metadata": {"name": "x", "namespace": "n", "labels": labels}}),
        )
        .unwrap()
        .metadata
    };
    let owned = json!({"app.kubernetes.io/managed-by": "nexo-manager", "nexo.io/owner-id": "env-a", "app": "y"});
    assert_eq!(meta(owned).ownership("env-a"), Ownership::Owned);
    let other =
        json!({"app.kubernetes.io/managed-by": "nexo-manager", "nexo.io/owner-id": "env-b"});
    assert_eq!(
        meta(other).ownership("env-a"),
        Ownership::OtherEnvironment("env-b".into())
    );
    let legacy = json!({"app.kubernetes.io/part-of": "nexo"});
    assert_eq!(meta(legacy).ownership("env-a"), Ownership::Legacy);
    let half = json!({"app.kubernetes.io/managed-by": "nexo-manager"});
    assert_eq!(meta(half).ownership("env-a"), Ownership::Unrelated);
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
fn topology_is_never_guessed() {
    let node = |r: Option<&str>, z: Option<&str>| {
        let mut labels = serde_json::Map::new();
        if let Some(r) = r {
            labels.insert("topology.kubernetes.io/region".into(), r.into());
        }
        if let Some(z) = z {
            labels.insert("topology.kubernetes.io/zone".into(), z.into());
        }
        serde_json::from_value::<NodeItem>(json!({"metadata": {"labels": labels}})).unwrap()
    };
    let mut t = Topology::default();
    t.add_node(&node(Some("eu-west-1"), Some("eu-west-1a")));
    t.add_node(&node(Some("eu-west-1"), Some("eu-west-1b")));
    assert_eq!(
        (t.region.get(), t.zone.get()),
        (Some("eu-west-1".into()), None)
    );
    let mut t = Topology::default();
    t.add_node(&node(Some("eu"), None));
    t.add_node(&node(None, None));
    assert_eq!((t.region.get(), t.zone.get()), (None, None));
    assert_eq!(Topology::default().region.get(), None);
}

fn proxy_crd(columns: Value) -> Value {
    json!({"spec": {"versions": [
        {"name": "v1alpha1", "served": true, "storage": true, "additionalPrinterColumns": columns}]}})
}

fn image_and_replicas() -> Value {
    json!([{"name": "Image", "type": "string", "jsonPath": ".spec.image"},
           {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
           {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"}])
}

#[test]
fn a_table_only_when_the_crd_columns_are_the_fields() {
    assert_eq!(
        proxy_listing(&proxy_crd(image_and_replicas())),
        ProxyListing::Table
    );
    let changed = |i: usize, key: &str, value: &str| {
        let mut c = image_and_replicas();
        c[i][key] = value.into();
        proxy_listing(&proxy_crd(c))
    };
    assert_eq!(
        changed(0, "jsonPath", ".status.image"),
        ProxyListing::Objects
    );
    assert_eq!(
        changed(1, "jsonPath", ".status.replicas"),
        ProxyListing::Objects
    );
    assert_eq!(changed(1, "type", "string"), ProxyListing::Objects);
    assert_eq!(changed(0, "name", "Picture"), ProxyListing::Objects);
    // A second column of the same name would make the Table ambiguous.
    assert_eq!(changed(2, "name", "Replicas"), ProxyListing::Objects);
    assert_eq!(proxy_listing(&proxy_crd(json!([]))), ProxyListing::Objects);
    // A column of its own named Name would shadow the object's name.
    assert_eq!(changed(2, "name", "Name"), ProxyListing::Objects);
    let mut other_version = proxy_crd(image_and_replicas());
    other_version["spec"]["versions"][0]["name"] = "v1beta1".into();
    assert_eq!(proxy_listing(&other_version), ProxyListing::Objects);
    let mut not_served = proxy_crd(image_and_replicas());
    not_served["spec"]["versions"][0]["served"] = false.into();
    assert_eq!(proxy_listing(&not_served), ProxyListing::Objects);
    assert_eq!(proxy_listing(&json!({})), ProxyListing::Objects);
}

fn table(columns: Value, rows: Value) -> Table {
    serde_json::from_value(json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": "7"}, "columnDefinitions": columns, "rows": rows}))
    .unwrap()
}

fn table_columns() -> Value {
    json!([{"name": "Name", "type": "string", "format": "name", "description": "Name must be unique", "priority": 0},
           {"name": "Image", "type": "string", "format": "", "description": "", "priority": 0},
           {"name": "Replicas", "type": "integer", "format": "", "description": "", "priority": 0},
           {"name": "Ready", "type": "integer", "format": "", "description": "", "priority": 0},
           {"name": "Age", "type": "date", "format": "", "description": "", "priority": 0}])
}

#[test]
fn table_rows_become_the_entries_the_objects_would() {
    let t = table(
        table_columns(),
        json!([{"cells": ["orders", "p:1", 3, 2, "5m"], "object": null},
               {"cells": ["bare", null, null, null, "1s"]}]),
    );
    let mut shared = Interner::default();
    let entries = table_entries(t, "shop", &mut shared).unwrap();
    let object = |v: Value| {
        proxy_entry(serde_json::from_value(v).unwrap(), &mut Interner::default()).unwrap()
    };
    assert_eq!(
        entries,
        vec![
            object(json!({"metadata": {"name": "orders", "namespace": "shop"},
                "spec": {"image": "p:1", "replicas": 3}})),
            object(json!({"metadata": {"name": "bare", "namespace": "shop"}})),
        ]
    );
    assert!(Rc::ptr_eq(&entries[0].namespace, &entries[1].namespace));
    let empty = table(table_columns(), json!([]));
    assert_eq!(table_entries(empty, "shop", &mut shared), Ok(vec![]));
}

#[test]
fn a_table_of_another_shape_is_refused_with_the_reason() {
    let with = |columns: Value, rows: Value| {
        table_entries(table(columns, rows), "shop", &mut Interner::default()).unwrap_err()
    };
    let row = json!([{"cells": ["orders", "p:1", 3, 2, "5m"]}]);
    let mut c = table_columns();
    c.as_array_mut().unwrap().remove(2);
    assert_eq!(with(c, row.clone()), TableProblem::Column("Replicas"));
    let mut c = table_columns();
    c[1]["type"] = "integer".into();
    assert_eq!(with(c, row.clone()), TableProblem::Column("Image"));
    let mut c = table_columns();
    c[3]["name"] = "Image".into();
    assert_eq!(with(c, row.clone()), TableProblem::Column("Image"));
    let mut c = table_columns();
    c.as_array_mut().unwrap().swap(0, 1);
    assert_eq!(with(c, row.clone()), TableProblem::Column("Name"));
    let cells = |cells: Value| with(table_columns(), json!([{"cells": cells}]));
    assert_eq!(
        cells(json!(["", "p:1", 3, 0, "1s"])),
        TableProblem::Cell {
            row: 0,
            column: "Name"
        }
    );
    assert_eq!(
        cells(json!([7, "p:1", 3, 0, "1s"])),
        TableProblem::Cell {
            row: 0,
            column: "Name"
        }
    );
    assert_eq!(
        cells(json!(["a", 1, 3, 0, "1s"])),
        TableProblem::Cell {
            row: 0,
            column: "Image"
        }
    );
    assert_eq!(
        cells(json!(["a", "p:1", "3", 0, "1s"])),
        TableProblem::Cell {
            row: 0,
            column: "Replicas"
        }
    );
    assert_eq!(
        cells(json!(["a", "p:1", 1.5, 0, "1s"])),
        TableProblem::Cell {
            row: 0,
            column: "Replicas"
        }
    );
    // A short row never reads as defaults.
    assert_eq!(cells(json!(["a", "p:1"])), TableProblem::Cells { row: 0 });
    assert_eq!(
        TableProblem::Cells { row: 2 }.to_string(),
        "row 2 of the table has not one cell per column"
    );
    assert_eq!(
        TableProblem::Cell {
            row: 4,
            column: "Image"
        }
        .to_string(),
        "row 4 of the table has a bad Image cell"
    );
    assert_eq!(
        TableProblem::Column("Replicas").to_string(),
        "the table has no single Replicas column of the expected type"
    );
}

#[test]
fn entries_sort_by_namespace_then_name() {
    let e = |ns: &str, n: &str| DeploymentEntry {
        namespace: ns.into(),
        name: n.into(),
        kind: "NexoProxy",
        replicas: 1,
        image: None,
    };
    let mut v = vec![e("shop", "b"), e("billing", "z"), e("shop", "a")];
    v.sort();
    assert_eq!(v, vec![e("billing", "z"), e("shop", "a"), e("shop", "b")]);
}
