//! Configuration: the environment, parsed once into a validated [`Config`].
//!
//! Every error names the variable and what is wrong with it. Secrets are
//! held in `Secret` and never printed.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::image::ImageRef;
use crate::logging::LogFormat;
use crate::names::{is_dns_label, is_dns_subdomain};
use crate::policy::{PodSecurity, Policy};
use crate::secret::Secret;
use crate::token::{ConnectToken, TokenError, TokenSource};

/// The validated configuration of one Manager process.
#[derive(Debug, Clone)]
pub struct Config {
    /// `NEXO_CONTROL_PLANE_URL`: the CP base URL without a trailing slash. Required.
    pub control_plane_url: String,
    /// `NEXO_CONNECT_TOKEN_FILE` or `NEXO_CONNECT_TOKEN`. Default: the file
    /// `/var/run/secrets/nexo/connect-token`.
    pub token_source: TokenSource,
    /// `NEXO_ENVIRONMENT_ID`: cross-check of the token's environment. Default: none.
    pub environment_id: Option<String>,
    /// `NEXO_PROXY_IMAGE`: the configured Proxy image. Required.
    pub proxy_image: ImageRef,
    /// `NEXO_NAMESPACES`: the managed namespaces. Default: empty, meaning the
    /// Manager's own namespace (resolved at start, see [`Config::managed_namespaces`]).
    pub namespaces: Vec<String>,
    /// `NEXO_HEARTBEAT_INTERVAL`: default 15 s; the CP may override it (5 s to 600 s).
    pub heartbeat_interval: Duration,
    /// `NEXO_PROGRESS_DEADLINE`: default 10 min (1 s to 24 h); how long a
    /// change may stay not available before its phase is `failed`
    /// (docs/protocol.md, `status.v1`).
    pub progress_deadline: Duration,
    /// `NEXO_SELF_UPGRADE_DEADLINE`: default 10 min (1 s to 24 h); how long
    /// the new pods of an upgrade this Manager applied may take to become
    /// Ready before it writes its own image back (docs/protocol.md,
    /// `rollback.v1`).
    pub self_upgrade_deadline: Duration,
    /// `NEXO_DRIFT_INTERVAL`: default 5 min (1 s to 24 h); how often drift
    /// is checked (docs/protocol.md, `drift.v1`). Under the heartbeat interval,
    /// the heartbeat interval is used (with a warning at start).
    pub drift_interval: Duration,
    /// `NEXO_CONTROL_PLANE_CA_FILE`: extra PEM trust anchors. Default: none
    /// (the built-in public roots only).
    pub control_plane_ca_file: Option<PathBuf>,
    /// `NEXO_CLUSTER_NAME`. Default: absent.
    pub cluster_name: Option<String>,
    /// `NEXO_CLUSTER_REGION`. Default: from node labels, else absent.
    pub cluster_region: Option<String>,
    /// `NEXO_CLUSTER_ZONE`. Default: from node labels, else absent.
    pub cluster_zone: Option<String>,
    /// `NEXO_ALLOW_LEGACY_ADOPTION`: the cluster side of the migration gate. Default: false.
    pub allow_legacy_adoption: bool,
    /// `NEXO_ADOPT_UNPROVEN`: the gate that lets a write give its proof to
    /// an object with this environment's labels but none (objects of 0.4;
    /// SECURITY.md, "Integrity the namespace cannot forge"). Default: false.
    pub adopt_unproven: bool,
    /// `NEXO_ALLOW_SELF_UPGRADE`: whether the `upgrade` command may patch
    /// the Manager's own Deployment; when false, `command.upgrade` is not
    /// advertised and every upgrade is refused (installs whose Deployment
    /// a GitOps tool or Helm alone owns). Default: true.
    pub allow_self_upgrade: bool,
    /// `NEXO_LISTEN_ADDR`: probes and metrics; `None` for `off`. Default: `0.0.0.0:8080`.
    pub listen_addr: Option<SocketAddr>,
    /// `NEXO_STATE_SECRET`. Default: `nexo-manager-state`.
    pub state_secret: String,
    /// `NEXO_EXECUTOR`: the ServiceAccount, in each managed namespace, whose
    /// identity every write and dry run of a command is sent with
    /// (impersonation: the namespace's RBAC bounds what a command may do);
    /// `None` for `off` (the Manager's own identity). Default:
    /// `nexo-executor`.
    pub executor: Option<String>,
    /// `NEXO_LEASE_NAME`. Default: `nexo-manager`.
    pub lease_name: String,
    /// `NEXO_SELF_DEPLOYMENT`. Default: `nexo-manager`.
    pub self_deployment: String,
    /// `POD_NAMESPACE`. Default: the service-account namespace file.
    pub pod_namespace: Option<String>,
    /// `POD_NAME`. Default: the hostname.
    pub pod_name: Option<String>,
    /// `POD_UID`. Default: the hostname.
    pub pod_uid: Option<String>,
    /// `NEXO_INSECURE_ALLOW_HTTP`: development only. Default: false.
    pub insecure_allow_http: bool,
    /// `NEXO_LOG_FORMAT`. Default: text.
    pub log_format: LogFormat,
    /// `KUBECONFIG`: out-of-cluster access. Default: in-cluster configuration.
    pub kubeconfig: Option<PathBuf>,
    /// `NEXO_CP_CONNECT_TIMEOUT`: connect timeout of CP calls. Default: 10 s.
    pub cp_connect_timeout: Duration,
    /// `NEXO_CP_REQUEST_TIMEOUT`: whole-request timeout of CP calls. Default: 30 s.
    pub cp_request_timeout: Duration,
    /// `HTTPS_PROXY` (or `https_proxy`) for the CP connection, unless `NO_PROXY`
    /// excludes the CP host. Default: none.
    pub https_proxy: Option<String>,
    /// `NEXO_COMMAND_KEYS_FILE`: Ed25519 command-verification keys; while
    /// the file does not exist, unsigned commands are accepted. Default:
    /// `/var/run/secrets/nexo/command-keys`.
    pub command_keys_file: PathBuf,
    /// `NEXO_COMMAND_SIGNATURES`: `required`, `off`, or unset (required
    /// once keys were seen). Default: unset.
    pub command_signatures: Signatures,
    /// `NEXO_BUNDLE_VERSION`: the installed bundle (chart) version, for the
    /// release contract. Default: absent.
    pub bundle_version: Option<String>,
    /// The content policy: `NEXO_ALLOWED_IMAGE_REPOSITORIES`,
    /// `NEXO_MANAGER_IMAGE_REPOSITORY`, `NEXO_ALLOW_EXTERNAL_SERVICES`,
    /// `NEXO_POD_SECURITY` (see [`Policy`] for the defaults).
    pub policy: Policy,
}

