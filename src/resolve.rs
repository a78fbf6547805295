//! Name resolution on the calling thread.
//!
//! ureq's default resolver spawns a thread for every lookup that has a
//! timeout, and every call here has one: that would break "one thread,
//! always". This resolver answers IP literals directly and looks names up
//! with the system resolver on the calling thread, bounded by its own
//! timeout and attempts (`/etc/resolv.conf`: 5 s and 2 attempts by default).

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

use ureq::config::Config;
use ureq::http::Uri;
use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{Connector, NextTimeout};

/// The capacity of [`ResolvedSocketAddrs`].
const MAX_ADDRS: usize = 16;

/// A resolver that never spawns a thread.
#[derive(Debug, Default)]
pub struct InlineResolver;

impl Resolver for InlineResolver {
    fn resolve(
        &self,
        uri: &Uri,
        config: &Config,
        _timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let host = uri.host().ok_or(ureq::Error::HostNotFound)?;
        let port = uri
            .port_u16()
            .unwrap_or(if uri.scheme_str() == Some("http") {
                80
            } else {
                443
            });
        let mut out = self.empty();
        let literal = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = literal.parse::<IpAddr>() {
            out.push(SocketAddr::new(ip, port));
            return Ok(out);
        }
        let family = config.ip_family();
        for addr in family
            .keep_wanted((host, port).to_socket_addrs()?)
            .take(MAX_ADDRS)
        {
            out.push(addr);
        }
        if out.is_empty() {
            Err(ureq::Error::HostNotFound)
        } else {
            Ok(out)
        }
    }
}

/// An agent with `config`, `connector` and [`InlineResolver`].
pub fn agent_with(config: Config, connector: impl Connector) -> ureq::Agent {
    ureq::Agent::with_parts(config, connector, InlineResolver)
}
