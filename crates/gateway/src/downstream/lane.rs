//! The lane: the gateway's own HTTP/1.1 loop for the request that dominates its load, an
//! authenticated request forwarded to an instance.
//!
//! hyper's server per forwarded request cost warden about twice what nginx and haproxy spend
//! (docs/BENCHMARKS.md). Here a connection's requests are parsed with httparse into ranges of
//! the bytes read, authenticated and authorised from the raw header values, and forwarded as
//! bytes with the gateway's header changes ([`crate::hygiene`]); the instance's answer comes
//! back through [`crate::upstream`] and is copied to the client. In the common case each side
//! costs one read and one write.
//!
//! Plain connections start on the lane, and so do TLS connections that did not choose h2 by ALPN.
//! Whatever the lane does not take is handed to hyper with the bytes read so far, and hyper
//! serves the connection from that request on: HTTP/2 (its preface is not HTTP/1.1), HTTP/1.0,
//! malformed or oversized heads, more than 64 header fields, `Expect`, `Upgrade`, `Connection`
//! options other than `keep-alive` and `close`, chunked, large or oddly framed request bodies,
//! requests without exactly one `Host`, targets not in origin form or with a fragment,
//! `CONNECT`, the gateway's own endpoints, unknown apps and static files. The choice is made
//! before anything is authenticated, so no request is counted or checked twice.
//!
//! Differences from hyper's path that remain: an idle keep-alive connection is closed without a
//! 408 after the header timeout, and a request body must arrive within the header timeout too.
//! Over TLS, a connection handed to hyper is closed without a 408 when a later head is slow:
//! hyper owns the stream then, and only a plain socket has a second handle to write it on.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::Instrument;
use warden_core::{AppSpec, Owner};

use crate::client::Client;
use crate::dispatch::{self, Forwarded};
use crate::error::GatewayError;
use crate::hygiene::{self, Identity};
use crate::metrics::Phase;
use crate::phases::Clock;
use crate::response::{Ask, TIMEOUT_408};
use crate::route::{admit, app_route, static_path};
use crate::shared::SharedTcp;
use crate::state::State;
use crate::upstream::{Exchange, KEEP_BUFFER};

/// Header fields a request head may have on the lane; more go to hyper.
const MAX_FIELDS: usize = 64;
/// Request bodies up to this size are read whole on the lane; larger ones go to hyper.
const MAX_BODY: usize = 64 * 1024;

/// A header field, as ranges into the bytes of its head.
struct Field {
    name: Range<usize>,
    value: Range<usize>,
}

/// A complete request head.
struct RequestHead {
    len: usize,
    method: Range<usize>,
    target: Range<usize>,
}

enum Parse {
    Head(RequestHead),
    Partial,
    /// Not for the lane: hyper answers it, with 400 if it is malformed.
    Elsewhere,
}

fn range(base: &[u8], part: &[u8]) -> Range<usize> {
    let start = part.as_ptr() as usize - base.as_ptr() as usize;
    start..start + part.len()
}

fn parse(buf: &[u8], fields: &mut Vec<Field>) -> Parse {
    // Left uninitialised: filling the array costs more than parsing a short head.
    let mut raw = [std::mem::MaybeUninit::uninit(); MAX_FIELDS];
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(buf, &mut raw) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Parse::Partial,
        Err(_) => return Parse::Elsewhere,
    };
    let (Some(method), Some(target), Some(1)) = (req.method, req.path, req.version) else {
        return Parse::Elsewhere;
    };
    fields.clear();
    fields.extend(req.headers.iter().map(|h| Field {
        name: range(buf, h.name.as_bytes()),
        value: range(buf, h.value),
    }));
    Parse::Head(RequestHead {
        len,
        method: range(buf, method.as_bytes()),
        target: range(buf, target.as_bytes()),
    })
}

/// A request the lane takes.
struct Lane {
    spec: Arc<AppSpec>,
    /// The request target as the app gets it.
    target: Range<usize>,
    /// What the gateway took off the front of the target (`/apps/<name>`, or nothing).
    prefix: Range<usize>,
    /// The Host the client sent.
    host: Range<usize>,
    body_len: usize,
    head_only: bool,
    /// The client asked to close the connection after this request.
    close: bool,
}