/// `NEXO_COMMAND_SIGNATURES` (docs/protocol.md, "Fail closed").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Signatures {
    /// Unset: required once command keys were seen (recorded in the state).
    #[default]
    Auto,
    /// `required`: every command must be signed, keys or not.
    Required,
    /// `off`: the operator turned signatures off; unsigned commands are
    /// accepted (logged at warning level at every start).
    Off,
}

/// The default command-keys file.
pub const DEFAULT_COMMAND_KEYS_FILE: &str = "/var/run/secrets/nexo/command-keys";

/// The default connect-token file.
pub const DEFAULT_TOKEN_FILE: &str = "/var/run/secrets/nexo/connect-token";

/// A configuration error: the variable and what is wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    /// The variable at fault.
    pub variable: &'static str,
    /// What is wrong, without any secret.
    pub problem: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.variable, self.problem)
    }
}

impl std::error::Error for ConfigError {}

fn err(variable: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        variable,
        problem: problem.into(),
    }
}

impl Config {
    /// Parses the configuration from the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Config::from_lookup(|k| std::env::var(k).ok())
    }

    /// Parses the configuration from `lookup` (a variable name to its value).
    /// Empty values count as unset.
    ///
    /// Long, and kept whole on purpose: one statement per variable, in the
    /// order of `--help`, so that the variables, their defaults and their
    /// checks read as one table.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let get = |k: &str| {
            lookup(k)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };

        let insecure_allow_http =
            parse_bool("NEXO_INSECURE_ALLOW_HTTP", get("NEXO_INSECURE_ALLOW_HTTP"))?;
        let url = get("NEXO_CONTROL_PLANE_URL")
            .ok_or_else(|| err("NEXO_CONTROL_PLANE_URL", "is required"))?;
        let control_plane_url = parse_cp_url(&url, insecure_allow_http)?;

        let token_source = match (get("NEXO_CONNECT_TOKEN"), get("NEXO_CONNECT_TOKEN_FILE")) {
            (Some(_), Some(_)) => {
                return Err(err(
                    "NEXO_CONNECT_TOKEN",
                    "set together with NEXO_CONNECT_TOKEN_FILE; set only one",
                ));
            }
            (Some(value), None) => TokenSource::Value(Secret::new(value)),
            (None, Some(file)) => TokenSource::File(PathBuf::from(file)),
            (None, None) => TokenSource::File(PathBuf::from(DEFAULT_TOKEN_FILE)),
        };

        let environment_id = get("NEXO_ENVIRONMENT_ID");
        if let Some(id) = &environment_id
            && !crate::token::valid_environment_id(id)
        {
            return Err(err(
                "NEXO_ENVIRONMENT_ID",
                format!("{id:?} is not an environment id ([a-z0-9][a-z0-9-]{{2,62}})"),
            ));
        }
        // A token given by value is checked now; a file is checked when read.
        if let TokenSource::Value(value) = &token_source {
            ConnectToken::parse(value.expose(), environment_id.as_deref())
                .map_err(|e: TokenError| err("NEXO_CONNECT_TOKEN", e.to_string()))?;
        }

        let image =
            get("NEXO_PROXY_IMAGE").ok_or_else(|| err("NEXO_PROXY_IMAGE", "is required"))?;
        let proxy_image =
            ImageRef::parse(&image).map_err(|e| err("NEXO_PROXY_IMAGE", e.to_string()))?;

        let mut namespaces = Vec::new();
        if let Some(list) = get("NEXO_NAMESPACES") {
            for ns in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                if !is_dns_label(ns) {
                    return Err(err(
                        "NEXO_NAMESPACES",
                        format!("{ns:?} is not a namespace name"),
                    ));
                }
                if !namespaces.iter().any(|n| n == ns) {
                    namespaces.push(ns.to_owned());
                }
            }
        }

        let duration =
            |var: &'static str, default: u64, max: u64| -> Result<Duration, ConfigError> {
                match get(var) {
                    None => Ok(Duration::from_secs(default)),
                    Some(v) => {
                        let d = humantime::parse_duration(&v).map_err(|e| {
                            err(var, format!("{v:?} is not a duration like 15s or 2m: {e}"))
                        })?;
                        if d < Duration::from_secs(1) || d > Duration::from_secs(max) {
                            let max = humantime::format_duration(Duration::from_secs(max));
                            return Err(err(var, format!("{v:?} is outside 1s..{max}")));
                        }
                        Ok(d)
                    }
                }
            };
        let heartbeat_interval = duration("NEXO_HEARTBEAT_INTERVAL", 15, 600)?;
        let progress_deadline = duration("NEXO_PROGRESS_DEADLINE", 600, 86_400)?;
        let self_upgrade_deadline = duration("NEXO_SELF_UPGRADE_DEADLINE", 600, 86_400)?;
        let drift_interval = duration("NEXO_DRIFT_INTERVAL", 300, 86_400)?;
        let cp_connect_timeout = duration("NEXO_CP_CONNECT_TIMEOUT", 10, 300)?;
        let cp_request_timeout = duration("NEXO_CP_REQUEST_TIMEOUT", 30, 300)?;

        let control_plane_ca_file = get("NEXO_CONTROL_PLANE_CA_FILE").map(PathBuf::from);
        let allow_legacy_adoption = parse_bool(
            "NEXO_ALLOW_LEGACY_ADOPTION",
            get("NEXO_ALLOW_LEGACY_ADOPTION"),
        )?;
        let adopt_unproven = parse_bool("NEXO_ADOPT_UNPROVEN", get("NEXO_ADOPT_UNPROVEN"))?;
        let allow_self_upgrade = match get("NEXO_ALLOW_SELF_UPGRADE") {
            None => true,
            value => parse_bool("NEXO_ALLOW_SELF_UPGRADE", value)?,
        };

        let listen_addr =
            match get("NEXO_LISTEN_ADDR").as_deref() {
                None => Some(SocketAddr::from(([0, 0, 0, 0], 8080))),
                Some("off") => None,
                Some(v) => Some(v.parse().map_err(|_| {
                    err("NEXO_LISTEN_ADDR", format!("{v:?} is not host:port or off"))
                })?),
            };

        let name_var = |var: &'static str, default: &str| -> Result<String, ConfigError> {
            let v = get(var).unwrap_or_else(|| default.to_owned());
            if is_dns_subdomain(&v) {
                Ok(v)
            } else {
                Err(err(var, format!("{v:?} is not a Kubernetes object name")))
            }
        };
        let state_secret = name_var("NEXO_STATE_SECRET", "nexo-manager-state")?;
        let lease_name = name_var("NEXO_LEASE_NAME", "nexo-manager")?;
        let self_deployment = name_var("NEXO_SELF_DEPLOYMENT", "nexo-manager")?;
        let executor = match get("NEXO_EXECUTOR").as_deref() {
            Some("off") => None,
            _ => Some(name_var("NEXO_EXECUTOR", "nexo-executor")?),
        };

        let pod_namespace = get("POD_NAMESPACE");
        if let Some(ns) = &pod_namespace
            && !is_dns_label(ns)
        {
            return Err(err(
                "POD_NAMESPACE",
                format!("{ns:?} is not a namespace name"),
            ));
        }

        let log_format = match get("NEXO_LOG_FORMAT").as_deref() {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(v) => {
                return Err(err(
                    "NEXO_LOG_FORMAT",
                    format!("{v:?} is neither text nor json"),
                ));
            }
        };

        let cp_host_port = host_port(&control_plane_url);
        let https_proxy = get("HTTPS_PROXY").or_else(|| get("https_proxy"));
        let no_proxy = get("NO_PROXY")
            .or_else(|| get("no_proxy"))
            .unwrap_or_default();
        let https_proxy = match https_proxy {
            Some(p) if !crate::cp::proxy::excluded(&no_proxy, &cp_host_port.0, cp_host_port.1) => {
                crate::cp::proxy::validate(&p).map_err(|e| err("HTTPS_PROXY", e.to_string()))?;
                Some(p)
            }
            _ => None,
        };

        let policy = policy(&get)?;

        Ok(Config {
            control_plane_url,
            token_source,
            environment_id,
            proxy_image,
            namespaces,
            heartbeat_interval,
            progress_deadline,
            self_upgrade_deadline,
            drift_interval,
            control_plane_ca_file,
            cluster_name: get("NEXO_CLUSTER_NAME"),
            cluster_region: get("NEXO_CLUSTER_REGION"),
            cluster_zone: get("NEXO_CLUSTER_ZONE"),
            allow_legacy_adoption,
            adopt_unproven,
            allow_self_upgrade,
            listen_addr,
            state_secret,
            executor,
            lease_name,
            self_deployment,
            pod_namespace,
            pod_name: get("POD_NAME"),
            pod_uid: get("POD_UID"),
            insecure_allow_http,
            log_format,
            kubeconfig: get("KUBECONFIG").map(PathBuf::from),
            cp_connect_timeout,
            cp_request_timeout,
            https_proxy,
            command_signatures: match get("NEXO_COMMAND_SIGNATURES").as_deref() {
                None => Signatures::Auto,
                Some("required") => Signatures::Required,
                Some("off") => Signatures::Off,
                Some(v) => {
                    return Err(err(
                        "NEXO_COMMAND_SIGNATURES",
                        format!(
                            "{:?} is neither required nor off (or unset)",
                            crate::text::clip(v, 32)
                        ),
                    ));
                }
            },
            bundle_version: get("NEXO_BUNDLE_VERSION"),
            command_keys_file: PathBuf::from(
                get("NEXO_COMMAND_KEYS_FILE")
                    .unwrap_or_else(|| DEFAULT_COMMAND_KEYS_FILE.to_owned()),
            ),
            policy,
        })
    }

    /// The managed namespaces: `NEXO_NAMESPACES`, else the Manager's own.
    pub fn managed_namespaces(&self, own: &str) -> Vec<String> {
        if self.namespaces.is_empty() {
            vec![own.to_owned()]
        } else {
            self.namespaces.clone()
        }
    }
}

