//! Keep-alive HTTP/1.1 connections to instances for the fast lane, and one exchange on them:
//! the request's bytes out, the response head parsed and cleaned, the body read whole when it is
//! small, or relayed to the client as it arrives.

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::chunked::Scanner;
use crate::idle::IDLE_TIMEOUT;
use crate::proxy::Failure;

/// Responses of known length up to this size are read whole before the client gets any byte;
/// larger ones, and those of unknown length, are relayed as they arrive.
const BUFFER_LIMIT: usize = 256 * 1024;
/// Bodies up to this size are copied behind the head for one write; larger ones are written
/// on their own, so no per-connection buffer grows to the size of a large answer.
const COPY_LIMIT: usize = 16 * 1024;
/// A connection's read buffer larger than this is let go when it goes back to the pool.
const KEEP_BUFFER: usize = 64 * 1024;
/// Largest response head accepted from an instance.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;
const MAX_HEADERS: usize = 100;

/// A connection to an instance, with the bytes read from it and not yet used.
pub(crate) struct Conn {
    stream: TcpStream,
    buf: BytesMut,
    idle_since: Instant,
}

impl crate::idle::Idle for Conn {
    /// Not too old, and the app has neither closed it nor sent anything unasked. Costs no
    /// system call when the socket has not become readable since it was last drained.
    fn reusable(&self) -> bool {
        if self.stale() || !self.buf.is_empty() {
            return false;
        }
        let mut probe = [0u8; 1];
        matches!(self.stream.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }

    fn stale(&self) -> bool {
        self.idle_since.elapsed() >= IDLE_TIMEOUT
    }

    fn touch(&mut self) {
        self.idle_since = Instant::now();
        // A large answer does not leave a large buffer behind on an idle connection.
        if self.buf.capacity() > KEEP_BUFFER {
            self.buf = BytesMut::with_capacity(8 * 1024);
        }
    }
}

/// Idle connections by instance address.
pub(crate) type Pool = crate::idle::Pool<Conn>;

async fn connect(addr: &str) -> Result<Conn, Failure> {
    // Plain `host:port`, or a sandbox's connection-handing socket.
    let stream = warden_agent::connect(addr)
        .await
        .map_err(|e| Failure::connecting(&e))?;
    let _ = stream.set_nodelay(true);
    Ok(Conn {
        stream,
        buf: BytesMut::with_capacity(8 * 1024),
        idle_since: Instant::now(),
    })
}

/// How the rest of a response body is delimited.
enum Framing {
    /// This many bytes.
    Length(u64),
    Chunked(Scanner),
    /// Until the instance closes the connection.
    Close,
}

enum Body {
    /// The whole body, read.
    Whole(Bytes),
    /// The body still to come on `conn` (whose buffer may already hold some of it).
    Rest { conn: Conn, framing: Framing },
}

/// A response head as read from an instance and cleaned for the client.
struct Head {
    status: u16,
    /// Status line and headers for the client, ending with the empty line.
    bytes: Vec<u8>,
    taint: Option<String>,
    /// How the body is delimited; `None` when there is none.
    framing: Option<Framing>,
    /// Whether the connection to the instance may carry another request after this one.
    reuse: bool,
}

/// An instance's answer, its head already cleaned for the client.
pub(crate) struct Answer {
    pub status: u16,
    head: Vec<u8>,
    /// The value of the taint header, which is not passed on.
    pub taint: Option<String>,
    body: Body,
    reuse: bool,
}

/// What the request is, as far as reading its response needs to know.
pub(crate) struct Exchange<'a> {
    /// The request as it goes to the instance: head and body.
    pub bytes: &'a [u8],
    /// A HEAD request: its response has no body whatever its headers say.
    pub head_only: bool,
    pub idempotent: bool,
}

