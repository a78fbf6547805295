use super::*;
use crate::commands::{Deploy, Format};
use crate::resource::Manifest;

const ENV: &str = "env-a";

fn key() -> &'static crate::integrity::Key {
    static KEY: std::sync::OnceLock<crate::integrity::Key> = std::sync::OnceLock::new();
    KEY.get_or_init(|| {
        crate::integrity::Key::from_stored("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=").unwrap()
    })
}

/// A deploy's writes as planned with no own object and no enforcement.
fn deploy(
    d: &Deploy,
    existing: &[Option<Value>],
    v: &Verifier<'_>,
    allow_legacy: bool,
) -> Result<Vec<Write>, Refused> {
    let own = crate::ownership::OwnObjects::default();
    let judge = Judge {
        own: &own,
        verifier: *v,
    };
    super::deploy(d, existing, &judge, allow_legacy, false).map(|p| p.writes)
}

/// `object` (a NexoProxy or Deployment named `name`, or a labelled object
/// when `labelled`) judged with no own object.
fn judge_of(
    v: &Verifier<'_>,
    r: &ObjectRef,
    deployment: &str,
    labelled: bool,
    object: &Value,
) -> Judged {
    let own = crate::ownership::OwnObjects::default();
    let judge = Judge {
        own: &own,
        verifier: *v,
    };
    judged(&judge, r, deployment, labelled, object.clone()).unwrap()
}

/// A rollout planned from its targets as read.
fn rollout(
    targets: &[(Target, Option<Value>)],
    image: &str,
    v: &Verifier<'_>,
) -> Result<Vec<ImageChange>, Refused> {
    let judged: Vec<(Target, Option<Judged>)> = targets
        .iter()
        .map(|(t, o)| {
            let r = ObjectRef::new(Kind::NexoProxy, &t.namespace, &t.name);
            (
                t.clone(),
                o.as_ref().map(|o| judge_of(v, &r, &t.name, false, o)),
            )
        })
        .collect();
    super::rollout(&judged, image, v)
}

/// An uninstall planned from what was read.
fn uninstall(
    t: &Target,
    proxy: Option<&Value>,
    deployment: Option<&Value>,
    labelled: &[(ObjectRef, Value)],
    v: &Verifier<'_>,
) -> Result<Removal, Refused> {
    let proxy_ref = ObjectRef::new(Kind::NexoProxy, &t.namespace, &t.name);
    let deployment_ref = ObjectRef::new(Kind::Deployment, &t.namespace, &t.name);
    let proxy = proxy.map(|o| judge_of(v, &proxy_ref, &t.name, false, o));
    let deployment = deployment.map(|o| judge_of(v, &deployment_ref, &t.name, false, o));
    let labelled: Vec<(ObjectRef, Judged)> = labelled
        .iter()
        .map(|(r, o)| (r.clone(), judge_of(v, r, &t.name, true, o)))
        .collect();
    super::uninstall(t, proxy.as_ref(), deployment.as_ref(), &labelled)
}

/// What drift enforcement leaves alone, with `own` the Manager's own
/// objects (the deployment's primary never left: a refusal is `Err`).
fn enforced(
    d: &Deploy,
    existing: &[Option<Value>],
    own: &crate::ownership::OwnObjects,
) -> Result<Vec<(ObjectRef, String)>, Refused> {
    let judge = Judge { own, verifier: v() };
    super::deploy(d, existing, &judge, false, true).map(|p| p.skipped)
}

/// This environment's verdict, the gate for unproven objects closed.
fn v() -> Verifier<'static> {
    Verifier {
        environment_id: ENV,
        key: key(),
        adopt_unproven: false,
    }
}

/// An object as read; one this environment's labels claim for a
/// deployment carries the Manager's proof (see [`unproven`]).
fn obj(kind: &str, name: &str, labels: Value) -> Value {
    let mut o = json!({"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": "shop", "labels": labels, "resourceVersion": "7", "uid": "u1"}});
    if let (Some(ENV), Some(deployment)) = (
        o["metadata"]["labels"]["nexo.io/owner-id"].as_str(),
        o["metadata"]["labels"]["nexo.io/deployment"].as_str(),
    ) {
        let proof = v().proof(kind, "shop", name, "u1", deployment);
        o["metadata"]["annotations"] = json!({"nexo.io/proof": proof});
    }
    o
}

/// The same object without its proof.
fn unproven(mut o: Value) -> Value {
    o["metadata"].as_object_mut().unwrap().remove("annotations");
    o
}

