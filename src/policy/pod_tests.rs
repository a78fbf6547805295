//! The legacy Deployment's pod template, judged as plain values.

use super::*;

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
            "field not allowed: spec.template.spec.hostNetwork",
        ),
        (
            changed(|d| d.pointer_mut(pod).unwrap()["hostPID"] = json!(true)),
            "field not allowed: spec.template.spec.hostPID",
        ),
        (
            changed(|d| d.pointer_mut(pod).unwrap()["hostIPC"] = json!(true)),
            "field not allowed: spec.template.spec.hostIPC",
        ),
        (
            changed(|d| d.pointer_mut(c0).unwrap()["securityContext"]["privileged"] = json!(true)),
            "containers[0].securityContext: privileged",
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
            "field not allowed: spec.template.spec.volumes[0].hostPath",
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
            "field not allowed: spec.template.spec.securityContext.windowsOptions",
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
            "initContainers[0].securityContext: privileged",
        ),
        (
            changed(|d| d.pointer_mut(pod).unwrap()["serviceAccountName"] = json!("nexo-manager")),
            "serviceAccountName: nexo-manager",
        ),
        (
            changed(|d| d.pointer_mut(pod).unwrap()["serviceAccount"] = json!("admin")),
            "serviceAccount: admin",
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
            "initContainers[0].image: image repository busybox",
        ),
    ];
    for (object, want) in cases {
        let got = check(&Policy::default(), vec![object]).unwrap_err();
        assert!(
            got.starts_with("policy: Deployment shop/billing")
                || (got.starts_with("policy: field not allowed: ")
                    && got.ends_with("(Deployment shop/billing)")),
            "{got}"
        );
        assert!(got.contains(want), "{got}\n  should name: {want}");
    }
}