/// Decides, from the head alone, whether the lane takes a request.
fn take(state: &State, buf: &[u8], head: &RequestHead, fields: &[Field]) -> Option<Lane> {
    if head.len > state.config.max_header_bytes {
        return None;
    }
    let mut host = None;
    let mut body_len = None;
    let mut close = false;
    for f in fields {
        let name = &buf[f.name.clone()];
        let value = &buf[f.value.clone()];
        let is = |n: &str| name.eq_ignore_ascii_case(n.as_bytes());
        if is("transfer-encoding") || is("upgrade") || is("expect") {
            return None;
        }
        if is("connection") {
            // Options other than these name hop-by-hop headers to strip: hyper's path does that.
            for token in std::str::from_utf8(value).ok()?.split(',') {
                match token.trim() {
                    t if t.eq_ignore_ascii_case("close") => close = true,
                    t if t.eq_ignore_ascii_case("keep-alive") => {}
                    _ => return None,
                }
            }
        }
        if is("host") {
            if host.is_some() {
                return None;
            }
            host = Some(value);
        }
        if is("content-length") {
            // Digits only: Rust's parse would take "+5", which the app may read otherwise.
            if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
                return None;
            }
            let n: usize = std::str::from_utf8(value).ok()?.parse().ok()?;
            if body_len.is_some() || n > MAX_BODY || n > state.config.max_body_bytes {
                return None;
            }
            body_len = Some(n);
        }
    }
    let host_bytes = host?;
    let host = std::str::from_utf8(host_bytes).ok()?;
    let target = std::str::from_utf8(&buf[head.target.clone()]).ok()?;
    // Origin form only, without a fragment (which hyper's URI parser drops); never CONNECT.
    if !target.starts_with('/') || target.contains('#') || &buf[head.method.clone()] == b"CONNECT" {
        return None;
    }
    let views = state.views.read();
    let (app, skip) = app_route(&views, Some(host), target)?;
    let spec = views.apps.get(app)?.clone();
    drop(views);
    if static_path(&spec, &target[skip..]).is_some() {
        return None;
    }
    let target = head.target.start + skip..head.target.end;
    Some(Lane {
        spec,
        prefix: head.target.start..head.target.start + skip,
        host: range(buf, host_bytes),
        target,
        body_len: body_len.unwrap_or(0),
        head_only: &buf[head.method.clone()] == b"HEAD",
        close,
    })
}

enum Read {
    Data,
    Closed,
    TimedOut,
}

async fn read_some<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    deadline: tokio::time::Instant,
    clock: &Clock,
) -> Read {
    if buf.capacity() - buf.len() < 2048 {
        buf.reserve(8 * 1024);
    }
    let was_empty = buf.is_empty();
    match tokio::time::timeout_at(deadline, stream.read_buf(buf)).await {
        Err(_) => Read::TimedOut,
        Ok(Ok(0) | Err(_)) => Read::Closed,
        Ok(Ok(_)) => {
            if was_empty {
                clock.bytes_arrived();
            }
            Read::Data
        }
    }
}

/// A connection on the lane, with its buffers.
struct Conn<S> {
    stream: S,
    /// Bytes read from the client and not yet used.
    buf: BytesMut,
    /// The fields of the request head in `buf`.
    fields: Vec<Field>,
    /// The request as it goes to the app.
    request: Vec<u8>,
    /// What goes back to the client.
    out: Vec<u8>,
    clock: Arc<Clock>,
    timeout: std::time::Duration,
}

