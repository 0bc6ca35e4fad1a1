//! TLS termination: certificates chosen by SNI, TLS 1.2 and 1.3, ALPN for h2 and http/1.1,
//! resumption by rotating tickets and a server-side session cache, and handshake admission
//! control (seed 004 §8): resumption attempts are always admitted, full handshakes only up to a
//! concurrency limit with a short bounded queue, and the excess is refused at once.

pub(crate) mod accept;
pub(crate) mod admission;
pub(crate) mod arrival;
mod certs;
pub(crate) mod hello;
mod redirect;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::server::{ServerSessionMemoryCache, StoresServerSessions};
use rustls::ServerConfig;

pub use admission::AdmissionConfig;

/// One certificate chain and its private key, both PEM files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// The chain, leaf first.
    pub cert: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Settings of the TLS listener.
#[derive(Debug, Clone)]
pub struct TlsSettings {
    /// Listen address.
    pub listen: SocketAddr,
    /// Certificates; SNI picks the one valid for the name asked for, the first is the default.
    pub certs: Vec<CertFiles>,
    /// Handshake admission control.
    pub admission: AdmissionConfig,
    /// Time a client gets to finish its handshake.
    pub handshake_timeout: Duration,
    /// Session-ticket keys shared with other gateways (absent: this gateway's own, rotating).
    pub tickets: Option<Arc<dyn rustls::server::ProducesTickets>>,
    /// Applied to the TLS listening socket before its first accept: an option this crate
    /// cannot set without unsafe code. The binary passes `TCP_DEFER_ACCEPT`, so that a
    /// connection is accepted with its ClientHello and admission decides in the accept loop.
    pub tune_listener: Option<fn(std::os::fd::BorrowedFd<'_>) -> std::io::Result<()>>,
}

/// Why TLS could not be set up. Raised at start, never at the first handshake.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The certificate file holds no certificate.
    #[error("{path} holds no PEM certificate (expected a '-----BEGIN CERTIFICATE-----' block)")]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// The key file holds no usable key.
    #[error("{path} holds no usable private key (expected PEM PKCS#8, PKCS#1 or SEC1): {reason}")]
    Key {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Key and certificate do not belong together.
    #[error("the key in {key} does not belong to the certificate in {cert}")]
    Mismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
    /// No certificate was given.
    #[error("a TLS listener needs at least one certificate: pass --tls-cert FILE --tls-key FILE")]
    NoCertificates,
    /// rustls refused the configuration.
    #[error("TLS setup failed: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The server-side session cache, which also answers whether a TLS 1.2 session id is one of ours
/// (a TLS 1.3 client sends a random legacy session id, which must not count as resumption).
#[derive(Debug)]
pub(crate) struct SessionCache(Arc<ServerSessionMemoryCache>);

impl SessionCache {
    pub fn contains(&self, id: &[u8]) -> bool {
        self.0.get(id).is_some()
    }
}

impl StoresServerSessions for SessionCache {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        self.0.put(key, value)
    }
    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.0.get(key)
    }
    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.0.take(key)
    }
    fn can_cache(&self) -> bool {
        self.0.can_cache()
    }
}

/// Everything the TLS accept path needs.
pub(crate) struct Tls {
    pub config: Arc<ServerConfig>,
    /// The certificates, for the names plain HTTP on the TLS port may be redirected to.
    pub names: Arc<certs::SniResolver>,
    pub sessions: Arc<SessionCache>,
    pub admission: admission::Admission,
    pub handshake_timeout: Duration,
}

/// The process's TLS cryptography: the provider the binary installed (see warden's `main`),
/// else ring.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
}

impl Tls {
    /// Loads every certificate and builds the rustls configuration; every file problem is
    /// reported here, naming the file.
    pub fn new(settings: &TlsSettings) -> Result<Self, TlsError> {
        let provider = provider();
        let resolver = Arc::new(certs::SniResolver::load(&settings.certs, &provider)?);
        let sessions = Arc::new(SessionCache(ServerSessionMemoryCache::new(64 * 1024)));
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
            .with_no_client_auth()
            .with_cert_resolver(resolver.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        config.session_storage = sessions.clone();
        // Ticket keys rotate (every 6 hours), so a stolen key exposes little; on a cluster
        // every gateway shares them, so a client resumes at any.
        config.ticketer = match &settings.tickets {
            Some(t) => t.clone(),
            None => rustls::crypto::ring::Ticketer::new()?,
        };
        Ok(Self {
            config: Arc::new(config),
            names: resolver,
            sessions,
            admission: admission::Admission::new(settings.admission.clone()),
            handshake_timeout: settings.handshake_timeout,
        })
    }
}

pub(crate) use redirect::answer_plain_http;
