//! The Helm chart (`charts/nexo-manager/`) with the test bed's `helm`:
//! it lints; bad values fail at install and change nothing; it renders the
//! kustomize base's objects (the two must not drift); the API server takes
//! what it renders, with every option and with the values of the usual
//! chart conventions (the ServiceMonitor and PodMonitor against
//! prometheus-operator's own CRDs); the pod's UID is the platform's on
//! OpenShift; a CA bundle change restarts the pods; and installed with
//! `helm install`, the Manager runs under the chart's RBAC, heartbeats,
//! deploys and uninstalls, survives a `helm upgrade` to the next chart
//! version, and `helm uninstall` leaves the NexoProxies it deployed.
//! Upgrades over time are chart_upgrade.rs's, packaging chart_package.rs's.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use nexo_cpsim::{SimConfig, Simulator};
use serde_json::{Value, json};
use support::chart::{
    CHART, HELM_LABELS, MANIFESTS, VERSION, chart_at, command, deploy, exists, heartbeat_after,
    helm, install_monitoring_crds, next_patch, objects, send, start_as_installed, template,
    yaml_scalar,
};
use support::{run_ok_with_input as ok, run_with_input as run, testbed};

#[test]
fn helm_lint_passes_strictly() {
    let tb = testbed();
    let out = ok(
        helm(tb).args([
            "lint",
            "--strict",
            CHART,
            "--set",
            "connectToken.value=nexo_ct_lint",
        ]),
        None,
    );
    assert!(
        out.contains("1 chart(s) linted, 0 chart(s) failed"),
        "{out}"
    );
}

#[test]
fn bad_values_fail_at_install_naming_the_value_and_install_nothing() {
    let tb = testbed();
    let ns = tb.namespace("chart-bad");
    let cases: [(&[&str], &str); 26] = [
        (&[], "connectToken.value is required"),
        (&["--set", "image.digest=latest"], "/image/digest"),
        (
            &["--set", "controlPlane.url=http://cp.nexo.example"],
            "/controlPlane/url",
        ),
        (&["--set", "logFormat=xml"], "/logFormat"),
        (
            &["--set", "policy.podSecurity=privileged"],
            "/policy/podSecurity",
        ),
        (
            &["--set", "managedNamespaces={Shop_1}"],
            "/managedNamespaces/0",
        ),
        (&["--set", "heartbeatInterval=soon"], "/heartbeatInterval"),
        (&["--set", "proxyImage=proxy@md5:00"], "/proxyImage"),
        (&["--set", "replicas=2"], "replicas"),
        // Values of the usual chart conventions, checked as strictly.
        (
            &["--set", "extraEnv[0].name=NEXO_CONTROL_PLANE_URL"],
            "/extraEnv/0/name",
        ),
        (&["--set", "runAsUser=root"], "/runAsUser"),
        (&["--set", "replicaCount=-1"], "/replicaCount"),
        (&["--set", "image.tag=a b"], "/image/tag"),
        (
            &["--set", "networkPolicy.enabled=true"],
            "networkPolicy.controlPlaneCIDRs is required",
        ),
        (
            &[
                "--set",
                "metrics.serviceMonitor.enabled=true",
                "--set",
                "metrics.service.enabled=false",
            ],
            "metrics.serviceMonitor.enabled needs metrics.service.enabled",
        ),
        (&["--set", "extraEnv[0].name=RUST_LOG"], "/extraEnv/0/name"),
        (&["--set", "logLevel=info debug"], "/logLevel"),
        (&["--set", "nameOverride=Nexo_Agent"], "/nameOverride"),
        (
            &[
                "--set",
                "podDisruptionBudget.unhealthyPodEvictionPolicy=Never",
            ],
            "/podDisruptionBudget/unhealthyPodEvictionPolicy",
        ),
        // Security contexts may tighten the restricted profile, never
        // loosen it.
        (
            &["--set", "securityContext.privileged=true"],
            "/securityContext/privileged",
        ),
        (
            &["--set", "securityContext.readOnlyRootFilesystem=false"],
            "/securityContext/readOnlyRootFilesystem",
        ),
        (
            &["--set", "securityContext.capabilities.add={NET_ADMIN}"],
            "/securityContext/capabilities/add",
        ),
        (
            &["--set", "podSecurityContext.runAsUser=0"],
            "/podSecurityContext/runAsUser",
        ),
        (
            &["--set", "podSecurityContext.runAsNonRoot=false"],
            "/podSecurityContext/runAsNonRoot",
        ),
        (
            &["--set", "podSecurityContext.seccompProfile.type=Unconfined"],
            "/podSecurityContext/seccompProfile/type",
        ),
        // (Helm 4.3.2 misplaces a propertyNames error: the key names it.)
        (
            &["--set", "podLabels.b/c/d=x"],
            "invalid propertyName 'b/c/d'",
        ),
    ];
    for (i, (args, named)) in cases.iter().enumerate() {
        let mut cmd = helm(tb);
        cmd.args([
            "install",
            &format!("bad-{i}"),
            CHART,
            "--namespace",
            &ns.name,
        ]);
        if !args.is_empty() {
            cmd.args(["--set", "connectToken.value=nexo_ct_bad"]);
        }
        cmd.args(*args);
        let shown = format!("{cmd:?}");
        let out = run(&mut cmd, None);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(named),
            "{shown}: expected a failure naming {named:?}, got {}:\n{}{stderr}",
            out.status,
            String::from_utf8_lossy(&out.stdout)
        );
    }
    // Nothing was installed: no release in any status (helm 4 lists all by
    // default), no object of the chart.
    let releases = ok(helm(tb).args(["list", "--namespace", &ns.name, "-q"]), None);
    assert_eq!(releases.trim(), "", "releases left by refused installs");
    let left = ok(
        tb.kubectl_cmd().args([
            "get",
            "serviceaccounts,secrets,deployments,roles,rolebindings",
            "--namespace",
            &ns.name,
            "-l",
            "app.kubernetes.io/name=nexo-manager",
            "-o",
            "name",
        ]),
        None,
    );
    assert_eq!(left.trim(), "", "objects left by refused installs");
}

