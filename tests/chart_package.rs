//! The chart as it is published: `helm package --sign`, `helm verify` (and
//! a tampered package refused), pushed to an OCI registry (the CNCF
//! distribution registry, started here) and installed from it with
//! `helm install oci://`; Chart.yaml complete for Artifact Hub; the chart's
//! README.md exactly what helm-docs writes from values.yaml.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use support::chart::{CHART, VERSION, exists, helm, yaml_scalar};
use support::registry::Registry;
use support::{run_ok_with_input as ok, run_with_input as run, testbed};

/// A folder of this test binary's own.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A throw-away OpenPGP signing key in `dir`: its name, and the legacy
/// keyrings Helm reads (`secring.gpg`, `pubring.gpg`).
fn signing_key(dir: &Path) -> (&'static str, PathBuf, PathBuf) {
    const NAME: &str = "Nexo chart test <chart-test@nexo.example>";
    let home = dir.join("gnupg");
    std::fs::create_dir_all(&home).unwrap();
    let gpg = || {
        let mut c = Command::new("gpg");
        c.env("GNUPGHOME", &home).args([
            "--batch",
            "--pinentry-mode",
            "loopback",
            "--passphrase",
            "",
        ]);
        c
    };
    ok(
        gpg().args(["--quick-gen-key", NAME, "rsa2048", "sign", "never"]),
        None,
    );
    let secring = dir.join("secring.gpg");
    let pubring = dir.join("pubring.gpg");
    ok(
        gpg()
            .arg("--output")
            .arg(&secring)
            .args(["--export-secret-keys", NAME]),
        None,
    );
    ok(
        gpg().arg("--output").arg(&pubring).args(["--export", NAME]),
        None,
    );
    (NAME, secring, pubring)
}

#[test]
fn the_signed_package_is_verified_pushed_to_an_oci_registry_and_installed_from_it() {
    let tb = testbed();
    let dir = scratch("package");
    let (key, secring, pubring) = signing_key(&dir);
    let out = ok(
        helm(tb)
            .args(["package", "--sign", "--key", key, "--keyring"])
            .arg(&secring)
            .arg("--destination")
            .arg(&dir)
            .arg(CHART),
        None,
    );
    let package = dir.join(format!("nexo-manager-{VERSION}.tgz"));
    assert!(
        package.exists()
            && dir
                .join(format!("nexo-manager-{VERSION}.tgz.prov"))
                .exists(),
        "{out}"
    );
    let verified = ok(
        helm(tb)
            .arg("verify")
            .arg(&package)
            .arg("--keyring")
            .arg(&pubring),
        None,
    );
    assert!(
        verified.contains("Signed by: Nexo chart test"),
        "{verified}"
    );
    // The package holds the CRDs themselves (files/crds links to
    // manifests/crds in the repository) and not helm-docs' template.
    let listing = ok(Command::new("tar").arg("-tzf").arg(&package), None);
    for want in [
        "nexo-manager/files/crds/nexoproxies.nexo.io.yaml",
        "nexo-manager/README.md",
        "nexo-manager/values.schema.json",
    ] {
        assert!(
            listing.lines().any(|l| l == want),
            "{want} not in the package:\n{listing}"
        );
    }
    assert!(!listing.contains("README.md.gotmpl"), "{listing}");
    let crd = ok(
        Command::new("tar")
            .arg("-xzOf")
            .arg(&package)
            .arg("nexo-manager/files/crds/nexoproxies.nexo.io.yaml"),
        None,
    );
    assert_eq!(
        crd,
        std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/manifests/crds/nexoproxies.nexo.io.yaml"
        ))
        .unwrap()
    );

    // A package changed after signing is refused.
    let tampered = dir.join("tampered");
    std::fs::create_dir_all(&tampered).unwrap();
    let copy = tampered.join(format!("nexo-manager-{VERSION}.tgz"));
    let mut bytes = std::fs::read(&package).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&copy, bytes).unwrap();
    std::fs::copy(
        dir.join(format!("nexo-manager-{VERSION}.tgz.prov")),
        tampered.join(format!("nexo-manager-{VERSION}.tgz.prov")),
    )
    .unwrap();
    let out = run(
        helm(tb)
            .arg("verify")
            .arg(&copy)
            .arg("--keyring")
            .arg(&pubring),
        None,
    );
    assert!(
        !out.status.success(),
        "helm verify passed a tampered package:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // Pushed to the registry, with its provenance, and installed from it.
    let registry = Registry::start(&tb.registry, &dir);
    let repo = format!("oci://{}/charts", registry.addr);
    let pushed = run(
        helm(tb)
            .args(["push"])
            .arg(&package)
            .arg(&repo)
            .arg("--plain-http"),
        None,
    );
    assert!(
        pushed.status.success(),
        "helm push: {}\n{}\nregistry log:\n{}",
        pushed.status,
        String::from_utf8_lossy(&pushed.stderr),
        registry.log()
    );
    let pulled = dir.join("pulled");
    std::fs::create_dir_all(&pulled).unwrap();
    ok(
        helm(tb)
            .args([
                "pull",
                &format!("{repo}/nexo-manager"),
                "--version",
                VERSION,
                "--plain-http",
                "--verify",
                "--keyring",
            ])
            .arg(&pubring)
            .arg("--destination")
            .arg(&pulled),
        None,
    );
    assert_eq!(
        std::fs::read(pulled.join(format!("nexo-manager-{VERSION}.tgz"))).unwrap(),
        std::fs::read(&package).unwrap(),
        "the registry gave back the signed package"
    );
    let ns = tb.namespace("chart-oci");
    ok(
        helm(tb).args([
            "install",
            "oci",
            &format!("{repo}/nexo-manager"),
            "--version",
            VERSION,
            "--plain-http",
            "--namespace",
            &ns.name,
            "--set",
            "connectToken.existingSecret=nexo-connect-token",
            "--set",
            "crds.install=false",
        ]),
        None,
    );
    let d: Value = tb
        .admin()
        .get(&format!(
            "/apis/apps/v1/namespaces/{}/deployments/oci-nexo-manager",
            ns.name
        ))
        .unwrap();
    assert_eq!(
        d["metadata"]["labels"]["helm.sh/chart"],
        format!("nexo-manager-{VERSION}")
    );
    ok(
        helm(tb).args(["uninstall", "oci", "--namespace", &ns.name]),
        None,
    );
    assert!(!exists(
        tb,
        &format!(
            "/apis/apps/v1/namespaces/{}/deployments/oci-nexo-manager",
            ns.name
        )
    ));
}

