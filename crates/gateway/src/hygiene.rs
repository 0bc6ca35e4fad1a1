//! Header hygiene: the one module that decides which headers cross the gateway, in both
//! directions, for every path (the HTTP/1.1 lane, and hyper's HTTP/1.1 and HTTP/2).
//!
//! Towards the app ([`write_request`]): hop-by-hop headers (RFC 9110 §7.6.1) and those a
//! `Connection` header names are dropped, and so are the credentials meant for the gateway
//! (`Authorization`, the session cookie; the app's own cookies pass) and every identity and
//! forwarding header, which the gateway owns: `X-Warden-*`, `X-Forwarded-*`, `Forwarded`, and
//! every header that names the client's address (`X-Real-IP`, `True-Client-IP`,
//! `CF-Connecting-IP` and their kin, by the words in their names) or scheme, in any case and
//! with `_` for `-`. The gateway then sets its own: who the user
//! is (`X-Warden-User`, `X-Warden-Label`) and how the request came (`Forwarded` per RFC 7239,
//! `X-Forwarded-For`, `-Proto`, `-Host`, and `-Prefix` with the `/apps/<name>` it took off the
//! path, so apps can build links that work), and `X-Warden-Signature`, a MAC of the identity
//! under the instance's own secret (see [`warden_core::identity`]), so an app can tell the
//! gateway's requests from those of anyone else who reaches its port.
//!
//! Towards the client ([`response_drops`]): hop-by-hop headers and those `Connection` names,
//! except the ones that frame the body; the taint report, which only the gateway reads; and
//! any cookie the gateway owns: an app can never set, change or delete the session cookie
//! (`Set-Cookie` judged as a browser parses it: its name in any case, with any attributes, or a
//! nameless cookie whose value a browser sends back as the session cookie; `Set-Cookie2`
//! altogether, which no browser reads any more; `Clear-Site-Data`, which would clear it).
//! Apps share one origin, so a planted session cookie would make another user's browser speak
//! as the app's choice of user.
//!
//! A rule written twice drifts, and the drift is the vulnerability: every path calls these.

use warden_core::identity::{Signer, SIGNATURE_HEADER, SIGNATURE_LEN};

/// Response header with which an instance reports it has read data of a higher class.
pub(crate) const TAINT: &str = "x-warden-taint";

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

/// Name prefixes of the headers the gateway owns, whatever follows.
const OWNED_PREFIXES: [&str; 2] = ["x-warden-", "x-forwarded-"];
/// Other headers the gateway owns: how the request came, in the spellings app servers read
/// besides `Forwarded` and `X-Forwarded-*` (gunicorn, Werkzeug and IIS take the scheme from
/// these when the peer is a local proxy, as the gateway is).
const OWNED: [&str; 6] = [
    "forwarded",
    "x-real-ip",
    "x-host",
    "x-scheme",
    "x-url-scheme",
    "front-end-https",
];
/// Words that, anywhere in a header's name, make it one that tells who the client is
/// (`True-Client-IP`, `CF-Connecting-IP`, `X-Cluster-Client-IP`, `X-Remote-Addr`,
/// `X-Envoy-External-Address`, `X-Original-Forwarded-For`…): proxies and CDNs each coin their
/// own, and an app trusts whichever its framework reads. The class is withheld, not the
/// spellings seen so far, so an app can trust every client-address header it gets.
const ADDRESS_WORDS: [&str; 4] = ["ip", "ipv6", "addr", "address"];

fn is(name: &[u8], wanted: &str) -> bool {
    name.eq_ignore_ascii_case(wanted.as_bytes())
}

/// Whether `name` is one of [`HOP_BY_HOP`], in any case.
fn hop_by_hop(name: &[u8]) -> bool {
    HOP_BY_HOP.iter().any(|h| is(name, h))
}

/// `name` in lower case with '_' for '-': servers that map headers to CGI variables read
/// `X_Warden_User` as `X-Warden-User`.
fn folded(name: &[u8]) -> impl Iterator<Item = u8> + '_ {
    name.iter().map(|&b| {
        if b == b'_' {
            b'-'
        } else {
            b.to_ascii_lowercase()
        }
    })
}