/// What Kubernetes added since the denylist was written, and what a
/// denylist missed: each refused by its path, in both profiles.
#[test]
fn the_pod_template_is_an_allowlist() {
    let pod = "/spec/template/spec";
    let c0 = "/spec/template/spec/containers/0";
    let cases: Vec<(Value, &str)> = vec![
        (
            changed(|d| {
                d.pointer_mut(pod).unwrap()["volumes"] =
                    json!([{"name": "img", "image": {"reference": "evil.example.com/x:1"}}])
            }),
            "field not allowed: spec.template.spec.volumes[0].image",
        ),
        (
            changed(|d| {
                d.pointer_mut(pod).unwrap()["volumes"] = json!([{"name": "tok", "projected": {"sources": [
                    {"serviceAccountToken": {"audience": "vault", "path": "t"}}]}}])
            }),
            "field not allowed: spec.template.spec.volumes[0].projected",
        ),
        (
            changed(|d| {
                d.pointer_mut(pod).unwrap()["volumes"] =
                    json!([{"name": "c", "csi": {"driver": "secrets-store.csi.k8s.io"}}])
            }),
            "field not allowed: spec.template.spec.volumes[0].csi",
        ),
        (
            changed(|d| {
                d.pointer_mut(pod).unwrap()["volumes"] =
                    json!([{"name": "c", "emptyDir": {}, "secret": {"secretName": "x"}}])
            }),
            "exactly one of",
        ),
        (
            changed(|d| {
                d.pointer_mut(pod).unwrap()["ephemeralContainers"] =
                    json!([{"name": "debug", "image": format!("{PROXY}:0.2.0")}])
            }),
            "field not allowed: spec.template.spec.ephemeralContainers",
        ),
        (
            changed(|d| d.pointer_mut(pod).unwrap()["nodeName"] = json!("control-plane")),
            "field not allowed: spec.template.spec.nodeName",
        ),
        (
            changed(|d| d.pointer_mut(pod).unwrap()["runtimeClassName"] = json!("unsafe")),
            "field not allowed: spec.template.spec.runtimeClassName",
        ),
        (
            changed(|d| d.pointer_mut(pod).unwrap()["hostUsers"] = json!(false)),
            "field not allowed: spec.template.spec.hostUsers",
        ),
        (
            changed(|d| d.pointer_mut(pod).unwrap()["automountServiceAccountToken"] = json!(true)),
            "automountServiceAccountToken: only false",
        ),
        (
            changed(|d| d.pointer_mut(c0).unwrap()["ports"][0]["hostPort"] = json!(80.0)),
            "hostPort is not allowed",
        ),
        (
            changed(|d| d.pointer_mut(c0).unwrap()["ports"][0]["hostPort"] = json!("80")),
            "hostPort is not allowed",
        ),
        (
            changed(|d| d.pointer_mut(c0).unwrap()["ports"][0]["hostIP"] = json!("0.0.0.0")),
            "hostIP is not allowed",
        ),
        (
            changed(|d| {
                d.pointer_mut(c0).unwrap()["securityContext"]["privileged"] = json!("true")
            }),
            "privileged: not a boolean",
        ),
        (
            changed(|d| {
                d.pointer_mut(c0).unwrap()["readinessProbe"] =
                    json!({"httpGet": {"host": "169.254.169.254", "path": "/", "port": 80}})
            }),
            "field not allowed: spec.template.spec.containers[0].readinessProbe.httpGet.host",
        ),
        (
            changed(
                |d| d.pointer_mut(c0).unwrap()["volumeMounts"] = json!([{"name": "config", "mountPath": "/c", "mountPropagation": "Bidirectional"}]),
            ),
            "field not allowed: spec.template.spec.containers[0].volumeMounts[0].mountPropagation",
        ),
        (
            changed(|d| d.pointer_mut(c0).unwrap()["resizePolicy"] = json!([])),
            "field not allowed: spec.template.spec.containers[0].resizePolicy",
        ),
        (
            changed(|d| d.pointer_mut(pod).unwrap()["dnsPolicy"] = json!("None")),
            "dnsPolicy: None is not allowed",
        ),
        (
            changed(|d| {
                d.pointer_mut("/spec").unwrap()["template"]["metadata"]["name"] = json!("x")
            }),
            "field not allowed: spec.template.metadata.name",
        ),
        (
            changed(|d| d["status"] = json!({"replicas": 1})),
            "field not allowed: status",
        ),
    ];
    let restricted = Policy {
        pod_security: PodSecurity::Restricted,
        ..Policy::default()
    };
    for (object, want) in cases {
        for policy in [&Policy::default(), &restricted] {
            let got = check(policy, vec![object.clone()]).unwrap_err();
            assert!(got.contains(want), "{got}\n  should name: {want}");
        }
    }
    // A null is the field left out; it hides nothing and breaks nothing.
    let nulls = changed(|d| {
        d.pointer_mut(pod).unwrap()["hostNetwork"] = Value::Null;
        d.pointer_mut(c0).unwrap()["ports"][0]["hostPort"] = json!(0);
    });
    assert_eq!(check(&Policy::default(), vec![nulls]), Ok(()));
    // What a kubectl-written Deployment carries is allowed.
    let written = changed(|d| {
        let p = d.pointer_mut(pod).unwrap();
        p["restartPolicy"] = json!("Always");
        p["dnsPolicy"] = json!("ClusterFirst");
        p["schedulerName"] = json!("default-scheduler");
        p["terminationGracePeriodSeconds"] = json!(30);
        p["securityContext"] = json!({});
        p["tolerations"] = json!([{"key": "k", "operator": "Exists"}]);
        d.pointer_mut(c0).unwrap()["terminationMessagePolicy"] = json!("File");
    });
    assert_eq!(check(&Policy::default(), vec![written]), Ok(()));
}

#[test]
fn values_are_judged_by_type_not_spelling() {
    let restricted = Policy {
        pod_security: PodSecurity::Restricted,
        ..Policy::default()
    };
    let hardened = |user: Value| {
        changed(|d| {
            let pod = d.pointer_mut("/spec/template/spec").unwrap();
            pod["securityContext"] = json!({"runAsNonRoot": true, "runAsUser": user.clone(), "seccompProfile": {"type": "RuntimeDefault"}});
            pod["containers"][0]["securityContext"] = json!({"allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"]}});
        })
    };
    assert_eq!(check(&restricted, vec![hardened(json!(65532))]), Ok(()));
    for zero in [json!(0), json!(0.0), json!("0")] {
        let got = check(&restricted, vec![hardened(zero.clone())]).unwrap_err();
        assert!(got.contains("runAsUser 0"), "{zero}: {got}");
    }
    let got = check(&restricted, vec![hardened(json!("root"))]).unwrap_err();
    assert!(got.contains("not an integer"), "{got}");
}

