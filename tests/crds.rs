//! The CRDs follow the API conventions users' tools rely on, on a real
//! kube-apiserver (and kube-controller-manager's HorizontalPodAutoscaler
//! controller): `kubectl explain` descriptions, `metav1.Condition`'s
//! schema, a Ready column, CEL rules where the schema cannot say it, and
//! a scale subresource an HPA can read.

mod support;

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use support::{Testbed, run_with_input, testbed, wait_for};

/// `kubectl` with `args` (and `input` on stdin): its status, stdout and
/// stderr.
fn kubectl(tb: &Testbed, args: &[&str], input: Option<&Value>) -> (bool, String, String) {
    let mut cmd: Command = tb.kubectl_cmd();
    cmd.args(args);
    let input = input.map(|v| v.to_string());
    let out = run_with_input(&mut cmd, input.as_deref().map(str::as_bytes));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn kubectl_ok(tb: &Testbed, args: &[&str], input: Option<&Value>) -> String {
    let (ok, out, err) = kubectl(tb, args, input);
    assert!(ok, "kubectl {}: {err}{out}", args.join(" "));
    out
}

/// Writes NexoProxy `name`'s status through the status subresource, as
/// the runtime does (a merge patch).
fn write_status(
    tb: &Testbed,
    namespace: &str,
    name: &str,
    status: &Value,
) -> (bool, String, String) {
    let patch = json!({"status": status}).to_string();
    let args = [
        "-n",
        namespace,
        "patch",
        "nexoproxy",
        name,
        "--subresource=status",
        "--type=merge",
        "-p",
        &patch,
    ];
    kubectl(tb, &args, None)
}

fn proxy(name: &str, spec: Value) -> Value {
    let mut spec_all = json!({"image": "registry.example.com/nexo/proxy:1.4.2",
        "replicas": 2, "mongodb": {"secretRef": {"name": format!("{name}-db")}}});
    spec_all
        .as_object_mut()
        .unwrap()
        .extend(spec.as_object().unwrap().clone());
    json!({"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy",
           "metadata": {"name": name}, "spec": spec_all})
}

fn condition(status: &str, reason: &str) -> Value {
    json!({"type": "Ready", "status": status, "reason": reason,
           "message": "2 of 2 proxy pods ready", "lastTransitionTime": "2026-12-07T10:00:00Z",
           "observedGeneration": 1})
}

#[test]
fn kubectl_explain_shows_the_descriptions() {
    let tb = testbed();
    tb.install_crds();
    let spec = kubectl_ok(tb, &["explain", "nexoproxy.spec"], None);
    for text in [
        "The proxy deployment wanted.",
        "The proxy container image",
        "The number of proxy pods",
        "The MongoDB target.",
    ] {
        assert!(
            spec.contains(text),
            "kubectl explain nexoproxy.spec: no {text:?}:\n{spec}"
        );
    }
    let conditions = kubectl_ok(tb, &["explain", "nexoproxy.status.conditions"], None);
    assert!(
        conditions.contains("metav1.Condition") && conditions.contains("lastTransitionTime"),
        "{conditions}"
    );
    let pipeline = kubectl_ok(tb, &["explain", "nexopipeline.spec.references"], None);
    assert!(
        pipeline.contains("The objects the pipeline uses"),
        "kubectl explain nexopipeline.spec.references:\n{pipeline}"
    );
}

#[test]
fn status_conditions_have_the_metav1_condition_schema_and_a_ready_column() {
    let tb = testbed();
    tb.install_crds();
    let ns = tb.namespace("crd-cond");
    let n = ns.name.as_str();
    kubectl_ok(
        tb,
        &["-n", n, "create", "-f", "-"],
        Some(&proxy("orders", json!({}))),
    );
    let write_status = |status: Value| write_status(tb, n, "orders", &status);
    // A condition without the fields metav1.Condition requires is refused,
    // naming them.
    let (ok, _, err) = write_status(
        json!({"conditions": [{"type": "Ready", "status": "True", "reason": "Running", "message": ""}]}),
    );
    assert!(!ok && err.contains("lastTransitionTime"), "{err}");
    let (ok, _, err) = write_status(json!({"conditions": [condition("True", "not a word")]}));
    assert!(!ok && err.contains("status.conditions[0].reason"), "{err}");
    // More ready than there are: the CEL rule's message.
    let (ok, _, err) = write_status(json!({"replicas": 1, "readyReplicas": 2}));
    assert!(
        !ok && err.contains("readyReplicas may not exceed replicas"),
        "{err}"
    );

    let (ok, _, err) = write_status(json!({"replicas": 2, "readyReplicas": 2,
        "conditions": [condition("True", "Running")]}));
    assert!(ok, "a full condition is taken: {err}");
    let table = kubectl_ok(tb, &["-n", n, "get", "nexoproxy", "orders"], None);
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "READY", "REASON", "REPLICAS", "AVAILABLE", "AGE"],
        "{table}"
    );
    assert_eq!(
        &row[..5],
        ["orders", "True", "Running", "2", "2"],
        "{table}"
    );
    let wide = kubectl_ok(tb, &["-n", n, "get", "nexoproxy", "-o", "wide"], None);
    assert!(
        wide.contains("registry.example.com/nexo/proxy:1.4.2"),
        "{wide}"
    );
}

