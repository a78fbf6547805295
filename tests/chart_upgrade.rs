//! The chart over time, with real installs: `helm upgrade` brings a
//! release's CRD changes and `helm uninstall` keeps the CRDs (on a test bed
//! of this test's own: CRDs are the cluster's); the way from 0.3.0, whose
//! CRDs Helm installed from crds/ and never owned; after the Manager
//! upgraded itself, a `helm upgrade` with Helm 3 (client-side three-way
//! merge) or Helm 4 (server-side apply) neither fails nor takes it back,
//! and a newer chart still upgrades it; the chart as the subchart of an
//! umbrella chart, with the ServiceMonitor against prometheus-operator's
//! own CRDs and a NetworkPolicy.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use nexo_cpsim::{SimConfig, Simulator};
use serde_json::{Value, json};
use support::chart::{
    CHART, VERSION, chart_at, command, exists, heartbeat_after, helm_with, install_monitoring_crds,
    next_patch, send, start_as_installed,
};
use support::{OwnBed, Testbed, run_ok_with_input as ok, run_with_input as run, testbed};

const CRDS: [&str; 2] = ["nexoproxies.nexo.io", "nexopipelines.nexo.io"];

fn crd_path(name: &str) -> String {
    format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
}

/// A folder of this test binary's own.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The chart as 0.3.0 laid it out: the CRDs in crds/, which Helm installs
/// with the first release and then never upgrades nor owns.
fn chart_of_0_3_0_layout() -> PathBuf {
    let dir = chart_at("0.3.0-crds");
    std::fs::rename(dir.join("files/crds"), dir.join("crds")).unwrap();
    std::fs::remove_file(dir.join("templates/crds.yaml")).unwrap();
    dir
}

#[test]
fn helm_upgrade_brings_a_changed_crd_and_uninstall_keeps_the_crds() {
    let bed = OwnBed::start("chart-crds", &[]);
    let tb = bed.tb;
    let ns = tb.namespace("crds");
    let helm = |args: &[&str]| {
        let mut c = helm_with(tb, &tb.helm);
        c.args(args).args(["--namespace", &ns.name]);
        c
    };
    let token = "connectToken.value=nexo_ct_env-crds_abcdefghijklmnopqrstuvwxyzABCDEF0123";

    // A 0.3.0 install: its CRDs came from crds/, without Helm's ownership.
    let old = chart_of_0_3_0_layout();
    ok(
        helm(&["install", "nm"]).arg(&old).args(["--set", token]),
        None,
    );
    for crd in CRDS {
        let live: Value = tb.admin().get(&crd_path(crd)).unwrap();
        assert!(
            live["metadata"]["labels"]["app.kubernetes.io/managed-by"].is_null(),
            "{live}"
        );
    }
    // Upgraded as is, Helm refuses to take over CRDs it does not own, and
    // changes nothing.
    let out = run(&mut helm(&["upgrade", "nm", CHART, "--set", token]), None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("invalid ownership metadata"),
        "an upgrade over CRDs Helm does not own: {}\n{stderr}",
        out.status
    );
    // CHANGELOG.md's upgrade note: the CRDs marked as the release's first.
    for crd in CRDS {
        ok(
            tb.kubectl_cmd()
                .args(["label", "crd", crd, "app.kubernetes.io/managed-by=Helm"]),
            None,
        );
        ok(
            tb.kubectl_cmd().args([
                "annotate",
                "crd",
                crd,
                "meta.helm.sh/release-name=nm",
                &format!("meta.helm.sh/release-namespace={}", ns.name),
            ]),
            None,
        );
    }
    ok(&mut helm(&["upgrade", "nm", CHART, "--set", token]), None);
    for crd in CRDS {
        let live: Value = tb.admin().get(&crd_path(crd)).unwrap();
        assert_eq!(
            live["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
            "{live}"
        );
        assert_eq!(
            live["metadata"]["labels"]["app.kubernetes.io/version"], VERSION,
            "{live}"
        );
    }

    // The next release changes a CRD: a new field and printer column.
    let next = chart_at(&next_patch(VERSION));
    let file = next.join("files/crds/nexoproxies.nexo.io.yaml");
    let text = std::fs::read_to_string(&file).unwrap();
    let changed = text.replacen(
        "additionalPrinterColumns:\n",
        "additionalPrinterColumns:\n        - name: Tier\n          type: string\n          jsonPath: .spec.tier\n",
        1,
    );
    assert_ne!(
        text, changed,
        "the CRD has additionalPrinterColumns to add to"
    );
    std::fs::write(&file, changed).unwrap();
    ok(
        helm(&["upgrade", "nm"]).arg(&next).args(["--set", token]),
        None,
    );
    let live: Value = tb.admin().get(&crd_path(CRDS[0])).unwrap();
    let columns = &live["spec"]["versions"][0]["additionalPrinterColumns"];
    assert!(
        columns
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == "Tier"),
        "helm upgrade brought the changed CRD: {columns}"
    );

    // A NexoProxy, then helm uninstall: the CRDs and the NexoProxy stay.
    let proxy = json!({"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy",
        "metadata": {"name": "orders"},
        "spec": {"image": "registry.example.com/nexo/proxy:1.4.2", "mongodb": {"secretRef": {"name": "db"}}}});
    let proxies = format!("/apis/nexo.io/v1alpha1/namespaces/{}/nexoproxies", ns.name);
    tb.admin().create(&proxies, &proxy).unwrap();
    let out = ok(&mut helm(&["uninstall", "nm"]), None);
    assert!(out.contains("kept due to the resource policy"), "{out}");
    for crd in CRDS {
        assert!(
            exists(tb, &crd_path(crd)),
            "{crd} is gone after helm uninstall"
        );
    }
    assert!(
        exists(tb, &format!("{proxies}/orders")),
        "the NexoProxy is gone"
    );
    assert!(!exists(
        tb,
        &format!(
            "/apis/apps/v1/namespaces/{}/deployments/nm-nexo-manager",
            ns.name
        )
    ));
}

