//! Header hygiene: the one module that decides which headers cross the gateway, in both
//! directions, for every path (the HTTP/1.1 lane, and hyper's HTTP/1.1 and HTTP/2).
//!
//! Towards the app ([`write_request`]): hop-by-hop headers (RFC 9110 §7.6.1) and those a
//! `Connection` header names are dropped, and so are the credentials meant for the gateway
//! (`Authorization`, the session cookie; the app's own cookies pass) and every header the
//! gateway vouches for (`X-Warden-User`, `X-Warden-Label`, `X-Forwarded-For`,
//! `X-Forwarded-Proto`, in any case and with `_` for `-`); the gateway then sets those itself.
//!
//! Towards the client ([`response_drops`]): hop-by-hop headers and those `Connection` names,
//! except the ones that frame the body, and the taint report, which only the gateway reads.
//!
//! A rule written twice drifts, and the drift is the vulnerability: every path calls these.

/// Response header with which an instance reports it has read data of a higher class.
pub(crate) const TAINT: &str = "x-warden-taint";

/// Name of the gateway's session cookie.
pub(crate) const SESSION_COOKIE: &str = "warden_session";

/// Headers that describe one hop and are never forwarded (RFC 9110 §7.6.1), in either
/// direction. `Transfer-Encoding` is not among them: a response's framing passes through with
/// its body on the lane (see [`response_drops`]).
const HOP_BY_HOP: [&str; 7] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
];

/// Headers in which the gateway tells the app who the user is and how they came.
const VOUCHED: [&str; 4] = [
    "x-warden-user",
    "x-warden-label",
    "x-forwarded-for",
    "x-forwarded-proto",
];

fn is(name: &[u8], wanted: &str) -> bool {
    name.eq_ignore_ascii_case(wanted.as_bytes())
}

/// Whether `name` is one of [`HOP_BY_HOP`], in any case.
fn hop_by_hop(name: &[u8]) -> bool {
    HOP_BY_HOP.iter().any(|h| is(name, h))
}

/// Whether a header `name` from a client claims to be one the gateway sets, in any case and with
/// '_' for '-' (servers that map headers to CGI variables read both alike).
fn vouched(name: &[u8]) -> bool {
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

/// Request headers the app never gets from the client: hop-by-hop ones, the framing (the
/// gateway frames the body it sends), the credentials meant for the gateway (cookies come back
/// filtered), and those the gateway itself sets.
fn withheld(name: &[u8]) -> bool {
    hop_by_hop(name)
        || is(name, "transfer-encoding")
        || is(name, "authorization")
        || is(name, "cookie")
        || vouched(name)
}

/// The tokens of `Connection` header values that name other headers (all but `close` and
/// `keep-alive`). Empty, without allocating, in the common case.
fn named_by_connection<'a>(values: impl Iterator<Item = &'a [u8]>) -> Vec<&'a [u8]> {
    let mut named = Vec::new();
    for v in values {
        for token in v.split(|&b| b == b',') {
            let token = token.trim_ascii();
            if !token.is_empty() && !is(token, "close") && !is(token, "keep-alive") {
                named.push(token);
            }
        }
    }
    named
}

/// The pairs of one Cookie header other than the gateway's session cookie.
pub(crate) fn app_cookies(header: &str) -> impl Iterator<Item = &str> {
    header
        .split(';')
        .map(str::trim)
        .filter(|p| !p.is_empty() && p.split_once('=').is_none_or(|(n, _)| n != SESSION_COOKIE))
}

/// Whether `v` may be a header value as it is (no control characters).
fn header_safe(v: &str) -> bool {
    v.bytes().all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

/// Who the gateway vouches for, told to the app in `X-Warden-*` and `X-Forwarded-*` headers.
pub(crate) struct Identity<'a> {
    pub user: &'a str,
    pub label: &'a str,
    /// The client's address, written out.
    pub client: &'a str,
    /// Whether the client reached the gateway over TLS.
    pub https: bool,
}

