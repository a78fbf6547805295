//! Where the Kubernetes API is and how to authenticate to it.
//!
//! Two sources: the in-cluster service account (the normal case) and a
//! kubeconfig file for development and tests. The kubeconfig must be JSON
//! (YAML's JSON subset; `kubectl config view --flatten -o json` writes one):
//! the Manager carries no YAML parser.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::Error;
use crate::secret::Secret;

/// The service-account folder mounted into every pod.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// How often a token file is re-read even without a 401 (bound service-account
/// tokens are rotated by the kubelet).
pub const TOKEN_REREAD: Duration = Duration::from_secs(60);

/// A validated client configuration.
#[derive(Debug)]
pub struct KubeConfig {
    /// Base URL, `https://host:port`, without a trailing slash.
    pub server: String,
    /// Trust anchors for the API server, PEM.
    pub ca_pem: Option<Vec<u8>>,
    /// Client credentials.
    pub auth: Auth,
    /// The namespace of the service account (in cluster) or of the context.
    pub namespace: Option<String>,
}

/// Client credentials.
#[derive(Debug)]
pub enum Auth {
    /// No credentials (anonymous).
    None,
    /// A bearer token, possibly re-read from a file.
    Bearer(BearerToken),
    /// A client certificate and key, PEM.
    ClientCert {
        /// Certificate chain, PEM.
        cert_pem: Vec<u8>,
        /// Private key, PEM.
        key_pem: Secret,
    },
}

/// A bearer token, from a fixed value or a file that is re-read every
/// [`TOKEN_REREAD`] and after a 401. A failed re-read keeps the last good token.
#[derive(Debug)]
pub struct BearerToken {
    file: Option<PathBuf>,
    current: RefCell<(Secret, Instant)>,
}

impl BearerToken {
    /// A token that never changes.
    pub fn fixed(token: Secret) -> Self {
        BearerToken {
            file: None,
            current: RefCell::new((token, Instant::now())),
        }
    }

    /// A token read from `path` now and re-read later.
    pub fn file(path: &Path) -> Result<Self, Error> {
        let token = read_token(path)?;
        Ok(BearerToken {
            file: Some(path.to_owned()),
            current: RefCell::new((token, Instant::now())),
        })
    }

    /// The token to send now.
    pub fn token(&self) -> Secret {
        if let Some(path) = &self.file {
            let stale = self.current.borrow().1.elapsed() >= TOKEN_REREAD;
            if stale {
                self.reload_from(path);
            }
        }
        self.current.borrow().0.clone()
    }

    /// Re-reads the file (after a 401). Returns whether the token changed.
    pub fn reload(&self) -> bool {
        match &self.file {
            Some(path) => self.reload_from(path),
            None => false,
        }
    }

    fn reload_from(&self, path: &Path) -> bool {
        let mut current = self.current.borrow_mut();
        current.1 = Instant::now();
        match read_token(path) {
            Ok(token) if token != current.0 => {
                current.0 = token;
                true
            }
            Ok(_) => false,
            Err(e) => {
                crate::warn!(err:% = e; "keeping the last service-account token");
                false
            }
        }
    }
}

/// The largest file of a kubeconfig or a service account read (a token, a
/// CA bundle, the kubeconfig itself).
const MAX_FILE: u64 = crate::files::MOUNTED_MAX;

fn read_token(path: &Path) -> Result<Secret, Error> {
    let raw = crate::files::read_to_string(path, MAX_FILE)
        .map_err(|e| Error::Config(format!("cannot read token file {}: {e}", path.display())))?;
    let token = raw.trim();
    if token.is_empty() {
        return Err(Error::Config(format!(
            "token file {} is empty",
            path.display()
        )));
    }
    Ok(Secret::new(token))
}