fn owned() -> Value {
    owned_by("orders")
}

fn owned_by(deployment: &str) -> Value {
    json!({"app.kubernetes.io/managed-by": "nexo-manager", "nexo.io/owner-id": ENV, "nexo.io/deployment": deployment})
}

fn d(adopt: bool) -> Deploy {
    Deploy {
        deployment: Target {
            name: "orders".into(),
            namespace: "shop".into(),
        },
        format: Format::Crd,
        manifests: vec![
            Manifest {
                reference: ObjectRef::new(Kind::ConfigMap, "shop", "orders-config"),
                object: json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "orders-config", "namespace": "shop", "labels": {"team": "db"}}}),
            },
            Manifest {
                reference: ObjectRef::new(Kind::NexoProxy, "shop", "orders"),
                object: json!({"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy", "metadata": {"name": "orders", "namespace": "shop"}}),
            },
        ],
        adopt_legacy: adopt,
        drift: Default::default(),
        on_failure: Default::default(),
    }
}

#[test]
fn deploy_labels_everything_and_orders_the_proxy_first() {
    let w = deploy(&d(false), &[None, None], &v(), false).unwrap();
    assert_eq!(w[0].reference.kind, Kind::NexoProxy);
    assert!(w[1].owned_by_proxy && !w[0].owned_by_proxy);
    let labels = &w[1].object["metadata"]["labels"];
    assert_eq!(labels["team"], "db");
    assert_eq!(labels["nexo.io/owner-id"], ENV);
    assert_eq!(labels["nexo.io/deployment"], "orders");
    assert_eq!(
        w[1].reference.path(),
        "/api/v1/namespaces/shop/configmaps/orders-config"
    );
    assert_eq!(
        w[0].reference.path(),
        "/apis/nexo.io/v1alpha1/namespaces/shop/nexoproxies/orders"
    );
}

#[test]
fn the_migration_gate_needs_both_halves() {
    let legacy = Some(obj(
        "ConfigMap",
        "orders-config",
        json!({"app.kubernetes.io/part-of": "nexo"}),
    ));
    for (cluster, command) in [(false, false), (true, false), (false, true)] {
        let r = deploy(&d(command), &[legacy.clone(), None], &v(), cluster).unwrap_err();
        assert!(
            r.refusal.to_string().contains("legacy"),
            "{}",
            r.refusal.to_string()
        );
        assert_eq!(r.resources[0].action, ResourceAction::Refused);
    }
    let w = deploy(&d(true), &[legacy, None], &v(), true).unwrap();
    assert!(w[1].adopt);
}

#[test]
fn unrelated_and_foreign_objects_are_refused() {
    let foreign = Some(obj(
        "ConfigMap",
        "orders-config",
        json!({"app.kubernetes.io/managed-by": "nexo-manager", "nexo.io/owner-id": "env-b"}),
    ));
    let r = deploy(&d(true), &[foreign, None], &v(), true).unwrap_err();
    assert!(
        r.refusal
            .to_string()
            .contains("belongs to environment env-b"),
        "{}",
        r.refusal.to_string()
    );
    let unrelated = Some(obj("ConfigMap", "orders-config", json!({})));
    let r = deploy(&d(true), &[unrelated, None], &v(), true).unwrap_err();
    assert!(
        r.refusal
            .to_string()
            .contains("not managed by nexo-manager")
    );
    let mine = Some(obj("ConfigMap", "orders-config", owned()));
    assert_eq!(
        deploy(&d(false), &[mine, None], &v(), false).unwrap()[1]
            .existing
            .as_ref()
            .map(|at| at.version.as_str()),
        Some("7")
    );
}

