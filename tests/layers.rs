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
