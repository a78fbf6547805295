//! The release-contract inventory against the real API server, checked by
//! an independent route: the installed CRDs read with `kubectl`, reduced
//! with `jq -S -c` and hashed with `sha256sum`, as docs/protocol.md defines the
//! fingerprint.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::fixture::Fixture;

/// Runs `sh -c script` and returns its stdout, failing with its stderr.
fn sh(script: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", script])
        .stdin(Stdio::null())
        .output()
        .expect("run sh");
    assert!(
        out.status.success(),
        "{script}\nfailed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

#[test]
fn the_heartbeat_reports_the_installed_crds_as_jq_and_sha256sum_see_them() {
    for tool in ["jq", "sha256sum"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output();
        assert!(
            found.is_ok_and(|o| o.status.success()),
            "this test needs {tool} (tests/install.sh installs it)"
        );
    }
    let f = Fixture::new("release");
    f.tb.install_crds();
    let mut env = f.env();
    env.insert("NEXO_BUNDLE_VERSION".into(), "0.4.0".into());
    let mut m = f.spawn(&env);
    m.wait_until(Duration::from_secs(60), "a heartbeat", || {
        f.sim.heartbeat_count() >= 1
    });
    let hb = f.sim.heartbeats().remove(0);
    let contract = &hb["releaseContract"];

    let kubectl = format!(
        "'{}' --kubeconfig '{}'",
        f.tb.kubectl.display(),
        f.tb.kubeconfig.display()
    );
    let crds = format!("{kubectl} get crd nexoproxies.nexo.io nexopipelines.nexo.io -o json");
    let canonical = sh(&format!(
        "{crds} | jq -S -c '[.items | sort_by(.spec.names.kind)[] | [.spec.versions[] | {{name, served, storage, schema}}]]'"
    ));
    let hash = sh(&format!(
        "{crds} | jq -S -c '[.items | sort_by(.spec.names.kind)[] | [.spec.versions[] | {{name, served, storage, schema}}]]' | tr -d '\\n' | sha256sum"
    ));
    let expected = format!(
        "sha256:{}",
        hash.split_whitespace().next().unwrap_or_default()
    );
    let kinds: Value = serde_json::from_str(&sh(&format!(
        "{crds} | jq -c '[.items[].spec.names.kind] | sort'"
    )))
    .unwrap();
    let references: Value = serde_json::from_str(&sh(&format!(
        "{kubectl} get crd nexopipelines.nexo.io -o json | jq -c '[.spec.versions[] | select(.storage) | .schema.openAPIV3Schema.properties.spec.properties.references.items.properties.kind.enum[]] | sort'"
    )))
    .unwrap();
    m.check(
        contract["schemaFingerprint"] == expected.as_str(),
        &format!(
            "fingerprint {} != {expected}\ncanonical JSON by jq: {canonical}",
            contract["schemaFingerprint"]
        ),
    );
    m.check(
        contract["crdKinds"] == kinds,
        &format!("crdKinds {} != {kinds}", contract["crdKinds"]),
    );
    m.check(
        contract["pipelineReferenceKinds"] == references,
        &format!(
            "pipelineReferenceKinds {} != {references}",
            contract["pipelineReferenceKinds"]
        ),
    );
    m.check(
        contract["bundleVersion"] == "0.4.0",
        &format!("bundleVersion: {contract}"),
    );
    m.check(
        contract["errors"].as_array().is_some_and(Vec::is_empty),
        &format!("no errors: {contract}"),
    );
    m.stop_expecting_exit_0();
}
