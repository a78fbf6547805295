//! Container image references: `repo[:tag][@sha256:<64 hex>]`.

use std::fmt;

/// A parsed image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// The repository, with its registry host (and port) if any.
    pub repository: String,
    /// The tag, if any.
    pub tag: Option<String>,
    /// The digest `sha256:<64 hex>`, if any.
    pub digest: Option<String>,
}

/// Whether `tag` is a valid tag: `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`.
pub fn valid_tag(tag: &str) -> bool {
    let b = tag.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// Whether `digest` is `sha256:` and 64 lowercase hex digits.
pub fn valid_digest(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
    })
}

/// What is wrong with an image reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageProblem {
    /// The digest is not `sha256:<64 lowercase hex>`.
    Digest,
    /// The tag is not `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`.
    Tag,
    /// Not `repo[:tag][@sha256:digest]` at all.
    Reference,
}

/// An image reference that does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageError {
    /// The reference (cut to 200 characters).
    pub input: String,
    /// What is wrong with it.
    pub problem: ImageProblem,
}

impl fmt::Display for ImageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let input = &self.input;
        match self.problem {
            ImageProblem::Digest => {
                write!(f, "{input:?}: the digest is not sha256:<64 lowercase hex>")
            }
            ImageProblem::Tag => write!(
                f,
                "{input:?}: the tag is not [A-Za-z0-9_][A-Za-z0-9._-]{{0,127}}"
            ),
            ImageProblem::Reference => write!(
                f,
                "{input:?} is not an image reference repo[:tag][@sha256:digest]"
            ),
        }
    }
}

impl std::error::Error for ImageError {}

impl ImageRef {
    /// Parses and validates a reference.
    pub fn parse(s: &str) -> Result<ImageRef, ImageError> {
        let invalid = |problem| ImageError {
            input: crate::text::clip(s, 200),
            problem,
        };
        let (name, digest) = match s.split_once('@') {
            Some((n, d)) => {
                if !valid_digest(d) {
                    return Err(invalid(ImageProblem::Digest));
                }
                (n, Some(d.to_owned()))
            }
            None => (s, None),
        };
        // A ':' after the last '/' separates the tag (a registry port comes before a '/').
        let last_slash = name.rfind('/').map_or(0, |i| i + 1);
        let (repository, tag) = match name[last_slash..].rfind(':') {
            Some(i) => {
                let i = last_slash + i;
                (&name[..i], Some(name[i + 1..].to_owned()))
            }
            None => (name, None),
        };
        if let Some(t) = &tag
            && !valid_tag(t)
        {
            return Err(invalid(ImageProblem::Tag));
        }
        if !valid_repository(repository) {
            return Err(invalid(ImageProblem::Reference));
        }
        Ok(ImageRef {
            repository: repository.to_owned(),
            tag,
            digest,
        })
    }

    /// The same repository with another tag (and no digest).
    pub fn with_tag(&self, tag: &str) -> ImageRef {
        ImageRef {
            repository: self.repository.clone(),
            tag: Some(tag.to_owned()),
            digest: None,
        }
    }

    /// The same repository pinned to a digest (and no tag).
    pub fn with_digest(&self, digest: &str) -> ImageRef {
        ImageRef {
            repository: self.repository.clone(),
            tag: None,
            digest: Some(digest.to_owned()),
        }
    }
}

fn valid_repository(repo: &str) -> bool {
    if repo.is_empty() || repo.len() > 255 {
        return false;
    }
    let mut parts = repo.split('/').peekable();
    let mut first = true;
    while let Some(part) = parts.next() {
        // The first part may be a registry host with a port and uppercase-free dots.
        let is_registry = first
            && parts.peek().is_some()
            && (part.contains('.') || part.contains(':') || part == "localhost");
        first = false;
        let ok = if is_registry {
            let (host, port) = part.split_once(':').unwrap_or((part, "1"));
            !host.is_empty()
                && host.bytes().all(|c| {
                    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'-')
                })
                && port.parse::<u16>().is_ok()
        } else {
            !part.is_empty()
                && part.bytes().all(|c| {
                    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'-')
                })
                && part.as_bytes()[0].is_ascii_alphanumeric()
                && part.as_bytes()[part.len() - 1].is_ascii_alphanumeric()
        };
        if !ok {
            return false;
        }
    }
    true
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn parses_the_usual_forms() {
        let i = ImageRef::parse("registry.example.com:5000/nexo/proxy:1.4.2").unwrap();
        assert_eq!(
            (i.repository.as_str(), i.tag.as_deref(), i.digest.as_deref()),
            ("registry.example.com:5000/nexo/proxy", Some("1.4.2"), None)
        );
        let i = ImageRef::parse(&format!("nexo/proxy@{D}")).unwrap();
        assert_eq!((i.tag, i.digest.as_deref()), (None, Some(D)));
        let i = ImageRef::parse(&format!("proxy:1@{D}")).unwrap();
        assert_eq!(i.to_string(), format!("proxy:1@{D}"));
        assert_eq!(
            ImageRef::parse("proxy")
                .unwrap()
                .with_tag("2.0")
                .to_string(),
            "proxy:2.0"
        );
        assert_eq!(
            ImageRef::parse("r.io/p:1")
                .unwrap()
                .with_digest(D)
                .to_string(),
            format!("r.io/p@{D}")
        );
    }

    #[test]
    fn refuses_bad_references() {
        for bad in [
            "",
            "Proxy:1",
            "proxy:",
            "proxy:-x",
            "proxy@sha256:abc",
            "proxy@md5:00",
            "/proxy",
            "a//b",
            "proxy:1 2",
        ] {
            assert!(ImageRef::parse(bad).is_err(), "{bad:?}");
        }
        let problem = |s: &str| ImageRef::parse(s).map_err(|e| e.problem).err();
        assert_eq!(problem("proxy@md5:00"), Some(ImageProblem::Digest));
        assert_eq!(problem("proxy:-x"), Some(ImageProblem::Tag));
        assert_eq!(problem("a//b"), Some(ImageProblem::Reference));
        assert!(valid_tag("_a.b-c") && !valid_tag(&"a".repeat(129)) && valid_tag(&"a".repeat(128)));
        assert!(valid_digest(D) && !valid_digest(&D.to_uppercase()));
    }
}
