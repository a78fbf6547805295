//! Start-up: everything checked before the loop. The configuration's files
//! and listeners first (exit 2 when wrong), then the cluster identity and
//! the persisted state, read with retries while the API server is not
//! ready yet, then the binding check (exit 3 when the state was bound on
//! another cluster).

use std::cell::RefCell;
use std::rc::Rc;

use k8s_openapi::apimachinery::pkg::version::Info;

use super::heartbeat::Beats;
use super::lead::{Background, LeaseKeeper};
use super::shared::{Identity, Link, Pace, round_ms};
use super::{Agent, StateStore};
use crate::backoff::{Backoff, retry_after_delay};
use crate::config::Config;
use crate::cp::CpClient;
use crate::cp::wire::{ClusterRef, InstanceInfo};
use crate::fatal::Fatal;
use crate::kube::pause::{Pause, Wake};
use crate::kube::{self, Client, KubeConfig};
use crate::lease::Elector;
use crate::probe::{Health, Probe, Role};
use crate::resource;
use crate::state::{Binding, StateError, StateSecret};
use crate::wait::Waiter;

/// Builds the agent, or says why it cannot run.
pub(super) fn start(cfg: Config) -> Result<Agent, Fatal> {
    // The probe listener first: the kubelet's probes are answered (not
    // ready: starting) while the cluster identity and state are read.
    let (waiter, status) = probes(&cfg)?;
    if cfg.control_plane_url.starts_with("http://") {
        crate::warn!(
            url:% = cfg.control_plane_url;
            "NEXO_INSECURE_ALLOW_HTTP is set: talking to the Control Plane over plain http; never do this outside development"
        );
    }
    let token = crate::token::read(&cfg.token_source, cfg.environment_id.as_deref())
        .map_err(Fatal::ConnectToken)?;
    let cp = control_plane(&cfg)?;
    let keys = crate::trust::KeyFile::open(&cfg.command_keys_file).map_err(Fatal::CommandKeys)?;
    let (kube, instance) = kube_client(&cfg, &waiter)?;
    let namespaces = cfg.managed_namespaces(&instance.namespace);
    let mut backoff = Backoff::control_plane();
    let cluster = cluster_identity(&kube, &waiter, &mut backoff)?;
    let store = StateSecret::new(
        &instance.namespace,
        &cfg.state_secret,
        token.environment_id(),
    );
    let store = load_state(store, &kube, &waiter, &mut backoff)?;
    let secret = format!("{}/{}", instance.namespace, cfg.state_secret);
    check_binding(store.binding(), &cluster, token.environment_id(), &secret)?;
    let (own, own_deployment_uid) = own_objects(&cfg, &instance.namespace, &kube);
    log_trust(&cfg, &keys, store.signatures_required());
    backoff.reset();
    crate::info!(
        version = crate::VERSION,
        build = crate::BUILD,
        environment = token.environment_id(),
        cluster = cluster.uid.as_str(),
        kubernetesVersion = cluster.kubernetes_version.as_str(),
        namespaces = namespaces.join(",").as_str();
        "nexo-manager starting"
    );
    // Every request that may change the cluster asks the lease first.
    let elector = Elector::new(&instance.namespace, &cfg.lease_name, &instance.id);
    let kube = Rc::new(kube.with_fence(elector.fence()));
    let elector = Rc::new(RefCell::new(elector));
    // The lease is renewed on its own schedule in the loop's waits, and
    // the CP client's sockets wait in the loop (net.rs).
    let index = Rc::new(RefCell::new(crate::inventory::Index::new(
        &namespaces,
        token.environment_id(),
        cfg.adopt_unproven,
    )));
    waiter.set_duty(Rc::new(Background {
        lease: LeaseKeeper::new(Rc::clone(&elector), Rc::clone(&kube)),
        index: Rc::clone(&index),
    }));
    crate::net::install(Rc::clone(&waiter) as Rc<dyn crate::net::Readiness>);
    if cfg.drift_interval < cfg.heartbeat_interval {
        crate::warn!(
            driftInterval:% = humantime::format_duration(cfg.drift_interval);
            "NEXO_DRIFT_INTERVAL is under the heartbeat interval; drift is checked once a heartbeat interval"
        );
    }
    Ok(Agent {
        drift: super::drift::Drift::new(cfg.drift_interval.max(cfg.heartbeat_interval)),
        events: crate::events::Recorder::new(&instance.pod_name),
        leader: super::lead::Leadership::new(elector),
        trusted: super::trusted::Trusted { keys },
        pace: Pace {
            interval: cfg.heartbeat_interval,
            backoff,
        },
        link: Link {
            writer: match &cfg.executor {
                Some(sa) => Rc::new(kube.executor(sa)),
                None => Rc::clone(&kube),
            },
            kube,
            index,
            cp,
            waiter,
            status,
        },
        store,
        me: Identity {
            capabilities: super::advertised(&cfg),
            cfg,
            token,
            instance,
            cluster,
            namespaces,
            own,
            own_deployment_uid,
        },
        session: None,
        beats: Beats::default(),
    })
}

