//! Plain HTTP sent to the TLS port: answered with a redirect to the same URL over https when
//! the request names a host one of the certificates is for, else a clear 400. Redirecting to
//! whatever `Host` says would make the TLS port an open redirect.

use std::convert::Infallible;

use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

/// The host part of a `Host` value: without its port, and an IPv6 address without brackets.
fn host_part(host: &str) -> &str {
    match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(v6),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    }
}

fn answer(req: &Request<Incoming>, ours: &dyn Fn(&str) -> bool) -> Response<Full<Bytes>> {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_graphic()))
        .filter(|h| ours(host_part(h)));
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let mut resp = match host {
        Some(host) => {
            let mut r = Response::new(Full::new(Bytes::from_static(
                b"this port speaks HTTPS; follow the Location header\n",
            )));
            *r.status_mut() = StatusCode::PERMANENT_REDIRECT;
            if let Ok(v) = header::HeaderValue::from_str(&format!("https://{host}{path}")) {
                r.headers_mut().insert(header::LOCATION, v);
            }
            r
        }
        None => {
            let mut r = Response::new(Full::new(Bytes::from_static(
                b"this port speaks HTTPS: use an https:// URL with a name this server has a certificate for\n",
            )));
            *r.status_mut() = StatusCode::BAD_REQUEST;
            r
        }
    };
    resp.headers_mut().insert(
        header::CONNECTION,
        header::HeaderValue::from_static("close"),
    );
    resp
}

/// Serves one plain HTTP/1.1 request on a connection to the TLS port, then closes it;
/// `names` tells the names the certificates are for.
pub(crate) async fn answer_plain_http<S>(io: S, names: std::sync::Arc<super::certs::SniResolver>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| {
        let names = names.clone();
        async move { Ok::<_, Infallible>(answer(&req, &|h| names.serves(h))) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .keep_alive(false)
        .serve_connection(TokioIo::new(io), svc)
        .await;
}
