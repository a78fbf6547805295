use super::*;
use crate::commands::{Deploy, Format, Target};
use crate::resource::{Manifest, ObjectRef};
use serde_json::json;

const PROXY: &str = "registry.example.com/nexo/proxy";

fn proxy_image() -> ImageRef {
    ImageRef::parse(&format!("{PROXY}:1.4.2")).unwrap()
}

/// A Deployment of the 0.2.0 line, as its chart rendered it: it meets
/// `baseline` and must keep deploying.
fn legacy_deployment() -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "billing"},
      "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "billing"}},
        "template": {"metadata": {"labels": {"app": "billing"}},
          "spec": {"containers": [{"name": "proxy", "image": format!("{PROXY}:0.2.0"),
              "ports": [{"containerPort": 27017, "name": "mongodb"}],
              "env": [{"name": "MONGODB_URI", "valueFrom": {"secretKeyRef": {"name": "billing-db", "key": "uri"}}}],
              "resources": {"limits": {"memory": "256Mi"}},
              "readinessProbe": {"tcpSocket": {"port": 27017}},
              "securityContext": {"readOnlyRootFilesystem": true, "capabilities": {"add": ["NET_BIND_SERVICE"]}}}],
            "volumes": [{"name": "config", "configMap": {"name": "billing-config"}}, {"name": "tmp", "emptyDir": {}}]}}}})
}

fn deploy_of(objects: Vec<Value>) -> Deploy {
    let manifests = objects
        .into_iter()
        .map(|object| {
            let kind = Kind::of(
                object["apiVersion"].as_str().unwrap(),
                object["kind"].as_str().unwrap(),
            )
            .unwrap();
            Manifest {
                reference: ObjectRef::new(
                    kind,
                    "shop",
                    object["metadata"]["name"].as_str().unwrap(),
                ),
                object,
            }
        })
        .collect();
    Deploy {
        deployment: Target {
            name: "billing".into(),
            namespace: "shop".into(),
        },
        format: Format::Legacy,
        manifests,
        adopt_legacy: false,
        drift: Default::default(),
        on_failure: Default::default(),
    }
}

fn check(policy: &Policy, objects: Vec<Value>) -> Result<(), String> {
    policy
        .walk_deploy(&deploy_of(objects).manifests, &proxy_image())
        .map(|_| ())
        .map_err(|v| v.to_string())
}

/// The legacy Deployment with `change` made to it.
fn changed(change: impl Fn(&mut Value)) -> Value {
    let mut d = legacy_deployment();
    change(&mut d);
    d
}

/// The legacy Deployment's pod template: the allowlist walk and the Pod
/// Security profiles.
#[path = "pod_tests.rs"]
mod pod;

#[test]
fn proxies_images_secrets_and_services() {
    let proxy = |image: &str| json!({"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy", "metadata": {"name": "orders"}, "spec": {"image": image}});
    let p = Policy::default();
    assert_eq!(check(&p, vec![proxy(&format!("{PROXY}:1.5.0"))]), Ok(()));
    let err = check(&p, vec![proxy("ghcr.io/someone/proxy:1")]).unwrap_err();
    assert!(
        err.contains("NexoProxy shop/orders spec.image: image repository ghcr.io/someone/proxy"),
        "{err}"
    );
    let allowed = Policy {
        image_repositories: vec!["ghcr.io/someone/proxy".into()],
        ..Policy::default()
    };
    assert_eq!(
        check(&allowed, vec![proxy("ghcr.io/someone/proxy:1")]),
        Ok(())
    );

    let secret = |t: Value| json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "type": t});
    assert_eq!(check(&p, vec![secret(Value::Null)]), Ok(()));
    assert_eq!(check(&p, vec![secret(json!("Opaque"))]), Ok(()));
    assert_eq!(check(&p, vec![secret(json!("kubernetes.io/tls"))]), Ok(()));
    let err = check(
        &p,
        vec![secret(json!("kubernetes.io/service-account-token"))],
    )
    .unwrap_err();
    assert!(
        err.contains("Secret shop/s: type \"kubernetes.io/service-account-token\""),
        "{err}"
    );
    assert!(check(&p, vec![secret(json!("kubernetes.io/dockerconfigjson"))]).is_err());

    let service = |mut spec: Value| {
        if spec["selector"].is_null() {
            spec["selector"] = json!({"app": "billing"});
        }
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc"}, "spec": spec})
    };
    let with_workload = |svc: Value| vec![legacy_deployment(), svc];
    assert_eq!(
        check(&p, with_workload(service(json!({"ports": [{"port": 1}]})))),
        Ok(())
    );
    assert_eq!(
        check(&p, with_workload(service(json!({"clusterIP": "None"})))),
        Ok(()),
        "headless"
    );
    // A Service selects the deployment's own pods and nothing wider.
    for (selector, want) in [
        (json!({}), "must select the deployment's own pods"),
        (
            json!({"app": "orders"}),
            "app=orders is not a label of the deployment's pod template",
        ),
        (json!({"tier": "db"}), "tier=db is not a label"),
    ] {
        let err = check(&p, with_workload(service(json!({"selector": selector})))).unwrap_err();
        assert!(err.contains(want), "{err}\n  should name: {want}");
    }
    let wide = changed(|d| {
        d.pointer_mut("/spec/template/metadata").unwrap()["labels"] =
            json!({"app": "billing", "tier": "proxy"});
        d.pointer_mut("/spec/selector").unwrap()["matchLabels"] =
            json!({"app": "billing", "tier": "proxy"});
    });
    let err = check(
        &p,
        vec![wide, service(json!({"selector": {"tier": "proxy"}}))],
    )
    .unwrap_err();
    assert!(
        err.contains("it lacks app=billing of the Deployment's selector"),
        "{err}"
    );
    let err = check(&p, vec![service(json!({}))]).unwrap_err();
    assert!(err.contains("deployed with the Deployment"), "{err}");
    let p = &p;
    let check = |p: &Policy, svc: Vec<Value>| {
        let mut all = vec![legacy_deployment()];
        all.extend(svc);
        check(p, all)
    };
    for t in ["LoadBalancer", "NodePort"] {
        let err = check(p, vec![service(json!({"type": t}))]).unwrap_err();
        assert!(
            err.contains("needs NEXO_ALLOW_EXTERNAL_SERVICES=true"),
            "{err}"
        );
    }
    let external = Policy {
        external_services: true,
        ..Policy::default()
    };
    assert_eq!(
        check(&external, vec![service(json!({"type": "LoadBalancer"}))]),
        Ok(())
    );
    let err = check(
        &external,
        vec![service(
            json!({"type": "ExternalName", "externalName": "x"}),
        )],
    )
    .unwrap_err();
    assert!(err.contains("ExternalName"), "{err}");
    let err = check(
        &external,
        vec![service(json!({"externalIPs": ["1.2.3.4"]}))],
    )
    .unwrap_err();
    assert!(err.contains("spec.externalIPs"), "{err}");
}