/// Says at start whether commands must be signed, and why.
fn log_trust(cfg: &Config, keys: &crate::trust::KeyFile, recorded: bool) {
    use crate::config::Signatures;
    let file = cfg.command_keys_file.display();
    let ids = match keys.keys() {
        Ok(Some(k)) => k.ids().join(", "),
        Ok(None) => "none".to_owned(),
        Err(e) => format!("unusable ({e})"),
    };
    if cfg.command_signatures == Signatures::Off {
        crate::warn!(
            keys = ids.as_str(), file:% = file;
            "NEXO_COMMAND_SIGNATURES=off: command signatures are not required, unsigned commands are accepted"
        );
        return;
    }
    if crate::trust::signatures_required(cfg.command_signatures, keys.configured(), recorded) {
        let why = match (cfg.command_signatures, keys.configured()) {
            (Signatures::Required, _) => "NEXO_COMMAND_SIGNATURES=required",
            (_, true) => "keys are configured",
            _ => {
                "the state records that they were required (NEXO_COMMAND_SIGNATURES=off turns them off)"
            }
        };
        crate::info!(
            why, keys = ids.as_str(), file:% = file;
            "command signatures required; unsigned commands are refused"
        );
    } else {
        crate::info!(file:% = file; "no command keys; unsigned commands are accepted");
    }
}

/// The Manager's own objects (docs/protocol.md, "Ownership"): the ones its
/// configuration names, and what its own Deployment's pod template names
/// (the Secrets its token and command keys are mounted from, its
/// ServiceAccount). A Deployment that cannot be read leaves the names of
/// the configuration and the labels to go by, with a warning. With them,
/// the Deployment's uid, when it was read.
fn own_objects(
    cfg: &Config,
    namespace: &str,
    kube: &Client,
) -> (crate::ownership::OwnObjects, Option<String>) {
    let mut own = crate::ownership::OwnObjects::new(
        namespace,
        &cfg.state_secret,
        &cfg.self_deployment,
        &cfg.lease_name,
    );
    let path = resource::DEPLOYMENTS.object(Some(namespace), &cfg.self_deployment);
    let mut uid = None;
    match kube.get_opt::<serde_json::Value>(&path) {
        Ok(Some(d)) => {
            own.add_pod_template(&d);
            uid = d["metadata"]["uid"].as_str().map(str::to_owned);
        }
        Ok(None) => crate::info!(
            namespace, name = cfg.self_deployment.as_str();
            "own objects: no own Deployment (not running from one); protecting the configured names and the app.kubernetes.io/name=nexo-manager label"
        ),
        Err(e) => crate::warn!(
            namespace, name = cfg.self_deployment.as_str(), err:% = e;
            "own objects: cannot read the own Deployment; protecting the configured names and the app.kubernetes.io/name=nexo-manager label"
        ),
    }
    (own, uid)
}

/// The Kubernetes client, pausing in `waiter`, and this pod's identity
/// (its namespace from `POD_NAMESPACE` or the service account's).
fn kube_client(cfg: &Config, waiter: &Rc<Waiter>) -> Result<(Client, InstanceInfo), Fatal> {
    let kube_cfg = kube_config(cfg)?;
    let namespace = cfg
        .pod_namespace
        .clone()
        .or_else(|| kube_cfg.namespace.clone())
        .ok_or(Fatal::NoNamespace)?;
    let kube = Client::new(kube_cfg)
        .map_err(Fatal::KubeConfig)?
        .with_pause(Rc::clone(waiter) as Rc<dyn Pause>);
    let host = hostname();
    let instance = InstanceInfo {
        id: cfg.pod_uid.clone().unwrap_or_else(|| host.clone()),
        pod_name: cfg.pod_name.clone().unwrap_or(host),
        namespace,
    };
    Ok((kube, instance))
}