/// The Manager's Deployment as the API server has it.
fn deployment(tb: &Testbed, ns: &str, name: &str) -> Value {
    tb.admin()
        .get(&format!("/apis/apps/v1/namespaces/{ns}/deployments/{name}"))
        .unwrap()
}

/// The manager container's image and NEXO_BUNDLE_VERSION.
fn running(d: &Value) -> (String, String) {
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    let bundle = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "NEXO_BUNDLE_VERSION")
        .and_then(|e| e["value"].as_str())
        .unwrap_or_default()
        .to_owned();
    (c["image"].as_str().unwrap().to_owned(), bundle)
}

fn image(digit: char) -> String {
    format!(
        "registry.example.com/nexo/manager@sha256:{}",
        digit.to_string().repeat(64)
    )
}

/// Installs the chart with `helm_bin`, upgrades the Manager through the
/// Control Plane, then runs `helm upgrade` with the same chart (the
/// Manager stays upgraded) and with a newer one (the chart's image wins).
fn self_upgrade_then_helm_upgrade(helm_bin: &Path, label: &str) {
    let tb = testbed();
    let sim = Arc::new(Simulator::start(SimConfig::default()));
    let env_id = format!("env-{label}-{}", std::process::id());
    let token = sim.add_environment(&env_id);
    let dir = scratch(label);
    sim.write_ca(&dir.join("cp-ca.pem"));
    let ns = tb.namespace(label);
    // A release name of each Helm's own: the two tests run side by side,
    // and ClusterRoles are named after the release.
    let release = format!("su-{label}");
    let name = format!("{release}-nexo-manager");
    let name = name.as_str();
    let values = [
        format!("connectToken.value={token}"),
        format!("controlPlane.url={}", sim.url()),
        "heartbeatInterval=1s".to_owned(),
        "crds.install=false".to_owned(),
    ];
    let helm = |verb: &str, chart: &Path, extra: &[&str]| {
        let mut c = helm_with(tb, helm_bin);
        c.args([verb, &release])
            .arg(chart)
            .args(["--namespace", &ns.name]);
        for v in &values {
            c.args(["--set", v]);
        }
        c.args(extra);
        ok(&mut c, None)
    };
    helm(
        "install",
        Path::new(CHART),
        &["--set", &format!("image.digest=sha256:{}", "1".repeat(64))],
    );
    let installed = deployment(tb, &ns.name, name);
    assert_eq!(running(&installed), (image('1'), VERSION.to_owned()));
    let managers: Vec<String> = installed["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            format!(
                "{} {}",
                e["manager"].as_str().unwrap(),
                e["operation"].as_str().unwrap()
            )
        })
        .collect();
    eprintln!("{label}: installed with field managers {managers:?}");
    if label == "helm4" {
        assert!(
            managers.contains(&"helm Apply".to_owned()),
            "Helm 4 applies server-side: {managers:?}"
        );
    }

    // The Control Plane upgrades the Manager to the next bundle: a
    // pre-release of it with Helm 3 (newer than this chart by SemVer
    // precedence, as a plain `> 0.4.0` constraint would not say).
    let upgraded = match label {
        "helm3" => format!("{}-rc.1", next_patch(VERSION)),
        _ => next_patch(VERSION),
    };
    let mut m = start_as_installed(tb, &sim, &dir, &ns.name, name);
    heartbeat_after(&mut m, &sim, 0);
    let ack = send(
        &mut m,
        &sim,
        &env_id,
        command(
            &format!("up-{label}"),
            "upgrade",
            json!({"bundleVersion": upgraded, "managerImage": image('2')}),
        ),
    );
    m.check(
        ack["result"] == "applied",
        &format!("the self-upgrade: {ack}"),
    );
    m.stop_expecting_exit_0();
    assert_eq!(
        running(&deployment(tb, &ns.name, name)),
        (image('2'), upgraded.clone())
    );

    // helm upgrade with the installed chart: no failure, no way back.
    helm(
        "upgrade",
        Path::new(CHART),
        &["--set", &format!("image.digest=sha256:{}", "1".repeat(64))],
    );
    assert_eq!(
        running(&deployment(tb, &ns.name, name)),
        (image('2'), upgraded.clone()),
        "{label}: helm upgrade with an older chart kept the self-upgraded Manager"
    );

    // The operator's way back, whatever bundle the CP recorded: self-upgrade
    // off, the chart's image.
    helm(
        "upgrade",
        Path::new(CHART),
        &[
            "--set",
            &format!("image.digest=sha256:{}", "1".repeat(64)),
            "--set",
            "selfUpgrade=false",
        ],
    );
    assert_eq!(
        running(&deployment(tb, &ns.name, name)),
        (image('1'), VERSION.to_owned()),
        "{label}: helm upgrade with selfUpgrade=false installed the chart's Manager"
    );

    // A newer chart than the self-upgrade: its Manager.
    let newer = next_patch(&next_patch(VERSION));
    let chart = chart_at(&newer);
    helm(
        "upgrade",
        &chart,
        &["--set", &format!("image.digest=sha256:{}", "3".repeat(64))],
    );
    assert_eq!(
        running(&deployment(tb, &ns.name, name)),
        (image('3'), newer),
        "{label}: helm upgrade with a newer chart upgraded the Manager"
    );
    let mut c = helm_with(tb, helm_bin);
    ok(
        c.args(["uninstall", &release, "--namespace", &ns.name]),
        None,
    );
}

