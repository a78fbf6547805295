//! An object's `metadata.uid` as the index keeps it: the API server's
//! UUIDs as their 16 bytes (no allocation), any other text as it is (a
//! leaf of the inventory's files).

/// An object's `metadata.uid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Uid {
    /// A UUID in its canonical form (lowercase, hyphenated), as 16 bytes:
    /// written back exactly as it was read.
    Uuid([u8; 16]),
    /// Any other uid, as it is.
    Text(Box<str>),
}

impl Uid {
    /// The uid `s`.
    pub fn new(s: &str) -> Uid {
        canonical(s).map_or_else(|| Uid::Text(s.into()), Uid::Uuid)
    }
}

impl std::fmt::Display for Uid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Uid::Text(s) => f.write_str(s),
            Uid::Uuid(bytes) => {
                for (i, b) in bytes.iter().enumerate() {
                    if matches!(i, 4 | 6 | 8 | 10) {
                        f.write_str("-")?;
                    }
                    write!(f, "{b:02x}")?;
                }
                Ok(())
            }
        }
    }
}

/// The 16 bytes of `s` when it is a UUID in canonical form
/// (`8-4-4-4-12` lowercase hex digits), the only form written back the same.
fn canonical(s: &str) -> Option<[u8; 16]> {
    let s = s.as_bytes();
    if s.len() != 36 {
        return None;
    }
    let mut bytes = [0u8; 16];
    let mut digits = s
        .iter()
        .enumerate()
        .filter(|(i, _)| !matches!(i, 8 | 13 | 18 | 23));
    for byte in &mut bytes {
        let (_, hi) = digits.next()?;
        let (_, lo) = digits.next()?;
        *byte = (hex(*hi)? << 4) | hex(*lo)?;
    }
    [8, 13, 18, 23]
        .iter()
        .all(|&i| s[i] == b'-')
        .then_some(bytes)
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_canonical_uuid_is_kept_as_bytes_and_written_back_the_same() {
        let s = "0dc3d303-f601-483b-81d9-e9a1ef16038b";
        let uid = Uid::new(s);
        assert!(matches!(uid, Uid::Uuid(_)));
        assert_eq!(uid.to_string(), s);
        assert_eq!(Uid::new(s), uid);
        assert_ne!(Uid::new("0dc3d303-f601-483b-81d9-e9a1ef16038c"), uid);
    }

    #[test]
    fn any_other_uid_is_kept_as_text() {
        for s in [
            "0DC3D303-F601-483B-81D9-E9A1EF16038B",
            "0dc3d303f601483b81d9e9a1ef16038b",
            "0dc3d303-f601-483b-81d9-e9a1ef16038",
            "0dc3d303-f601-483b-81d9-e9a1ef16038bb",
            "0dc3d303_f601-483b-81d9-e9a1ef16038b",
            "0dc3d303-f601-483b-81d9-e9a1ef16038g",
            "uid-1",
            "",
            "é0c3d303-f601-483b-81d9-e9a1ef1603",
        ] {
            let uid = Uid::new(s);
            assert_eq!(uid, Uid::Text(s.into()), "{s}");
            assert_eq!(uid.to_string(), s);
        }
    }
}