/// Reads the state Secret, waiting while the API server fails transiently.
fn load_state(
    mut store: StateSecret,
    kube: &Client,
    waiter: &Waiter,
    backoff: &mut Backoff,
) -> Result<StateStore, Fatal> {
    let state = retry_kube(waiter, backoff, "read the state secret", || {
        match store.load(kube) {
            Ok(s) => Ok(Ok(s)),
            Err(StateError::Kube(e)) => Err(e),
            Err(other) => Ok(Err(other)),
        }
    })??;
    Ok(StateStore::new(store, state))
}

/// The probe listener (when configured), the status it answers from, and
/// the waiter that serves it.
fn probes(cfg: &Config) -> Result<(Rc<Waiter>, Rc<RefCell<Health>>), Fatal> {
    let probe = match cfg.listen_addr {
        Some(addr) => {
            let probe = Probe::bind(addr).map_err(|source| Fatal::Listen { addr, source })?;
            // Port 0 picks a free port: the line says which.
            match probe.local_addr() {
                Ok(bound) => crate::info!(address:% = bound; "probes and metrics listening"),
                Err(e) => {
                    crate::warn!(err:% = e; "probes and metrics: cannot read the bound address")
                }
            }
            Some(probe)
        }
        None => None,
    };
    let status = Rc::new(RefCell::new(Health {
        role: Role::Starting,
        interval: cfg.heartbeat_interval,
        // The CP request timeout bounds the handshake of a standby check.
        check_time: cfg.cp_request_timeout,
        ..Health::default()
    }));
    let waiter = Waiter::new(probe, Rc::clone(&status)).map_err(Fatal::Signals)?;
    Ok((Rc::new(waiter), status))
}

fn control_plane(cfg: &Config) -> Result<CpClient, Fatal> {
    let ca = match &cfg.control_plane_ca_file {
        Some(path) => {
            // One byte over the bound, for CpClient::new to refuse.
            let pem = crate::files::read(path, crate::cp::MAX_CA_BUNDLE + 1).map_err(|source| {
                Fatal::ReadFile {
                    variable: "NEXO_CONTROL_PLANE_CA_FILE",
                    path: path.clone(),
                    source,
                }
            })?;
            Some(crate::cp::CaBundle {
                path: path.clone(),
                pem,
            })
        }
        None => None,
    };
    CpClient::new(
        &cfg.control_plane_url,
        ca,
        cfg.https_proxy.as_deref(),
        (cfg.cp_connect_timeout, cfg.cp_request_timeout),
    )
    .map_err(Fatal::ControlPlaneSetup)
}

fn kube_config(cfg: &Config) -> Result<KubeConfig, Fatal> {
    let host = std::env::var("KUBERNETES_SERVICE_HOST");
    let port = std::env::var("KUBERNETES_SERVICE_PORT");
    match (&cfg.kubeconfig, host, port) {
        (Some(path), _, _) => KubeConfig::from_kubeconfig(path),
        (None, Ok(host), Ok(port)) => KubeConfig::in_cluster(
            &host,
            &port,
            std::path::Path::new(kube::config::SERVICE_ACCOUNT_DIR),
        ),
        _ => Err(kube::Error::Config(
            "not in a cluster (KUBERNETES_SERVICE_HOST/_PORT unset) and KUBECONFIG is not set"
                .into(),
        )),
    }
    .map_err(Fatal::KubeConfig)
}

/// `metadata.uid` of `kube-system` (the cluster's identity) and the
/// API server's version.
fn cluster_identity(
    kube: &Client,
    waiter: &Waiter,
    backoff: &mut Backoff,
) -> Result<ClusterRef, Fatal> {
    let cluster = retry_kube(waiter, backoff, "read the cluster identity", || {
        let ns: NamespaceUid = kube.get(&resource::NAMESPACES.object(None, "kube-system"))?;
        let version: Info = kube.get("/version")?;
        Ok(ClusterRef {
            uid: ns.metadata.uid.unwrap_or_default(),
            kubernetes_version: version.git_version,
        })
    })?;
    if cluster.uid.is_empty() {
        return Err(Fatal::NoClusterUid);
    }
    Ok(cluster)
}

