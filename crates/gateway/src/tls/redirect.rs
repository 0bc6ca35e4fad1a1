//! Plain HTTP sent to the TLS port: answered with a redirect to the same URL over https, or a
//! clear 400 when the request names no host.

use std::convert::Infallible;

use bytes::Bytes;
use http::{header, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

fn answer(req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_graphic()));
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
                b"this port speaks HTTPS: use an https:// URL\n",
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

/// Serves one plain HTTP/1.1 request on a connection to the TLS port, then closes it.
pub(crate) async fn answer_plain_http<S>(io: S)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(|req| async move { Ok::<_, Infallible>(answer(&req)) });
    let _ = hyper::server::conn::http1::Builder::new()
        .keep_alive(false)
        .serve_connection(TokioIo::new(io), svc)
        .await;
}
