//! The crate's layers have no import cycle (ARCHITECTURE.md, "Layers").
//!
//! Two graphs are built from the production source (test modules left
//! out): one between the crate's top-level modules, a folder counting as
//! one module, and one between the files of each folder, its `mod.rs`
//! aside. An edge is a path the source names: `crate::a::…` (and the
//! items of a `use crate::{…}` group) for the first; `super::b`,
//! `crate::folder::b` for the second. Comments and string literals are
//! not read. Each graph must be acyclic; a cycle is printed with one
//! place in the source for each of its edges.
//!
//! The agent's parts (the files of `src/agent/`) are one `Agent` type, so
//! their imports cannot show how they use each other: a third graph joins
//! the calls between them to their imports. A call is `self.m(…)`,
//! `Self::m(…)` or `Agent::m(…)` of an `Agent` method `m` defined in
//! another file (an inherent method's name is unique, so each call names
//! one file). That graph must be acyclic too, and no part may call a
//! method of the loop (`mod.rs`).
//!
//! And no source file of the Manager or of the CP simulator is over
//! [`MAX_LINES`] lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

mod source;

/// `text` without comments, string and character literals (their bytes
/// become spaces, newlines kept), and without its test module (by the
/// crate's convention at the end of a file, after `#[cfg(test)]`).
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, c: u8| out.push(if c == b'\n' { b'\n' } else { b' ' });
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if b[i] == b'r' && (b[i..].starts_with(b"r\"") || b[i..].starts_with(b"r#")) {
            // A raw string: r"…", r#"…"#.
            let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
            if b.get(i + 1 + hashes) != Some(&b'"') {
                out.push(b[i]);
                i += 1;
                continue;
            }
            let end: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            i += 2 + hashes;
            while i < b.len() && !b[i..].starts_with(&end) {
                blank(&mut out, b[i]);
                i += 1;
            }
            i += end.len();
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    blank(&mut out, b[i]);
                    i += 1;
                }
                if i < b.len() {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
            i += 1;
        } else if b[i] == b'\'' && (b.get(i + 2) == Some(&b'\'') || (b.get(i + 1) == Some(&b'\\')))
        {
            // A character literal ('x', '\n', '\u{..}'), not a lifetime.
            i += 1;
            while i < b.len() && b[i] != b'\'' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn ident_at(code: &str, at: usize) -> &str {
    let rest = &code[at..];
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    &rest[..end]
}

/// The first segments of the paths after each `prefix` (`crate::`,
/// `super::`) in `code`, with their lines; a `{…}` group gives each of its
/// items' first segments.
fn references(code: &str, prefix: &str) -> Vec<(String, usize)> {
    let mut found = Vec::new();
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let mut from = 0;
    while let Some(pos) = code[from..].find(prefix) {
        let at = from + pos;
        from = at + prefix.len();
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let after = from;
        if code[after..].starts_with('{') {
            // A group: its items at depth one.
            let mut depth = 0;
            let mut item_start = true;
            for (k, c) in code[after..].char_indices() {
                match c {
                    '{' => {
                        depth += 1;
                        item_start = depth == 1;
                        continue;
                    }
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => {
                        item_start = true;
                        continue;
                    }
                    c if c.is_whitespace() => continue,
                    _ if item_start && depth == 1 => {
                        let name = ident_at(code, after + k);
                        if !name.is_empty() {
                            found.push((name.to_owned(), line_of(after + k)));
                        }
                    }
                    _ => {}
                }
                item_start = false;
            }
        } else {
            let name = ident_at(code, after);
            if !name.is_empty() {
                found.push((name.to_owned(), line_of(after)));
            }
        }
    }
    found
}

/// A graph's edges, each with the first place that makes it.
type Graph = BTreeMap<String, BTreeMap<String, String>>;

fn add(graph: &mut Graph, from: &str, to: &str, place: String) {
    if from != to {
        graph
            .entry(from.to_owned())
            .or_default()
            .entry(to.to_owned())
            .or_insert(place);
    }
}

/// The strongly connected components of more than one node (Tarjan).
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flat_map(|e| e.keys()) {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut scc = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    scc.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if scc.len() > 1 {
                    scc.sort();
                    self.found.push(scc);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

fn describe(graph: &Graph, scc: &[String]) -> String {
    let mut out = format!("cycle among {}:\n", scc.join(", "));
    for from in scc {
        for (to, place) in graph.get(from).into_iter().flatten() {
            if scc.contains(to) {
                out.push_str(&format!("  {from} -> {to} ({place})\n"));
            }
        }
    }
    out
}

/// The two graphs of the crate in `src`: between top-level modules, and
/// between the files of each folder (keyed `folder/file`).
fn graphs(src: &Path) -> (Graph, Graph) {
    // Each production file as its path's parts, `.rs` cut: `["apply", "plan"]`.
    let files: Vec<(PathBuf, Vec<String>)> = source::rust_files(src)
        .into_iter()
        .filter(|f| !source::is_test_module(f))
        .map(|f| {
            let parts = f
                .strip_prefix(src)
                .unwrap()
                .components()
                .map(|c| {
                    c.as_os_str()
                        .to_string_lossy()
                        .trim_end_matches(".rs")
                        .to_owned()
                })
                .collect();
            (f, parts)
        })
        .collect();
    let modules: BTreeSet<&str> = files.iter().map(|(_, p)| p[0].as_str()).collect();
    // The files of each folder that count as its parts (`mod.rs` aside).
    let mut folders: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (_, parts) in &files {
        if let [folder, file] = &parts[..]
            && file != "mod"
        {
            folders.entry(folder).or_default().insert(file);
        }
    }
    let mut top = Graph::new();
    let mut inner = Graph::new();
    for (f, parts) in &files {
        let rel = f.strip_prefix(src).unwrap();
        let name = parts[parts.len() - 1].as_str();
        if name == "lib" || name == "main" {
            continue;
        }
        let module = parts[0].clone();
        let code = code_of(&std::fs::read_to_string(f).unwrap());
        let place = |line: usize| format!("src/{}:{line}", rel.display());
        for (to, line) in references(&code, "crate::") {
            if modules.contains(to.as_str()) {
                add(&mut top, &module, &to, place(line));
            }
        }
        // Files of one folder: `super::sibling` and `crate::folder::sibling`.
        if parts.len() == 2 && name != "mod" {
            let folder = &parts[0];
            let siblings = &folders[folder.as_str()];
            let key = |s: &str| format!("{folder}/{s}");
            let mut refs = references(&code, "super::");
            refs.extend(references(&code, &format!("crate::{folder}::")));
            for (to, line) in refs {
                if siblings.contains(to.as_str()) {
                    add(&mut inner, &key(name), &key(&to), place(line));
                }
            }
        }
    }
    (top, inner)
}

/// The most lines a source file may have.
const MAX_LINES: usize = 600;

/// The `Agent` methods each file of `files` defines (name → file), from
/// its `impl Agent { … }` blocks.
fn agent_methods(files: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut defs = BTreeMap::new();
    for (file, code) in files {
        let mut from = 0;
        while let Some(pos) = code[from..].find("\nimpl Agent {") {
            let start = from + pos;
            let end = code[start..]
                .find("\n}\n")
                .map_or(code.len(), |e| start + e);
            for line in code[start..end].lines() {
                // A method at the block's indentation: `    fn m(`,
                // `    pub(super) fn m(`.
                let Some(rest) = line.strip_prefix("    ") else {
                    continue;
                };
                let rest = rest
                    .trim_start_matches("pub(super) ")
                    .trim_start_matches("pub(crate) ")
                    .trim_start_matches("pub ");
                if let Some(name) = rest.strip_prefix("fn ") {
                    let name = ident_at(name, 0);
                    defs.insert(name.to_owned(), file.clone());
                }
            }
            from = end;
        }
    }
    defs
}

/// The graph of the agent's parts: an edge for each call of an `Agent`
/// method defined in another file (`self.m(`, `Self::m(`, `Agent::m(`),
/// and for each `super::file` import. `files` maps a file's name (`batch`)
/// to its code (comments and strings blanked); `where_` names a place.
fn part_graph(files: &BTreeMap<String, String>, where_: &dyn Fn(&str, usize) -> String) -> Graph {
    let defs = agent_methods(files);
    let mut graph = Graph::new();
    for (file, code) in files {
        let line_of = |at: usize| code[..at].matches('\n').count() + 1;
        for prefix in ["self.", "Self::", "Agent::"] {
            let mut from = 0;
            while let Some(pos) = code[from..].find(prefix) {
                let at = from + pos + prefix.len();
                from = at;
                let before = code[..at - prefix.len()].chars().next_back();
                if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.') {
                    continue;
                }
                let name = ident_at(code, at);
                if !code[at + name.len()..].trim_start().starts_with('(') {
                    continue;
                }
                if let Some(to) = defs.get(name)
                    && to != file
                {
                    add(
                        &mut graph,
                        file,
                        to,
                        format!("{} calls {name}", where_(file, line_of(at))),
                    );
                }
            }
        }
        for (to, line) in references(code, "super::") {
            if files.contains_key(&to) && file != "mod" {
                add(&mut graph, file, &to, where_(file, line));
            }
        }
    }
    graph
}

/// The calls of a part into the loop (`mod`): each a place.
fn calls_into_the_loop(graph: &Graph) -> Vec<String> {
    graph
        .iter()
        .filter(|(from, _)| from.as_str() != "mod")
        .filter_map(|(_, edges)| edges.get("mod").cloned())
        .filter(|place| place.contains(" calls "))
        .collect()
}

/// The agent's production files (name → code).
fn agent_files(src: &Path) -> BTreeMap<String, String> {
    source::rust_files(&src.join("agent"))
        .into_iter()
        .filter(|f| !source::is_test_module(f))
        .map(|f| {
            let name = f.file_stem().unwrap().to_string_lossy().into_owned();
            (name, code_of(&std::fs::read_to_string(&f).unwrap()))
        })
        .collect()
}

#[test]
fn the_agent_parts_call_each_other_without_a_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = agent_files(&src);
    assert!(
        agent_methods(&files).len() > 20,
        "the check found almost no Agent methods: it no longer reads the source it checks"
    );
    let graph = part_graph(&files, &|f, l| format!("src/agent/{f}.rs:{l}"));
    let mut report = String::new();
    for scc in cycles(&graph) {
        report.push_str(&describe(&graph, &scc));
    }
    for place in calls_into_the_loop(&graph) {
        report.push_str(&format!("a part calls into the loop: {place}\n"));
    }
    assert!(
        report.is_empty(),
        "calls between the agent's parts:\n{report}"
    );
}

/// Files over [`MAX_LINES`] among `files`, each with its count.
fn too_long(files: &[PathBuf]) -> Vec<String> {
    files
        .iter()
        .filter_map(|f| {
            let lines = std::fs::read_to_string(f).unwrap().lines().count();
            (lines > MAX_LINES).then(|| format!("{} ({lines} lines)", f.display()))
        })
        .collect()
}

#[test]
fn no_source_file_is_over_600_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = source::rust_files(&root.join("src"));
    files.extend(source::rust_files(&root.join("tests/cpsim/src")));
    assert!(files.len() > 50, "only {} files found", files.len());
    let long = too_long(&files);
    assert!(
        long.is_empty(),
        "over {MAX_LINES} lines (split them by concern):\n  {}",
        long.join("\n  ")
    );
}