#[test]
fn the_chart_renders_the_kustomize_base_objects() {
    let tb = testbed();
    let kustomize = |dir: &str| objects(tb, &ok(tb.kubectl_cmd().args(["kustomize", dir]), None));
    // The base, its CRDs' base and its namespace: what the chart installs
    // with its defaults, but for the token Secret (made by hand beside the
    // base, by the chart from connectToken.value unless existingSecret).
    let mut base = kustomize(MANIFESTS);
    base.extend(kustomize(&format!("{MANIFESTS}/crds")));
    // The base pins the release's image by digest; the chart does when
    // image.digest is given (its default is appVersion's tag).
    let pinned = std::fs::read_to_string(format!("{MANIFESTS}/deployment.yaml"))
        .unwrap()
        .split("registry.example.com/nexo/manager@")
        .nth(1)
        .map(|rest| rest[..71].to_owned())
        .expect("the base pins the image");
    let chart = objects(
        tb,
        &template(
            tb,
            "nexo-manager",
            "nexo-system",
            &[
                "--set",
                "connectToken.existingSecret=nexo-connect-token",
                "--set",
                &format!("image.digest={pinned}"),
            ],
        ),
    );

    // The release namespace is Helm's (`helm install --create-namespace`);
    // manifests/namespace.yaml creates it with the restricted Pod Security
    // label, which the chart's NOTES.txt asks for.
    let ns = std::fs::read_to_string(format!("{MANIFESTS}/namespace.yaml")).unwrap();
    assert!(ns.contains("pod-security.kubernetes.io/enforce: restricted"));
    let notes = std::fs::read_to_string(Path::new(CHART).join("templates/NOTES.txt")).unwrap();
    assert!(notes.contains("pod-security.kubernetes.io/enforce=restricted"));

    // The base names the lease and the state Secret after
    // NEXO_SELF_DEPLOYMENT (for an overlay's namePrefix); the kubelet
    // expands them to the names the chart writes out.
    for object in base.values_mut() {
        if object["kind"] != "Deployment" {
            continue;
        }
        let mut defined = BTreeMap::new();
        for e in object["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array_mut()
            .unwrap()
        {
            if let Some(v) = e["value"].as_str() {
                let v = support::expand_env(v, &defined);
                e["value"] = json!(v);
                defined.insert(e["name"].as_str().unwrap().to_owned(), v);
            }
        }
    }

    let mut chart = chart;
    for (key, object) in chart.iter_mut() {
        let labels = object["metadata"]["labels"]
            .as_object_mut()
            .unwrap_or_else(|| panic!("{key} has no labels"));
        assert_eq!(
            labels.remove(HELM_LABELS[0]),
            Some(json!(format!("nexo-manager-{VERSION}"))),
            "{key}"
        );
        assert_eq!(labels.remove(HELM_LABELS[1]), Some(json!("Helm")), "{key}");
        if key.starts_with("CustomResourceDefinition ") {
            // The base's files, with the release's labels, and kept by
            // helm uninstall.
            for label in ["app.kubernetes.io/instance", "app.kubernetes.io/version"] {
                assert!(labels.remove(label).is_some(), "{key}: {label}");
            }
            let annotations = object["metadata"]
                .as_object_mut()
                .unwrap()
                .remove("annotations");
            assert_eq!(
                annotations,
                Some(json!({"helm.sh/resource-policy": "keep"})),
                "{key}"
            );
        }
    }

    let base_keys: Vec<_> = base.keys().collect();
    let chart_keys: Vec<_> = chart.keys().collect();
    assert_eq!(base_keys, chart_keys, "the two render different objects");
    for (key, b) in &base {
        let c = &chart[key];
        assert!(
            b == c,
            "{key} differs:\nkustomize base:\n{}\nchart:\n{}",
            serde_json::to_string_pretty(b).unwrap(),
            serde_json::to_string_pretty(c).unwrap()
        );
    }
}

#[test]
fn the_api_server_takes_what_the_chart_renders_with_every_option() {
    let tb = testbed();
    let release_ns = tb.namespace("chart-dry");
    let shop = tb.namespace("chart-shop");
    let billing = tb.namespace("chart-billing");
    let ca =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chart-ca-{}.pem", std::process::id()));
    Simulator::start(SimConfig::default()).write_ca(&ca);
    let ca_arg = format!("controlPlane.caBundle={}", ca.display());
    let rendered = template(
        tb,
        "dry",
        &release_ns.name,
        &[
            "--set",
            "connectToken.existingSecret=my-token",
            "--set",
            &format!("managedNamespaces={{{},{}}}", shop.name, billing.name),
            "--set",
            "commandKeys.keys=cp-2026 AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
            "--set",
            "policy.allowedImageRepositories={mirror.example.com/nexo/proxy}",
            "--set",
            "policy.managerImageRepository=mirror.example.com/nexo/manager",
            "--set",
            "policy.allowExternalServices=true",
            "--set",
            "policy.podSecurity=restricted",
            "--set",
            "logFormat=json",
            "--set",
            "controlPlane.requestTimeout=20s",
            "--set-file",
            &ca_arg,
        ],
    );
    let objects = objects(tb, &rendered);
    // One RoleBinding per managed namespace, none in the release namespace.
    for ns in [&shop.name, &billing.name] {
        assert!(
            objects.contains_key(&format!("RoleBinding {ns}/dry-nexo-manager-managed")),
            "no RoleBinding in {ns}: {:?}",
            objects.keys()
        );
    }
    assert!(!objects.contains_key(&format!(
        "RoleBinding {}/dry-nexo-manager-managed",
        release_ns.name
    )));
    assert!(!objects.keys().any(|k| k.contains("nexo-connect-token")));
    let ca_map = &objects[&format!("ConfigMap {}/dry-nexo-manager-cp-ca", release_ns.name)];
    assert_eq!(
        ca_map["data"]["ca.crt"].as_str(),
        Some(std::fs::read_to_string(&ca).unwrap().as_str())
    );
    let env: BTreeMap<&str, &str> = objects[&format!(
        "Deployment {}/dry-nexo-manager",
        release_ns.name
    )]["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?, e["value"].as_str()?)))
        .collect();
    let names = format!("{},{}", shop.name, billing.name);
    for (var, want) in [
        ("NEXO_NAMESPACES", names.as_str()),
        (
            "NEXO_ALLOWED_IMAGE_REPOSITORIES",
            "mirror.example.com/nexo/proxy",
        ),
        (
            "NEXO_MANAGER_IMAGE_REPOSITORY",
            "mirror.example.com/nexo/manager",
        ),
        ("NEXO_ALLOW_EXTERNAL_SERVICES", "true"),
        ("NEXO_POD_SECURITY", "restricted"),
        ("NEXO_LOG_FORMAT", "json"),
        ("NEXO_CP_REQUEST_TIMEOUT", "20s"),
        ("NEXO_CONTROL_PLANE_CA_FILE", "/var/run/nexo-cp-ca/ca.crt"),
        ("NEXO_BUNDLE_VERSION", VERSION),
        ("NEXO_SELF_DEPLOYMENT", "dry-nexo-manager"),
        ("NEXO_STATE_SECRET", "dry-nexo-manager-state"),
    ] {
        assert_eq!(env.get(var).copied(), Some(want), "{var} in {env:?}");
    }
    assert_the_api_server_takes(tb, &rendered, objects.len());
}

/// `kubectl apply --dry-run=server` of `rendered` accepts each of its
/// `count` objects.
fn assert_the_api_server_takes(tb: &support::Testbed, rendered: &str, count: usize) {
    let out = ok(
        tb.kubectl_cmd()
            .args(["apply", "--dry-run=server", "-f", "-"]),
        Some(rendered.as_bytes()),
    );
    let accepted = out
        .lines()
        .filter(|l| l.ends_with("(server dry run)"))
        .count();
    assert_eq!(accepted, count, "kubectl apply --dry-run=server:\n{out}");
}

#[test]
fn the_values_users_reach_for_render_and_the_api_server_takes_them() {
    let tb = testbed();
    install_monitoring_crds(tb);
    let ns = tb.namespace("chart-conv");
    let rendered = template(
        tb,
        "conv",
        &ns.name,
        &[
            "--set",
            "connectToken.existingSecret=my-token",
            "--set",
            "global.imageRegistry=mirror.example.com",
            "--set",
            "crds.install=false",
            "--set",
            "image.digest=",
            "--set",
            "replicaCount=2",
            "--set",
            "selfUpgrade=false",
            "--set",
            "podAnnotations.team/owner=db",
            "--set",
            "podLabels.team=db",
            "--set",
            "imagePullSecrets[0].name=regcred",
            // (--set would split the filter at its comma.)
            "--set-json",
            r#"logLevel="info,nexo_manager::kube=debug""#,
            "--set",
            "image.tag=0.4.0-mirror.1",
            "--set-json",
            r#"global.imagePullSecrets=["shared-cred",{"name":"regcred"}]"#,
            "--set",
            "podDisruptionBudget.minAvailable=1",
            "--set-json",
            r#"podSecurityContext={"fsGroup":65532,"supplementalGroups":[4000]}"#,
            "--set-json",
            r#"securityContext={"seLinuxOptions":{"type":"container_t"},"capabilities":{"drop":["ALL","NET_RAW"]}}"#,
            "--set-json",
            r#"extraEnv=[{"name":"NO_PROXY","value":".svc"}]"#,
            "--set-json",
            r#"extraVolumes=[{"name":"extra-ca","configMap":{"name":"extra-ca"}}]"#,
            "--set-json",
            r#"extraVolumeMounts=[{"name":"extra-ca","mountPath":"/etc/extra-ca","readOnly":true}]"#,
            "--set",
            "serviceAccount.create=false",
            "--set",
            "serviceAccount.name=shared-sa",
            "--set",
            "priorityClassName=system-cluster-critical",
            "--set-json",
            r#"topologySpreadConstraints=[{"maxSkew":1,"topologyKey":"kubernetes.io/hostname","whenUnsatisfiable":"ScheduleAnyway","labelSelector":{"matchLabels":{"app.kubernetes.io/name":"nexo-manager"}}}]"#,
            "--set",
            "runAsUser=platform",
            "--set-string",
            "metrics.service.annotations.prometheus\\.io/scrape=true",
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "metrics.serviceMonitor.interval=30s",
            "--set",
            "metrics.serviceMonitor.labels.release=prom",
            "--set",
            "metrics.podMonitor.enabled=true",
            "--set",
            "metrics.prometheusRule.enabled=true",
            "--set",
            "metrics.grafanaDashboard.enabled=true",
            "--set",
            "networkPolicy.enabled=true",
            "--set",
            "networkPolicy.controlPlaneCIDRs={203.0.113.0/24}",
            "--set",
            "networkPolicy.apiServer.cidrs={10.0.0.1/32}",
            "--set",
            "networkPolicy.apiServer.port=6443",
            // OpenShift's DNS.
            "--set-json",
            r#"networkPolicy.dns.to=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"openshift-dns"}}}]"#,
            "--set-json",
            r#"networkPolicy.dns.ports=[{"port":5353,"protocol":"UDP"}]"#,
        ],
    );
    let objects = objects(tb, &rendered);
    let key = |kind: &str, name: &str| format!("{kind} {}/{name}", ns.name);
    let d = &objects[&key("Deployment", "conv-nexo-manager")];
    let pod = &d["spec"]["template"];
    let spec = &pod["spec"];
    let c = &spec["containers"][0];
    assert_eq!(d["spec"]["replicas"], 2);
    assert_eq!(
        c["image"], "registry.example.com/nexo/manager:0.4.0-mirror.1",
        "image.tag is used when no digest is given"
    );
    assert_eq!(pod["metadata"]["annotations"]["team/owner"], "db");
    assert_eq!(pod["metadata"]["labels"]["team"], "db");
    assert_eq!(
        pod["metadata"]["labels"]["app.kubernetes.io/name"],
        "nexo-manager"
    );
    assert_eq!(
        spec["imagePullSecrets"],
        json!([{"name": "shared-cred"}, {"name": "regcred"}]),
        "global.imagePullSecrets and imagePullSecrets, each once"
    );
    assert_eq!(spec["serviceAccountName"], "shared-sa");
    assert_eq!(spec["priorityClassName"], "system-cluster-critical");
    assert_eq!(
        spec["topologySpreadConstraints"][0]["topologyKey"],
        "kubernetes.io/hostname"
    );
    assert_eq!(
        spec["securityContext"],
        json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"},
               "fsGroup": 65532, "supplementalGroups": [4000]}),
        "the platform assigns the UID; podSecurityContext adds to the profile"
    );
    assert_eq!(
        c["securityContext"],
        json!({"allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
               "runAsNonRoot": true, "capabilities": {"drop": ["ALL", "NET_RAW"]},
               "seLinuxOptions": {"type": "container_t"}}),
        "securityContext adds to the restricted profile"
    );
    let env: BTreeMap<&str, &str> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?, e["value"].as_str()?)))
        .collect();
    assert_eq!(env.get("RUST_LOG"), Some(&"info,nexo_manager::kube=debug"));
    assert_eq!(env.get("NO_PROXY"), Some(&".svc"));
    assert_eq!(env.get("NEXO_ALLOW_SELF_UPGRADE"), Some(&"false"));
    assert!(
        spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["name"] == "extra-ca")
            && c["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["mountPath"] == "/etc/extra-ca"),
        "the extra volume and its mount: {d}"
    );
    // More than one pod: a PodDisruptionBudget, which never keeps an
    // unready pod from being evicted (a Control Plane outage makes them
    // all unready).
    let pdb = &objects[&key("PodDisruptionBudget", "conv-nexo-manager")];
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert!(pdb["spec"].get("maxUnavailable").is_none(), "{pdb}");
    assert_eq!(pdb["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow");
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"],
        "conv"
    );
    // No ServiceAccount of the chart's; the RBAC binds the one named.
    assert!(!objects.keys().any(|k| k.starts_with("ServiceAccount ")));
    assert!(
        !objects
            .keys()
            .any(|k| k.starts_with("CustomResourceDefinition "))
    );
    for (k, o) in &objects {
        if k.starts_with("RoleBinding ") || k.starts_with("ClusterRoleBinding ") {
            assert_eq!(o["subjects"][0]["name"], "shared-sa", "{k}");
        }
    }
    // The monitors select what is there, by the port names there.
    let service = &objects[&key("Service", "conv-nexo-manager-metrics")];
    assert_eq!(
        service["metadata"]["annotations"]["prometheus.io/scrape"],
        "true"
    );
    assert_eq!(service["spec"]["ports"][0]["name"], "metrics");
    let sm = &objects[&key("ServiceMonitor", "conv-nexo-manager")];
    assert_eq!(sm["metadata"]["labels"]["release"], "prom");
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "metrics");
    assert_eq!(sm["spec"]["endpoints"][0]["interval"], "30s");
    for (label, value) in sm["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(
            &service["metadata"]["labels"][label], value,
            "the ServiceMonitor selects the Service by {label}"
        );
    }
    let pm = &objects[&key("PodMonitor", "conv-nexo-manager")];
    assert_eq!(
        pm["spec"]["podMetricsEndpoints"][0]["port"],
        c["ports"][0]["name"]
    );
    for (label, value) in pm["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(
            &pod["metadata"]["labels"][label], value,
            "the PodMonitor selects the pods by {label}"
        );
    }
    // The alerts select the release's pods by the labels a scrape of them
    // carries; the dashboard is labelled for Grafana's sidecar.
    let pr = &objects[&key("PrometheusRule", "conv-nexo-manager")];
    let expr = pr["spec"]["groups"][0]["rules"][0]["expr"]
        .as_str()
        .unwrap();
    assert!(
        expr.contains(&format!(
            "namespace=\"{}\",container=\"{}\"",
            ns.name,
            c["name"].as_str().unwrap()
        )),
        "{expr}"
    );
    let cm = &objects[&key("ConfigMap", "conv-nexo-manager-dashboard")];
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    // Egress to the CP, the API server's endpoints and the cluster DNS only.
    let np = &objects[&key("NetworkPolicy", "conv-nexo-manager")];
    let egress = np["spec"]["egress"].as_array().unwrap();
    assert_eq!(egress.len(), 3, "{np}");
    assert_eq!(
        egress[0]["to"],
        json!([{"ipBlock": {"cidr": "203.0.113.0/24"}}])
    );
    assert_eq!(
        egress[0]["ports"],
        json!([{"port": 443, "protocol": "TCP"}])
    );
    assert_eq!(
        egress[1]["to"],
        json!([{"ipBlock": {"cidr": "10.0.0.1/32"}}])
    );
    assert_eq!(
        egress[1]["ports"],
        json!([{"port": 6443, "protocol": "TCP"}])
    );
    assert_eq!(
        egress[2],
        json!({"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "openshift-dns"}}}],
               "ports": [{"port": 5353, "protocol": "UDP"}]})
    );
    assert_eq!(
        np["spec"]["ingress"],
        json!([{"ports": [{"port": "probes", "protocol": "TCP"}]}])
    );

    assert_the_api_server_takes(tb, &rendered, objects.len());
}

