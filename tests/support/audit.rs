//! The API server's audit log of a test bed started with `--audit`
//! (`testbed.sh`): where it ends now, and the Manager's requests after a
//! point, as the audit events of their completion.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use serde_json::Value;

/// The audit log's length now: where what follows starts.
pub fn mark(bed: &Path) -> u64 {
    std::fs::metadata(bed.join("logs/audit.log")).map_or(0, |m| m.len())
}

/// The Manager's completed requests (its `User-Agent`) from byte `from`
/// on, each its audit event.
pub fn managers_requests(bed: &Path, from: u64) -> Vec<Value> {
    let mut text = String::new();
    let mut log = std::fs::File::open(bed.join("logs/audit.log")).expect("the audit log");
    log.seek(SeekFrom::Start(from)).unwrap();
    log.read_to_string(&mut text).unwrap();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| {
            e["stage"] == "ResponseComplete"
                && e["userAgent"]
                    .as_str()
                    .is_some_and(|ua| ua.starts_with("nexo-manager/"))
        })
        .collect()
}
