use super::*;
use crate::commands::{Format, ObjectRef, Target};
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
    }
}

fn check(policy: &Policy, objects: Vec<Value>) -> Result<(), String> {
    policy
        .check_deploy(&deploy_of(objects), &proxy_image())
        .map_err(|v| v.to_string())
}

/// The legacy Deployment with `change` made to it.
fn changed(change: impl Fn(&mut Value)) -> Value {
    let mut d = legacy_deployment();
    change(&mut d);
    d
}

#[test]
fn a_legacy_workload_of_the_0_2_0_line_meets_baseline() {
    assert_eq!(check(&Policy::default(), vec![legacy_deployment()]), Ok(()));
}

#[test]
fn every_baseline_rule_is_checked_where_it_applies() {
    let pod = "/spec/template/spec";
    let c0 = "/spec/template/spec/containers/0";
    let cases: Vec<(Value, &str)> = vec![
        (
            changed(|d| d.pointer_mut(pod).unwrap()["hostNetwork"] = json!(true)),
            "hostNetwork: host namespaces",
        ),
        (
            changed(|d| d.pointer_mut(pod).unwrap()["hostPID"] = json!(true)),
            "hostPID: host namespaces",
        ),
        (
            changed(|d| d.pointer_mut(pod).unwrap()["hostIPC"] = json!(true)),
            "hostIPC: host namespaces",
        ),
        (
            changed(|d| d.pointer_mut(c0).unwrap()["securityContext"]["privileged"] = json!(true)),
            "containers proxy securityContext: privileged",
        ),
        (
            changed(|d| {
                d.pointer_mut(c0).unwrap()["securityContext"]["capabilities"]["add"] =
                    json!(["SYS_ADMIN"])
            }),
            "capability SYS_ADMIN may not be added",
        ),
        (
            changed(|d| d.pointer_mut(c0).unwrap()["ports"][0]["hostPort"] = json!(27017)),
            "hostPort is not allowed",
        ),
        (
            changed(|d| {
                d.pointer_mut(pod).unwrap()["volumes"] =
                    json!([{"name": "root", "hostPath": {"path": "/"}}])
            }),
            "root: hostPath volumes",
        ),
        (
            changed(|d| {
                d.pointer_mut(pod).unwrap()["securityContext"] =
                    json!({"sysctls": [{"name": "kernel.msgmax", "value": "1"}]})
            }),
            "kernel.msgmax is not a safe sysctl",
        ),
        (
            changed(|d| {
                d.pointer_mut(c0).unwrap()["securityContext"]["procMount"] = json!("Unmasked")
            }),
            "procMount",
        ),
        (
            changed(|d| {
                d.pointer_mut(c0).unwrap()["securityContext"]["seccompProfile"] =
                    json!({"type": "Unconfined"})
            }),
            "seccompProfile.type Unconfined",
        ),
        (
            changed(|d| {
                d.pointer_mut(pod).unwrap()["securityContext"] =
                    json!({"seLinuxOptions": {"type": "spc_t"}})
            }),
            "seLinuxOptions.type spc_t",
        ),
        (
            changed(|d| {
                d.pointer_mut(pod).unwrap()["securityContext"] =
                    json!({"seLinuxOptions": {"user": "system_u"}})
            }),
            "seLinuxOptions.user and role",
        ),
        (
            changed(|d| {
                d.pointer_mut(c0).unwrap()["securityContext"]["appArmorProfile"] =
                    json!({"type": "Unconfined"})
            }),
            "appArmorProfile.type Unconfined",
        ),
        (
            changed(|d| {
                d.pointer_mut(pod).unwrap()["securityContext"] =
                    json!({"windowsOptions": {"hostProcess": true}})
            }),
            "hostProcess",
        ),
        (
            changed(|d| {
                d.pointer_mut("/spec/template/metadata").unwrap()["annotations"] = json!({
                    "container.apparmor.security.beta.kubernetes.io/proxy": "unconfined"
                })
            }),
            "apparmor.security.beta.kubernetes.io/proxy unconfined",
        ),
        (
            changed(
                |d| d.pointer_mut(pod).unwrap()["initContainers"] = json!([{"name": "setup", "image": format!("{PROXY}:0.2.0"), "securityContext": {"privileged": true}}]),
            ),
            "initContainers setup securityContext: privileged",
        ),
        (
            changed(|d| d.pointer_mut(pod).unwrap()["serviceAccountName"] = json!("nexo-manager")),
            "serviceAccountName nexo-manager",
        ),
        (
            changed(|d| d.pointer_mut(pod).unwrap()["serviceAccount"] = json!("admin")),
            "serviceAccount admin",
        ),
        (
            changed(|d| d.pointer_mut(c0).unwrap()["image"] = json!("evil.example.com/miner:1")),
            "image repository evil.example.com/miner is not allowed",
        ),
        (
            changed(|d| {
                d.pointer_mut(pod).unwrap()["initContainers"] =
                    json!([{"name": "fetch", "image": "busybox"}])
            }),
            "initContainers fetch: image repository busybox",
        ),
    ];
    for (object, want) in cases {
        let got = check(&Policy::default(), vec![object]).unwrap_err();
        assert!(got.starts_with("policy: Deployment shop/billing"), "{got}");
        assert!(got.contains(want), "{got}\n  should name: {want}");
    }
}

