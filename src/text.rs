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