impl Exchange<'_> {
    /// Sends the request to `addr` and reads the response head, and the body if it is small.
    pub async fn send(&self, pool: &Pool, addr: &str) -> Result<Answer, Failure> {
        let mut fresh_only = false;
        loop {
            let pooled = if fresh_only {
                None
            } else {
                pool.checkout(addr)
            };
            let (mut conn, reused) = match pooled {
                Some(c) => (c, true),
                None => (connect(addr).await?, false),
            };
            if let Err(e) = conn.stream.write_all(self.bytes).await {
                // The app closed the idle connection. Part of the request may have gone out, so
                // only an idempotent one is sent again.
                if reused && self.idempotent {
                    fresh_only = true;
                    continue;
                }
                // The app accepted the connection and then dropped it: it is alive, and may
                // have read part of the request, so this is no refusal.
                return Err(Failure::Other(format!("sending the request: {e}")));
            }
            let head = match self.read_head(&mut conn).await {
                Ok(Some(h)) => h,
                // Closed before a byte of an answer on a reused connection: the app closed it as
                // it went idle. The request may have arrived, so only an idempotent one is sent
                // again, on a new connection.
                Ok(None) if reused && self.idempotent => {
                    fresh_only = true;
                    continue;
                }
                Ok(None) => {
                    return Err(Failure::Other(
                        "the instance closed the connection without answering".into(),
                    ))
                }
                Err(e) => return Err(Failure::Other(e)),
            };
            let small = match &head.framing {
                None => Some(0),
                Some(Framing::Length(n)) => usize::try_from(*n).ok().filter(|n| *n <= BUFFER_LIMIT),
                Some(_) => None,
            };
            let body = match (small, head.framing) {
                (Some(len), _) => {
                    while conn.buf.len() < len {
                        if read_more(&mut conn).await.map_err(Failure::Other)? == 0 {
                            return Err(Failure::Other(
                                "the instance closed the connection inside the body".into(),
                            ));
                        }
                    }
                    let body = conn.buf.split_to(len).freeze();
                    if head.reuse && conn.buf.is_empty() {
                        pool.checkin(addr, conn);
                    }
                    Body::Whole(body)
                }
                (None, Some(framing)) => Body::Rest { conn, framing },
                (None, None) => Body::Whole(Bytes::new()),
            };
            return Ok(Answer {
                status: head.status,
                head: head.bytes,
                taint: head.taint,
                body,
                reuse: head.reuse,
            });
        }
    }

    /// Reads one final response head; `None` when the connection closed or was reset before
    /// any byte.
    async fn read_head(&self, conn: &mut Conn) -> Result<Option<Head>, String> {
        loop {
            match parse_head(&conn.buf, self.head_only)? {
                Parsed::Informational(n) => {
                    let _ = conn.buf.split_to(n);
                    continue;
                }
                Parsed::Final(head, n) => {
                    let _ = conn.buf.split_to(n);
                    return Ok(Some(head));
                }
                Parsed::Partial => {}
            }
            if conn.buf.len() > MAX_RESPONSE_HEAD {
                return Err(format!(
                    "the response head is larger than {MAX_RESPONSE_HEAD} bytes"
                ));
            }
            let before = conn.buf.len();
            match read_more(conn).await {
                Ok(0) | Err(_) if before == 0 => return Ok(None),
                Ok(0) => {
                    return Err(
                        "the instance closed the connection inside the response head".into(),
                    )
                }
                Err(e) => return Err(e),
                Ok(_) => {}
            }
        }
    }
}

async fn read_more(conn: &mut Conn) -> Result<usize, String> {
    if conn.buf.capacity() - conn.buf.len() < 4096 {
        conn.buf.reserve(16 * 1024);
    }
    conn.stream
        .read_buf(&mut conn.buf)
        .await
        .map_err(|e| format!("reading the response: {e}"))
}

enum Parsed {
    Partial,
    /// A 1xx head of this length, to skip: the request sends no `Expect`, so it is a hint.
    Informational(usize),
    Final(Head, usize),
}