#[test]
fn an_object_of_another_deployment_is_refused_by_every_class() {
    // beta's deploy names alpha's ConfigMap: refused, never relabelled.
    let mut alpha = owned();
    alpha["nexo.io/deployment"] = json!("alpha");
    let alphas = obj("ConfigMap", "orders-config", alpha.clone());
    let r = deploy(&d(false), &[Some(alphas.clone()), None], &v(), false).unwrap_err();
    assert!(
        r.refusal
            .to_string()
            .contains("belongs to deployment alpha"),
        "{}",
        r.refusal.to_string()
    );
    assert_eq!(r.resources.len(), 1);
    assert_eq!(r.resources[0].action, ResourceAction::Refused);
    // The same with the label right but a controller elsewhere.
    let mut controlled = obj("ConfigMap", "orders-config", owned());
    controlled["metadata"]["ownerReferences"] = owner_reference("alpha", "u-alpha");
    let r = deploy(&d(false), &[Some(controlled.clone()), None], &v(), false).unwrap_err();
    assert!(
        r.refusal
            .to_string()
            .contains("controlled by NexoProxy alpha"),
        "{}",
        r.refusal.to_string()
    );
    // Its own controller, its own label, or no label at all: fine.
    let mut mine = obj("ConfigMap", "orders-config", owned());
    mine["metadata"]["ownerReferences"] = owner_reference("orders", "u-orders");
    mine["metadata"]["labels"]["nexo.io/deployment"] = json!("orders");
    assert!(deploy(&d(false), &[Some(mine), None], &v(), false).is_ok());
    // A non-controller reference does not claim the object.
    let mut referenced = obj("ConfigMap", "orders-config", owned());
    referenced["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"}]);
    assert!(deploy(&d(false), &[Some(referenced), None], &v(), false).is_ok());
}

#[test]
fn rollout_and_uninstall_refuse_another_deployments_objects() {
    let mut alpha = owned();
    alpha["nexo.io/deployment"] = json!("alpha");
    // A rollout or uninstall of "orders" whose NexoProxy says "alpha".
    let t = Target {
        name: "orders".into(),
        namespace: "shop".into(),
    };
    let mut proxy = obj("NexoProxy", "orders", alpha.clone());
    proxy["spec"] = json!({"image": "p:1"});
    let r = rollout(&[(t.clone(), Some(proxy.clone()))], "p:2", &v()).unwrap_err();
    assert_eq!(r.resources[0].action, ResourceAction::Refused);
    assert!(
        r.refusal
            .to_string()
            .contains("belongs to deployment alpha"),
        "{}",
        r.refusal.to_string()
    );
    let r = uninstall(&t, Some(&proxy), None, &[], &v()).unwrap_err();
    assert!(
        r.refusal
            .to_string()
            .contains("belongs to deployment alpha"),
        "{}",
        r.refusal.to_string()
    );
    let dep = obj("Deployment", "orders", alpha);
    assert!(uninstall(&t, None, Some(&dep), &[], &v()).is_err());
    // A labelled object controlled by something else is left alone.
    let mut labels = owned();
    labels["nexo.io/deployment"] = json!("orders");
    let mine = obj("Deployment", "orders", labels.clone());
    let mut svc = obj("Service", "orders", labels);
    svc["metadata"]["ownerReferences"] = owner_reference("alpha", "u-alpha");
    let Removal::Legacy(refs) = uninstall(
        &t,
        None,
        Some(&mine),
        &[(ObjectRef::new(Kind::Service, "shop", "orders"), svc)],
        &v(),
    )
    .unwrap() else {
        panic!("an owned legacy Deployment is removed")
    };
    assert_eq!(refs.len(), 1, "{refs:?}");
    // A hostile label value cannot forge a line of the ack message.
    let mut forged = owned();
    forged["nexo.io/deployment"] = json!("x\nINFO fake");
    let r = deploy(
        &d(false),
        &[Some(obj("ConfigMap", "orders-config", forged)), None],
        &v(),
        false,
    )
    .unwrap_err();
    assert!(
        !r.refusal.to_string().contains('\n'),
        "{}",
        r.refusal.to_string()
    );
}

#[test]
fn rollout_checks_every_target_first() {
    let t = |n: &str| Target {
        name: n.into(),
        namespace: "shop".into(),
    };
    let mut mine = obj("NexoProxy", "a", owned_by("a"));
    mine["spec"] = json!({"image": "p:1"});
    let ok = rollout(&[(t("a"), Some(mine.clone()))], "p:2", &v()).unwrap();
    assert!(ok[0].changed);
    assert!(!rollout(&[(t("a"), Some(mine.clone()))], "p:1", &v()).unwrap()[0].changed);
    let r = rollout(
        &[
            (t("a"), Some(mine.clone())),
            (t("b"), None),
            (t("c"), Some(obj("NexoProxy", "c", json!({})))),
        ],
        "p:2",
        &v(),
    )
    .unwrap_err();
    let actions: Vec<&str> = r.resources.iter().map(|x| x.action.as_str()).collect();
    assert_eq!(actions, ["absent", "refused", "unchanged"]);
    let img = ImageRef::parse("r.io/nexo/proxy:1.4.2").unwrap();
    assert_eq!(rollout_image(&img, Some("1.4.3")), "r.io/nexo/proxy:1.4.3");
    assert_eq!(rollout_image(&img, None), "r.io/nexo/proxy:1.4.2");
    let dg = format!("sha256:{}", "a".repeat(64));
    assert_eq!(
        rollout_image(&img, Some(&dg)),
        format!("r.io/nexo/proxy@{dg}")
    );
}