#[test]
fn the_crate_has_no_import_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (top, inner) = graphs(&src);
    let mut report = String::new();
    for (what, graph) in [("top-level modules", &top), ("files of a folder", &inner)] {
        for scc in cycles(graph) {
            report.push_str(&format!("{what}: {}", describe(graph, &scc)));
        }
    }
    assert!(report.is_empty(), "import cycles:\n{report}");
}

#[test]
fn the_check_sees_what_it_forbids() {
    // A cycle through a group import, a path in code and a sibling file.
    let code = code_of(
        "use crate::{a::X, b};\n// crate::c in a comment\nlet s = \"crate::d\";\nfn f() { crate::e::g(); super::h::i(); }\n",
    );
    let names: Vec<String> = references(&code, "crate::")
        .into_iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(names, ["a", "b", "e"]);
    assert_eq!(references(&code, "super::")[0].0, "h");
    let mut g = Graph::new();
    add(&mut g, "a", "b", "x".into());
    add(&mut g, "b", "c", "y".into());
    assert!(cycles(&g).is_empty());
    add(&mut g, "c", "a", "z".into());
    assert_eq!(cycles(&g), [vec!["a".to_owned(), "b".into(), "c".into()]]);
}

#[test]
fn the_part_check_sees_a_cycle_of_calls_and_a_call_into_the_loop() {
    let file = |code: &str| code_of(&format!("\n{code}"));
    let mut files = BTreeMap::new();
    files.insert(
        "mod".to_owned(),
        file("impl Agent {\n    fn cycle(&mut self) {\n        self.batch();\n    }\n}\n"),
    );
    files.insert(
        "batch".to_owned(),
        file("impl Agent {\n    pub(super) fn batch(&mut self) {\n        self.checked();\n        // self.heartbeat() in a comment\n        let s = \"self.cycle()\";\n        self.store.record();\n    }\n}\n"),
    );
    files.insert(
        "run".to_owned(),
        file("impl Agent {\n    pub(super) fn checked(&self) {}\n    fn record(&self) {}\n}\n"),
    );
    let place = |f: &str, l: usize| format!("{f}:{l}");
    let graph = part_graph(&files, &place);
    assert!(cycles(&graph).is_empty(), "{graph:?}");
    assert!(calls_into_the_loop(&graph).is_empty(), "{graph:?}");
    // `self.store.record()` is the store's method, not the part's.
    assert_eq!(graph["batch"].keys().collect::<Vec<_>>(), ["run"]);
    // A cycle through a call: run calls back into batch.
    files.insert(
        "run".to_owned(),
        file("impl Agent {\n    pub(super) fn checked(&self) {\n        Self::batch(self);\n    }\n}\n"),
    );
    let graph = part_graph(&files, &place);
    assert_eq!(cycles(&graph), [vec!["batch".to_owned(), "run".into()]]);
    // A cycle through an import and a call, and a call into the loop.
    files.insert(
        "run".to_owned(),
        file("use super::batch::X;\nimpl Agent {\n    pub(super) fn checked(&self) {\n        self.cycle();\n    }\n}\n"),
    );
    let graph = part_graph(&files, &place);
    assert_eq!(cycles(&graph).len(), 1, "{graph:?}");
    assert_eq!(calls_into_the_loop(&graph), ["run:5 calls cycle"]);
}

#[test]
fn the_size_check_sees_a_long_file() {
    let dir = std::env::temp_dir().join(format!("nexo-layers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let short = dir.join("short.rs");
    let long = dir.join("long.rs");
    std::fs::write(&short, "fn a() {}\n".repeat(MAX_LINES)).unwrap();
    std::fs::write(&long, "fn a() {}\n".repeat(MAX_LINES + 1)).unwrap();
    let found = too_long(&[short, long.clone()]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(found, [format!("{} (601 lines)", long.display())]);
}