/// A request as it goes to the app: the request line, the client's headers without what
/// [`withheld`] names or `Connection` names, the app's own cookies in one header, and who the
/// gateway vouches for. `reframed` is the body's length when the gateway frames the body
/// itself (the client's `Content-Length` is dropped then); with `None`, the client's
/// `Content-Length` (validated by the caller) frames `body`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_request<'a, H>(
    out: &mut Vec<u8>,
    method: &[u8],
    target: &[u8],
    headers: H,
    reframed: Option<usize>,
    who: &Identity<'_>,
    body: &[u8],
) where
    H: Iterator<Item = (&'a [u8], &'a [u8])> + Clone,
{
    let named = named_by_connection(
        headers
            .clone()
            .filter(|(n, _)| is(n, "connection"))
            .map(|(_, v)| v),
    );
    out.extend_from_slice(method);
    out.push(b' ');
    out.extend_from_slice(target);
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let mut cookies: Vec<&str> = Vec::new();
    for (name, value) in headers {
        if is(name, "cookie") {
            if let Ok(v) = std::str::from_utf8(value) {
                cookies.extend(app_cookies(v));
            }
        }
        let reframe = reframed.is_some() && is(name, "content-length");
        if withheld(name) || reframe || named.iter().any(|n| n.eq_ignore_ascii_case(name)) {
            continue;
        }
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    if let Some(n) = reframed {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(n.to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !cookies.is_empty() {
        out.extend_from_slice(b"cookie: ");
        for (i, c) in cookies.iter().enumerate() {
            if i > 0 {
                out.extend_from_slice(b"; ");
            }
            out.extend_from_slice(c.as_bytes());
        }
        out.extend_from_slice(b"\r\n");
    }
    for (name, value) in [
        (&b"x-warden-user: "[..], who.user),
        (b"x-warden-label: ", who.label),
    ] {
        if header_safe(value) {
            out.extend_from_slice(name);
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
    out.extend_from_slice(b"x-forwarded-for: ");
    out.extend_from_slice(who.client.as_bytes());
    out.extend_from_slice(if who.https {
        &b"\r\nx-forwarded-proto: https\r\n\r\n"[..]
    } else {
        b"\r\nx-forwarded-proto: http\r\n\r\n"
    });
    out.extend_from_slice(body);
}

/// What a response head's `Connection` and framing headers say, gathered before its headers
/// are judged one by one with [`response_drops`].
pub(crate) struct ResponseFraming<'a> {
    /// Headers `Connection` names (never the framing ones: the body is framed by them).
    pub named: Vec<&'a [u8]>,
    /// The response has a `Transfer-Encoding`.
    pub transfer_encoded: bool,
}

impl<'a> ResponseFraming<'a> {
    /// Gathers what the headers of a response say about themselves.
    pub(crate) fn of(headers: impl Iterator<Item = (&'a [u8], &'a [u8])> + Clone) -> Self {
        let named = named_by_connection(
            headers
                .clone()
                .filter(|(n, _)| is(n, "connection"))
                .map(|(_, v)| v),
        )
        .into_iter()
        .filter(|t| !is(t, "content-length") && !is(t, "transfer-encoding"))
        .collect();
        let transfer_encoded = headers.into_iter().any(|(n, _)| is(n, "transfer-encoding"));
        Self {
            named,
            transfer_encoded,
        }
    }
}

/// Whether a response header `name` stays away from the client: hop-by-hop, named by
/// `Connection`, the taint report (read by the gateway), or a `Content-Length` that a
/// `Transfer-Encoding` overrides (RFC 9112 §6.3). `Transfer-Encoding` itself passes: the body is
/// relayed with its framing on the lane, and hyper's path drops it when it frames the body
/// anew.
pub(crate) fn response_drops(name: &[u8], framing: &ResponseFraming<'_>) -> bool {
    hop_by_hop(name)
        || is(name, TAINT)
        || framing.named.iter().any(|n| n.eq_ignore_ascii_case(name))
        || (framing.transfer_encoded && is(name, "content-length"))
}

#[cfg(test)]
mod tests;