#[test]
fn name_override_renames_the_objects_and_keeps_the_ownership_label() {
    let tb = testbed();
    let ns = tb.namespace("chart-name");
    // Release acme with `value` set besides the token.
    let render = |value: &str| {
        let args = [
            "--set",
            "connectToken.value=nexo_ct_name",
            "--set",
            "crds.install=false",
            "--set",
            value,
        ];
        template(tb, "acme", &ns.name, &args)
    };
    let rendered = render("nameOverride=mongo-agent");
    let renamed = objects(tb, &rendered);
    let key = |kind: &str, name: &str| format!("{kind} {}/{name}", ns.name);
    let d = renamed
        .get(&key("Deployment", "acme-mongo-agent"))
        .unwrap_or_else(|| panic!("no Deployment acme-mongo-agent: {:?}", renamed.keys()));
    let env: BTreeMap<&str, &str> = d["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?, e["value"].as_str()?)))
        .collect();
    for (var, want) in [
        ("NEXO_SELF_DEPLOYMENT", "acme-mongo-agent"),
        ("NEXO_LEASE_NAME", "acme-mongo-agent"),
        ("NEXO_STATE_SECRET", "acme-mongo-agent-state"),
    ] {
        assert_eq!(env.get(var), Some(&want), "{var}");
    }
    // The Manager knows its own objects by this label: it stays.
    for (k, o) in &renamed {
        if k.starts_with("CustomResourceDefinition ") {
            continue;
        }
        assert_eq!(
            o["metadata"]["labels"]["app.kubernetes.io/name"], "nexo-manager",
            "{k}"
        );
        assert!(
            !o["metadata"]["name"]
                .as_str()
                .unwrap()
                .contains("acme-nexo-manager"),
            "{k} is not renamed"
        );
    }
    // The default install has no PodDisruptionBudget (one pod); asked
    // for, it allows evicting an unready pod.
    assert!(
        !renamed
            .keys()
            .any(|k| k.starts_with("PodDisruptionBudget "))
    );
    let with_pdb = objects(tb, &render("podDisruptionBudget.enabled=true"));
    let pdb = &with_pdb[&key("PodDisruptionBudget", "acme-nexo-manager")];
    assert_eq!(
        pdb["spec"],
        json!({"maxUnavailable": 1, "unhealthyPodEvictionPolicy": "AlwaysAllow",
               "selector": {"matchLabels": {"app.kubernetes.io/name": "nexo-manager",
                                            "app.kubernetes.io/instance": "acme"}}})
    );
    assert_the_api_server_takes(tb, &rendered, renamed.len());
}

#[test]
fn the_pods_uid_is_fixed_unless_the_platform_assigns_one() {
    let tb = testbed();
    let context = |args: &[&str]| -> Value {
        let mut all = vec!["--set", "connectToken.existingSecret=t"];
        all.extend_from_slice(args);
        let objects = objects(tb, &template(tb, "uid", "nexo-system", &all));
        objects["Deployment nexo-system/uid-nexo-manager"]["spec"]["template"]["spec"]["securityContext"].clone()
    };
    let fixed = json!({"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
                       "seccompProfile": {"type": "RuntimeDefault"}});
    let assigned = json!({"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}});
    assert_eq!(
        context(&[]),
        fixed,
        "auto, on a cluster without OpenShift's API"
    );
    assert_eq!(
        context(&["--api-versions", "security.openshift.io/v1"]),
        assigned,
        "auto, on OpenShift"
    );
    assert_eq!(
        context(&[
            "--set",
            "runAsUser=fixed",
            "--api-versions",
            "security.openshift.io/v1"
        ]),
        fixed
    );
    assert_eq!(context(&["--set", "runAsUser=platform"]), assigned);
}

#[test]
fn a_ca_bundle_change_through_helm_restarts_the_pods() {
    let tb = testbed();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let annotations = |ca: Option<&Simulator>| -> Value {
        let mut args = vec![
            "--set".to_owned(),
            "connectToken.existingSecret=t".to_owned(),
        ];
        if let Some(sim) = ca {
            let path = dir.join(format!(
                "ca-{}-{}.pem",
                std::process::id(),
                sim.addr().port()
            ));
            sim.write_ca(&path);
            args.push("--set-file".into());
            args.push(format!("controlPlane.caBundle={}", path.display()));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let objects = objects(tb, &template(tb, "ca", "nexo-system", &args));
        objects["Deployment nexo-system/ca-nexo-manager"]["spec"]["template"]["metadata"]["annotations"].clone()
    };
    let (one, two) = (
        Simulator::start(SimConfig::default()),
        Simulator::start(SimConfig::default()),
    );
    let first = annotations(Some(&one));
    let again = annotations(Some(&one));
    let second = annotations(Some(&two));
    let sum = |a: &Value| a["checksum/cp-ca"].as_str().map(str::to_owned);
    assert!(sum(&first).is_some_and(|s| s.len() == 64), "{first}");
    assert_eq!(sum(&first), sum(&again), "the same bundle, the same pods");
    assert_ne!(sum(&first), sum(&second), "another bundle, new pods");
    assert_eq!(annotations(None), Value::Null, "no bundle, no annotation");
}

#[test]
fn helm_install_upgrade_and_uninstall_with_the_manager_under_the_charts_rbac() {
    let tb = testbed();
    tb.install_crds();
    let sim = Arc::new(Simulator::start(SimConfig::default()));
    let env_id = format!("env-chart-{}", std::process::id());
    let token = sim.add_environment(&env_id);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("chart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    sim.write_ca(&dir.join("cp-ca.pem"));
    let rel = tb.namespace("chart-rel");
    let shop = tb.namespace("chart-shop");
    let name = "nm-nexo-manager";
    let values = [
        format!("connectToken.value={token}"),
        format!("controlPlane.url={}", sim.url()),
        format!("managedNamespaces={{{}}}", shop.name),
        "heartbeatInterval=1s".to_owned(),
        // The shared test bed's CRDs are no release's: the CRDs' own
        // install, upgrade and uninstall are chart_crds.rs's, on a test bed
        // of their own.
        "crds.install=false".to_owned(),
    ];
    let set = |cmd: &mut Command| {
        for v in &values {
            cmd.args(["--set", v]);
        }
    };

    // The README's command, with the simulator's URL and token.
    let mut install = helm(tb);
    install.args(["install", "nm", CHART, "--namespace", &rel.name]);
    set(&mut install);
    ok(&mut install, None);

    let mut m = start_as_installed(tb, &sim, &dir, &rel.name, name);
    let hb = heartbeat_after(&mut m, &sim, 0);
    m.check(
        hb["manager"]["version"] == VERSION
            && hb["releaseContract"]["bundleVersion"] == VERSION
            && hb["releaseContract"]["errors"] == json!([])
            && hb["releaseContract"]["crdKinds"] == json!(["NexoPipeline", "NexoProxy"])
            && hb.get("inventoryErrors").is_none(),
        &format!("the first heartbeat under the chart's RBAC: {hb}"),
    );
    let proxy = |n: &str| {
        format!(
            "/apis/nexo.io/v1alpha1/namespaces/{}/nexoproxies/{n}",
            shop.name
        )
    };
    for (cmd, want) in [
        (deploy("orders", &shop.name), "applied"),
        (
            command(
                "uninstall-orders",
                "uninstall",
                json!({"deployment": {"name": "orders", "namespace": shop.name}}),
            ),
            "applied",
        ),
        (deploy("kept", &shop.name), "applied"),
        // Outside the managed namespaces (NEXO_NAMESPACES, set by the chart): refused.
        (deploy("stray", &rel.name), "failed"),
    ] {
        let ack = send(&mut m, &sim, &env_id, cmd);
        m.check(ack["result"] == want, &format!("expected {want}: {ack}"));
    }
    m.check(
        !exists(tb, &proxy("orders")) && exists(tb, &proxy("kept")),
        "orders deployed then uninstalled, kept deployed",
    );
    m.stop_expecting_exit_0();
    let state = format!("/api/v1/namespaces/{}/secrets/{name}-state", rel.name);
    let state_before: Value = tb.admin().get(&state).unwrap();

    // helm upgrade to the next chart version, with a new image.
    let next_version = next_patch(VERSION);
    let next = chart_at(&next_version);
    let digest = format!("sha256:{}", "1".repeat(64));
    let mut upgrade = helm(tb);
    upgrade.args(["upgrade", "nm"]).arg(&next).args([
        "--namespace",
        &rel.name,
        "--set",
        &format!("image.digest={digest}"),
    ]);
    set(&mut upgrade);
    ok(&mut upgrade, None);
    let d: Value = tb
        .admin()
        .get(&format!(
            "/apis/apps/v1/namespaces/{}/deployments/{name}",
            rel.name
        ))
        .unwrap();
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"][0]["image"],
        format!("registry.example.com/nexo/manager@{digest}")
    );
    let state_after: Value = tb.admin().get(&state).unwrap();
    assert_eq!(
        state_after["data"], state_before["data"],
        "the upgrade kept the Manager's state (binding and ledger)"
    );

    let seen = sim.heartbeat_count();
    let mut m = start_as_installed(tb, &sim, &dir, &rel.name, name);
    let hb = heartbeat_after(&mut m, &sim, seen);
    m.check(
        hb["releaseContract"]["bundleVersion"] == next_version.as_str()
            && hb["deployments"]
                .as_array()
                .is_some_and(|d| d.len() == 1 && d[0]["name"] == "kept"),
        &format!("after the upgrade, the same binding and inventory, the new bundle: {hb}"),
    );
    m.stop_expecting_exit_0();

    // helm uninstall: the chart's objects go; the NexoProxies the Manager
    // deployed stay.
    ok(
        helm(tb).args(["uninstall", "nm", "--namespace", &rel.name]),
        None,
    );
    for gone in [
        format!("/apis/apps/v1/namespaces/{}/deployments/{name}", rel.name),
        format!("/api/v1/namespaces/{}/serviceaccounts/{name}", rel.name),
        format!(
            "/apis/rbac.authorization.k8s.io/v1/namespaces/{}/rolebindings/{name}-managed",
            shop.name
        ),
        format!("/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}-managed"),
        format!("/apis/rbac.authorization.k8s.io/v1/clusterroles/{name}-cluster"),
    ] {
        assert!(!exists(tb, &gone), "{gone} is left after helm uninstall");
    }
    assert!(
        exists(tb, &proxy("kept")),
        "the NexoProxy kept is gone after helm uninstall"
    );
}

#[test]
fn one_version_number_everywhere() {
    // Cargo.toml's is the one; everything else is checked against it.
    let chart = std::fs::read_to_string(Path::new(CHART).join("Chart.yaml")).unwrap();
    assert_eq!(
        yaml_scalar(&chart, "version"),
        Some(VERSION),
        "Chart.yaml version (the bundle)"
    );
    assert_eq!(
        yaml_scalar(&chart, "appVersion"),
        Some(VERSION),
        "Chart.yaml appVersion"
    );

    let tb = testbed();
    let base = objects(
        tb,
        &ok(tb.kubectl_cmd().args(["kustomize", MANIFESTS]), None),
    );
    for (key, object) in &base {
        if let Some(v) = object["metadata"]["labels"].get("app.kubernetes.io/version") {
            assert_eq!(v, VERSION, "{key}: app.kubernetes.io/version");
        }
    }
    let deployment = &base["Deployment nexo-system/nexo-manager"];
    let bundle = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "NEXO_BUNDLE_VERSION")
        .expect("the base sets NEXO_BUNDLE_VERSION");
    assert_eq!(
        bundle["value"], VERSION,
        "manifests/deployment.yaml NEXO_BUNDLE_VERSION"
    );
    assert_eq!(
        deployment["metadata"]["labels"]["app.kubernetes.io/version"],
        VERSION
    );

    let out = ok(
        Command::new(support::manager::binary()).arg("--version"),
        None,
    );
    assert!(
        out.starts_with(&format!("nexo-manager {VERSION} ")),
        "--version: {out}"
    );

    // The newest release in CHANGELOG.md is this one.
    let changelog =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("CHANGELOG.md"))
            .unwrap();
    let newest = changelog
        .lines()
        .find_map(|l| l.strip_prefix("## ["))
        .and_then(|l| l.split(']').next());
    let newest = if newest == Some("Unreleased") {
        changelog
            .lines()
            .filter_map(|l| l.strip_prefix("## ["))
            .nth(1)
            .and_then(|l| l.split(']').next())
    } else {
        newest
    };
    assert_eq!(newest, Some(VERSION), "CHANGELOG.md's newest release");
}

/// The image the bundle pins is the one the release notes name: when the
/// newest release's section of CHANGELOG.md lists its image digests (`###
/// Image`, written by tests/image/stamp-release.sh with the chart's and
/// `manifests/`' pins), its index digest is the pinned one.
#[test]
fn the_pinned_image_is_the_one_the_release_notes_name() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
    let chart = read("charts/nexo-manager/Chart.yaml");
    let pinned = chart
        .split("image: registry.example.com/nexo/manager@")
        .nth(1)
        .map(|rest| &rest[..71])
        .expect("Chart.yaml's artifacthub.io/images pins the image");
    assert!(
        read("manifests/deployment.yaml")
            .contains(&format!("registry.example.com/nexo/manager@{pinned}")),
        "manifests/deployment.yaml pins another image than Chart.yaml ({pinned})"
    );
    let changelog = read("CHANGELOG.md");
    let release = changelog
        .split("\n## [")
        .skip(1)
        .find(|s| !s.starts_with("Unreleased"))
        .expect("a release section in CHANGELOG.md");
    if let Some(image) = release.split("\n### Image\n").nth(1) {
        let index = image
            .lines()
            .find_map(|l| l.strip_prefix("- index: `"))
            .and_then(|l| l.strip_suffix('`'))
            .expect("the ### Image list names the index");
        assert_eq!(
            index, pinned,
            "CHANGELOG.md's image index vs the pinned digest"
        );
        for platform in ["linux/amd64", "linux/arm64"] {
            assert!(
                image.contains(&format!("- {platform}: `sha256:")),
                "the ### Image list names the {platform} image"
            );
        }
    }
}
