//! Loading certificates and keys, and choosing one by SNI.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use super::{CertFiles, TlsError};

/// Picks the first certificate valid for the name the client asked for; the first certificate
/// when there is no name (an IP address) or no certificate matches.
#[derive(Debug)]
pub(crate) struct SniResolver {
    certs: Vec<Arc<CertifiedKey>>,
}

impl SniResolver {
    pub fn load(files: &[CertFiles], provider: &CryptoProvider) -> Result<Self, TlsError> {
        if files.is_empty() {
            return Err(TlsError::NoCertificates);
        }
        let certs = files
            .iter()
            .map(|f| load_one(f, provider).map(Arc::new))
            .collect::<Result<_, _>>()?;
        Ok(Self { certs })
    }
}

fn read(path: &std::path::Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

fn load_one(f: &CertFiles, provider: &CryptoProvider) -> Result<CertifiedKey, TlsError> {
    let pem = read(&f.cert)?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<_, _>>()
        .map_err(|_| TlsError::NoCertificate {
            path: f.cert.clone(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate {
            path: f.cert.clone(),
        });
    }
    let key_pem = read(&f.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::Key {
        path: f.key.clone(),
        reason: e.to_string(),
    })?;
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| TlsError::Key {
            path: f.key.clone(),
            reason: e.to_string(),
        })?;
    let ck = CertifiedKey::new(chain, signing);
    if ck.keys_match().is_err() {
        return Err(TlsError::Mismatch {
            cert: f.cert.clone(),
            key: f.key.clone(),
        });
    }
    // Parse now, so a certificate webpki cannot read fails at start rather than at SNI time.
    webpki::EndEntityCert::try_from(&ck.cert[0]).map_err(|_| TlsError::NoCertificate {
        path: f.cert.clone(),
    })?;
    Ok(ck)
}

fn valid_for(ck: &CertifiedKey, name: &ServerName<'_>) -> bool {
    webpki::EndEntityCert::try_from(&ck.cert[0])
        .is_ok_and(|c| c.verify_is_valid_for_subject_name(name).is_ok())
}

impl SniResolver {
    /// Whether one of the certificates is valid for `host` (a DNS name or an IP address).
    pub fn serves(&self, host: &str) -> bool {
        ServerName::try_from(host)
            .is_ok_and(|name| self.certs.iter().any(|ck| valid_for(ck, &name)))
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        if self.certs.len() > 1 {
            if let Some(name) = hello
                .server_name()
                .and_then(|n| ServerName::try_from(n).ok())
            {
                if let Some(ck) = self.certs.iter().find(|ck| valid_for(ck, &name)) {
                    return Some(ck.clone());
                }
            }
        }
        self.certs.first().cloned()
    }
}
