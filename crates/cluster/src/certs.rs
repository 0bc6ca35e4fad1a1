//! The cluster CA and node certificates. Every node holds the CA (it came sealed with the
//! cluster's secrets, opened with the join token) and issues itself a certificate at start:
//! holding the join token is what makes a machine a node. Peers accept only certificates of
//! this CA, both ways.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// Why node TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// Making or signing a certificate failed.
    #[error("cannot make the node certificate: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// TLS configuration failed.
    #[error("cannot set up node TLS: {0}")]
    Tls(String),
}

fn ca_params() -> Result<rcgen::CertificateParams, rcgen::Error> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "warden cluster CA");
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    Ok(params)
}

/// A new cluster CA: (certificate PEM, key PEM).
pub fn new_ca() -> Result<(String, String), CertError> {
    let key = rcgen::KeyPair::generate()?;
    let cert = ca_params()?.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// This node's TLS, both as the node port's server and as a client of other nodes' ports.
#[derive(Clone)]
pub struct NodeTls {
    /// Server side: asks every client for a certificate of the cluster CA.
    pub server: Arc<ServerConfig>,
    /// Client side: presents this node's certificate, accepts only the cluster CA's.
    pub client: Arc<ClientConfig>,
}

/// The host part of `advertise` (`host:port`), as a certificate name.
fn host_of(advertise: &str) -> &str {
    advertise
        .rsplit_once(':')
        .map_or(advertise, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']')
}

/// The name a client checks the node port's certificate against.
pub(crate) fn server_name(advertise: &str) -> Result<ServerName<'static>, CertError> {
    ServerName::try_from(host_of(advertise).to_owned())
        .map_err(|e| CertError::Tls(format!("{advertise:?} is not a node address: {e}")))
}

impl NodeTls {
    /// Issues this node a certificate for `name` and its node port at `advertise`, signed by
    /// the cluster CA.
    pub fn issue(
        ca_cert: &str,
        ca_key: &str,
        name: &str,
        advertise: &str,
    ) -> Result<Self, CertError> {
        let ca_key = rcgen::KeyPair::from_pem(ca_key)?;
        // The same subject and key as the stored CA certificate: what it signs chains to it.
        let issuer = ca_params()?.self_signed(&ca_key)?;
        let mut params = rcgen::CertificateParams::new(vec![
            format!("{name}.node.warden"),
            host_of(advertise).to_owned(),
        ])?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("warden node {name}"));
        params.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = rcgen::KeyPair::generate()?;
        let cert = params.signed_by(&key, &issuer, &ca_key)?;
        let chain = vec![cert.der().clone()];
        let key_der = PrivateKeyDer::try_from(key.serialize_der())
            .map_err(|e| CertError::Tls(e.to_string()))?;
        let ca_der = CertificateDer::from_pem_slice(ca_cert.as_bytes())
            .map_err(|e| CertError::Tls(format!("the cluster CA certificate: {e}")))?;
        Self::from_parts(chain, key_der, ca_der)
    }

    fn from_parts(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        ca: CertificateDer<'static>,
    ) -> Result<Self, CertError> {
        let tls = |e: rustls::Error| CertError::Tls(e.to_string());
        // The process's provider (warden's `main` installs it), else ring.
        let provider = rustls::crypto::CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
        let mut roots = RootCertStore::empty();
        roots.add(ca).map_err(tls)?;
        let roots = Arc::new(roots);
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| CertError::Tls(e.to_string()))?;
        let mut server = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(tls)?;
        server.alpn_protocols = vec![crate::ALPN.to_vec()];
        // Nodes keep their connections; no resumption tickets to send or store.
        server.send_tls13_tickets = 0;
        let mut client = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(tls)?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(tls)?;
        client.alpn_protocols = vec![crate::ALPN.to_vec()];
        client.resumption = rustls::client::Resumption::disabled();
        Ok(Self {
            server: Arc::new(server),
            client: Arc::new(client),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_of_node_addresses() {
        assert_eq!(host_of("127.0.0.2:7710"), "127.0.0.2");
        assert_eq!(host_of("[::1]:7710"), "::1");
        assert_eq!(host_of("node-a.example:7710"), "node-a.example");
        assert!(server_name("127.0.0.2:7710").is_ok());
    }

    #[test]
    fn node_certificates_chain_to_the_cluster_ca() {
        let (cert, key) = new_ca().unwrap();
        NodeTls::issue(&cert, &key, "alpha", "127.0.0.2:7710").unwrap();
    }
}