#[test]
fn after_a_self_upgrade_helm_3_upgrade_neither_fails_nor_downgrades() {
    let tb = testbed();
    self_upgrade_then_helm_upgrade(&tb.helm3, "helm3");
}

#[test]
fn after_a_self_upgrade_helm_4_upgrade_neither_fails_nor_downgrades() {
    let tb = testbed();
    self_upgrade_then_helm_upgrade(&tb.helm, "helm4");
}

#[test]
fn the_chart_installs_as_a_subchart_of_an_umbrella_chart() {
    let tb = testbed();
    install_monitoring_crds(tb);
    let ns = tb.namespace("umbrella");
    let dir = scratch("umbrella");
    std::fs::write(
        dir.join("Chart.yaml"),
        format!(
            "apiVersion: v2\nname: nexo-env\nversion: 1.0.0\ndependencies:\n  - name: nexo-manager\n    version: \"{VERSION}\"\n    repository: \"file://{CHART}\"\n"
        ),
    )
    .unwrap();
    // What an umbrella passes: `global` to every subchart, and the
    // subchart's own values under its name.
    std::fs::write(
        dir.join("values.yaml"),
        "global:\n  imageRegistry: mirror.example.com\n  storageClass: fast\nnexo-manager:\n  connectToken:\n    value: nexo_ct_env-umbrella_abcdefghijklmnopqrstuvwxyzABCDEF0123\n  crds:\n    install: false\n  metrics:\n    serviceMonitor:\n      enabled: true\n  networkPolicy:\n    enabled: true\n    controlPlaneCIDRs: [203.0.113.0/24]\n    apiServer:\n      cidrs: [192.0.2.10/32]\n      port: 6443\n",
    )
    .unwrap();
    let helm = || helm_with(tb, &tb.helm);
    ok(helm().args(["dependency", "update"]).arg(&dir), None);
    ok(
        helm()
            .args(["install", "env"])
            .arg(&dir)
            .args(["--namespace", &ns.name]),
        None,
    );
    let base = format!("/namespaces/{}", ns.name);
    assert!(exists(
        tb,
        &format!("/apis/apps/v1{base}/deployments/env-nexo-manager")
    ));
    // The ServiceMonitor, taken by prometheus-operator's own CRD.
    let sm: Value = tb
        .admin()
        .get(&format!(
            "/apis/monitoring.coreos.com/v1{base}/servicemonitors/env-nexo-manager"
        ))
        .unwrap();
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "metrics", "{sm}");
    // The NetworkPolicy, with the API server's endpoints as given (this
    // test bed publishes none; tests/node.rs reads them at install).
    let np: Value = tb
        .admin()
        .get(&format!(
            "/apis/networking.k8s.io/v1{base}/networkpolicies/env-nexo-manager"
        ))
        .unwrap();
    assert_eq!(
        np["spec"]["egress"][1]["to"][0]["ipBlock"]["cidr"], "192.0.2.10/32",
        "{np}"
    );
    assert_eq!(np["spec"]["egress"][1]["ports"][0]["port"], 6443, "{np}");
    ok(
        helm().args(["uninstall", "env", "--namespace", &ns.name]),
        None,
    );
}
