//! Rules of the source that a reviewer would otherwise have to remember.
//!
//! No panic is reachable from input (docs/protocol.md, "Hostile and buggy
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

/// The `log` crate's own macros at a call site: a message with its values
/// in it, which the structured logs (agent.md, "Operating it") forbid.
fn unstructured_logs(lines: &[(usize, String)]) -> Vec<usize> {
    let macros = [
        "log::info!(",
        "log::warn!(",
        "log::error!(",
        "log::debug!(",
        "log::trace!(",
    ];
    lines
        .iter()
        .filter(|(_, l)| macros.iter().any(|m| l.contains(m)))
        .map(|(n, _)| *n)
        .collect()
}

#[test]
fn every_log_line_has_a_constant_message_and_fields() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    for file in source::rust_files(&root) {
        // The one place that calls `log` itself.
        if file.ends_with("logging.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for n in unstructured_logs(&production_lines(&file, &text)) {
            found.push(format!("{}:{n}", file.display()));
        }
    }
    assert!(
        found.is_empty(),
        "log calls without fields (use crate::info! and its siblings, src/logging.rs):\n{}",
        found.join("\n")
    );
    let seen = unstructured_logs(&[(7, "        log::warn!(\"cannot {what}: {e}\");".into())]);
    assert_eq!(seen, [7], "the rule sees what it forbids");
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

/// The section names cited as `docs/protocol.md, "Section"` in `text`,
/// with comment markers between the words of a wrapped citation removed.
fn protocol_citations(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("docs/protocol.md") {
        rest = &rest[at + "docs/protocol.md".len()..];
        let after = rest.trim_start_matches([',', ':']).trim_start();
        let Some(quoted) = after.strip_prefix('"') else {
            continue;
        };
        let Some(end) = quoted.find('"') else {
            continue;
        };
        let words: Vec<&str> = quoted[..end]
            .split_whitespace()
            .filter(|w| !w.chars().all(|c| c == '/' || c == '!'))
            .collect();
        found.push(words.join(" "));
    }
    found
}

/// The code cites the contract it implements by section; each cited
/// section is one of `docs/protocol.md`'s headings.
#[test]
fn every_cited_protocol_section_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let protocol = std::fs::read_to_string(root.join("docs/protocol.md"))
        .expect("docs/protocol.md, the contract the code cites, is missing");
    let headings: Vec<String> = protocol
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| l.trim_start_matches('#').trim().to_lowercase())
        .collect();
    let mut files = source::rust_files(&root.join("src"));
    files.extend(source::rust_files(&root.join("tests")));
    let mut cited = 0;
    let mut missing = Vec::new();
    // This file names citations as examples.
    files.retain(|f| !f.ends_with("tests/source_rules.rs"));
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for section in protocol_citations(&text) {
            cited += 1;
            let wanted = section.to_lowercase();
            if !headings.iter().any(|h| h.contains(&wanted)) {
                missing.push(format!("{}: {section:?}", f.display()));
            }
        }
    }
    assert!(
        cited > 20,
        "only {cited} citations found: the check no longer reads them"
    );
    assert!(
        missing.is_empty(),
        "cited sections docs/protocol.md does not have:\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn a_wrapped_citation_is_read_whole() {
    let text = "// as docs/protocol.md, \"Hostile and\n// buggy values\" says; docs/protocol.md, \"Nowhere\"";
    assert_eq!(
        protocol_citations(text),
        ["Hostile and buggy values", "Nowhere"]
    );
}

/// The places in `lines` (numbered production lines, joined so that a
/// signature over several lines is read whole) where a function returns
/// `Result<_, String>`: an error flattened to text where a typed error
/// belongs.
fn string_errors(lines: &[(usize, String)]) -> Vec<usize> {
    let mut found = Vec::new();
    let text: String = lines.iter().map(|(_, l)| format!("{l}\n")).collect();
    let line_of = |at: usize| {
        let n = text[..at].matches('\n').count();
        lines.get(n).map_or(0, |(k, _)| *k)
    };
    let mut from = 0;
    while let Some(pos) = text[from..].find("-> Result<") {
        let start = from + pos + "-> Result<".len();
        from = start;
        // The type arguments, up to the matching `>`.
        let mut depth = 1;
        let mut args = Vec::new();
        let mut arg = String::new();
        for c in text[start..].chars() {
            match c {
                '<' | '(' | '[' => depth += 1,
                '>' | ')' | ']' => depth -= 1,
                ',' if depth == 1 => {
                    args.push(std::mem::take(&mut arg));
                    continue;
                }
                _ => {}
            }
            if depth == 0 {
                break;
            }
            arg.push(c);
        }
        args.push(arg);
        if args.len() == 2 && args[1].trim() == "String" {
            found.push(line_of(start));
        }
    }
    found
}

/// Errors stay typed to where they are shown: no production function
/// returns `Result<_, String>`.
#[test]
fn no_function_returns_a_string_as_its_error() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    for file in source::rust_files(&root) {
        let text = std::fs::read_to_string(&file).unwrap();
        for n in string_errors(&production_lines(&file, &text)) {
            found.push(format!("{}:{n}", file.display()));
        }
    }
    assert!(
        found.is_empty(),
        "functions returning Result<_, String> (give them a typed error):\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn the_string_error_check_reads_signatures_whole() {
    let lines: Vec<(usize, String)> = [
        "fn a() -> Result<Vec<u8>, String> {",
        "fn b(",
        "    x: u8,",
        ") -> Result<Option<(u8, u8)>,",
        "    String> {",
        "fn c() -> Result<String, Error> {",
        "fn d() -> Result<HashMap<String, String>, Error> {",
    ]
    .iter()
    .enumerate()
    .map(|(i, l)| (i + 10, l.to_string()))
    .collect();
    assert_eq!(string_errors(&lines), [10, 13]);
}

/// The tests SECURITY.md names as the proof of each guarantee exist where
/// it says: each `` `path.rs` `test_name` `` pair is a function of that file.
#[test]
fn every_test_security_md_cites_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("SECURITY.md")).unwrap();
    let mut cited = 0;
    let mut missing = Vec::new();
    for piece in text.split("` `").collect::<Vec<_>>().windows(2) {
        let (Some(path), Some(name)) = (piece[0].rsplit('`').next(), piece[1].split('`').next())
        else {
            continue;
        };
        if !(path.starts_with("src/") || path.starts_with("tests/")) || !path.ends_with(".rs") {
            continue;
        }
        if !name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            continue;
        }
        cited += 1;
        let source = std::fs::read_to_string(root.join(path)).unwrap_or_default();
        if !source.contains(&format!("fn {name}(")) {
            missing.push(format!("{path} {name}"));
        }
    }
    assert!(
        cited > 30,
        "only {cited} citations read: the check no longer reads SECURITY.md"
    );
    assert!(
        missing.is_empty(),
        "SECURITY.md cites tests that are not there:\n  {}",
        missing.join("\n  ")
    );
}