#[test]
fn references_stay_inside_the_deployment() {
    // The 0.2.0 workload names billing-db and billing-config: outside
    // the deploy, to be checked against the cluster.
    let d = deploy_of(vec![legacy_deployment()]);
    let outside = Policy::default()
        .walk_deploy(&d.manifests, &proxy_image())
        .unwrap()
        .outside;
    let named: Vec<(Kind, &str, &str)> = outside
        .iter()
        .map(|(_, r)| (r.kind, r.name.as_str(), r.at.as_str()))
        .collect();
    assert_eq!(
        named,
        vec![
            (
                Kind::ConfigMap,
                "billing-config",
                "spec.template.spec.volumes[0].configMap.name"
            ),
            (
                Kind::Secret,
                "billing-db",
                "spec.template.spec.containers[0].env[0].valueFrom.secretKeyRef.name"
            ),
        ]
    );
    // Carried by the deploy: nothing left to check.
    let config =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "billing-config"}});
    let db = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "billing-db"}});
    let d = deploy_of(vec![legacy_deployment(), config, db]);
    assert!(
        Policy::default()
            .walk_deploy(&d.manifests, &proxy_image())
            .unwrap()
            .outside
            .is_empty()
    );
    // envFrom and secret volumes are references too.
    let more = changed(|d| {
        let pod = d.pointer_mut("/spec/template/spec").unwrap();
        pod["containers"][0]["envFrom"] = json!([{"secretRef": {"name": "nexo-connect-token"}}]);
        pod["volumes"] = json!([{"name": "keys", "secret": {"secretName": "nexo-command-keys"}}]);
    });
    let d = deploy_of(vec![more]);
    let outside = Policy::default()
        .walk_deploy(&d.manifests, &proxy_image())
        .unwrap()
        .outside;
    let names: Vec<&str> = outside.iter().map(|(_, r)| r.name.as_str()).collect();
    assert_eq!(
        names,
        ["nexo-command-keys", "billing-db", "nexo-connect-token"]
    );
    let (manifest, r) = &outside[0];
    let refused = r.refused(manifest, "is not this deployment's").to_string();
    assert!(
        refused.starts_with("policy: Deployment shop/billing spec.template.spec.volumes[0].secret.secretName: Secret nexo-command-keys is not this deployment's"),
        "{refused}"
    );
}

#[test]
fn the_namespace_profile_is_the_stricter_one() {
    assert_eq!(
        namespace_profile(Some("restricted")),
        PodSecurity::Restricted
    );
    for other in [None, Some("baseline"), Some("privileged"), Some("bogus")] {
        assert_eq!(namespace_profile(other), PodSecurity::Baseline, "{other:?}");
    }
    let baseline = Policy::default();
    let restricted = Policy {
        pod_security: PodSecurity::Restricted,
        ..baseline.clone()
    };
    // A baseline-only pod template passes baseline and fails restricted.
    assert_eq!(check(&baseline, vec![legacy_deployment()]), Ok(()));
    assert!(check(&restricted, vec![legacy_deployment()]).is_err());
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
    for p in [&restricted, &Policy::default()] {
        let got = check(p, vec![nfs.clone()]).unwrap_err();
        assert!(
            got.contains("field not allowed: spec.template.spec.volumes[0].nfs"),
            "{got}"
        );
    }
}

/// The permit walks a template once, at its configured profile; what a
/// namespace enforcing `restricted` refuses is what a walk at
/// `restricted` would have stopped at.
#[test]
fn one_walk_at_baseline_finds_what_restricted_refuses() {
    let restricted = Policy {
        pod_security: PodSecurity::Restricted,
        ..Policy::default()
    };
    let hardened = changed(|d| {
        let c = d.pointer_mut("/spec/template/spec/containers/0").unwrap();
        c["securityContext"] = json!({"allowPrivilegeEscalation": false, "runAsNonRoot": true,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}});
    });
    for (template, breaks) in [(legacy_deployment(), true), (hardened, false)] {
        let d = deploy_of(vec![template]);
        let walked = Policy::default()
            .walk_deploy(&d.manifests, &proxy_image())
            .unwrap();
        assert!(walked.pod_template);
        assert_eq!(
            walked.restricted.is_some(),
            breaks,
            "{:?}",
            walked.restricted
        );
        assert_eq!(
            walked.restricted,
            restricted.walk_deploy(&d.manifests, &proxy_image()).err(),
            "{:?}",
            d.manifests[0].object
        );
    }
}