#[test]
fn a_write_says_what_it_did_from_the_version_it_got_back() {
    let mut w = deploy(&d(false), &[None, None], &v(), false)
        .unwrap()
        .remove(1);
    assert_eq!(w.action(Some("1")), ResourceAction::Created);
    assert!(
        w.needs_owner_dry_run(false),
        "a new runtime object of a new NexoProxy"
    );
    assert!(!w.needs_owner_dry_run(true));
    w.existing = Some(ReadAt {
        uid: "u1".into(),
        version: "7".into(),
    });
    assert_eq!(w.action(Some("7")), ResourceAction::Unchanged);
    assert_eq!(w.action(Some("8")), ResourceAction::Configured);
    assert!(!w.needs_owner_dry_run(false));
    w.adopt = true;
    assert_eq!(
        w.action(Some("7")),
        ResourceAction::Configured,
        "an adoption always configures"
    );
}

#[test]
fn existing_objects_are_guarded_by_where_they_were_read() {
    let mine = obj("ConfigMap", "orders-config", owned());
    let w = deploy(&d(false), &[Some(mine.clone()), None], &v(), false).unwrap();
    assert_eq!(w[1].object["metadata"]["uid"], "u1");
    assert_eq!(w[1].object["metadata"]["resourceVersion"], "7");
    assert!(
        w[0].object["metadata"].get("uid").is_none(),
        "an absent one is not"
    );
    let mut unguardable = mine;
    unguardable["metadata"]["resourceVersion"] = Value::Null;
    let r = deploy(&d(false), &[Some(unguardable), None], &v(), false).unwrap_err();
    assert!(
        r.refusal.to_string().contains("without a uid"),
        "{}",
        r.refusal.to_string()
    );
}

#[test]
fn uninstall_refuses_what_is_not_owned() {
    let t = Target {
        name: "orders".into(),
        namespace: "shop".into(),
    };
    assert_eq!(
        uninstall(&t, None, None, &[], &v()).unwrap(),
        Removal::Absent
    );
    let mine = obj("NexoProxy", "orders", owned());
    assert!(matches!(
        uninstall(&t, Some(&mine), None, &[], &v()).unwrap(),
        Removal::Proxy(_)
    ));
    assert!(
        uninstall(
            &t,
            Some(&obj("NexoProxy", "orders", json!({}))),
            None,
            &[],
            &v()
        )
        .is_err()
    );
    let mut labels = owned();
    labels["nexo.io/deployment"] = json!("orders");
    let svc = (
        ObjectRef::new(Kind::Service, "shop", "orders"),
        obj("Service", "orders", labels),
    );
    let other = (
        ObjectRef::new(Kind::Service, "shop", "x"),
        obj("Service", "x", owned_by("billing")),
    );
    let legacy = obj("Deployment", "orders", owned());
    let Removal::Legacy(refs) = uninstall(&t, None, Some(&legacy), &[svc, other], &v()).unwrap()
    else {
        panic!()
    };
    assert_eq!(
        refs.iter().map(|r| r.reference.kind).collect::<Vec<_>>(),
        [Kind::Deployment, Kind::Service]
    );
}