/// An image repository named by a variable: `host/path`, no tag or digest.
fn repository(var: &'static str, v: &str) -> Result<String, ConfigError> {
    match ImageRef::parse(v) {
        Ok(r) if r.tag.is_none() && r.digest.is_none() => Ok(r.repository),
        _ => Err(err(
            var,
            format!("{v:?} is not an image repository (host/path, without a tag or digest)"),
        )),
    }
}

/// The content policy's variables.
fn policy(get: &impl Fn(&str) -> Option<String>) -> Result<Policy, ConfigError> {
    let mut image_repositories = Vec::new();
    let var = "NEXO_ALLOWED_IMAGE_REPOSITORIES";
    for r in get(var)
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        image_repositories.push(repository(var, r)?);
    }
    let var = "NEXO_MANAGER_IMAGE_REPOSITORY";
    let manager_repository = get(var).map(|r| repository(var, &r)).transpose()?;
    let pod_security = match get("NEXO_POD_SECURITY").as_deref() {
        None | Some("baseline") => PodSecurity::Baseline,
        Some("restricted") => PodSecurity::Restricted,
        Some(v) => {
            return Err(err(
                "NEXO_POD_SECURITY",
                format!("{v:?} is neither baseline nor restricted"),
            ));
        }
    };
    Ok(Policy {
        image_repositories,
        manager_repository,
        external_services: parse_bool(
            "NEXO_ALLOW_EXTERNAL_SERVICES",
            get("NEXO_ALLOW_EXTERNAL_SERVICES"),
        )?,
        pod_security,
    })
}