/// What the next request on a connection turned out to be.
enum Next {
    /// A complete head in the buffer.
    Head(RequestHead),
    /// Something for hyper (the bytes are in the buffer).
    Elsewhere,
    /// The connection is over: closed, or timed out (and answered 408 if a head had begun).
    Over,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Conn<S> {
    /// Reads until a request head is complete. An idle keep-alive connection gets the header
    /// timeout to start a request, and is then closed without a word; a started head gets the
    /// header timeout from its first byte.
    async fn next_head(&mut self, max_head: usize) -> Next {
        let mut deadline = tokio::time::Instant::now() + self.timeout;
        let mut begun = !self.buf.is_empty();
        loop {
            match parse(&self.buf, &mut self.fields) {
                Parse::Head(h) => return Next::Head(h),
                Parse::Elsewhere => return Next::Elsewhere,
                Parse::Partial if self.buf.len() > max_head => return Next::Elsewhere,
                Parse::Partial => {}
            }
            match read_some(&mut self.stream, &mut self.buf, deadline, &self.clock).await {
                Read::Data if !begun => {
                    begun = true;
                    deadline = tokio::time::Instant::now() + self.timeout;
                }
                Read::Data => {}
                Read::Closed => return Next::Over,
                Read::TimedOut => {
                    if !self.buf.is_empty() {
                        let _ = write_flushed(&mut self.stream, TIMEOUT_408).await;
                    }
                    return Next::Over;
                }
            }
        }
    }

    /// Reads until the buffer holds `total` bytes (head and body), within the header timeout;
    /// false when the connection is over.
    async fn read_to(&mut self, total: usize) -> bool {
        let deadline = tokio::time::Instant::now() + self.timeout;
        while self.buf.len() < total {
            match read_some(&mut self.stream, &mut self.buf, deadline, &self.clock).await {
                Read::Data => {}
                Read::Closed => return false,
                Read::TimedOut => {
                    let _ = write_flushed(&mut self.stream, TIMEOUT_408).await;
                    return false;
                }
            }
        }
        true
    }

    /// Writes the reply (a refusal as `ask` wants it); returns whether the connection can carry
    /// another request.
    async fn reply(&mut self, state: &State, lane: &Lane, ask: &Ask<'_>, reply: Reply) -> bool {
        let kept = match reply {
            Reply::Refused(e) => {
                self.out.clear();
                e.write_http1(ask, lane.head_only, lane.close, &mut self.out);
                write_flushed(&mut self.stream, &self.out).await.is_ok()
            }
            Reply::App(Forwarded { answer, retire }) => {
                let kept = answer
                    .relay(&state.upstream, lane.close, &mut self.stream, &mut self.out)
                    .await
                    .unwrap_or(false);
                // A per-request instance stops once its answer is through.
                drop(retire);
                kept
            }
        };
        // A TLS stream may hold the last records back until flushed; a socket flushes at once.
        kept && self.stream.flush().await.is_ok()
    }

    /// A large request or answer does not leave large buffers behind on an idle connection.
    fn shrink(&mut self) {
        for v in [&mut self.out, &mut self.request] {
            if v.capacity() > KEEP_BUFFER {
                *v = Vec::with_capacity(8 * 1024);
            }
        }
        if self.buf.is_empty() && self.buf.capacity() > KEEP_BUFFER {
            self.buf = BytesMut::with_capacity(8 * 1024);
        }
    }
}

/// Serves a connection on the lane while it can, then through hyper. `spare` is a second handle
/// on a plain socket, which hyper's path uses to answer 408.
pub(super) async fn serve<S>(
    state: Arc<State>,
    stream: S,
    client: Client,
    spare: Option<SharedTcp>,
    clock: Arc<Clock>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut c = Conn {
        stream,
        buf: BytesMut::with_capacity(8 * 1024),
        fields: Vec::with_capacity(MAX_FIELDS),
        request: Vec::with_capacity(8 * 1024),
        out: Vec::with_capacity(8 * 1024),
        clock,
        timeout: state.config.header_timeout,
    };
    loop {
        let head = match c.next_head(state.config.max_header_bytes).await {
            Next::Over => break,
            Next::Head(h) => Some(h),
            Next::Elsewhere => None,
        };
        let lane = head.and_then(|h| take(&state, &c.buf, &h, &c.fields).map(|l| (h, l)));
        let Some((head, lane)) = lane else {
            let io = crate::prefixed::Prefixed::new(c.buf, c.stream);
            return super::hyper::serve(state, io, client, spare, c.clock).await;
        };
        // Timed as hyper's path is: service from the complete head to the response head.
        c.clock.service_start();
        let started = Instant::now();
        let total = head.len + lane.body_len;
        if !c.read_to(total).await {
            break;
        }
        let msg = c.buf.split_to(total).freeze();
        let span =
            tracing::debug_span!("request", app = %lane.spec.name, label = tracing::field::Empty);
        let reply = to_app(
            &state,
            &msg,
            &head,
            &c.fields,
            &lane,
            &client,
            &mut c.request,
        )
        .instrument(span)
        .await;
        // Only a refusal depends on who asks: an answer from the app goes back as it is.
        let ask = match &reply {
            Reply::Refused(_) => refusal_ask(&msg, &head, &c.fields, &lane),
            Reply::App(_) => Ask::API,
        };
        let status = match &reply {
            Reply::Refused(e) => e.status_for(&ask).as_u16(),
            Reply::App(f) => f.answer.status,
        };
        state.metrics.request(&lane.spec.name, status);
        state
            .metrics
            .request_time(&lane.spec.name, started.elapsed().as_secs_f64());
        c.clock.service_end();
        if !c.reply(&state, &lane, &ask, reply).await || lane.close {
            break;
        }
        c.shrink();
    }
    // A FIN on a socket; on TLS also close_notify and whatever rustls still holds, so a body
    // that ends with the connection arrives whole and the client can tell it is complete.
    // Bounded: a client that reads nothing would otherwise hold the connection forever.
    let _ = tokio::time::timeout(c.timeout, c.stream.shutdown()).await;
    c.clock.closed();
}

async fn write_flushed<S: AsyncWrite + Unpin>(stream: &mut S, bytes: &[u8]) -> std::io::Result<()> {
    stream.write_all(bytes).await?;
    stream.flush().await
}

/// Who asked for a refused request ([`Ask`]): its `Accept`, its method, and its target when
/// the app is reached by path (the gateway's sign-in page is then on the same host).
fn refusal_ask<'m>(msg: &'m [u8], head: &RequestHead, fields: &[Field], lane: &Lane) -> Ask<'m> {
    let accept = fields
        .iter()
        .find(|f| msg[f.name.clone()].eq_ignore_ascii_case(b"accept"))
        .map(|f| &msg[f.value.clone()]);
    let target = match lane.prefix.is_empty() {
        true => None,
        false => std::str::from_utf8(&msg[head.target.clone()]).ok(),
    };
    Ask::new(accept, &msg[head.method.clone()], target)
}