#[test]
fn enforcement_leaves_what_became_anothers_and_keeps_the_rest() {
    let d = d(false);
    let with = |labels: Value| obj("ConfigMap", "orders-config", labels);
    let mine = json!({"app.kubernetes.io/managed-by": "nexo-manager", "nexo.io/owner-id": ENV, "nexo.io/deployment": "orders"});
    let none = crate::ownership::OwnObjects::default();
    // Absent or the deployment's own: restored.
    assert!(enforced(&d, &[None, None], &none).unwrap().is_empty());
    assert!(
        enforced(&d, &[Some(with(mine.clone())), None], &none)
            .unwrap()
            .is_empty()
    );
    // A tenant's object of the same name, another deployment's, a legacy
    // one (enforcement never adopts): left alone, each with its reason.
    for (labels, why) in [
        (json!({"team": "x"}), "not managed by nexo-manager"),
        (
            json!({"app.kubernetes.io/managed-by": "nexo-manager", "nexo.io/owner-id": ENV, "nexo.io/deployment": "billing"}),
            "belongs to deployment billing",
        ),
        (json!({"app.kubernetes.io/part-of": "nexo"}), "legacy"),
    ] {
        let left = enforced(&d, &[Some(with(labels)), None], &none).unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].0.name, "orders-config");
        assert!(left[0].1.contains(why), "{}", left[0].1);
    }
    // The Manager's own object, as its rule says.
    let mut own = crate::ownership::OwnObjects::new("shop", "", "", "");
    own.add("ConfigMap", "orders-config");
    assert_eq!(
        enforced(&d, &[Some(with(mine)), None], &own).unwrap()[0].1,
        "refused: the Manager's own object ConfigMap/orders-config"
    );
    // The deployment's NexoProxy is never left out: a proxy that became
    // another's refuses the enforcement whole.
    let foreign_proxy = obj("NexoProxy", "orders", json!({"team": "x"}));
    let refused = enforced(&d, &[None, Some(foreign_proxy)], &none).unwrap_err();
    assert_eq!(
        refused.resources,
        [ObjectRef::new(Kind::NexoProxy, "shop", "orders").ack(ResourceAction::Refused)]
    );
}

#[test]
fn what_is_only_labelled_as_owned_is_refused_by_every_class_unless_adopted() {
    let t = Target {
        name: "orders".into(),
        namespace: "shop".into(),
    };
    let gate = Verifier {
        adopt_unproven: true,
        ..v()
    };
    // Labelled by someone else, or proven for another object (copied).
    let labelled = unproven(obj("ConfigMap", "orders-config", owned()));
    let mut copied = obj("ConfigMap", "orders-config", owned());
    copied["metadata"]["uid"] = json!("u2");
    for o in [labelled.clone(), copied] {
        let r = deploy(&d(false), &[Some(o), None], &v(), false).unwrap_err();
        assert!(
            r.refusal.to_string().contains("no valid proof"),
            "{}",
            r.refusal.to_string()
        );
    }
    let proxy = unproven(obj("NexoProxy", "orders", owned()));
    let r = rollout(&[(t.clone(), Some(proxy.clone()))], "p:2", &v()).unwrap_err();
    assert!(r.refusal.to_string().contains("no valid proof"));
    assert!(uninstall(&t, Some(&proxy), None, &[], &v()).is_err());
    // A legacy uninstall leaves an unproven labelled object alone.
    let svc = (
        ObjectRef::new(Kind::Service, "shop", "orders"),
        unproven(obj("Service", "orders", owned())),
    );
    let legacy = obj("Deployment", "orders", owned());
    let Removal::Legacy(deletes) = uninstall(&t, None, Some(&legacy), &[svc], &v()).unwrap() else {
        panic!("a legacy removal")
    };
    assert_eq!(deletes.len(), 1, "the Deployment only");

    // Through the gate, the write carries its proof.
    let w = deploy(&d(false), &[Some(labelled), None], &gate, false).unwrap();
    let proof = &w[1].object["metadata"]["annotations"]["nexo.io/proof"];
    assert_eq!(
        proof,
        &json!(v().proof("ConfigMap", "shop", "orders-config", "u1", "orders"))
    );
    assert!(v().proven("ConfigMap", &{
        let mut o = w[1].object.clone();
        o["metadata"]["namespace"] = json!("shop");
        o
    }));
    let changes = rollout(&[(t.clone(), Some(proxy.clone()))], "p:2", &gate).unwrap();
    assert_eq!(
        changes[0].proof,
        v().proof("NexoProxy", "shop", "orders", "u1", "orders")
    );
    assert!(uninstall(&t, Some(&proxy), None, &[], &gate).is_ok());
}

#[test]
fn an_absent_object_is_written_with_an_empty_proof_its_create_fills() {
    let w = deploy(&d(false), &[None, None], &v(), false).unwrap();
    for w in &w {
        assert_eq!(
            w.object["metadata"]["annotations"]["nexo.io/proof"], "",
            "{}",
            w.reference
        );
    }
    let mine = obj("ConfigMap", "orders-config", owned());
    let w = deploy(&d(false), &[Some(mine.clone()), None], &v(), false).unwrap();
    assert_eq!(
        w[1].object["metadata"]["annotations"]["nexo.io/proof"],
        mine["metadata"]["annotations"]["nexo.io/proof"],
        "an existing one keeps its proof"
    );
}

#[path = "plan_cluster_tests.rs"]
mod cluster;