#[test]
fn an_upgrade_stays_in_the_managers_repository() {
    let d = format!("@sha256:{}", "a".repeat(64));
    let image = |r: &str| ImageRef::parse(&format!("{r}{d}")).unwrap();
    let current = Some("registry.example.com/nexo/manager:0.3.0");
    let p = Policy::default();
    assert_eq!(
        p.check_upgrade(&image("registry.example.com/nexo/manager"), current),
        Ok(())
    );
    let err = p
        .check_upgrade(&image("evil.example.com/manager"), current)
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("policy: managerImage: evil.example.com/manager"),
        "{err}"
    );
    let moved = Policy {
        manager_repository: Some("mirror.example.com/nexo/manager".into()),
        ..Policy::default()
    };
    assert_eq!(
        moved.check_upgrade(&image("mirror.example.com/nexo/manager"), current),
        Ok(())
    );
    assert!(
        p.check_upgrade(&image("registry.example.com/nexo/manager"), None)
            .is_err(),
        "no current image, no configured one: refused"
    );
}

#[test]
fn metadata_external_names_and_old_security_annotations() {
    let p = Policy::default();
    let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "finalizers": ["x/block"]}});
    let err = check(&p, vec![cm.clone()]).unwrap_err();
    assert!(
        err.starts_with("policy: field not allowed: metadata.finalizers (ConfigMap shop/c)"),
        "{err}"
    );
    cm["metadata"]["finalizers"] = Value::Null;
    assert_eq!(check(&p, vec![cm]), Ok(()));
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
        "spec": {"externalName": "db.example.com", "selector": {"app": "billing"}}});
    let err = check(&p, vec![legacy_deployment(), svc]).unwrap_err();
    assert!(err.contains("spec.externalName"), "{err}");
    let unconfined = changed(|d| {
        d.pointer_mut("/spec/template/metadata").unwrap()["annotations"] =
            json!({"seccomp.security.alpha.kubernetes.io/pod": "unconfined"})
    });
    let err = check(&p, vec![unconfined]).unwrap_err();
    assert!(
        err.contains("seccomp.security.alpha.kubernetes.io/pod unconfined"),
        "{err}"
    );
}

#[test]
fn custom_resources_name_their_references() {
    let proxy = json!({"kind": "NexoProxy", "spec": {"mongodb": {"secretRef": {"name": "db"}}, "configMapRef": {"name": "cfg"}}});
    assert_eq!(
        custom_resource_references(&proxy),
        vec![(Kind::Secret, "db"), (Kind::ConfigMap, "cfg")]
    );
    let pipeline = json!({"kind": "NexoPipeline", "spec": {"references": [
        {"kind": "Secret", "name": "nexo-connect-token"}, {"kind": "Other", "name": "x"}, {"kind": "NexoProxy", "name": "p"}]}});
    assert_eq!(
        custom_resource_references(&pipeline),
        vec![(Kind::Secret, "nexo-connect-token"), (Kind::NexoProxy, "p")]
    );
}

#[test]
fn a_services_fields_are_judged_by_type() {
    let p = Policy::default();
    let service = |spec: Value| {
        let mut spec = spec;
        spec["selector"] = json!({"app": "billing"});
        vec![
            legacy_deployment(),
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": spec}),
        ]
    };
    for (spec, want) in [
        (json!({"type": 1}), "spec.type is not a string"),
        (json!({"externalIPs": "203.0.113.7"}), "spec.externalIPs"),
        (
            json!({"externalIPs": {"0": "203.0.113.7"}}),
            "spec.externalIPs",
        ),
    ] {
        let err = check(&p, service(spec.clone())).unwrap_err();
        assert!(err.contains(want), "{spec}: {err}");
    }
    assert_eq!(
        check(&p, service(json!({"externalIPs": [], "type": null}))),
        Ok(())
    );
}
