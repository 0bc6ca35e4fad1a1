//! One request to a provider: https (or plain http to a loopback issuer, for tests), with a
//! timeout over the whole exchange and a bound on the answer's size.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::OidcError;

/// Longest a provider call may take, connection included.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest answer read from a provider (discovery, keys, tokens are a few KB).
pub(crate) const MAX_ANSWER: usize = 256 * 1024;

/// Where the system's trust roots usually are (Debian/Ubuntu, then Fedora/RHEL, then Alpine's
/// and others' copy of the first).
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

/// Calls a provider.
#[derive(Clone)]
pub(crate) struct HttpClient {
    tls: tokio_rustls::TlsConnector,
    timeout: Duration,
}

/// A URL warden will call, taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub https: bool,
    pub host: String,
    pub port: u16,
    pub authority: String,
    pub path_and_query: String,
}

/// Checks `url` and takes it apart: https anywhere, plain http only to a loopback host.
pub(crate) fn target(url: &str) -> Result<Target, OidcError> {
    let bad = |reason: &str| OidcError::BadUrl {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let uri: Uri = url.parse().map_err(|_| bad("it is not an absolute URL"))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(bad("only https URLs are called")),
    };
    let authority = uri.authority().ok_or_else(|| bad("it has no host"))?;
    if authority.as_str().contains('@') {
        return Err(bad("credentials in a URL are not sent"));
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    if !https && !is_loopback(host) {
        return Err(bad(
            "plain http is allowed only to a loopback issuer (tests); use https",
        ));
    }
    Ok(Target {
        https,
        host: host.to_owned(),
        port: authority.port_u16().unwrap_or(if https { 443 } else { 80 }),
        authority: authority.as_str().to_owned(),
        path_and_query: uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| "/".into()),
    })
}

fn is_loopback(host: &str) -> bool {
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The trust roots: the operator's `ca_file` when given, else the system's bundle.
fn roots(ca_file: Option<&Path>) -> Result<rustls::RootCertStore, OidcError> {
    let mut store = rustls::RootCertStore::empty();
    let path = match ca_file {
        Some(p) => p.to_owned(),
        None => match SYSTEM_BUNDLES.iter().map(Path::new).find(|p| p.exists()) {
            Some(p) => p.to_owned(),
            // No system bundle: only loopback http issuers (or a ca_file) work; an https call
            // fails its handshake with a clear error.
            None => return Ok(store),
        },
    };
    let certs = CertificateDer::pem_file_iter(&path)
        .map_err(|e| OidcError::Roots(format!("{}: {e}", path.display())))?;
    for c in certs {
        let c = c.map_err(|e| OidcError::Roots(format!("{}: {e}", path.display())))?;
        // A bundle may hold a certificate rustls cannot use; the others still count.
        let _ = store.add(c);
    }
    if ca_file.is_some() && store.is_empty() {
        return Err(OidcError::Roots(format!(
            "{} holds no usable PEM certificate",
            path.display()
        )));
    }
    Ok(store)
}

// === impl HttpClient ===

impl HttpClient {
    pub(crate) fn new(ca_file: Option<&Path>) -> Result<Self, OidcError> {
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| OidcError::Roots(e.to_string()))?
        .with_root_certificates(roots(ca_file)?)
        .with_no_client_auth();
        Ok(Self {
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
            timeout: CALL_TIMEOUT,
        })
    }

    /// GETs `url`; the answer's status and body.
    pub(crate) async fn get(&self, url: &str) -> Result<(StatusCode, Bytes), OidcError> {
        self.call(Method::GET, url, None, None).await
    }

    /// POSTs a form to `url` with an `Authorization` header.
    pub(crate) async fn post_form(
        &self,
        url: &str,
        authorization: &str,
        form: String,
    ) -> Result<(StatusCode, Bytes), OidcError> {
        self.call(Method::POST, url, Some(authorization), Some(form))
            .await
    }

    async fn call(
        &self,
        method: Method,
        url: &str,
        authorization: Option<&str>,
        form: Option<String>,
    ) -> Result<(StatusCode, Bytes), OidcError> {
        let t = target(url)?;
        // The URL of errors: no query (a provider might put something there).
        let shown = url.split('?').next().unwrap_or(url).to_owned();
        let unreachable = |reason: String| OidcError::Unreachable {
            url: shown.clone(),
            reason,
        };
        let mut req = Request::builder()
            .method(method)
            .uri(&t.path_and_query)
            .header(header::HOST, &t.authority)
            .header(header::ACCEPT, "application/json")
            .header(header::CONNECTION, "close");
        if let Some(a) = authorization {
            req = req.header(header::AUTHORIZATION, a);
        }
        if form.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        }
        let req = req
            .body(Full::new(Bytes::from(form.unwrap_or_default())))
            .map_err(|e| unreachable(e.to_string()))?;
        let exchange = async {
            let tcp = TcpStream::connect((t.host.as_str(), t.port))
                .await
                .map_err(|e| unreachable(format!("cannot connect: {e}")))?;
            if t.https {
                let name =
                    ServerName::try_from(t.host.clone()).map_err(|e| unreachable(e.to_string()))?;
                let tls = self
                    .tls
                    .connect(name, tcp)
                    .await
                    .map_err(|e| unreachable(format!("TLS: {e}")))?;
                send(tls, req).await.map_err(unreachable)
            } else {
                send(tcp, req).await.map_err(unreachable)
            }
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(r) => r,
            Err(_) => Err(unreachable(format!(
                "no answer within {}s",
                self.timeout.as_secs()
            ))),
        }
    }
}

/// One HTTP/1.1 exchange on `io`, the connection driven beside it (no task of its own).
async fn send<I>(io: I, req: Request<Full<Bytes>>) -> Result<(StatusCode, Bytes), String>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| e.to_string())?;
    let exchange = async move {
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| format!("answer unreadable or over {MAX_ANSWER} bytes: {e}"))?
            .to_bytes();
        Ok::<_, String>((status, body))
    };
    tokio::pin!(exchange);
    tokio::pin!(conn);
    tokio::select! {
        biased;
        r = &mut exchange => r,
        // The connection ended first: what it delivered is in the exchange's channel.
        _ = &mut conn => exchange.await,
    }
}

#[cfg(test)]
mod tests;
