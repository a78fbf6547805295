//! URL query strings for API paths.

/// A URL query string builder with percent-encoding.
#[derive(Default)]
pub struct Query(String);

impl Query {
    /// An empty query.
    pub fn new() -> Self {
        Query(String::new())
    }

    /// Adds `key=value`, percent-encoding the value.
    pub fn param(mut self, key: &str, value: &str) -> Self {
        self.0.push(if self.0.is_empty() { '?' } else { '&' });
        self.0.push_str(key);
        self.0.push('=');
        self.0.push_str(&percent_encode(value));
        self
    }

    /// The query, with its leading `?` (empty when no parameter was added).
    pub fn finish(self) -> String {
        self.0
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
