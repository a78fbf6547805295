//! Semantic versions (SemVer 2.0.0): parsing and precedence, for the
//! downgrade rule of `upgrade` (docs/protocol.md, "upgrade"). A leaf module.

use std::cmp::Ordering;
use std::fmt;

/// A parsed `MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    core: [u64; 3],
    /// Dot-separated pre-release identifiers; empty for a release.
    pre: Vec<String>,
}

/// Why a text is not a semantic version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotSemver(&'static str);

impl fmt::Display for NotSemver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "not a semantic version: {}", self.0)
    }
}

impl std::error::Error for NotSemver {}

fn numeric(part: &str) -> Result<u64, NotSemver> {
    if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
        return Err(NotSemver("MAJOR.MINOR.PATCH must be numbers"));
    }
    if part.len() > 1 && part.starts_with('0') {
        return Err(NotSemver("a number has a leading zero"));
    }
    part.parse().map_err(|_| NotSemver("a number is too large"))
}

fn identifiers(text: &str, what: &'static str) -> Result<Vec<String>, NotSemver> {
    text.split('.')
        .map(|id| {
            if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
                return Err(NotSemver(what));
            }
            if what == "bad pre-release identifier"
                && id.len() > 1
                && id.starts_with('0')
                && id.bytes().all(|b| b.is_ascii_digit())
            {
                return Err(NotSemver(
                    "a numeric pre-release identifier has a leading zero",
                ));
            }
            Ok(id.to_owned())
        })
        .collect()
}

impl Version {
    /// Parses a version; a leading `v` is not allowed (not SemVer).
    pub fn parse(text: &str) -> Result<Version, NotSemver> {
        let (rest, build) = match text.split_once('+') {
            Some((rest, build)) => (rest, Some(build)),
            None => (text, None),
        };
        if let Some(build) = build {
            identifiers(build, "bad build metadata")?;
        }
        let (core, pre) = match rest.split_once('-') {
            Some((core, pre)) => (core, identifiers(pre, "bad pre-release identifier")?),
            None => (rest, Vec::new()),
        };
        let mut parts = core.split('.');
        let (Some(major), Some(minor), Some(patch), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(NotSemver("it is not MAJOR.MINOR.PATCH"));
        };
        Ok(Version {
            core: [numeric(major)?, numeric(minor)?, numeric(patch)?],
            pre,
        })
    }
}

fn compare_identifier(a: &str, b: &str) -> Ordering {
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(x), Ok(y)) => x.cmp(&y),
        // Numeric identifiers have lower precedence than alphanumeric ones.
        (Ok(_), Err(_)) => Ordering::Less,
        (Err(_), Ok(_)) => Ordering::Greater,
        (Err(_), Err(_)) => a.cmp(b),
    }
}

impl Ord for Version {
    /// SemVer precedence (build metadata ignored).
    fn cmp(&self, other: &Self) -> Ordering {
        self.core.cmp(&other.core).then_with(|| {
            match (self.pre.is_empty(), other.pre.is_empty()) {
                (true, true) => Ordering::Equal,
                // A release is above its pre-releases.
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => {
                    for (a, b) in self.pre.iter().zip(&other.pre) {
                        let o = compare_identifier(a, b);
                        if o != Ordering::Equal {
                            return o;
                        }
                    }
                    self.pre.len().cmp(&other.pre.len())
                }
            }
        })
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    #[test]
    fn precedence_follows_semver() {
        // The example chain of SemVer 2.0.0, section 11.
        let chain = [
            "1.0.0-alpha",
            "1.0.0-alpha.1",
            "1.0.0-alpha.beta",
            "1.0.0-beta",
            "1.0.0-beta.2",
            "1.0.0-beta.11",
            "1.0.0-rc.1",
            "1.0.0",
            "1.0.1",
            "1.1.0",
            "2.0.0",
            "10.0.0",
        ];
        for pair in chain.windows(2) {
            assert!(v(pair[0]) < v(pair[1]), "{} < {}", pair[0], pair[1]);
        }
        assert_eq!(v("0.3.0+build.1").cmp(&v("0.3.0+other")), Ordering::Equal);
    }

    #[test]
    fn what_is_not_semver_is_refused() {
        for bad in [
            "",
            "1",
            "1.2",
            "v1.2.3",
            "1.2.3.4",
            "01.2.3",
            "1.2.x",
            "1.2.3-",
            "1.2.3-a..b",
            "1.2.3-01",
            "1.2.3+",
            "1.2.3-a_b",
            " 1.2.3",
        ] {
            assert!(Version::parse(bad).is_err(), "{bad:?}");
        }
    }
}