/// Whether a header `name` from a client is one the gateway owns (sets itself, or keeps to
/// itself), in any case and with '_' for '-': the gateway's identity headers, and every header
/// that says where the client is or how it came (a word of [`ADDRESS_WORDS`], or one starting
/// with `forwarded`, between the name's dashes).
fn owned(name: &[u8]) -> bool {
    let starts = |p: &str| name.len() >= p.len() && folded(&name[..p.len()]).eq(p.bytes());
    let equals = |w: &str| name.len() == w.len() && folded(name).eq(w.bytes());
    OWNED_PREFIXES.iter().any(|p| starts(p))
        || OWNED.iter().any(|w| equals(w))
        || name.split(|&b| b == b'-' || b == b'_').any(|word| {
            ADDRESS_WORDS.iter().any(|w| is(word, w))
                || (word.len() >= 9 && word[..9].eq_ignore_ascii_case(b"forwarded"))
        })
}

/// Request headers the app never gets from the client: hop-by-hop ones, the framing (the
/// gateway frames the body it sends), the credentials meant for the gateway (cookies come back
/// filtered), and those the gateway itself sets.
///
/// Names compare with `_` for `-`, as for owned headers: an app server that maps headers to
/// CGI variables reads `Proxy_Authorization` as `Proxy-Authorization`. `Proxy` is withheld
/// too: CGI turns it into `HTTP_PROXY`, which many HTTP libraries take as their proxy
/// ("httpoxy", CVE-2016-5385).
fn withheld(name: &[u8]) -> bool {
    let like = |w: &str| name.len() == w.len() && folded(name).eq(w.bytes());
    HOP_BY_HOP.iter().any(|h| like(h))
        || like("transfer-encoding")
        || like("authorization")
        || like("cookie")
        || like("proxy")
        || owned(name)
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

/// The pairs of one Cookie header other than the gateway's own cookies (the session and the
/// CSRF cookie; their names in any case).
pub(crate) fn app_cookies(header: &str) -> impl Iterator<Item = &str> {
    header.split(';').map(str::trim).filter(|p| {
        !p.is_empty()
            && p.split_once('=')
                .is_none_or(|(n, _)| !crate::auth::session::is_gateway_cookie(n))
    })
}

/// Whether `v` may be a header value as it is (no control characters).
fn header_safe(v: &str) -> bool {
    v.bytes().all(|b| b == b'\t' || (b >= 0x20 && b != 0x7f))
}

/// Who the gateway vouches for, and how the request came, told to the app in `X-Warden-*`,
/// `Forwarded` and `X-Forwarded-*` headers.
pub(crate) struct Identity<'a> {
    pub user: &'a str,
    pub label: &'a str,
    /// The client's address, written out.
    pub client: &'a str,
    /// Whether the client reached the gateway over TLS.
    pub https: bool,
    /// The host the client asked for (its `Host`, or the HTTP/2 authority).
    pub host: &'a str,
    /// What the gateway took off the front of the path: `/apps/<name>`, or nothing when the
    /// app was chosen by host name.
    pub prefix: &'a str,
}

/// Appends `name: value\r\n`.
fn header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// The forwarding headers the gateway sets: `Forwarded` (RFC 7239) and the `X-Forwarded-*`
/// ones. A host that could not be written safely is left out.
fn write_forwarding(out: &mut Vec<u8>, who: &Identity<'_>) {
    let proto = if who.https { "https" } else { "http" };
    let host_ok = !who.host.is_empty() && header_safe(who.host) && !who.host.contains(['"', '\\']);
    out.extend_from_slice(b"forwarded: for=");
    if who.client.contains(':') {
        // An IPv6 address is a quoted, bracketed node (RFC 7239 §6).
        out.extend_from_slice(b"\"[");
        out.extend_from_slice(who.client.as_bytes());
        out.extend_from_slice(b"]\"");
    } else {
        out.extend_from_slice(who.client.as_bytes());
    }
    if host_ok {
        out.extend_from_slice(b";host=\"");
        out.extend_from_slice(who.host.as_bytes());
        out.push(b'"');
    }
    out.extend_from_slice(b";proto=");
    out.extend_from_slice(proto.as_bytes());
    out.extend_from_slice(b"\r\n");
    header(out, b"x-forwarded-for", who.client.as_bytes());
    header(out, b"x-forwarded-proto", proto.as_bytes());
    if host_ok {
        header(out, b"x-forwarded-host", who.host.as_bytes());
    }
    if !who.prefix.is_empty() && header_safe(who.prefix) {
        header(out, b"x-forwarded-prefix", who.prefix.as_bytes());
    }
}

