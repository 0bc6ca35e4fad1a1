//! The gateway's TLS settings for `warden up`: the certificates the config names (or the demo
//! certificate, made once under the data dir) and this node's session tickets.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;

use crate::config::Config;
use crate::files;

/// The TLS settings the config asks for, generating the demo certificate when needed.
pub(super) fn settings(cfg: &Config) -> anyhow::Result<Option<warden_gateway::TlsSettings>> {
    let Some(listen) = cfg.tls_listen() else {
        return Ok(None);
    };
    let mut certs: Vec<warden_gateway::CertFiles> = cfg
        .tls_cert
        .iter()
        .zip(&cfg.tls_key)
        .map(|(cert, key)| warden_gateway::CertFiles {
            cert: cert.clone(),
            key: key.clone(),
        })
        .collect();
    if certs.is_empty() {
        certs.push(demo_certificate(&cfg.data_dir)?);
    }
    Ok(Some(warden_gateway::TlsSettings {
        listen,
        certs,
        admission: cfg.admission(),
        handshake_timeout: cfg.tls_handshake_timeout.0,
        tickets: local_ticketer()?,
        tune_listener: Some(crate::listen::defer_accept),
    }))
}

/// Session tickets on one node, sealed by the binary's own provider: aws-lc-rs draws each
/// ticket's nonce from its own generator, where ring's ticketer (the gateway's fallback) asks
/// the kernel, one `getrandom` call for every connection that gets a ticket. A cluster
/// replaces this with keys shared through the store.
fn local_ticketer() -> anyhow::Result<Option<Arc<dyn rustls::server::ProducesTickets>>> {
    #[cfg(feature = "aws-lc")]
    return Ok(Some(
        rustls::crypto::aws_lc_rs::Ticketer::new()
            .context("cannot make TLS session ticket keys")?,
    ));
    #[cfg(not(feature = "aws-lc"))]
    Ok(None)
}

/// A self-signed certificate for localhost and 127.0.0.1, made once per data dir.
fn demo_certificate(dir: &Path) -> anyhow::Result<warden_gateway::CertFiles> {
    let tls_dir = dir.join("tls");
    files::ensure_private_dir(&tls_dir)?;
    let files = warden_gateway::CertFiles {
        cert: tls_dir.join("demo-cert.pem"),
        key: tls_dir.join("demo-key.pem"),
    };
    if !(files.cert.exists() && files.key.exists()) {
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
            .context("cannot generate the demo TLS certificate")?;
        files::write_private(&files.key, ck.key_pair.serialize_pem().as_bytes())?;
        files::write_private(&files.cert, ck.cert.pem().as_bytes())?;
    }
    Ok(files)
}
