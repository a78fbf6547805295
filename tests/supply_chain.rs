//! The image's supply chain, offline against the test bed's OCI registry
//! (agent.md, "Operating it"): the image built as the node tests build it
//! (tests/image/build-image.sh) and published as a release publishes it
//! (tests/image/publish.sh: its SBOM and build provenance attached as OCI
//! referrers, the three signed with cosign and a throw-away key), then
//! verified from the registry as README.md's "Verify a release" says: the
//! OCI annotations, the signatures, the SBOM against the binary's embedded
//! dependency list and Cargo.lock, the provenance's subject and commit; and
//! refused when tampered with (another image under the tag, an SBOM no key
//! signed, a key that is not the release's).

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use support::registry::Registry;
use support::{Testbed, run_ok_with_input as ok, run_with_input as run, testbed};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
/// The throw-away key's password (cosign encrypts private keys).
const PASSWORD: &str = "supply-chain-test";

fn script(name: &str) -> PathBuf {
    Path::new(ROOT).join("tests/image").join(name)
}

fn cosign(tb: &Testbed, dir: &Path) -> Command {
    assert!(
        tb.cosign.is_file(),
        "cosign is missing at {} (tests/testbed/testbed.sh build builds it)",
        tb.cosign.display()
    );
    let mut c = Command::new(&tb.cosign);
    c.current_dir(dir)
        .env("COSIGN_PASSWORD", PASSWORD)
        // Nothing reaches the public Sigstore instance: no TUF root fetched.
        .env("TUF_ROOT", dir.join("tuf"))
        .env("SIGSTORE_NO_CACHE", "true");
    c
}

/// A cosign key pair in `dir` with `prefix`: (private, public).
fn key_pair(tb: &Testbed, dir: &Path, prefix: &str) -> (PathBuf, PathBuf) {
    ok(
        cosign(tb, dir).args(["generate-key-pair", "--output-key-prefix", prefix]),
        None,
    );
    (
        dir.join(format!("{prefix}.key")),
        dir.join(format!("{prefix}.pub")),
    )
}

/// `cosign verify` of `reference` with `public` and no transparency log.
fn verify(tb: &Testbed, dir: &Path, public: &Path, reference: &str) -> std::process::Output {
    run(
        cosign(tb, dir)
            .args([
                "verify",
                "--insecure-ignore-tlog=true",
                "--allow-http-registry",
            ])
            .arg("--key")
            .arg(public)
            .arg(reference),
        None,
    )
}

fn text(out: &std::process::Output) -> String {
    format!(
        "({})\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn registry_py(args: &[&str]) -> String {
    ok(
        Command::new("python3")
            .arg(script("registry.py"))
            .args(args),
        None,
    )
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}):\n{text}"))
}

/// (name, version) of every package of Cargo.lock.
fn locked() -> BTreeSet<(String, String)> {
    let lock = std::fs::read_to_string(Path::new(ROOT).join("Cargo.lock")).unwrap();
    let mut out = BTreeSet::new();
    let mut name = None;
    for line in lock.lines() {
        if let Some(n) = line.strip_prefix("name = ") {
            name = Some(n.trim_matches('"').to_owned());
        } else if let Some(v) = line.strip_prefix("version = ")
            && let Some(n) = name.take()
        {
            out.insert((n, v.trim_matches('"').to_owned()));
        }
    }
    out
}