/// A Namespace's `metadata.uid`, all that is read of it: decoding the whole
/// object (k8s-openapi's `Namespace`) linked a decoder of every
/// `ObjectMeta` field and a date-time library (BENCHMARKS.md, "The
/// binary's size").
#[derive(serde::Deserialize)]
struct NamespaceUid {
    metadata: UidOnly,
}

#[derive(serde::Deserialize)]
struct UidOnly {
    uid: Option<String>,
}

/// A state bound on another cluster was copied here (exit 3), or the
/// connect token is another environment's than the binding (exit 2): refused.
pub(crate) fn check_binding(
    binding: Option<&Binding>,
    cluster: &ClusterRef,
    token_environment: &str,
    secret: &str,
) -> Result<(), Fatal> {
    match binding {
        Some(Binding {
            cluster_uid,
            environment_id,
            ..
        }) if *cluster_uid != cluster.uid => Err(Fatal::ClusterMismatch {
            secret: secret.to_owned(),
            bound: cluster_uid.clone(),
            this: cluster.uid.clone(),
            environment: environment_id.clone(),
        }),
        Some(Binding { environment_id, .. }) if environment_id != token_environment => {
            Err(Fatal::EnvironmentSwitch {
                bound: environment_id.clone(),
                token: token_environment.to_owned(),
            })
        }
        _ => Ok(()),
    }
}

/// Retries a Kubernetes read at start-up while it fails transiently;
/// interruptible by SIGTERM.
fn retry_kube<T>(
    waiter: &Waiter,
    backoff: &mut Backoff,
    what: &'static str,
    mut f: impl FnMut() -> Result<T, kube::Error>,
) -> Result<T, Fatal> {
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) if e.is_transient() => {
                let delay = retry_after_delay(e.retry_after(), backoff);
                crate::warn!(
                    step = what, err:% = e, retryIn:% = humantime::format_duration(round_ms(delay));
                    "a start step failed; retrying"
                );
                if let Ok(Wake::Stop) = waiter.wait(delay) {
                    return Err(Fatal::StoppedDuringStartup(what));
                }
            }
            Err(source) => return Err(Fatal::Startup { what, source }),
        }
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::State;

    fn state_bound_to(cluster_uid: &str) -> State {
        State {
            binding: Some(Binding {
                environment_id: "env-a".into(),
                manager_id: "m-1".into(),
                cluster_uid: cluster_uid.into(),
            }),
            ..State::default()
        }
    }

    #[test]
    fn a_state_bound_on_another_cluster_is_refused() {
        let here = ClusterRef {
            uid: "uid-here".into(),
            kubernetes_version: "v1.34.0".into(),
        };
        assert!(check_binding(None, &here, "env-a", "ns/s").is_ok());
        let bound_here = state_bound_to("uid-here");
        assert!(check_binding(bound_here.binding.as_ref(), &here, "env-a", "ns/s").is_ok());
        // A token of another environment than the binding's: exit 2.
        match check_binding(bound_here.binding.as_ref(), &here, "env-b", "ns/s") {
            Err(e @ Fatal::EnvironmentSwitch { .. }) => {
                assert_eq!(e.exit_code(), 2);
                assert!(
                    e.to_string().contains("env-b") && e.to_string().contains("env-a"),
                    "{e}"
                );
            }
            other => panic!("expected EnvironmentSwitch, got {other:?}"),
        }
        let refused = check_binding(
            state_bound_to("uid-there").binding.as_ref(),
            &here,
            "env-a",
            "ns/s",
        );
        match refused {
            Err(e @ Fatal::ClusterMismatch { .. }) => {
                assert_eq!(e.exit_code(), 3);
                let text = e.to_string();
                assert!(
                    text.contains("uid-there") && text.contains("uid-here"),
                    "{text}"
                );
            }
            other => panic!("expected a cluster mismatch, got {other:?}"),
        }
    }
}