fn parse_bool(var: &'static str, v: Option<String>) -> Result<bool, ConfigError> {
    match v.as_deref() {
        None => Ok(false),
        Some("true" | "1" | "yes") => Ok(true),
        Some("false" | "0" | "no") => Ok(false),
        Some(other) => Err(err(var, format!("{other:?} is not true or false"))),
    }
}

fn parse_cp_url(url: &str, insecure_allow_http: bool) -> Result<String, ConfigError> {
    const VAR: &str = "NEXO_CONTROL_PLANE_URL";
    let rest = if let Some(rest) = url.strip_prefix("https://") {
        rest
    } else if let Some(rest) = url.strip_prefix("http://") {
        if !insecure_allow_http {
            return Err(err(
                VAR,
                "is a plain http:// URL; the Control Plane is reached over https:// only (NEXO_INSECURE_ALLOW_HTTP=true allows http for development)",
            ));
        }
        rest
    } else {
        return Err(err(VAR, format!("{url:?} is not an https:// URL")));
    };
    let authority = rest.split('/').next().unwrap_or("");
    if authority.is_empty() || authority.contains('@') || rest.contains(['?', '#', ' ']) {
        return Err(err(
            VAR,
            format!("{url:?} is not a base URL like https://cp.example.com"),
        ));
    }
    Ok(url.trim_end_matches('/').to_owned())
}

/// Host (without brackets) and port of a validated http(s) base URL.
pub fn host_port(url: &str) -> (String, u16) {
    let (rest, default_port) = match url.strip_prefix("https://") {
        Some(r) => (r, 443),
        None => (url.strip_prefix("http://").unwrap_or(url), 80),
    };
    let authority = rest.split('/').next().unwrap_or("");
    if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']').unwrap_or((v6, ""));
        let port = after
            .strip_prefix(':')
            .and_then(|p| p.parse().ok())
            .unwrap_or(default_port);
        return (host.to_owned(), port);
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => (h.to_ascii_lowercase(), p.parse().unwrap_or(default_port)),
        None => (authority.to_ascii_lowercase(), default_port),
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