#[test]
fn the_published_image_its_sbom_and_provenance_verify_and_tampering_is_refused() {
    let tb = testbed();
    let binary = support::manager::static_binary();
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("supply-chain-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let images = dir.join("images");
    ok(
        Command::new("bash")
            .arg(script("build-image.sh"))
            .arg(&binary)
            .arg(&images),
        None,
    );
    let (private, public) = key_pair(tb, &dir, "release");
    let registry = Registry::start(&tb.registry, &dir);
    let name = format!("{}/nexo/manager", registry.addr);
    let tag = format!("{name}:{}", env!("CARGO_PKG_VERSION"));

    let published = run(
        Command::new("bash")
            .arg(script("publish.sh"))
            .arg(images.join("manager.oci.tar"))
            .arg(&tag)
            .arg(&private)
            .arg(&binary)
            .env("COSIGN", &tb.cosign)
            .env("COSIGN_PASSWORD", PASSWORD)
            .env("TUF_ROOT", dir.join("tuf")),
        None,
    );
    assert!(
        published.status.success(),
        "publish.sh {}\nregistry log:\n{}",
        text(&published),
        registry.log()
    );
    let lines = String::from_utf8_lossy(&published.stdout).into_owned();
    let digest = |key: &str| {
        lines
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("publish.sh printed no {key}=:\n{lines}"))
            .to_owned()
    };
    let (image, sbom, provenance) = (digest("image"), digest("sbom"), digest("provenance"));

    // The OCI annotations, read from the registry.
    let manifest = json_of(&registry_py(&["manifest", &tag]));
    let annotations = &manifest["annotations"];
    for key in [
        "title",
        "description",
        "source",
        "licenses",
        "version",
        "revision",
        "created",
    ] {
        let value = annotations[format!("org.opencontainers.image.{key}")]
            .as_str()
            .unwrap_or_else(|| panic!("no org.opencontainers.image.{key}: {manifest}"));
        assert!(!value.is_empty() && !value.contains("${"), "{key}={value}");
    }
    assert_eq!(
        annotations["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(
        annotations["org.opencontainers.image.licenses"],
        "Apache-2.0"
    );
    let revision = annotations["org.opencontainers.image.revision"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        revision.len() == 40 && revision.bytes().all(|b| b.is_ascii_hexdigit()),
        "the revision is the commit: {revision}"
    );

    // The image's signature, by tag and by digest.
    for reference in [tag.clone(), format!("{name}@{image}")] {
        let out = verify(tb, &dir, &public, &reference);
        assert!(
            out.status.success(),
            "cosign verify {reference} {}",
            text(&out)
        );
        let claims = json_of(&String::from_utf8_lossy(&out.stdout));
        assert_eq!(
            claims[0]["critical"]["image"]["docker-manifest-digest"], image,
            "the signature names the image: {claims}"
        );
    }

    // The SBOM and the provenance: the image's referrers, each signed.
    let referrers = json_of(&registry_py(&["referrers", &format!("{name}@{image}")]));
    let listed: BTreeSet<(String, String)> = referrers["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["artifactType"].as_str().unwrap_or("").to_owned(),
                m["digest"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    for (kind, d) in [
        ("application/spdx+json", &sbom),
        ("application/vnd.in-toto+json", &provenance),
    ] {
        assert!(
            listed.contains(&(kind.to_owned(), d.clone())),
            "{kind} {d} among the referrers: {referrers}"
        );
        let out = verify(tb, &dir, &public, &format!("{name}@{d}"));
        assert!(
            out.status.success(),
            "cosign verify of the {kind} {}",
            text(&out)
        );
    }

    // The SBOM lists what the binary embeds (cargo auditable), each crate
    // as Cargo.lock locks it, the Manager its root, and not the simulator.
    let spdx = json_of(&registry_py(&["blob", &format!("{name}@{image}"), &sbom]));
    assert_eq!(spdx["spdxVersion"], "SPDX-2.3");
    let in_sbom: BTreeSet<(String, String)> = spdx["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["versionInfo"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let embedded: BTreeSet<(String, String)> = ok(
        Command::new("python3")
            .arg(script("sbom.py"))
            .arg("deps")
            .arg(&binary),
        None,
    )
    .lines()
    .map(|l| {
        let (n, v) = l.split_once(' ').unwrap();
        (n.to_owned(), v.to_owned())
    })
    .collect();
    assert_eq!(
        in_sbom, embedded,
        "the SBOM is the binary's dependency list"
    );
    let lock = locked();
    let unlocked: Vec<_> = in_sbom.difference(&lock).collect();
    assert!(unlocked.is_empty(), "not in Cargo.lock: {unlocked:?}");
    let names: BTreeSet<&str> = in_sbom.iter().map(|(n, _)| n.as_str()).collect();
    for crate_name in ["nexo-manager", "ureq", "rustls", "serde_json"] {
        assert!(
            names.contains(crate_name),
            "{crate_name} in the SBOM: {names:?}"
        );
    }
    assert!(
        !names.contains("nexo-cpsim"),
        "the production binary links no simulator: {names:?}"
    );

    // The provenance names the image and the commit.
    let statement = json_of(&registry_py(&[
        "blob",
        &format!("{name}@{image}"),
        &provenance,
    ]));
    assert_eq!(statement["_type"], "https://in-toto.io/Statement/v1");
    assert_eq!(statement["predicateType"], "https://slsa.dev/provenance/v1");
    assert_eq!(
        format!(
            "sha256:{}",
            statement["subject"][0]["digest"]["sha256"]
                .as_str()
                .unwrap()
        ),
        image
    );
    assert_eq!(
        statement["predicate"]["buildDefinition"]["externalParameters"]["revision"],
        revision.as_str()
    );

    // Tampered with: refused.
    let (_, other_public) = key_pair(tb, &dir, "not-the-release");
    let out = verify(tb, &dir, &other_public, &tag);
    assert!(
        !out.status.success(),
        "another key verifies nothing {}",
        text(&out)
    );
    let forged = dir.join("forged.spdx.json");
    std::fs::write(&forged, br#"{"spdxVersion": "SPDX-2.3", "packages": []}"#).unwrap();
    let forged = registry_py(&[
        "attach",
        &format!("{name}@{image}"),
        "application/spdx+json",
        forged.to_str().unwrap(),
        "application/spdx+json",
    ]);
    let out = verify(tb, &dir, &public, &format!("{name}@{}", forged.trim()));
    assert!(
        !out.status.success(),
        "an SBOM no one signed {}",
        text(&out)
    );
    let swapped = registry_py(&[
        "push",
        images.join("manager-b.oci.tar").to_str().unwrap(),
        &tag,
    ]);
    assert_ne!(swapped.trim(), image, "another image under the tag");
    let out = verify(tb, &dir, &public, &tag);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no signatures found"),
        "the image swapped under the tag is refused {}",
        text(&out)
    );
}
