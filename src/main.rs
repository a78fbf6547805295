//! The `nexo-manager` binary. See the library crate for what it does.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use nexo_manager::agent::{Agent, Fatal};
use nexo_manager::config::Config;

const HELP: &str = "\
nexo-manager: the in-cluster agent of a Nexo environment

USAGE:
    nexo-manager [--help | --version]

Configuration is read from the environment only.

ENVIRONMENT:
    NEXO_CONTROL_PLANE_URL       Control Plane base URL, https://... (required)
    NEXO_CONNECT_TOKEN_FILE      file holding the connect token
                                 [default: /var/run/secrets/nexo/connect-token]
    NEXO_CONNECT_TOKEN           the connect token itself, when no file is used
    NEXO_ENVIRONMENT_ID          cross-check of the token's environment [default: none]
    NEXO_PROXY_IMAGE             the configured Proxy image, repo[:tag][@digest] (required)
    NEXO_NAMESPACES              comma-separated managed namespaces [default: its own namespace]
    NEXO_HEARTBEAT_INTERVAL      heartbeat interval [default: 15s]
    NEXO_PROGRESS_DEADLINE       how long a change may stay not available before its
                                 status phase is failed [default: 10m]
    NEXO_SELF_UPGRADE_DEADLINE   how long the new pods of an upgrade may take to become
                                 Ready before it is rolled back [default: 10m]
    NEXO_DRIFT_INTERVAL          how often drift is checked (at least the heartbeat
                                 interval) [default: 5m]
    NEXO_CONTROL_PLANE_CA_FILE   extra PEM trust anchors for the Control Plane [default: none]
    NEXO_CP_CONNECT_TIMEOUT      connect timeout of Control Plane calls [default: 10s]
    NEXO_CP_REQUEST_TIMEOUT      whole-request timeout of Control Plane calls [default: 30s]
    NEXO_CLUSTER_NAME            cluster name [default: absent]
    NEXO_CLUSTER_REGION          cluster region [default: node label, else absent]
    NEXO_CLUSTER_ZONE            cluster zone [default: node label, else absent]
    NEXO_ALLOW_LEGACY_ADOPTION   the cluster side of the migration gate [default: false]
    NEXO_EXECUTOR                the ServiceAccount of each managed namespace every write
                                 and dry run of a command is sent as (impersonation);
                                 off: the Manager's own identity [default: nexo-executor]
    NEXO_ADOPT_UNPROVEN          whether writes give their proof to objects with this
                                 environment's labels but none (from 0.4) [default: false]
    NEXO_ALLOW_SELF_UPGRADE      whether the upgrade command may patch the Manager's own
                                 Deployment; false: command.upgrade is not advertised
                                 [default: true]
    NEXO_BUNDLE_VERSION          the installed bundle (chart) version, reported in the
                                 heartbeat's releaseContract [default: absent]
    NEXO_COMMAND_KEYS_FILE       Ed25519 keys commands must be signed with, lines of
                                 `<keyId> <base64 public key>` [default:
                                 /var/run/secrets/nexo/command-keys]
    NEXO_COMMAND_SIGNATURES      required, off, or unset: required once keys were seen,
                                 and then kept required in the state (fail closed) until
                                 set to off [default: unset]
    NEXO_ALLOWED_IMAGE_REPOSITORIES  comma-separated repositories a deploy may use besides
                                 the Proxy image's [default: none]
    NEXO_MANAGER_IMAGE_REPOSITORY    a repository an upgrade may use besides the Manager's
                                 own [default: none]
    NEXO_ALLOW_EXTERNAL_SERVICES allow NodePort and LoadBalancer Services [default: false]
    NEXO_POD_SECURITY            Pod Security profile of a legacy pod template: baseline
                                 or restricted [default: baseline]
    NEXO_LISTEN_ADDR             probes and metrics address, or off; port 0 takes a free
                                 port, logged as `probes and metrics listening on ADDR`
                                 [default: 0.0.0.0:8080]
    NEXO_STATE_SECRET            state Secret in its own namespace [default: nexo-manager-state]
    NEXO_LEASE_NAME              leader-election Lease in its own namespace [default: nexo-manager]
    NEXO_SELF_DEPLOYMENT         its own Deployment, for upgrade [default: nexo-manager]
    POD_NAMESPACE                its own namespace [default: from the service-account files]
    POD_NAME                     its pod name [default: hostname]
    POD_UID                      its pod uid [default: hostname]
    NEXO_INSECURE_ALLOW_HTTP     development only: allow an http:// Control Plane URL [default: false]
    NEXO_LOG_FORMAT              text or json [default: text]
    RUST_LOG                     log filter [default: info]
    KUBECONFIG                   out-of-cluster access (JSON kubeconfig) [default: in-cluster]
    HTTPS_PROXY, NO_PROXY        egress proxy for the Control Plane [default: none]

EXIT CODES:
    0  clean stop (SIGTERM or SIGINT)
    1  unexpected fatal error
    2  configuration error
    3  binding refused (wrong token for this cluster, environment bound elsewhere,
       protocol unsupported)
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--help" | "-h") => {
            print!("{HELP}");
            return ExitCode::SUCCESS;
        }
        Some("--version" | "-V") => {
            println!(
                "nexo-manager {} (build {})",
                nexo_manager::VERSION,
                nexo_manager::BUILD
            );
            return ExitCode::SUCCESS;
        }
        Some(other) => {
            eprintln!("error: unknown argument {other:?}; see --help");
            return ExitCode::from(2);
        }
        None => {}
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(fatal) => {
            nexo_manager::error!(
                err:% = fatal, exitCode = fatal.exit_code();
                "fatal error; exiting"
            );
            ExitCode::from(fatal.exit_code())
        }
    }
}

/// Parses the configuration, starts the agent and runs it until a signal
/// or a fatal error.
// A fatal error is returned once, at exit: its size costs nothing.
#[allow(clippy::result_large_err)]
fn run() -> Result<(), Fatal> {
    nexo_manager::metrics::started();
    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            // The logger's format is part of the configuration: install the
            // default one to report this error.
            nexo_manager::logging::init(nexo_manager::logging::LogFormat::Text);
            return Err(Fatal::Config(e));
        }
    };
    nexo_manager::logging::init(config.log_format);
    Agent::start(config)?.run()
}
