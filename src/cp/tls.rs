//! The TLS side of the Control Plane client: the agent assembled from
//! the public roots and the extra trust anchors (`NEXO_CONTROL_PLANE_CA_FILE`,
//! read bounded), over the CONNECT proxy and the loop's TCP transport; and
//! the handshake check's gate, which ends a call once TLS is established.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use ureq::tls::{RootCerts, TlsConfig};
use ureq::unversioned::transport::{
    ConnectProxyConnector, ConnectionDetails, Connector, RustlsConnector, Transport,
};

/// The path of the URL a handshake check is made for. No request is ever
/// written to it: the check ends once TLS is established.
pub(super) const HANDSHAKE_PATH: &str = "/.nexo-manager-handshake-check";

/// The last link of a handshake check's connector chain: once the default
/// chain (proxy, TCP, TLS) has produced an established transport for the
/// check's URL, it notes the success and ends the call, so no request is
/// written and no token is sent. Connections for any other URL (the proxy's
/// own, for example) pass through.
#[derive(Debug, Default)]
pub(super) struct HandshakeGate {
    pub(super) established: Arc<AtomicBool>,
}

impl<In: Transport> Connector<In> for HandshakeGate {
    type Out = In;

    fn connect(
        &self,
        details: &ConnectionDetails,
        chained: Option<In>,
    ) -> Result<Option<Self::Out>, ureq::Error> {
        if details.uri.path() != HANDSHAKE_PATH {
            return Ok(chained);
        }
        match chained {
            Some(transport) if transport.is_tls() || !details.needs_tls() => {
                self.established.store(true, Ordering::Relaxed);
                Err(ureq::Error::Io(std::io::Error::other(
                    "handshake check: connection established, no request sent",
                )))
            }
            other => Ok(other),
        }
    }
}

/// The largest CA bundle read: a ConfigMap holds at most 1 MiB.
pub const MAX_CA_BUNDLE: u64 = crate::files::MOUNTED_MAX;

/// A file's bytes, refused when over `max` (1 MiB) or not a regular file
/// (a FIFO would block: `crate::files`).
pub fn read_bounded(path: &std::path::Path, max: u64) -> Result<Vec<u8>, &'static str> {
    crate::files::read(path, max).map_err(|e| match e.kind() {
        std::io::ErrorKind::FileTooLarge => "is over 1 MiB",
        std::io::ErrorKind::InvalidInput => "is not a regular file",
        _ => "cannot be read",
    })
}

impl Tls {
    pub(super) fn new(
        extra: Vec<ureq::tls::Certificate<'static>>,
        proxy: Option<ureq::Proxy>,
        timeouts: (Duration, Duration),
    ) -> Tls {
        let mut roots = crate::tls::public_roots();
        roots.extend(extra);
        let config = crate::net::buffers(ureq::Agent::config_builder())
            .http_status_as_error(false)
            .timeout_connect(Some(timeouts.0))
            .timeout_global(Some(timeouts.1))
            .max_redirects(0)
            .proxy(proxy)
            .user_agent(crate::USER_AGENT)
            .tls_config(
                TlsConfig::builder()
                    .root_certs(RootCerts::Specific(Arc::new(roots)))
                    .build(),
            )
            .build();
        // Proxy, then TCP whose reads wait in the loop (net.rs), then TLS.
        let chain =
            ().chain(ConnectProxyConnector::default())
                .chain(crate::net::PollTcpConnector::CONTROL_PLANE)
                .chain(RustlsConnector::default());
        let agent = crate::resolve::agent_with(config.clone(), chain);
        Tls { agent, config }
    }
}

/// The agent of every call, and its configuration for the handshake
/// check's own agent.
pub(super) struct Tls {
    pub(super) agent: ureq::Agent,
    pub(super) config: ureq::config::Config,
}

/// `NEXO_CONTROL_PLANE_CA_FILE`: its path and the bytes the agent trusts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaBundle {
    pub path: PathBuf,
    pub pem: Vec<u8>,
}

/// What a re-read of the CA bundle found (`CpClient::reread_ca`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaReread {
    /// No file is configured, or its bytes are those already trusted.
    Unchanged,
    /// New certificates, now trusted: this many.
    Changed(usize),
    /// The file cannot be read or holds no certificate: the last good
    /// bundle stays trusted.
    Kept(&'static str),
}
