//! A throw-away CA and a server certificate for 127.0.0.1 and localhost.

use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The CA's PEM (to trust) and the server's rustls configuration.
pub struct Tls {
    /// PEM of the CA certificate.
    pub ca_pem: String,
    /// Server configuration with the leaf certificate.
    pub config: Arc<rustls::ServerConfig>,
}

/// Generates the CA and the leaf.
pub fn generate(extra_names: &[String]) -> Tls {
    let ca_key = KeyPair::generate().expect("generate CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "nexo-cpsim test CA");
    let ca_cert = ca_params.self_signed(&ca_key).expect("self-sign CA");
    let issuer = Issuer::new(ca_params, ca_key);

    let leaf_key = KeyPair::generate().expect("generate server key");
    let mut names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    names.extend(extra_names.iter().cloned());
    let mut leaf_params = CertificateParams::new(names).expect("server params");
    leaf_params
        .distinguished_name
        .push(DnType::CommonName, "nexo-cpsim");
    let leaf = leaf_params
        .signed_by(&leaf_key, &issuer)
        .expect("sign server certificate");

    let chain = vec![
        CertificateDer::from(leaf.der().to_vec()),
        CertificateDer::from(ca_cert.der().to_vec()),
    ];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server certificate");
    Tls {
        ca_pem: ca_cert.pem(),
        config: Arc::new(config),
    }
}

/// A server-side TLS stream over TCP.
pub type Stream = rustls::StreamOwned<rustls::ServerConnection, std::net::TcpStream>;

/// `tcp` served as the TLS server of `config` (the handshake happens on
/// the first read or write).
pub fn server_stream(
    config: &Arc<rustls::ServerConfig>,
    tcp: std::net::TcpStream,
) -> Option<Stream> {
    let conn = rustls::ServerConnection::new(config.clone()).ok()?;
    Some(rustls::StreamOwned::new(conn, tcp))
}