impl KubeConfig {
    /// In-cluster configuration from `KUBERNETES_SERVICE_HOST`/`_PORT` and the
    /// service-account files in `dir` (normally [`SERVICE_ACCOUNT_DIR`]).
    pub fn in_cluster(host: &str, port: &str, dir: &Path) -> Result<Self, Error> {
        if host.is_empty() {
            return Err(Error::Config("KUBERNETES_SERVICE_HOST is empty".into()));
        }
        port.parse::<u16>().map_err(|_| {
            Error::Config(format!("KUBERNETES_SERVICE_PORT {port:?} is not a port"))
        })?;
        // An IPv6 literal is bracketed in a URL.
        let server = if host.contains(':') && !host.starts_with('[') {
            format!("https://[{host}]:{port}")
        } else {
            format!("https://{host}:{port}")
        };
        let ca_path = dir.join("ca.crt");
        let ca_pem = crate::files::read(&ca_path, MAX_FILE)
            .map_err(|e| Error::Config(format!("cannot read {}: {e}", ca_path.display())))?;
        let auth = Auth::Bearer(BearerToken::file(&dir.join("token"))?);
        let namespace = crate::files::read_to_string(&dir.join("namespace"), MAX_FILE)
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty());
        Ok(KubeConfig {
            server,
            ca_pem: Some(ca_pem),
            auth,
            namespace,
        })
    }

    /// Reads a kubeconfig file (JSON), using its current context. Relative
    /// file paths inside it are taken relative to the file's folder.
    pub fn from_kubeconfig(path: &Path) -> Result<Self, Error> {
        let text = crate::files::read_to_string(path, MAX_FILE).map_err(|e| {
            Error::Config(format!("cannot read kubeconfig {}: {e}", path.display()))
        })?;
        let file: KubeconfigFile = serde_json::from_str(&text).map_err(|e| {
            Error::Config(format!(
                "kubeconfig {} is not JSON ({e}); convert it with `kubectl config view --flatten -o json`",
                path.display()
            ))
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        file.resolve(base)
            .map_err(|why| Error::Config(format!("kubeconfig {}: {why}", path.display())))
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct KubeconfigFile {
    #[serde(default)]
    clusters: Vec<Named<ClusterEntry>>,
    #[serde(default)]
    users: Vec<Named<UserEntry>>,
    #[serde(default)]
    contexts: Vec<Named<ContextEntry>>,
    #[serde(default)]
    current_context: String,
}

#[derive(Deserialize)]
struct Named<T> {
    name: String,
    #[serde(alias = "cluster", alias = "user", alias = "context")]
    value: T,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct ClusterEntry {
    server: String,
    #[serde(default)]
    certificate_authority: Option<PathBuf>,
    #[serde(default)]
    certificate_authority_data: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
struct UserEntry {
    #[serde(default)]
    token: Option<String>,
    #[serde(default, rename = "tokenFile")]
    token_file: Option<PathBuf>,
    #[serde(default)]
    client_certificate: Option<PathBuf>,
    #[serde(default)]
    client_certificate_data: Option<String>,
    #[serde(default)]
    client_key: Option<PathBuf>,
    #[serde(default)]
    client_key_data: Option<String>,
}

#[derive(Deserialize)]
struct ContextEntry {
    cluster: String,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
}

impl KubeconfigFile {
    fn resolve(self, base: &Path) -> Result<KubeConfig, KubeconfigError> {
        let context = self
            .contexts
            .iter()
            .find(|c| c.name == self.current_context)
            .ok_or_else(|| KubeconfigError::NoCurrentContext(self.current_context.clone()))?;
        let cluster = self
            .clusters
            .iter()
            .find(|c| c.name == context.value.cluster)
            .ok_or_else(|| KubeconfigError::NoCluster(context.value.cluster.clone()))?;
        let user = match &context.value.user {
            Some(name) => Some(
                self.users
                    .iter()
                    .find(|u| &u.name == name)
                    .ok_or_else(|| KubeconfigError::NoUser(name.clone()))?,
            ),
            None => None,
        };
        let server = cluster.value.server.trim_end_matches('/').to_owned();
        if !server.starts_with("https://") {
            return Err(KubeconfigError::NotHttps(server));
        }
        let ca_pem = pem_from(
            base,
            &cluster.value.certificate_authority,
            &cluster.value.certificate_authority_data,
        )?;
        let auth = match user {
            None => Auth::None,
            Some(u) => auth_of(base, &u.value)?,
        };
        Ok(KubeConfig {
            server,
            ca_pem,
            auth,
            namespace: context.value.namespace.clone(),
        })
    }
}

/// A user's credentials: a token, a token file (re-read when it rotates),
/// or a client certificate and key.
fn auth_of(base: &Path, u: &UserEntry) -> Result<Auth, KubeconfigError> {
    if let Some(token) = &u.token {
        return Ok(Auth::Bearer(BearerToken::fixed(Secret::new(token.clone()))));
    }
    if let Some(file) = &u.token_file {
        let source = BearerToken::file(&base.join(file)).map_err(KubeconfigError::TokenFile)?;
        return Ok(Auth::Bearer(source));
    }
    let cert = pem_from(base, &u.client_certificate, &u.client_certificate_data)?;
    let key = pem_from(base, &u.client_key, &u.client_key_data)?;
    match (cert, key) {
        (Some(cert_pem), Some(key)) => Ok(Auth::ClientCert {
            cert_pem,
            key_pem: Secret::new(String::from_utf8(key).map_err(|_| KubeconfigError::KeyNotText)?),
        }),
        (None, None) => Ok(Auth::None),
        _ => Err(KubeconfigError::HalfClientCert),
    }
}

fn pem_from(
    base: &Path,
    file: &Option<PathBuf>,
    data: &Option<String>,
) -> Result<Option<Vec<u8>>, KubeconfigError> {
    if let Some(data) = data {
        return base64_decode(data)
            .map(Some)
            .ok_or(KubeconfigError::DataNotBase64);
    }
    match file {
        Some(f) => {
            let path = base.join(f);
            crate::files::read(&path, MAX_FILE)
                .map(Some)
                .map_err(|source| KubeconfigError::Unreadable { path, source })
        }
        None => Ok(None),
    }
}

/// Why a kubeconfig cannot be used.
#[derive(Debug)]
enum KubeconfigError {
    NoCurrentContext(String),
    NoCluster(String),
    NoUser(String),
    NotHttps(String),
    TokenFile(Error),
    KeyNotText,
    HalfClientCert,
    DataNotBase64,
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl std::fmt::Display for KubeconfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use KubeconfigError as E;
        match self {
            E::NoCurrentContext(c) => write!(f, "current-context {c:?} is not among its contexts"),
            E::NoCluster(c) => write!(f, "cluster {c:?} not found"),
            E::NoUser(u) => write!(f, "user {u:?} not found"),
            E::NotHttps(s) => write!(f, "server {s:?} is not an https:// URL"),
            E::TokenFile(e) => write!(f, "{e}"),
            E::KeyNotText => f.write_str("client key is not PEM text"),
            E::HalfClientCert => f.write_str("a client certificate needs both certificate and key"),
            E::DataNotBase64 => f.write_str("a *-data field is not valid base64"),
            E::Unreadable { path, source } => write!(f, "cannot read {}: {source}", path.display()),
        }
    }
}

/// Standard base64 (with or without padding), whitespace ignored.
pub(crate) fn base64_decode(input: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(input.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0;
    for c in input.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' | b'\n' | b'\r' | b' ' | b'\t' => continue,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVsbG8").unwrap(), b"hello");
        assert!(base64_decode("a$b").is_none());
    }

    #[test]
    fn in_cluster_brackets_ipv6() {
        let dir = std::env::temp_dir().join(format!("nexo-sa-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("ca.crt"), "pem").unwrap();
        std::fs::write(dir.join("token"), "tok\n").unwrap();
        std::fs::write(dir.join("namespace"), "nexo-system").unwrap();
        let v6 = KubeConfig::in_cluster("fd00::1", "443", &dir).unwrap();
        assert_eq!(v6.server, "https://[fd00::1]:443");
        assert_eq!(v6.namespace.as_deref(), Some("nexo-system"));
        let v4 = KubeConfig::in_cluster("10.0.0.1", "6443", &dir).unwrap();
        assert_eq!(v4.server, "https://10.0.0.1:6443");
        assert!(KubeConfig::in_cluster("10.0.0.1", "x", &dir).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn token_file_reload_keeps_last_good_token() {
        let path = std::env::temp_dir().join(format!("nexo-token-{}", std::process::id()));
        std::fs::write(&path, "first").unwrap();
        let source = BearerToken::file(&path).unwrap();
        assert_eq!(source.token().expose(), "first");
        std::fs::write(&path, "second").unwrap();
        assert!(source.reload());
        assert_eq!(source.token().expose(), "second");
        std::fs::remove_file(&path).unwrap();
        assert!(!source.reload());
        assert_eq!(source.token().expose(), "second");
    }

    #[test]
    fn kubeconfig_current_context_and_relative_paths() {
        let dir = std::env::temp_dir().join(format!("nexo-kc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("ca.crt"), "CA").unwrap();
        let kc = r#"{"clusters":[{"name":"c","cluster":{"server":"https://127.0.0.1:6443/","certificate-authority":"ca.crt"}}],
            "users":[{"name":"u","user":{"token":"abc"}}],
            "contexts":[{"name":"x","context":{"cluster":"c","user":"u","namespace":"ns1"}}],
            "current-context":"x"}"#;
        std::fs::write(dir.join("config"), kc).unwrap();
        let cfg = KubeConfig::from_kubeconfig(&dir.join("config")).unwrap();
        assert_eq!(cfg.server, "https://127.0.0.1:6443");
        assert_eq!(cfg.ca_pem.as_deref(), Some(&b"CA"[..]));
        assert_eq!(cfg.namespace.as_deref(), Some("ns1"));
        assert!(matches!(&cfg.auth, Auth::Bearer(t) if t.token().expose() == "abc"));
        assert!(
            !format!("{cfg:?}").contains("abc"),
            "the token must not reach Debug output"
        );
        std::fs::write(dir.join("config"), "apiVersion: v1\n").unwrap();
        let err = KubeConfig::from_kubeconfig(&dir.join("config"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("is not JSON"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
