//! Trust anchors for both HTTPS peers.

use ureq::tls::{Certificate, PemItem};

/// The built-in public root set (Mozilla's, through `webpki-root-certs`):
/// the image has no OS trust store.
pub fn public_roots() -> Vec<Certificate<'static>> {
    webpki_root_certs::TLS_SERVER_ROOT_CERTS
        .iter()
        .map(|der| Certificate::from_der(der.as_ref()))
        .collect()
}

/// The certificates of a PEM bundle; an error when it holds none or is not PEM.
pub fn certs_from_pem(pem: &[u8]) -> Result<Vec<Certificate<'static>>, &'static str> {
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(pem) {
        match item {
            Ok(PemItem::Certificate(c)) => certs.push(c),
            Ok(_) => {}
            Err(_) => return Err("is not valid PEM"),
        }
    }
    if certs.is_empty() {
        return Err("holds no PEM certificate");
    }
    Ok(certs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_roots_are_present() {
        assert!(public_roots().len() > 50);
    }

    #[test]
    fn pem_errors() {
        assert_eq!(
            certs_from_pem(b"nothing here").unwrap_err(),
            "holds no PEM certificate"
        );
    }
}