#[test]
fn restricted_adds_its_own_rules() {
    let restricted = Policy {
        pod_security: PodSecurity::Restricted,
        ..Policy::default()
    };
    let err = check(&restricted, vec![legacy_deployment()]).unwrap_err();
    assert!(
        err.contains("allowPrivilegeEscalation must be false"),
        "{err}"
    );
    let hardened = changed(|d| {
        let pod = d.pointer_mut("/spec/template/spec").unwrap();
        pod["securityContext"] = json!({"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}});
        pod["containers"][0]["securityContext"] = json!({"allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}});
    });
    assert_eq!(check(&restricted, vec![hardened.clone()]), Ok(()));
    assert_eq!(check(&Policy::default(), vec![hardened.clone()]), Ok(()));
    let c0 = "/spec/template/spec/containers/0/securityContext";
    for (change, want) in [
        (json!({"runAsNonRoot": false}), "runAsNonRoot must be true"),
        (json!({"runAsUser": 0}), "runAsUser 0"),
        (
            json!({"capabilities": {"drop": []}}),
            "drop must include ALL",
        ),
        (
            json!({"capabilities": {"drop": ["ALL"], "add": ["CHOWN"]}}),
            "only NET_BIND_SERVICE",
        ),
        (json!({"seccompProfile": {"type": null}}), ""),
    ] {
        let mut object = hardened.clone();
        let sc = object.pointer_mut(c0).unwrap();
        for (k, v) in change.as_object().unwrap() {
            sc[k] = v.clone();
        }
        let got = check(&restricted, vec![object]);
        if want.is_empty() {
            assert_eq!(got, Ok(()), "the pod's seccomp profile is inherited");
        } else {
            let got = got.unwrap_err();
            assert!(got.contains(want), "{got}\n  should name: {want}");
        }
    }
    let mut nfs = hardened;
    nfs.pointer_mut("/spec/template/spec").unwrap()["volumes"] =
        json!([{"name": "data", "nfs": {"server": "s", "path": "/"}}]);
    let got = check(&restricted, vec![nfs.clone()]).unwrap_err();
    assert!(got.contains("data: nfs volumes are not allowed"), "{got}");
    assert_eq!(
        check(&Policy::default(), vec![nfs]),
        Ok(()),
        "baseline allows nfs"
    );
}

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

    let service = |spec: Value| json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc"}, "spec": spec});
    assert_eq!(
        check(&p, vec![service(json!({"ports": [{"port": 1}]}))]),
        Ok(())
    );
    assert_eq!(
        check(&p, vec![service(json!({"clusterIP": "None"}))]),
        Ok(()),
        "headless"
    );
    for t in ["LoadBalancer", "NodePort"] {
        let err = check(&p, vec![service(json!({"type": t}))]).unwrap_err();
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
