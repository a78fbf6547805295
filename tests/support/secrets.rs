//! Secrets searched for in a Manager's log: every test that runs the
//! Manager runs it at `RUST_LOG=trace` ([`super::fixture::Fixture::env`])
//! and, when the process is done with, searches its log for every token
//! it held or sent ([`super::manager::Manager`]): the connect token, each
//! session token the simulator saw, the API server's bearer token. A token
//! counts as found plain, in hex (a wire dump, split across lines or not)
//! and in base64 (at any of the three alignments).

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};

/// Secrets shorter than this are not searched for (a test's made-up `x`
/// would match anything).
const SHORTEST: usize = 12;

/// How `secret` appears in `log`, if it does: `"plain"`, `"hex"` or
/// `"base64"`.
pub fn found_in(log: &str, secret: &str) -> Option<&'static str> {
    if secret.len() < SHORTEST {
        return None;
    }
    if log.contains(secret) {
        return Some("plain");
    }
    let hex: String = secret.bytes().map(|b| format!("{b:02x}")).collect();
    if hex_stream(log).contains(&hex) {
        return Some("hex");
    }
    // Base64 of the secret at each alignment: the characters that encode
    // only the secret's own bits (the first ones after a 1- or 2-byte
    // prefix mix in the prefix's, the last ones the next bytes').
    for shift in 0..3 {
        let mut bytes = vec![0u8; shift];
        bytes.extend_from_slice(secret.as_bytes());
        let skip = (shift * 8).div_ceil(6);
        for engine in [&STANDARD_NO_PAD, &URL_SAFE_NO_PAD] {
            let encoded = engine.encode(&bytes);
            let keep = (bytes.len() * 8) / 6;
            let core = &encoded[skip..keep.max(skip)];
            if core.len() >= SHORTEST && log.contains(core) {
                return Some("base64");
            }
        }
    }
    None
}

/// Every hex digit of every line's message, lowercased and joined: a dump
/// split over rows (with an ASCII column, timestamps and targets between)
/// reads as one run of hex here, the rows' own text dropped.
fn hex_stream(log: &str) -> String {
    let mut out = String::new();
    for line in log.lines() {
        // ureq-proto's rows: "4174 7468 … ASCII"; keep the 16-byte hex
        // groups before the ASCII column.
        let message = line.split_once(": ").map_or(line, |(_, m)| m);
        let groups: Vec<&str> = message.split(' ').collect();
        for g in groups.iter().take(8) {
            if !g.is_empty() && g.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
                out.extend(
                    g.chars()
                        .filter(char::is_ascii_hexdigit)
                        .map(|c| c.to_ascii_lowercase()),
                );
            } else {
                break;
            }
        }
    }
    out
}

/// The bearer tokens in a kubeconfig (JSON, as the test bed writes them).
pub fn kubeconfig_tokens(path: &std::path::Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Vec::new();
    };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Vec::new();
    };
    v["users"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|u| u["user"]["token"].as_str().map(str::to_owned))
        .collect()
}
