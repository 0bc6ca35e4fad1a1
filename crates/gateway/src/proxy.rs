//! Forwarding a request to an instance and its answer back, with header hygiene.

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, Uri};
use http_body_util::Full;

use crate::respond::Body;
use crate::upstream::Pool;

/// Response header with which an instance reports it has read data of a higher class.
pub(crate) const TAINT: &str = "x-warden-taint";

/// Headers that describe one hop and must not be forwarded (RFC 9110 §7.6.1), on either path.
const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
];

/// Whether `name` is one of [`HOP_BY_HOP`], in any case.
pub(crate) fn hop_by_hop(name: &[u8]) -> bool {
    HOP_BY_HOP
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h.as_bytes()))
}

fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in HOP_BY_HOP {
        h.remove(n);
    }
    h.remove(header::TRANSFER_ENCODING);
}

/// Headers in which the gateway tells the app who the user is and how they came.
const VOUCHED: [&str; 4] = [
    "x-warden-user",
    "x-warden-label",
    "x-forwarded-for",
    "x-forwarded-proto",
];

/// Whether a header `name` from a client claims to be one the gateway sets, in any case and with
/// '_' for '-' (servers that map headers to CGI variables read both alike).
pub(crate) fn vouched(name: &[u8]) -> bool {
    VOUCHED.iter().any(|v| {
        v.len() == name.len()
            && v.bytes().zip(name).all(|(a, &b)| {
                let b = if b == b'_' {
                    b'-'
                } else {
                    b.to_ascii_lowercase()
                };
                a == b
            })
    })
}

/// Who the gateway vouches for, passed to the app in `X-Warden-*` headers.
pub(crate) struct Forwarded<'a> {
    pub user: &'a str,
    pub label: &'a str,
    pub client: std::net::IpAddr,
    /// Whether the client reached the gateway over TLS.
    pub https: bool,
}

/// A request ready to send, any number of times (the body is buffered).
pub(crate) struct Prepared {
    parts: http::request::Parts,
    body: Bytes,
}

/// Cleans a client request for forwarding: drops hop-by-hop headers and every credential meant
/// for the gateway (Authorization, the session cookie), and says who the user is.
pub(crate) fn prepare(
    mut parts: http::request::Parts,
    body: Bytes,
    who: Forwarded<'_>,
) -> Prepared {
    let h = &mut parts.headers;
    strip_hop_by_hop(h);
    // The app must never see the user's password or session token.
    h.remove(header::AUTHORIZATION);
    crate::auth::session::strip_cookie(h);
    if !h.contains_key(header::HOST) {
        // HTTP/2 carries the host in the URI; HTTP/1.1 to the app needs the header.
        if let Some(v) = parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        {
            h.insert(header::HOST, v);
        }
    }
    // The client's own copies go first, whether or not ours can be set, including spellings
    // with '_' that CGI-style servers read as the same header.
    let forged: Vec<HeaderName> = h
        .keys()
        .filter(|n| vouched(n.as_str().as_bytes()))
        .cloned()
        .collect();
    for n in forged {
        h.remove(n);
    }
    let set = |h: &mut HeaderMap, name: &'static str, v: &str| {
        // Raw UTF-8, as the fast lane sends it: lattice names may be any letters.
        if let Ok(v) = HeaderValue::from_bytes(v.as_bytes()) {
            h.insert(name, v);
        }
    };
    set(h, "x-warden-user", who.user);
    set(h, "x-warden-label", who.label);
    set(h, "x-forwarded-for", &who.client.to_string());
    set(
        h,
        "x-forwarded-proto",
        if who.https { "https" } else { "http" },
    );
    parts.version = http::Version::HTTP_11;
    Prepared { parts, body }
}

/// How a forward failed.
pub(crate) enum Failure {
    /// The connection was refused: the instance is not listening, and the request never
    /// reached it, so it is safe to retry elsewhere.
    Refused(String),
    /// No connection for another reason (the gateway out of descriptors or ports, a sandbox's
    /// backlog full): the request never left, but the instance may be fine.
    Unsent(String),
    /// Anything else: the app may have seen the request.
    Other(String),
    /// No answer within the upstream timeout; the app may still be working on it.
    TimedOut,
}

impl Failure {
    /// A failed connect: refused when the instance (or its sandbox's socket) is not there.
    pub(crate) fn connecting(e: &std::io::Error) -> Failure {
        use std::io::ErrorKind as K;
        match e.kind() {
            K::ConnectionRefused | K::NotFound | K::ConnectionReset | K::ConnectionAborted => {
                Failure::Refused(e.to_string())
            }
            _ => Failure::Unsent(e.to_string()),
        }
    }
}

impl Prepared {
    /// True for methods that may be repeated without changing the outcome (RFC 9110 §9.2.2).
    pub fn idempotent(&self) -> bool {
        self.parts.method.is_idempotent()
    }

    /// Sends to `addr` with the path replaced by `path_and_query`.
    pub async fn send(
        &self,
        pool: &Pool,
        addr: &str,
        path_and_query: &str,
        timeout: std::time::Duration,
    ) -> Result<Response<Body>, Failure> {
        // Origin form: the connection already goes to the instance.
        let uri: Uri = path_and_query
            .parse()
            .map_err(|e| Failure::Other(format!("unusable path: {e}")))?;
        let mut req = Request::from_parts(self.parts.clone(), Full::new(self.body.clone()));
        *req.uri_mut() = uri;
        if !req.headers().contains_key(header::HOST) {
            // An HTTP/1.0 client may send none; HTTP/1.1 to the app needs one.
            if let Ok(v) = HeaderValue::from_str(addr) {
                req.headers_mut().insert(header::HOST, v);
            }
        }
        // Dropping the send on timeout drops its connection too, so it never goes back to the
        // pool with an answer still owed.
        let resp = tokio::time::timeout(timeout, pool.send(req, addr))
            .await
            .map_err(|_| Failure::TimedOut)??;
        let (mut parts, body) = resp.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        Ok(Response::from_parts(parts, body))
    }
}
