//! The release check (`.ci/release-check`) fails on what it is there to
//! catch: each case is a scratch workspace with exactly one fault, beside a
//! clean one that passes, so a failure is the fault's and not the scratch's.
//! The check stops at its first failure and names it.
//!
//! Needs what the check needs: rustup (for the declared rust-version's
//! toolchain) and cargo-deny, which the check builds once into its cache.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// A scratch workspace: one crate `scratch` with `lib`, `manifest_extra`
/// appended to its `[package]`, `deps` as its `[dependencies]`, extra files,
/// the project's deny.toml, and a lock file.
fn scratch(
    name: &str,
    lib: &str,
    manifest_extra: &str,
    deps: &str,
    files: &[(&str, &str)],
) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("release-check-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let msrv = std::fs::read_to_string(Path::new(ROOT).join("Cargo.toml"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = ").map(str::to_owned))
        .expect("Cargo.toml's rust-version");
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"scratch\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\
             rust-version = {msrv}\npublish = false\n{manifest_extra}\n\
             [dependencies]\n{deps}\n\n[workspace]\n"
        ),
    )
    .unwrap();
    std::fs::write(dir.join("src/lib.rs"), lib).unwrap();
    for (path, text) in files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    std::fs::copy(Path::new(ROOT).join("deny.toml"), dir.join("deny.toml")).unwrap();
    let out = Command::new("cargo")
        .args(["generate-lockfile", "--offline"])
        .current_dir(&dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo generate-lockfile in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

const CLEAN: &str = "/// Adds.\npub fn add(a: u32, b: u32) -> u32 {\n    a + b\n}\n";
const LICENSED: &str = "license = \"Apache-2.0\"";

fn check(dir: &Path, advisory_db: Option<&Path>) -> Output {
    let mut cmd = Command::new("bash");
    cmd.arg(Path::new(ROOT).join(".ci/release-check")).arg(dir);
    cmd.env_remove("NEXO_ADVISORY_DB");
    if let Some(db) = advisory_db {
        cmd.env("NEXO_ADVISORY_DB", db);
    }
    cmd.output().expect("run .ci/release-check")
}

fn report(dir: &Path, out: &Output) -> String {
    format!(
        ".ci/release-check {} exited {}:\nstdout:\n{}\nstderr:\n{}",
        dir.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn expect_failure(dir: &Path, advisory_db: Option<&Path>, named: &str) {
    let out = check(dir, advisory_db);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains(&format!("release-check: FAILED: {named}")),
        "expected the check to fail at {named:?}; {}",
        report(dir, &out)
    );
}

/// A made-up advisory database (a git repository, as the real one is)
/// with one advisory against `itoa` below 99.
fn advisory_db(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("release-check-db-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("crates/itoa")).unwrap();
    std::fs::write(
        dir.join("crates/itoa/RUSTSEC-2099-0001.md"),
        "```toml\n[advisory]\nid = \"RUSTSEC-2099-0001\"\npackage = \"itoa\"\n\
         date = \"2099-01-01\"\ntitle = \"Made up, for tests/release_check.rs\"\n\
         description = \"Made up.\"\n\n[versions]\npatched = [\">= 99.0.0\"]\n```\n\n\
         # Made up\n\nMade up, for tests/release_check.rs.\n",
    )
    .unwrap();
    for args in [
        &["init", "-q", "-b", "main"][..],
        &["add", "."],
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
            "commit",
            "-q",
            "-m",
            "db",
        ],
    ] {
        let out = Command::new("git")
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    dir
}

#[test]
fn a_clean_workspace_passes() {
    let dir = scratch("clean", CLEAN, LICENSED, "", &[]);
    let db = advisory_db("clean");
    let out = check(&dir, Some(&db));
    assert!(
        out.status.success()
            && String::from_utf8_lossy(&out.stderr).contains("release-check: passed"),
        "{}",
        report(&dir, &out)
    );
}

#[test]
fn a_format_difference_fails() {
    let dir = scratch(
        "format",
        "pub fn add(a:u32,b:u32)->u32{a+b}\n",
        LICENSED,
        "",
        &[],
    );
    expect_failure(&dir, None, "format");
}

#[test]
fn a_clippy_warning_fails() {
    let lib = "/// Returns.\npub fn id(x: u32) -> u32 {\n    return x;\n}\n";
    let dir = scratch("clippy", lib, LICENSED, "", &[]);
    expect_failure(&dir, None, "clippy");
}

#[test]
fn a_doc_link_to_nothing_fails() {
    let lib = "/// Adds; see [`subtract`].\npub fn add(a: u32, b: u32) -> u32 {\n    a + b\n}\n";
    let dir = scratch("docs", lib, LICENSED, "", &[]);
    expect_failure(&dir, None, "docs");
}

#[test]
fn code_newer_than_the_declared_rust_version_fails() {
    // An inferred array length (`[0; _]`) is stable since Rust 1.89, after
    // the declared 1.88. (A library item newer than the declared version is
    // caught one step earlier, by clippy's incompatible_msrv.)
    let lib = "/// Zeros.\npub fn zeros() -> [u8; 4] {\n    [0; _]\n}\n";
    let dir = scratch("msrv", lib, LICENSED, "", &[]);
    expect_failure(&dir, None, "msrv");
}

#[test]
fn a_denied_licence_fails() {
    let dir = scratch("licence", CLEAN, "license = \"GPL-3.0-only\"", "", &[]);
    expect_failure(&dir, None, "deny");
}

#[test]
fn a_banned_crate_fails() {
    // A second async runtime or TLS stack is refused by name, wherever it
    // comes from: here a local crate called tokio.
    let dir = scratch(
        "ban",
        CLEAN,
        LICENSED,
        "tokio = { path = \"tokio\" }",
        &[
            (
                "tokio/Cargo.toml",
                "[package]\nname = \"tokio\"\nversion = \"1.0.0\"\nedition = \"2024\"\nlicense = \"MIT\"\npublish = false\n",
            ),
            ("tokio/src/lib.rs", "//! Not tokio.\n"),
        ],
    );
    expect_failure(&dir, None, "deny");
}

#[test]
fn a_dependency_with_an_advisory_fails() {
    let lock = std::fs::read_to_string(Path::new(ROOT).join("Cargo.lock")).unwrap();
    // The itoa of the project's own lock file, so that it is in the local
    // registry cache and the scratch needs no network.
    let itoa = lock
        .split("[[package]]")
        .find(|p| p.contains("name = \"itoa\""))
        .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = ")))
        .expect("itoa in Cargo.lock")
        .to_owned();
    let dir = scratch(
        "advisory",
        CLEAN,
        LICENSED,
        &format!("itoa = \"={}\"", itoa.trim_matches('"')),
        &[],
    );
    let db = advisory_db("advisory");
    expect_failure(&dir, Some(&db), "deny: advisories");
}
