//! Rules of the source that a reviewer would otherwise have to remember.
//!
//! No panic is reachable from input (protocol.md, "Hostile and buggy
//! values"), and the release profile aborts on panic: outside test code,
//! the crate has no `unwrap()`, `expect(`, `panic!`, `unreachable!`,
//! `todo!` or `unimplemented!` at all. `src/lib.rs` denies the same through
//! clippy; this test holds without clippy.

use std::path::Path;

mod source;

/// The lines of `text` before its test module (by convention at the end of
/// a file, after `#[cfg(test)]`); none for a file that is a test module.
fn production_lines(path: &Path, text: &str) -> Vec<(usize, String)> {
    if source::is_test_module(path) {
        return Vec::new();
    }
    text.lines()
        .enumerate()
        .take_while(|(_, l)| l.trim() != "#[cfg(test)]")
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .map(|(i, l)| (i + 1, l.to_owned()))
        .collect()
}

#[test]
fn no_panic_is_reachable_outside_tests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = source::rust_files(&root);
    assert!(
        files.len() > 20,
        "found only {} files under {root:?}",
        files.len()
    );
    let forbidden = [
        ".unwrap()",
        ".expect(",
        "panic!(",
        "unreachable!(",
        "todo!(",
        "unimplemented!(",
    ];
    let mut found = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (n, line) in production_lines(file, &text) {
            if let Some(f) = forbidden.iter().find(|f| line.contains(*f)) {
                found.push(format!("{}:{n}: {f}: {}", file.display(), line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "panicking calls outside tests:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_rule_sees_what_it_forbids() {
    let text = "fn a() { x.unwrap(); }\n// y.unwrap()\n#[cfg(test)]\nmod tests { fn b() { z.unwrap(); } }\n";
    let lines = production_lines(Path::new("src/a.rs"), text);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].1.contains(".unwrap()"));
    assert!(production_lines(Path::new("src/commands/tests.rs"), text).is_empty());
    assert!(production_lines(Path::new("src/state_tests.rs"), text).is_empty());
}

/// Every variable the configuration reads is in `--help`, with its default.
#[test]
fn help_lists_every_variable_the_configuration_reads() {
    let source = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/config.rs"))
        .expect("read src/config.rs");
    let mut vars: Vec<&str> = source
        .split('"')
        .filter(|s| {
            s.starts_with("NEXO_") && s.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
        })
        .collect();
    vars.sort_unstable();
    vars.dedup();
    assert!(vars.len() > 20, "found only {vars:?} in src/config.rs");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nexo-manager"))
        .arg("--help")
        .output()
        .expect("run nexo-manager --help");
    let help = String::from_utf8_lossy(&out.stdout);
    let missing: Vec<&&str> = vars.iter().filter(|v| !help.contains(**v)).collect();
    assert!(missing.is_empty(), "--help lacks {missing:?}:\n{help}");
}