/// A request as it goes to the app: the request line, the client's headers without what
/// [`withheld`] names or `Connection` names, the app's own cookies in one header, and who the
/// gateway vouches for. `reframed` is the body's length when the gateway frames the body
/// itself (the client's `Content-Length` is dropped then); with `None`, the client's
/// `Content-Length` (validated by the caller) frames `body`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_request<'a, 'w, H>(
    out: &mut Vec<u8>,
    method: &[u8],
    target: &[u8],
    headers: H,
    reframed: Option<usize>,
    who: &Identity<'w>,
    body: &[u8],
) -> Signed<'w>
where
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
        (&b"x-warden-user"[..], who.user),
        (b"x-warden-label", who.label),
    ] {
        if header_safe(value) {
            header(out, name, value.as_bytes());
        }
    }
    // The signature depends on the instance, which is chosen later: a placeholder of its
    // length, filled in by [`Signed::bytes_for`] for each instance tried.
    out.extend_from_slice(SIGNATURE_HEADER.as_bytes());
    out.extend_from_slice(b": ");
    let at = out.len();
    out.extend_from_slice(b"v1=");
    out.extend_from_slice(&[b'0'; SIGNATURE_LEN - 3]);
    out.extend_from_slice(b"\r\n");
    write_forwarding(out, who);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    Signed {
        at,
        user: signed_value(who.user),
        label: signed_value(who.label),
    }
}

/// What an identity header carries: the value, or nothing when it is not sent.
fn signed_value(v: &str) -> &str {
    if header_safe(v) {
        v
    } else {
        ""
    }
}

/// Where a request written by [`write_request`] carries its signature, and what it signs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Signed<'w> {
    /// Offset of the signature's value in the request bytes.
    pub at: usize,
    /// The `X-Warden-User` sent ("" when none).
    pub user: &'w str,
    /// The `X-Warden-Label` sent ("" when none).
    pub label: &'w str,
}

impl Signed<'_> {
    /// The signature of this identity for the instance `signer` belongs to.
    pub(crate) fn for_instance(&self, signer: &Signer) -> [u8; SIGNATURE_LEN] {
        signer.sign(self.user, self.label)
    }
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

/// Whether a `Set-Cookie` value may set the gateway's session cookie, judged as a browser
/// parses it (RFC 6265bis §5.6): the pair is what comes before the first `;`; its name is what
/// comes before the first `=` (none: the pair is a nameless cookie's value), both trimmed.
/// A browser sends a nameless cookie back as its bare value, so `=warden_session=X` comes
/// back as `warden_session=X`: what is judged is the pair as the browser will send it, read
/// as the gateway reads a `Cookie` header ([`crate::auth::session::tokens`]). A value with a
/// control character, which a browser ignores whole, is dropped too.
fn sets_session_cookie(value: &[u8]) -> bool {
    let Ok(value) = std::str::from_utf8(value) else {
        // Not text: no browser reads it as the session cookie, and no app needs to send it.
        return true;
    };
    if value.chars().any(|c| c != '\t' && c.is_ascii_control()) {
        return true;
    }
    let pair = value.split(';').next().unwrap_or(value);
    let sent = match pair.split_once('=') {
        Some((name, rest)) if name.trim_matches([' ', '\t']).is_empty() => rest,
        _ => pair,
    };
    let name = sent.split_once('=').map_or(sent, |(n, _)| n);
    crate::auth::session::is_gateway_cookie(name)
}

/// Whether a `Clear-Site-Data` response header stays away from the client: always. Every app
/// shares the gateway's origin, so `"cookies"` (or `"*"`) would end the user's session and
/// `"storage"` would wipe every other app's storage on that origin: no app may speak for the
/// origin.
fn clears_site_data(name: &[u8]) -> bool {
    is(name, "clear-site-data")
}

/// Whether a response header stays away from the client: hop-by-hop, named by `Connection`,
/// the taint report (read by the gateway), a cookie the gateway owns, `Clear-Site-Data`, or a
/// `Content-Length` that a `Transfer-Encoding` overrides (RFC 9112 §6.3). `Transfer-Encoding`
/// itself passes: the body is relayed with its framing on the lane, and hyper's path drops it
/// when it frames the body anew.
pub(crate) fn response_drops(name: &[u8], value: &[u8], framing: &ResponseFraming<'_>) -> bool {
    hop_by_hop(name)
        || is(name, TAINT)
        || is(name, "set-cookie2")
        || (is(name, "set-cookie") && sets_session_cookie(value))
        || clears_site_data(name)
        // An app's service worker may only control its own path (its script's directory): a
        // wider scope would put the sign-in page, and every other app, under its script.
        || is(name, "service-worker-allowed")
        || framing.named.iter().any(|n| n.eq_ignore_ascii_case(name))
        || (framing.transfer_encoded && is(name, "content-length"))
}

#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;
