//! `HTTPS_PROXY` / `NO_PROXY` for the Control Plane connection.
//!
//! ureq 3.5's own `NO_PROXY` matching is exact-host or `*`/`.` suffix only:
//! a bare `example.com` does not cover `cp.example.com`, and neither CIDR
//! blocks nor `host:port` entries are understood. The Manager has exactly one
//! proxied peer, so it decides once, at start, with the rules curl and Go
//! use, and gives ureq a proxy only when the CP is not excluded.

use std::net::IpAddr;

/// Whether `no_proxy` (comma- or space-separated) excludes `host:port`.
///
/// Entries: `*` (everything); a domain, with or without a leading `.` or
/// `*.`, matching itself and its subdomains; an IP address; a CIDR block
/// matching IP literal hosts; any of these with `:port` to match that port only.
pub fn excluded(no_proxy: &str, host: &str, port: u16) -> bool {
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    let host_ip: Option<IpAddr> = host.parse().ok();
    no_proxy
        .split([',', ' '])
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .any(|entry| {
            if entry == "*" {
                return true;
            }
            let (pattern, entry_port) = split_port(entry);
            if entry_port.is_some_and(|p| p != port) {
                return false;
            }
            let pattern = pattern.to_ascii_lowercase();
            if let Some((net, bits)) = pattern.split_once('/') {
                return match (host_ip, net.parse::<IpAddr>(), bits.parse::<u8>()) {
                    (Some(ip), Ok(net), Ok(bits)) => in_cidr(ip, net, bits),
                    _ => false,
                };
            }
            if let (Some(ip), Ok(p)) = (host_ip, pattern.parse::<IpAddr>()) {
                return ip == p;
            }
            let domain = pattern.trim_start_matches("*.").trim_start_matches('.');
            !domain.is_empty() && (host == domain || host.ends_with(&format!(".{domain}")))
        })
}

fn split_port(entry: &str) -> (&str, Option<u16>) {
    if let Some(rest) = entry.strip_prefix('[') {
        // [v6]:port
        if let Some((ip, after)) = rest.split_once(']') {
            return (ip, after.strip_prefix(':').and_then(|p| p.parse().ok()));
        }
    }
    // A bare IPv6 address has several ':'; only host:port has exactly one.
    match entry.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => match p.parse() {
            Ok(port) => (h, Some(port)),
            Err(_) => (entry, None),
        },
        _ => (entry, None),
    }
}

fn in_cidr(ip: IpAddr, net: IpAddr, bits: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) if bits <= 32 => {
            let mask = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - bits)
            };
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) if bits <= 128 => {
            let mask = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - bits)
            };
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// Checks a proxy URL: `http://[user:pass@]host:port` (the CONNECT tunnel
/// ureq speaks). The error never repeats the URL (it may hold a password).
pub fn validate(proxy: &str) -> Result<(), ProxyUrlError> {
    let rest = proxy
        .strip_prefix("http://")
        .ok_or(ProxyUrlError::NotHttp)?;
    let authority = rest.split('/').next().unwrap_or("");
    let host = authority.rsplit('@').next().unwrap_or("");
    if host.is_empty() {
        return Err(ProxyUrlError::NoHost);
    }
    ureq::Proxy::new(proxy)
        .map(|_| ())
        .map_err(|_| ProxyUrlError::Invalid)
}

/// Why a proxy URL is refused; never the URL itself (it may hold a
/// password).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyUrlError {
    NotHttp,
    NoHost,
    Invalid,
}

impl std::fmt::Display for ProxyUrlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ProxyUrlError::NotHttp => "the proxy must be an http://host:port URL (a CONNECT proxy)",
            ProxyUrlError::NoHost => "the proxy URL has no host",
            ProxyUrlError::Invalid => "the proxy URL is not valid",
        })
    }
}

impl std::error::Error for ProxyUrlError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domains_and_subdomains() {
        assert!(excluded("example.com", "cp.example.com", 443));
        assert!(excluded(".example.com", "example.com", 443));
        assert!(excluded("*.example.com", "a.b.example.com", 443));
        assert!(!excluded("example.com", "badexample.com", 443));
        assert!(excluded("localhost, internal", "INTERNAL", 443));
        assert!(excluded("*", "anything", 1));
        assert!(!excluded("", "cp.example.com", 443));
    }

    #[test]
    fn addresses_blocks_and_ports() {
        assert!(excluded("127.0.0.1", "127.0.0.1", 8443));
        assert!(excluded("10.0.0.0/8", "10.1.2.3", 443));
        assert!(!excluded("10.0.0.0/8", "11.1.2.3", 443));
        assert!(excluded("::1", "[::1]", 443));
        assert!(excluded("fd00::/8", "fd12::1", 443));
        assert!(excluded("cp.example.com:8443", "cp.example.com", 8443));
        assert!(!excluded("cp.example.com:8443", "cp.example.com", 443));
        assert!(excluded("[::1]:9", "::1", 9));
        assert!(!excluded("10.0.0.0/8", "ten.example.com", 443));
    }

    #[test]
    fn proxy_urls() {
        assert!(validate("http://proxy.corp:3128").is_ok());
        assert!(validate("http://user:pw@proxy.corp:3128").is_ok());
        let e = validate("socks5://user:hunter2@proxy")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("hunter2"));
        assert!(validate("http://").is_err());
    }
}
