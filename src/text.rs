//! Text from the CP and the cluster made fit for a message or a log line:
//! cut to a length ([`clip`]) and with control characters escaped
//! ([`escape`]). A leaf: it imports nothing of the crate.

use std::borrow::Cow;

/// Cuts `s` to at most `max` characters for a message.
pub fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

/// `s` cut to at most `max` bytes, at a character boundary (nothing
/// added: the result is never longer than `max`).
pub fn clip_bytes(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// `s` with every control character (and the Unicode line and paragraph
/// separators) escaped as Rust does (`\n`, `\u{1b}`), so that a value
/// cannot start a new line or move the cursor. Borrowed when clean.
pub fn escape(s: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}');
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if unsafe_char(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_clipping_stops_at_a_character_boundary() {
        assert_eq!(clip_bytes("short", 256), "short");
        assert_eq!(clip_bytes("abcdef", 4), "abcd");
        // 'é' is two bytes: a cut inside it steps back before it.
        assert_eq!(clip_bytes("aé", 2), "a");
        let long = "é".repeat(200);
        let cut = clip_bytes(&long, 256);
        assert!(cut.len() <= 256 && cut.len() == 256, "{}", cut.len());
        assert_eq!(clip_bytes(&"€".repeat(100), 256).len(), 255);
    }

    #[test]
    fn clipping_is_char_safe() {
        assert_eq!(clip("héllo", 2), "hé…");
        assert_eq!(clip("ab", 5), "ab");
    }

    #[test]
    fn a_value_cannot_forge_a_line() {
        assert!(matches!(escape("orders-1"), Cow::Borrowed(_)));
        assert_eq!(
            escape("a\nINFO b\r\u{1b}[2J\u{2028}"),
            "a\\nINFO b\\r\\u{1b}[2J\\u{2028}"
        );
    }
}
