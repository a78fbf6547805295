//! The connect token: `nexo_ct_<environmentId>_<secret>`, validated before
//! it is sent anywhere. Errors name the problem, never the secret.

use std::fmt;
use std::path::PathBuf;

use crate::secret::Secret;

/// Where the connect token comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum TokenSource {
    /// A file (a mounted Secret), re-read after a 401 so rotation needs no restart.
    File(PathBuf),
    /// The value of `NEXO_CONNECT_TOKEN`.
    Value(Secret),
}

/// A connect token whose format was checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ConnectToken {
    environment_id: String,
    whole: Secret,
}

/// Why a connect token was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenError {
    /// It does not start with `nexo_ct_`.
    Prefix,
    /// The environment id part is not `[a-z0-9][a-z0-9-]{2,62}`.
    EnvironmentId,
    /// The secret part is not 32 or more of `[A-Za-z0-9]`.
    Secret,
    /// The token's environment is not the configured one.
    Mismatch {
        /// The token's environment id.
        token: String,
        /// `NEXO_ENVIRONMENT_ID`.
        configured: String,
    },
}

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenError::Prefix => f.write_str("the connect token is malformed: it must start with nexo_ct_"),
            TokenError::EnvironmentId => f.write_str(
                "the connect token is malformed: its environment id is not [a-z0-9][a-z0-9-]{2,62}",
            ),
            TokenError::Secret => f.write_str(
                "the connect token is malformed: its secret part must be at least 32 characters of [A-Za-z0-9]",
            ),
            TokenError::Mismatch { token, configured } => write!(
                f,
                "the connect token is for environment {token}, but NEXO_ENVIRONMENT_ID is {configured}"
            ),
        }
    }
}

impl std::error::Error for TokenError {}

/// Whether `id` is a valid environment id.
pub fn valid_environment_id(id: &str) -> bool {
    let b = id.as_bytes();
    (3..=63).contains(&b.len())
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

impl ConnectToken {
    /// Validates `raw` (surrounding whitespace ignored), and its environment
    /// against `expected` when one is configured.
    pub fn parse(raw: &str, expected: Option<&str>) -> Result<ConnectToken, TokenError> {
        let raw = raw.trim();
        let rest = raw.strip_prefix("nexo_ct_").ok_or(TokenError::Prefix)?;
        // Neither part may contain '_', so the split is unambiguous.
        let (env, secret) = rest.split_once('_').ok_or(TokenError::Secret)?;
        if !valid_environment_id(env) {
            return Err(TokenError::EnvironmentId);
        }
        if secret.len() < 32 || !secret.bytes().all(|c| c.is_ascii_alphanumeric()) {
            return Err(TokenError::Secret);
        }
        if let Some(expected) = expected
            && expected != env
        {
            return Err(TokenError::Mismatch {
                token: env.to_owned(),
                configured: expected.to_owned(),
            });
        }
        Ok(ConnectToken {
            environment_id: env.to_owned(),
            whole: Secret::new(raw),
        })
    }

    /// The environment the token is bound to.
    pub fn environment_id(&self) -> &str {
        &self.environment_id
    }

    /// The whole token, for the `Authorization` header.
    pub fn secret(&self) -> &Secret {
        &self.whole
    }
}

/// A connect token that could not be had from its source.
#[derive(Debug)]
pub enum TokenReadError {
    /// The token file cannot be read.
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The token (from `variable`, in `path` when a file) is malformed or
    /// for another environment.
    Invalid {
        /// `NEXO_CONNECT_TOKEN` or `NEXO_CONNECT_TOKEN_FILE`.
        variable: &'static str,
        /// The file, when read from one.
        path: Option<PathBuf>,
        /// What is wrong with it.
        source: TokenError,
    },
}

impl fmt::Display for TokenReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TokenReadError::Read { path, source } => write!(
                f,
                "NEXO_CONNECT_TOKEN_FILE: cannot read {}: {source}",
                path.display()
            ),
            TokenReadError::Invalid {
                variable,
                path: Some(path),
                source,
            } => write!(f, "{variable} ({}): {source}", path.display()),
            TokenReadError::Invalid {
                variable, source, ..
            } => write!(f, "{variable}: {source}"),
        }
    }
}

impl std::error::Error for TokenReadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TokenReadError::Read { source, .. } => Some(source),
            TokenReadError::Invalid { source, .. } => Some(source),
        }
    }
}

/// Reads the connect token from its source and validates it (against
/// `expected`, `NEXO_ENVIRONMENT_ID`, when set).
pub fn read(source: &TokenSource, expected: Option<&str>) -> Result<ConnectToken, TokenReadError> {
    match source {
        TokenSource::Value(v) => {
            ConnectToken::parse(v.expose(), expected).map_err(|source| TokenReadError::Invalid {
                variable: "NEXO_CONNECT_TOKEN",
                path: None,
                source,
            })
        }
        TokenSource::File(path) => {
            // A Secret's key; only a regular file, never waited for.
            let raw = crate::files::read_to_string(path, crate::files::MOUNTED_MAX).map_err(
                |source| TokenReadError::Read {
                    path: path.clone(),
                    source,
                },
            )?;
            ConnectToken::parse(&raw, expected).map_err(|source| TokenReadError::Invalid {
                variable: "NEXO_CONNECT_TOKEN_FILE",
                path: Some(path.clone()),
                source,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "abcdefghijklmnopqrstuvwxyzABCDEF0123";

    #[test]
    fn accepts_a_well_formed_token() {
        let t = ConnectToken::parse(
            &format!(" nexo_ct_env-prod-eu_{SECRET}\n"),
            Some("env-prod-eu"),
        )
        .unwrap();
        assert_eq!(t.environment_id(), "env-prod-eu");
        assert_eq!(t.secret().expose(), format!("nexo_ct_env-prod-eu_{SECRET}"));
        assert!(!format!("{t:?}").contains(SECRET));
    }

    #[test]
    fn refuses_malformed_tokens_without_printing_them() {
        let cases = [
            (format!("ct_env-a_{SECRET}"), TokenError::Prefix),
            (format!("nexo_ct_EN_{SECRET}"), TokenError::EnvironmentId),
            (format!("nexo_ct_ab_{SECRET}"), TokenError::EnvironmentId),
            (format!("nexo_ct_-abc_{SECRET}"), TokenError::EnvironmentId),
            ("nexo_ct_env-a_short".to_owned(), TokenError::Secret),
            (format!("nexo_ct_env-a_{SECRET}!"), TokenError::Secret),
            (format!("nexo_ct_env-a_{SECRET}_x"), TokenError::Secret),
            ("nexo_ct_env-a".to_owned(), TokenError::Secret),
        ];
        for (raw, want) in cases {
            let e = ConnectToken::parse(&raw, None).unwrap_err();
            assert_eq!(e, want, "{raw}");
            assert!(!e.to_string().contains(SECRET));
        }
    }

    #[test]
    fn environment_cross_check() {
        let e = ConnectToken::parse(&format!("nexo_ct_env-a_{SECRET}"), Some("env-b")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the connect token is for environment env-a, but NEXO_ENVIRONMENT_ID is env-b"
        );
    }
}
