//! Forwarding a request to an instance and its answer back, with header hygiene.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

use crate::respond::{Body, GatewayError};

/// Pooled keep-alive client to instances.
pub(crate) type Upstream = Client<HttpConnector, Incoming>;

pub(crate) fn client() -> Upstream {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(connector)
}

/// Headers that describe one hop and must not be forwarded (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];

fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named.iter().chain(HOP_BY_HOP.iter()) {
        h.remove(n);
    }
    h.remove(header::TRANSFER_ENCODING);
}

/// Who the gateway vouches for, passed to the app in `X-Warden-*` headers.
pub(crate) struct Forwarded<'a> {
    pub user: &'a str,
    pub label: &'a str,
    pub client: std::net::IpAddr,
}

/// Sends `req` with its path replaced by `path_and_query` to `addr`.
pub(crate) async fn forward(
    client: &Upstream,
    mut req: Request<Incoming>,
    addr: &str,
    path_and_query: &str,
    who: Forwarded<'_>,
    app: &str,
) -> Result<Response<Body>, (GatewayError, bool)> {
    let uri: Uri = format!("http://{addr}{path_and_query}")
        .parse()
        .map_err(|e| {
            (
                GatewayError::BadRequest(format!("unusable path: {e}")),
                false,
            )
        })?;
    *req.uri_mut() = uri;
    let h = req.headers_mut();
    strip_hop_by_hop(h);
    // The app must never see the user's password; it learns who the user is from the gateway.
    h.remove(header::AUTHORIZATION);
    for name in ["x-warden-user", "x-warden-label"] {
        h.remove(name);
    }
    let set = |h: &mut HeaderMap, name: &'static str, v: &str| {
        if let Ok(v) = HeaderValue::from_str(v) {
            h.insert(name, v);
        }
    };
    set(h, "x-warden-user", who.user);
    set(h, "x-warden-label", who.label);
    set(h, "x-forwarded-for", &who.client.to_string());
    set(h, "x-forwarded-proto", "http");
    match client.request(req).await {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Ok(Response::from_parts(parts, body.boxed()))
        }
        Err(e) => {
            let refused = e.is_connect();
            Err((
                GatewayError::Upstream {
                    app: app.to_owned(),
                    reason: e.to_string(),
                },
                refused,
            ))
        }
    }
}