#[test]
fn cel_rules_refuse_what_the_schema_cannot_say_and_store_nothing() {
    let tb = testbed();
    tb.install_crds();
    let ns = tb.namespace("crd-cel");
    let n = ns.name.as_str();
    let over = proxy(
        "over",
        json!({"resources": {"requests": {"memory": "64Mi", "cpu": "500m"},
                             "limits": {"memory": "32Mi", "cpu": 1}}}),
    );
    let (ok, _, err) = kubectl(tb, &["-n", n, "create", "-f", "-"], Some(&over));
    assert!(
        !ok && err.contains("a request may not exceed its limit"),
        "{err}"
    );
    let fits = proxy(
        "fits",
        json!({"resources": {"requests": {"memory": "32Mi", "cpu": "500m"},
                             "limits": {"memory": "64Mi", "cpu": 1}}}),
    );
    kubectl_ok(tb, &["-n", n, "create", "-f", "-"], Some(&fits));
    let twice = json!({"apiVersion": "nexo.io/v1alpha1", "kind": "NexoPipeline",
        "metadata": {"name": "twice"},
        "spec": {"references": [{"kind": "NexoProxy", "name": "fits"}, {"kind": "NexoProxy", "name": "fits"}]}});
    let (ok, _, err) = kubectl(tb, &["-n", n, "create", "-f", "-"], Some(&twice));
    assert!(!ok && err.contains("each reference once"), "{err}");
    let names = kubectl_ok(
        tb,
        &["-n", n, "get", "nexoproxies,nexopipelines", "-o", "name"],
        None,
    );
    assert_eq!(
        names.trim(),
        "nexoproxy.nexo.io/fits",
        "only the valid one stored"
    );
}

#[test]
fn a_horizontal_pod_autoscaler_reads_the_nexoproxy_scale() {
    let tb = testbed();
    tb.install_crds();
    let ns = tb.namespace("crd-hpa");
    let n = ns.name.as_str();
    kubectl_ok(
        tb,
        &["-n", n, "create", "-f", "-"],
        Some(&proxy("orders", json!({}))),
    );
    // What the runtime writes: the pods there are and their selector.
    let status =
        json!({"replicas": 2, "readyReplicas": 2, "selector": "nexo.io/deployment=orders"});
    let (ok, _, err) = write_status(tb, n, "orders", &status);
    assert!(ok, "{err}");
    let scale = kubectl_ok(
        tb,
        &[
            "get",
            "--raw",
            &format!("/apis/nexo.io/v1alpha1/namespaces/{n}/nexoproxies/orders/scale"),
        ],
        None,
    );
    let scale: Value = serde_json::from_str(&scale).unwrap();
    assert_eq!(scale["spec"]["replicas"], 2, "{scale}");
    assert_eq!(
        scale["status"]["selector"], "nexo.io/deployment=orders",
        "{scale}"
    );

    let hpa = json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "orders"},
        "spec": {"scaleTargetRef": {"apiVersion": "nexo.io/v1alpha1", "kind": "NexoProxy", "name": "orders"},
                 "minReplicas": 1, "maxReplicas": 4,
                 "metrics": [{"type": "Resource", "resource": {"name": "cpu",
                     "target": {"type": "Utilization", "averageUtilization": 80}}}]}});
    kubectl_ok(tb, &["-n", n, "create", "-f", "-"], Some(&hpa));
    // The controller got the scale (AbleToScale) and took its selector (no
    // InvalidSelector); with no metrics API on the test bed it can go no
    // further, which is what it says.
    let status = wait_for(
        Duration::from_secs(90),
        "the HPA controller's conditions",
        || {
            let hpa: Value = serde_json::from_str(&kubectl_ok(
                tb,
                &["-n", n, "get", "hpa", "orders", "-o", "json"],
                None,
            ))
            .unwrap();
            let conditions = hpa["status"]["conditions"].as_array()?.clone();
            let active = conditions.iter().find(|c| c["type"] == "ScalingActive")?;
            (active["reason"] != "").then(|| hpa["status"].clone())
        },
    );
    let conditions = status["conditions"].as_array().unwrap();
    let of = |t: &str| conditions.iter().find(|c| c["type"] == t).unwrap();
    assert_eq!(of("AbleToScale")["status"], "True", "{status}");
    assert_eq!(of("AbleToScale")["reason"], "SucceededGetScale", "{status}");
    assert_ne!(of("ScalingActive")["reason"], "InvalidSelector", "{status}");
    assert_eq!(status["currentReplicas"], 2, "{status}");
}
