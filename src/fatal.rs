//! Why the Manager stopped: every fatal error, its exit code, and what the
//! operator can do about it.
//!
//! Exit codes (also in `--help`): 1 an unexpected fatal error, 2 a
//! configuration error, 3 a binding refused. A clean stop exits 0 and is not
//! an error. Each variant keeps its cause as a typed `source()`.

use std::error::Error as StdError;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::config::ConfigError;
use crate::cp::CpError;
use crate::cp::client::SetupError;
use crate::kube;
use crate::state::StateError;
use crate::token::TokenReadError;

/// Why the Manager stopped.
#[derive(Debug)]
pub enum Fatal {
    /// Exit 2: a variable of the environment is invalid.
    Config(ConfigError),
    /// Exit 2: the connect token cannot be read, or is malformed.
    ConnectToken(TokenReadError),
    /// Exit 2: a file a variable names cannot be read.
    ReadFile {
        /// The variable naming it.
        variable: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Exit 2: `NEXO_LISTEN_ADDR` cannot be listened on.
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Exit 2: the Control Plane client cannot be built.
    ControlPlaneSetup(SetupError),
    /// Exit 2: no usable Kubernetes access (in-cluster or `KUBECONFIG`).
    KubeConfig(kube::Error),
    /// Exit 2: the Manager's own namespace is unknown.
    NoNamespace,
    /// Exit 2: `NEXO_COMMAND_KEYS_FILE` exists and cannot be used.
    CommandKeys(crate::trust::KeysError),
    /// Exit 2: `NEXO_STATE_SECRET` names a Secret that is not this Manager's.
    ForeignState(StateError),
    /// Exit 3: the state Secret was bound on another cluster.
    ClusterMismatch {
        /// `namespace/name` of the state Secret.
        secret: String,
        /// The cluster it is bound to.
        bound: String,
        /// This cluster.
        this: String,
        /// The environment of the binding.
        environment: String,
    },
    /// Exit 3: the CP answered connect for another environment.
    EnvironmentMismatch {
        /// What the CP answered.
        answered: String,
        /// The connect token's.
        token: String,
    },
    /// Exit 3: the environment is bound to another cluster.
    BoundElsewhere {
        /// The environment.
        environment: String,
        /// This cluster.
        cluster: String,
        /// The CP's 403.
        source: CpError,
    },
    /// Exit 3: the CP does not speak this protocol version.
    ProtocolUnsupported(CpError),
    /// Exit 2: the connect token is for another environment than the one
    /// this Manager is bound to (docs/protocol.md, "Connect token and binding").
    EnvironmentSwitch {
        /// The bound environment.
        bound: String,
        /// The token's.
        token: String,
    },
    /// Exit 1: the signal handlers cannot be installed.
    Signals(std::io::Error),
    /// Exit 1: the wait between heartbeats failed.
    Wait(std::io::Error),
    /// Exit 1: a start-up read failed for good.
    Startup {
        /// What was being read.
        what: &'static str,
        /// Why.
        source: kube::Error,
    },
    /// Exit 1: SIGTERM arrived during start-up.
    StoppedDuringStartup(&'static str),
    /// Exit 1: the kube-system namespace has no uid.
    NoClusterUid,
    /// Exit 1: the CP called the connect body malformed.
    ConnectMalformed(CpError),
    /// Exit 1: the state Secret cannot be read or written.
    State(StateError),
}

impl Fatal {
    /// The process exit code.
    pub fn exit_code(&self) -> u8 {
        match self {
            Fatal::Config(_)
            | Fatal::ConnectToken(_)
            | Fatal::ReadFile { .. }
            | Fatal::Listen { .. }
            | Fatal::ControlPlaneSetup(_)
            | Fatal::KubeConfig(_)
            | Fatal::NoNamespace
            | Fatal::CommandKeys(_)
            | Fatal::ForeignState(_)
            | Fatal::EnvironmentSwitch { .. } => 2,
            Fatal::ClusterMismatch { .. }
            | Fatal::EnvironmentMismatch { .. }
            | Fatal::BoundElsewhere { .. }
            | Fatal::ProtocolUnsupported(_) => 3,
            Fatal::Signals(_)
            | Fatal::Wait(_)
            | Fatal::Startup { .. }
            | Fatal::StoppedDuringStartup(_)
            | Fatal::NoClusterUid
            | Fatal::ConnectMalformed(_)
            | Fatal::State(_) => 1,
        }
    }

    /// The message without its prefix: one arm per variant, long on
    /// purpose (each message says what the operator can do).
    fn detail(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fatal::Config(e) => write!(f, "{e}"),
            Fatal::ConnectToken(e) => write!(f, "{e}"),
            Fatal::ReadFile {
                variable,
                path,
                source,
            } => write!(f, "{variable}: cannot read {}: {source}", path.display()),
            Fatal::Listen { addr, source } => {
                write!(f, "NEXO_LISTEN_ADDR: cannot listen on {addr}: {source}")
            }
            Fatal::ControlPlaneSetup(e) => write!(f, "{e}"),
            Fatal::KubeConfig(e) => write!(f, "{e}"),
            Fatal::NoNamespace => f.write_str(
                "POD_NAMESPACE: not set, and no service-account namespace to fall back on",
            ),
            Fatal::ForeignState(e) => write!(f, "NEXO_STATE_SECRET: {e}"),
            Fatal::CommandKeys(e) => write!(
                f,
                "NEXO_COMMAND_KEYS_FILE: {e}; it holds lines of `<keyId> <base64 of a raw 32-byte Ed25519 public key>`"
            ),
            Fatal::ClusterMismatch {
                secret,
                bound,
                this,
                environment,
            } => write!(
                f,
                "the state secret {secret} is bound to cluster {bound} but this cluster is {this}: the state was copied from another cluster; delete that secret only if this cluster really is a new home for environment {environment}"
            ),
            Fatal::EnvironmentSwitch { bound, token } => write!(
                f,
                "the connect token is for environment {token} but this Manager is bound to environment {bound}: a Manager never switches environments; to move this cluster to {token}, delete the state Secret (NEXO_STATE_SECRET), then install the new token"
            ),
            Fatal::EnvironmentMismatch { answered, token } => write!(
                f,
                "the Control Plane answered for environment {answered} but the connect token is for {token}"
            ),
            Fatal::BoundElsewhere {
                environment,
                cluster,
                ..
            } => write!(
                f,
                "environment {environment} is bound to another Kubernetes cluster (this one is {cluster}); use the connect token issued for this cluster's environment, or release the binding in the Nexo console"
            ),
            Fatal::ProtocolUnsupported(e) => write!(
                f,
                "the Control Plane does not accept protocol version {}; upgrade the Manager ({e})",
                crate::cp::wire::PROTOCOL_VERSION
            ),
            Fatal::Signals(e) => write!(f, "cannot install signal handlers: {e}"),
            Fatal::Wait(e) => write!(f, "wait failed: {e}"),
            Fatal::Startup { what, source } => {
                write!(f, "cannot {what}: {source}")?;
                if source.is_forbidden() {
                    f.write_str(
                        "; the Manager's ServiceAccount lacks a permission that manifests/ grants (check its ClusterRole and RoleBindings)",
                    )?;
                }
                Ok(())
            }
            Fatal::StoppedDuringStartup(what) => {
                write!(f, "stopped before being able to {what}")
            }
            Fatal::NoClusterUid => f.write_str(
                "the kube-system namespace has no metadata.uid; the cluster identity cannot be read",
            ),
            Fatal::ConnectMalformed(e) => write!(
                f,
                "the Control Plane refused the connect body as malformed: {e}; this Manager and the Control Plane disagree on the protocol: report it with this line"
            ),
            Fatal::State(e) => write!(
                f,
                "{e}; the Manager cannot keep its command ledger without its state secret"
            ),
        }
    }
}

impl fmt::Display for Fatal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.exit_code() {
            2 => f.write_str("configuration error: ")?,
            3 => f.write_str("binding refused: ")?,
            _ => {}
        }
        self.detail(f)
    }
}