/// What the lane answers a request with.
enum Reply {
    /// The gateway's own refusal.
    Refused(GatewayError),
    /// An instance's answer.
    App(Forwarded),
}

/// Authenticates, authorises and forwards one request; `request` is the buffer its bytes for
/// the app are written to.
async fn to_app(
    state: &State,
    msg: &Bytes,
    head: &RequestHead,
    fields: &[Field],
    lane: &Lane,
    client: &Client,
    request: &mut Vec<u8>,
) -> Reply {
    let m = &state.metrics;
    // Before anything is signed in or served: nothing of it could be recorded.
    let named = |n: &'static str| {
        fields
            .iter()
            .filter(move |f| msg[f.name.clone()].eq_ignore_ascii_case(n.as_bytes()))
            .map(|f| &msg[f.value.clone()])
    };
    if let Err(e) = state.audit_gate(named("accept").next()) {
        return Reply::Refused(e);
    }
    let t = Instant::now();
    let mut authorizations = named("authorization");
    let authorization = authorizations.next();
    if authorizations.next().is_some() {
        return Reply::Refused(crate::auth::two_authorizations());
    }
    let user = state
        .auth
        .authenticate_raw(&state.views, authorization, named("cookie"), client.ip, m)
        .await;
    let user = match user {
        Ok(u) => u,
        Err(e) => {
            let app = Some(lane.spec.name.as_str());
            state
                .audit
                .refusal(e.status().as_u16(), None, client.ip, app);
            return Reply::Refused(e);
        }
    };
    m.phase(Phase::Auth, t.elapsed());
    let spec = &lane.spec;
    if let Err(e) = admit(spec, &user) {
        let (name, app) = (Some(user.record.name.as_str()), Some(spec.name.as_str()));
        state
            .audit
            .refusal(e.status().as_u16(), name, client.ip, app);
        return Reply::Refused(e);
    }
    let label = user.record.clearance.as_str();
    tracing::Span::current().record("label", label);
    request.clear();
    let signed = hygiene::write_request(
        request,
        &msg[head.method.clone()],
        &msg[lane.target.clone()],
        fields
            .iter()
            .map(|f| (&msg[f.name.clone()], &msg[f.value.clone()])),
        None,
        &Identity {
            user: &user.record.name,
            label,
            client: &client.text,
            https: client.https,
            host: std::str::from_utf8(&msg[lane.host.clone()]).unwrap_or(""),
            prefix: std::str::from_utf8(&msg[lane.prefix.clone()]).unwrap_or(""),
        },
        &msg[head.len..],
    );
    let method = &msg[head.method.clone()];
    let x = Exchange {
        bytes: request,
        signed,
        head_only: lane.head_only,
        idempotent: http::Method::from_bytes(method).is_ok_and(|m| m.is_idempotent()),
        pooled: true,
        user: &user.record.name,
        method,
        target: &msg[lane.target.clone()],
    };
    let owner = Owner::for_lifetime(spec.lifetime, &user.record.name);
    match dispatch::forward(state, spec, label, &owner, &x).await {
        Ok(f) => Reply::App(f),
        Err(e) => Reply::Refused(e),
    }
}