#[test]
fn chart_yaml_is_complete_for_users_and_artifact_hub() {
    let chart = std::fs::read_to_string(Path::new(CHART).join("Chart.yaml")).unwrap();
    let values = std::fs::read_to_string(Path::new(CHART).join("values.yaml")).unwrap();
    for key in [
        "home",
        "sources",
        "maintainers",
        "icon",
        "kubeVersion",
        "keywords",
    ] {
        assert!(
            chart.lines().any(|l| l.starts_with(&format!("{key}:"))),
            "Chart.yaml has no {key}"
        );
    }
    // kubeVersion admits the oldest supported release and every newer one:
    // a new Kubernetes release is not refused before a chart release.
    let supported = ok(
        Command::new("bash")
            .arg(support::script())
            .args(["bin", "--versions"]),
        None,
    );
    let minors: Vec<u32> = supported
        .split_whitespace()
        .map(|v| {
            v.trim_start_matches("v1.")
                .split('.')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    let lo = minors.iter().min().unwrap();
    assert_eq!(
        yaml_scalar(&chart, "kubeVersion"),
        Some(format!(">=1.{lo}.0-0").as_str()),
        "Chart.yaml kubeVersion vs the oldest supported release ({supported})"
    );
    for annotation in [
        "artifacthub.io/license",
        "artifacthub.io/images",
        "artifacthub.io/crds",
    ] {
        assert!(chart.contains(annotation), "Chart.yaml has no {annotation}");
    }
    // The chart pins no digest by default (image.tag works); Artifact
    // Hub's image is the one the kustomize base pins.
    assert_eq!(
        yaml_scalar(&values, "digest"),
        Some(""),
        "values.yaml image.digest"
    );
    let base = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/deployment.yaml"),
    )
    .unwrap();
    let pinned = base
        .split("registry.example.com/nexo/manager@")
        .nth(1)
        .map(|rest| &rest[..71])
        .expect("manifests/deployment.yaml pins the image by digest");
    assert!(
        chart.contains(&format!(
            "image: registry.example.com/nexo/manager@{pinned}"
        )),
        "artifacthub.io/images names another image than manifests/deployment.yaml ({pinned})"
    );
}

#[test]
fn the_charts_readme_is_what_helm_docs_writes() {
    let tb = testbed();
    let dir = scratch("helm-docs");
    let copy = dir.join("nexo-manager");
    ok(Command::new("cp").arg("-rL").arg(CHART).arg(&copy), None);
    std::fs::remove_file(copy.join("README.md")).unwrap();
    let out = run(
        Command::new(&tb.helm_docs)
            .arg("--chart-search-root")
            .arg(&dir)
            .arg("--template-files")
            .arg("README.md.gotmpl")
            .arg("--sort-values-order")
            .arg("file"),
        None,
    );
    assert!(
        out.status.success(),
        "helm-docs: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let written = std::fs::read_to_string(copy.join("README.md")).unwrap();
    let committed = std::fs::read_to_string(Path::new(CHART).join("README.md")).unwrap();
    assert!(
        written == committed,
        "charts/nexo-manager/README.md is not current: run\n  {} --chart-search-root charts --template-files README.md.gotmpl --sort-values-order file\nhelm-docs writes:\n{written}",
        tb.helm_docs.display()
    );
    // Every value is in its table, with a description.
    for value in [
        "connectToken.existingSecret",
        "selfUpgrade",
        "metrics.serviceMonitor.enabled",
        "metrics.prometheusRule.enabled",
        "metrics.grafanaDashboard.enabled",
        "networkPolicy.controlPlaneCIDRs",
        "runAsUser",
        "global.imagePullSecrets",
        "nameOverride",
        "podSecurityContext",
        "securityContext",
        "podDisruptionBudget.unhealthyPodEvictionPolicy",
        "logLevel",
    ] {
        let row = committed
            .lines()
            .find(|l| l.starts_with(&format!("| {value} |")))
            .unwrap_or_else(|| panic!("no row for {value} in the chart's README"));
        assert!(
            row.trim_end_matches('|')
                .rsplit('|')
                .next()
                .is_some_and(|d| !d.trim().is_empty()),
            "{row}"
        );
    }
}
