use super::*;
use crate::kube::changes::Refresh;
use serde_json::json;

fn crd(kind: &str, plural: &str, versions: Value) -> Value {
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": format!("{plural}.nexo.io"), "resourceVersion": "12", "uid": "u"},
           "spec": {"group": "nexo.io", "names": {"kind": kind, "plural": plural}, "scope": "Namespaced",
                    "versions": versions},
           "status": {"acceptedNames": {"kind": kind}}})
}

fn pipeline(kinds: Value) -> Value {
    crd(
        "NexoPipeline",
        "nexopipelines",
        json!([{"name": "v1alpha1", "served": true, "storage": true,
        "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "references": {"type": "array", "items": {"type": "object", "properties": {
                "kind": {"type": "string", "enum": kinds}, "name": {"type": "string"}}}}}}}}},
        "subresources": {"status": {}}}]),
    )
}

fn proxy() -> Value {
    crd(
        "NexoProxy",
        "nexoproxies",
        json!([{"name": "v1alpha1", "served": true, "storage": true,
        "schema": {"openAPIV3Schema": {"type": "object", "description": "Über-proxy"}}}]),
    )
}

#[test]
fn served_kinds_leave_out_subresources() {
    let lists = [json!({"groupVersion": "nexo.io/v1alpha1", "resources": [
        {"name": "nexoproxies", "kind": "NexoProxy"}, {"name": "nexoproxies/status", "kind": "NexoProxy"},
        {"name": "nexopipelines", "kind": "NexoPipeline"}]})];
    assert_eq!(
        served_kinds(&lists),
        [
            ("NexoPipeline".to_owned(), "nexopipelines".to_owned()),
            ("NexoProxy".to_owned(), "nexoproxies".to_owned())
        ]
    );
}

#[test]
fn reference_kinds_come_sorted_from_the_storage_version() {
    assert_eq!(
        reference_kinds(&pipeline(json!(["NexoProxy", "ConfigMap", "Secret"]))).unwrap(),
        ["ConfigMap", "NexoProxy", "Secret"]
    );
    assert!(reference_kinds(&proxy()).is_err());
}

#[test]
fn the_canonical_form_keeps_only_the_four_keys_sorted_and_unescaped() {
    let crds = [pipeline(json!(["NexoProxy"])), proxy()];
    let text = canonical(&crds);
    // Sorted by kind: NexoPipeline before NexoProxy; keys sorted; no
    // whitespace; "Ü" as itself; no subresources, metadata or status.
    assert!(
        text.starts_with(r#"[[{"name":"v1alpha1","schema":{"openAPIV3Schema":{"properties""#),
        "{text}"
    );
    assert!(text.contains("Über-proxy"), "{text}");
    assert!(
        !text.contains("subresources") && !text.contains("resourceVersion") && !text.contains(' ')
    );
    // Order of the input, metadata and status do not matter.
    let mut moved = proxy();
    moved["metadata"]["resourceVersion"] = json!("99");
    assert_eq!(
        fingerprint(&crds),
        fingerprint(&[moved, pipeline(json!(["NexoProxy"]))])
    );
    // The schema does.
    assert_ne!(
        fingerprint(&crds),
        fingerprint(&[pipeline(json!(["Secret"])), proxy()])
    );
    let f = fingerprint(&crds);
    assert!(f.starts_with("sha256:") && f.len() == 71, "{f}");
}

#[test]
fn the_fingerprint_of_a_known_document() {
    // `printf '[[{"name":"v1","schema":null,"served":true,"storage":true}]]' | sha256sum`
    let crds = [crd(
        "X",
        "xs",
        json!([{"name": "v1", "served": true, "storage": true}]),
    )];
    assert_eq!(
        canonical(&crds),
        r#"[[{"name":"v1","schema":null,"served":true,"storage":true}]]"#
    );
    assert_eq!(
        fingerprint(&crds),
        "sha256:193bb72b70233ccc2cd3f533e9bacdbe6835fe1543dc8fcb2d920af53e6dfc55"
    );
}

/// A reading, counted in `n`.
fn read(n: &mut i32) -> Reading {
    *n += 1;
    Reading::default()
}

#[test]
fn not_watched_a_reading_is_reused_for_five_minutes() {
    let mut cache = Cache::default();
    let now = Instant::now();
    let mut reads = 0;
    let p = Refresh::Periodic;
    cache.get(now, p, || read(&mut reads));
    cache.get(now + REFRESH - Duration::from_secs(1), p, || {
        read(&mut reads)
    });
    assert_eq!(reads, 1);
    cache.get(now + REFRESH, p, || read(&mut reads));
    assert_eq!(reads, 2);
}

#[test]
fn watched_a_reading_is_made_again_only_when_the_watch_says_the_crds_changed() {
    let mut cache = Cache::default();
    let now = Instant::now();
    let mut reads = 0;
    let quiet = Refresh::Watched { changed: false };
    cache.get(now, quiet, || read(&mut reads));
    assert_eq!(reads, 1, "read once at the start");
    cache.get(now + 100 * REFRESH, quiet, || read(&mut reads));
    assert_eq!(reads, 1, "never again at rest");
    cache.get(
        now + 100 * REFRESH,
        Refresh::Watched { changed: true },
        || read(&mut reads),
    );
    assert_eq!(reads, 2);
}