#[cfg(test)]
mod props;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_heads_into_ranges_and_leaves_the_rest_to_hyper() {
        let mut fields = Vec::new();
        let buf = b"GET /apps/demo/x?y=1 HTTP/1.1\r\nHost: a\r\nCookie: c=1\r\n\r\nNEXT";
        let Parse::Head(h) = parse(buf, &mut fields) else {
            panic!("a complete head");
        };
        assert_eq!(h.len, buf.len() - 4);
        assert_eq!(&buf[h.method], b"GET");
        assert_eq!(&buf[h.target], b"/apps/demo/x?y=1");
        assert_eq!(fields.len(), 2);
        assert_eq!(&buf[fields[1].name.clone()], b"Cookie");
        assert_eq!(&buf[fields[1].value.clone()], b"c=1");
        assert!(matches!(
            parse(b"GET / HTTP/1.1\r\nHost:", &mut fields),
            Parse::Partial
        ));
        for other in [
            &b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"[..],
            b"GET / HTTP/1.0\r\n\r\n",
            b"GET / HTTP/1.1\r\nhost x\r\n\r\n",
        ] {
            assert!(
                matches!(parse(other, &mut fields), Parse::Elsewhere),
                "{other:?}"
            );
        }
    }

    /// The request the lane writes for the app from `msg`.
    fn for_app(msg: &[u8], client: &str, https: bool) -> String {
        let mut fields = Vec::new();
        let Parse::Head(head) = parse(msg, &mut fields) else {
            panic!("a complete head");
        };
        let mut out = Vec::new();
        hygiene::write_request(
            &mut out,
            &msg[head.method.clone()],
            &msg[head.target.start + "/apps/demo".len()..head.target.end],
            fields
                .iter()
                .map(|f| (&msg[f.name.clone()], &msg[f.value.clone()])),
            None,
            &Identity {
                user: "alice",
                label: "SECRET",
                client,
                https,
                host: "a",
                prefix: "/apps/demo",
            },
            &msg[head.len..],
        );
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_app_never_gets_credentials_or_forged_identity_headers() {
        let msg = b"POST /apps/demo/p HTTP/1.1\r\nHost: a\r\nAuthorization: Basic eDp5\r\nCookie: a=1; warden_session=tok; b=2\r\nX-Warden-User: mallory\r\nx-forwarded-for: 1.2.3.4\r\nConnection: keep-alive\r\ncontent-length: 2\r\n\r\nhi";
        assert_eq!(
            for_app(msg, "127.0.0.1", false),
            "POST /p HTTP/1.1\r\nHost: a\r\ncontent-length: 2\r\ncookie: a=1; b=2\r\nx-warden-user: alice\r\nx-warden-label: SECRET\r\nx-warden-signature: v1=0000000000000000000000000000000000000000000000000000000000000000\r\nforwarded: for=127.0.0.1;host=\"a\";proto=http\r\nx-forwarded-for: 127.0.0.1\r\nx-forwarded-proto: http\r\nx-forwarded-host: a\r\nx-forwarded-prefix: /apps/demo\r\n\r\nhi"
        );
        assert!(for_app(msg, "::1", true).contains(
            "forwarded: for=\"[::1]\";host=\"a\";proto=https\r\nx-forwarded-for: ::1\r\nx-forwarded-proto: https\r\n"
        ));
    }
}