fn parse_head(buf: &[u8], head_only: bool) -> Result<Parsed, String> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut r = httparse::Response::new(&mut fields);
    let n = match r.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
        Err(e) => return Err(format!("malformed response head: {e}")),
    };
    let status = r.code.unwrap_or(0);
    if status == 101 {
        return Err("the instance switched protocols unasked".into());
    }
    if (100..200).contains(&status) {
        return Ok(Parsed::Informational(n));
    }
    let mut keep_alive = r.version == Some(1);
    let mut named: Vec<&str> = Vec::new();
    let mut chunked = None;
    let mut length: Option<u64> = None;
    for f in r.headers.iter() {
        if f.name.eq_ignore_ascii_case("connection") {
            for token in std::str::from_utf8(f.value).unwrap_or("").split(',') {
                let token = token.trim();
                if token.eq_ignore_ascii_case("close") {
                    keep_alive = false;
                } else if token.eq_ignore_ascii_case("keep-alive") && r.version == Some(0) {
                    keep_alive = true;
                }
                // Framing headers stay whatever Connection says: the body is framed by them.
                if !token.eq_ignore_ascii_case("content-length")
                    && !token.eq_ignore_ascii_case("transfer-encoding")
                {
                    named.push(token);
                }
            }
        } else if f.name.eq_ignore_ascii_case("transfer-encoding") {
            let last = std::str::from_utf8(f.value)
                .unwrap_or("")
                .rsplit(',')
                .next();
            chunked = Some(last.is_some_and(|c| c.trim().eq_ignore_ascii_case("chunked")));
        } else if f.name.eq_ignore_ascii_case("content-length") {
            // Digits only, as passed on: a client must read the same length as the gateway.
            let v = Some(f.value)
                .filter(|v| !v.is_empty() && v.iter().all(u8::is_ascii_digit))
                .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok())
                .ok_or("the response has an unreadable content-length")?;
            if length.is_some_and(|l| l != v) {
                return Err("the response has conflicting content-lengths".into());
            }
            length = Some(v);
        }
    }
    let no_body = head_only || status == 204 || status == 304;
    let framing = match (no_body, chunked, length) {
        (true, _, _) => None,
        (false, Some(true), _) => Some(Framing::Chunked(Scanner::new())),
        // A transfer coding other than chunked last: the body runs to the close (RFC 9112 §6.3).
        (false, Some(false), _) => Some(Framing::Close),
        (false, None, Some(n)) => Some(Framing::Length(n)),
        (false, None, None) => Some(Framing::Close),
    };
    let close = matches!(framing, Some(Framing::Close));
    let mut out = Vec::with_capacity(n + 32);
    out.extend_from_slice(b"HTTP/1.1 ");
    // httparse took exactly three digits.
    out.extend_from_slice(&crate::metrics::status_digits(status));
    out.push(b' ');
    out.extend_from_slice(r.reason.unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let mut taint = None;
    for f in r.headers.iter() {
        let name = f.name;
        if name.eq_ignore_ascii_case(crate::proxy::TAINT) {
            taint = Some(String::from_utf8_lossy(f.value).into_owned());
            continue;
        }
        // Transfer-Encoding passes through with the body's framing, which is relayed unchanged;
        // with it present, Content-Length means nothing (RFC 9112 §6.3).
        let drop = crate::proxy::hop_by_hop(name.as_bytes())
            || named.iter().any(|n| name.eq_ignore_ascii_case(n))
            || (name.eq_ignore_ascii_case("content-length") && chunked.is_some());
        if drop {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(f.value);
        out.extend_from_slice(b"\r\n");
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    Ok(Parsed::Final(
        Head {
            status,
            bytes: out,
            taint,
            reuse: keep_alive && !close,
            framing,
        },
        n,
    ))
}

impl Answer {
    /// Writes the answer to the client, relaying a body still to come, and hands the instance's
    /// connection back to the pool when it can be reused. Returns whether the client's
    /// connection can carry another request.
    /// `close` adds `connection: close`, for a client that asked for it.
    pub async fn relay<W: AsyncWrite + Unpin>(
        self,
        pool: &Pool,
        addr: &str,
        close: bool,
        client: &mut W,
        out: &mut Vec<u8>,
    ) -> std::io::Result<bool> {
        out.clear();
        out.extend_from_slice(&self.head);
        let closing = matches!(
            &self.body,
            Body::Rest {
                framing: Framing::Close,
                ..
            }
        );
        if close && !closing {
            // Before the empty line that ends the head.
            out.truncate(out.len() - 2);
            out.extend_from_slice(b"connection: close\r\n\r\n");
        }
        let (mut conn, mut framing) = match self.body {
            Body::Whole(b) if b.len() <= COPY_LIMIT => {
                out.extend_from_slice(&b);
                client.write_all(out).await?;
                return Ok(true);
            }
            Body::Whole(b) => {
                client.write_all(out).await?;
                client.write_all(&b).await?;
                return Ok(true);
            }
            Body::Rest { conn, framing } => (conn, framing),
        };
        client.write_all(out).await?;
        let broken =
            || std::io::Error::other("the instance's response body ended early or was malformed");
        loop {
            let take = match &mut framing {
                Framing::Length(left) => usize::try_from(*left)
                    .unwrap_or(usize::MAX)
                    .min(conn.buf.len()),
                Framing::Chunked(s) => s.advance(&conn.buf).map_err(|_| broken())?,
                Framing::Close => conn.buf.len(),
            };
            if take > 0 {
                let chunk = conn.buf.split_to(take);
                client.write_all(&chunk).await?;
                if let Framing::Length(left) = &mut framing {
                    *left -= take as u64;
                }
            }
            let done = match &framing {
                Framing::Length(left) => *left == 0,
                Framing::Chunked(s) => s.done(),
                Framing::Close => false,
            };
            if done {
                if self.reuse && conn.buf.is_empty() {
                    pool.checkin(addr, conn);
                }
                return Ok(true);
            }
            match read_more(&mut conn).await {
                Ok(0) if matches!(framing, Framing::Close) => return Ok(false),
                Ok(0) | Err(_) => return Err(broken()),
                Ok(_) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &str, head_only: bool) -> (Head, usize) {
        match parse_head(raw.as_bytes(), head_only).expect("parses") {
            Parsed::Final(h, n) => (h, n),
            _ => panic!("not a final head"),
        }
    }

    #[test]
    fn cleans_the_head_and_finds_the_framing() {
        let raw = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: x-hop\r\nx-hop: 1\r\nkeep-alive: timeout=5\r\nx-warden-taint: SECRET\r\nx-app: y\r\n\r\nhello";
        let (h, n) = head(raw, false);
        assert_eq!(n, raw.len() - 5);
        let text = String::from_utf8(h.bytes).unwrap();
        assert_eq!(
            text,
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nx-app: y\r\n\r\n"
        );
        assert_eq!(h.taint.as_deref(), Some("SECRET"));
        assert!(matches!(h.framing, Some(Framing::Length(5))));
        assert!(h.reuse);

        let (h, _) = head(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 9\r\n\r\n",
            false,
        );
        assert_eq!(
            String::from_utf8(h.bytes).unwrap(),
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        assert!(matches!(h.framing, Some(Framing::Chunked(_))));

        let (h, _) = head("HTTP/1.0 200 OK\r\n\r\n", false);
        assert!(String::from_utf8(h.bytes)
            .unwrap()
            .ends_with("connection: close\r\n\r\n"));
        assert!(matches!(h.framing, Some(Framing::Close)));
        assert!(!h.reuse);

        let (h, _) = head(
            "HTTP/1.1 200 OK\r\ncontent-length: 9\r\nconnection: close\r\n\r\n",
            true,
        );
        assert!(h.framing.is_none());
        assert!(!h.reuse);
        let (h, _) = head(
            "HTTP/1.1 304 Not Modified\r\ncontent-length: 9\r\n\r\n",
            false,
        );
        assert!(h.framing.is_none());

        // Connection cannot take away the header that frames the body.
        let (h, _) = head(
            "HTTP/1.1 200 OK\r\nConnection: content-length, x-a\r\nContent-Length: 5\r\nx-a: 1\r\n\r\n",
            false,
        );
        assert_eq!(
            String::from_utf8(h.bytes).unwrap(),
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
        );
    }

    #[test]
    fn refuses_what_it_cannot_frame() {
        for bad in [
            "HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: x\r\n\r\n",
            "HTTP/1.1 101 Switching Protocols\r\n\r\n",
            "HTTP/1.1 2000 OK\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: +5\r\n\r\n",
        ] {
            assert!(parse_head(bad.as_bytes(), false).is_err(), "{bad}");
        }
        assert!(matches!(
            parse_head(
                b"HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\nHTTP/1.1 200",
                false
            ),
            Ok(Parsed::Informational(_))
        ));
    }
}