impl StdError for Fatal {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            Fatal::Config(e) => Some(e),
            Fatal::ConnectToken(e) => Some(e),
            Fatal::ReadFile { source, .. }
            | Fatal::Listen { source, .. }
            | Fatal::Signals(source)
            | Fatal::Wait(source) => Some(source),
            Fatal::ControlPlaneSetup(e) => Some(e),
            Fatal::KubeConfig(e) | Fatal::Startup { source: e, .. } => Some(e),
            Fatal::ForeignState(e) | Fatal::State(e) => Some(e),
            Fatal::CommandKeys(e) => Some(e),
            Fatal::BoundElsewhere { source: e, .. }
            | Fatal::ProtocolUnsupported(e)
            | Fatal::ConnectMalformed(e) => Some(e),
            Fatal::ClusterMismatch { .. }
            | Fatal::EnvironmentMismatch { .. }
            | Fatal::EnvironmentSwitch { .. }
            | Fatal::NoNamespace
            | Fatal::StoppedDuringStartup(_)
            | Fatal::NoClusterUid => None,
        }
    }
}

impl From<StateError> for Fatal {
    fn from(e: StateError) -> Self {
        match e {
            StateError::NotOurs(_) => Fatal::ForeignState(e),
            StateError::OtherEnvironment { bound, token } => {
                Fatal::EnvironmentSwitch { bound, token }
            }
            _ => Fatal::State(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_and_prefixes() {
        let cases = [
            (Fatal::NoNamespace, 2, "configuration error: POD_NAMESPACE"),
            (
                Fatal::EnvironmentMismatch {
                    answered: "env-b".into(),
                    token: "env-a".into(),
                },
                3,
                "binding refused: the Control Plane answered for environment env-b",
            ),
            (
                Fatal::EnvironmentSwitch {
                    bound: "env-a".into(),
                    token: "env-b".into(),
                },
                2,
                "configuration error: the connect token is for environment env-b but this Manager is bound to environment env-a",
            ),
            (Fatal::NoClusterUid, 1, "the kube-system namespace"),
            (
                Fatal::StoppedDuringStartup("read the state secret"),
                1,
                "stopped before",
            ),
        ];
        for (fatal, code, start) in cases {
            assert_eq!(fatal.exit_code(), code, "{fatal}");
            assert!(fatal.to_string().starts_with(start), "{fatal}");
        }
    }

    #[test]
    fn causes_are_kept_as_sources() {
        let e = Fatal::Listen {
            addr: "127.0.0.1:1".parse().unwrap_or_else(|_| unreachable!()),
            source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
        };
        assert_eq!(e.exit_code(), 2);
        let source = e.source().map(ToString::to_string);
        assert_eq!(
            source,
            Some(std::io::Error::from(std::io::ErrorKind::AddrInUse).to_string())
        );
        let refused = Fatal::Startup {
            what: "read the cluster identity",
            source: kube::Error::Api {
                status: 403,
                body: kube::error::Status::default(),
                retry_after: None,
            },
        };
        assert!(
            refused.to_string().contains("lacks a permission"),
            "a 403 says what to check: {refused}"
        );
        assert!(refused.source().is_some());
    }
}
