//! The crate's source files, for the tests that read the source
//! (`source_rules.rs`, `layers.rs`).

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, sorted.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out.sort();
    out
}

/// Whether `path` is a test module of its own (`tests.rs`, `*_tests.rs`).
pub fn is_test_module(path: &Path) -> bool {
    let stem = path
        .file_stem()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    stem == "tests" || stem.ends_with("_tests")
}
