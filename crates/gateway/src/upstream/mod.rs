//! The upstream side: keep-alive HTTP/1.1 connections to instances, and one exchange on them,
//! for every downstream protocol. The request's bytes go out (already cleaned by
//! [`crate::hygiene`]); the response head is parsed and cleaned ([`head`]); a body of known,
//! small length is read whole on the request's own task, so its connection goes back to the
//! pool at once; a larger or open-ended one is relayed as it arrives ([`relay`]), and its
//! connection goes back after it.
//!
//! The request's task drives its connection itself: there is no connection task and no
//! channel to cross per request, which is what made hyper's client cost about three times what
//! nginx and haproxy spend per forwarded request (docs/BENCHMARKS.md).

mod chunked;
mod head;
mod pool;
mod relay;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use std::io::IoSlice;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warden_core::{InstanceRecord, InstanceStream, Instances};

use warden_core::identity::Signer;

use crate::error::{Fault, GatewayError, Stage};
use crate::hygiene::Signed;
use head::{Framing, Parsed, ResponseHead};
use pool::IDLE_TIMEOUT;

/// Responses of known length up to this size are read whole before the client gets any byte;
/// larger ones, and those of unknown length, are relayed as they arrive.
const BUFFER_LIMIT: usize = 256 * 1024;
/// A connection's read buffer larger than this is let go when it goes back to the pool.
pub(crate) const KEEP_BUFFER: usize = 64 * 1024;
/// Largest response head accepted from an instance.
const MAX_RESPONSE_HEAD: usize = 64 * 1024;

/// A connection to an instance, with the bytes read from it and not yet used.
pub(crate) struct Conn {
    stream: InstanceStream,
    buf: BytesMut,
    idle_since: Instant,
    /// Taken from the pool: it carried a request before this one.
    reused: bool,
}

impl pool::Idle for Conn {
    /// Not too old, and the app has neither closed it nor sent anything unasked. Costs no
    /// system call when the socket has not become readable since it was last drained.
    fn reusable(&self) -> bool {
        if self.stale() || !self.buf.is_empty() {
            return false;
        }
        match &self.stream {
            InstanceStream::Tcp(s) => {
                let mut probe = [0u8; 1];
                matches!(s.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            }
            InstanceStream::Remote(s) => s.reusable(),
        }
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

impl Conn {
    async fn read_more(&mut self, step: Stage) -> Result<usize, GatewayError> {
        if self.buf.capacity() - self.buf.len() < 4096 {
            self.buf.reserve(16 * 1024);
        }
        let reused = self.reused;
        self.stream
            .read_buf(&mut self.buf)
            .await
            .map_err(|e| GatewayError::Broken(Fault::io(step, &e, reused)))
    }
}

/// Writes `bytes` with `signature` in place of the placeholder at `at`, in one system call
/// when the socket takes it all, as a single `write_all` would.
///
/// The first write goes straight to a local instance's socket, without asking tokio whether
/// it is writable. A connection the agent hands over (a start's first, which the sandbox's
/// init made and found connected) is new to tokio, which knows nothing of its readiness until
/// a turn of its I/O driver: its first write would wait for that turn (about 25 µs on the
/// path of every slot start's request) to learn what the kernel says at once.
async fn write_signed(
    stream: &mut InstanceStream,
    bytes: &[u8],
    at: usize,
    signature: &[u8],
) -> std::io::Result<()> {
    let (before, rest) = bytes.split_at(at);
    let after = &rest[signature.len()..];
    let mut parts = [before, signature, after];
    let mut first = 0;
    let mut straight = true;
    while first < parts.len() {
        let slices = [
            IoSlice::new(parts[first]),
            IoSlice::new(parts.get(first + 1).copied().unwrap_or(&[])),
            IoSlice::new(parts.get(first + 2).copied().unwrap_or(&[])),
        ];
        let tried = match stream {
            InstanceStream::Tcp(s) if std::mem::take(&mut straight) => {
                // Non-blocking, as tokio keeps its sockets: a full buffer says WouldBlock.
                match socket2::SockRef::from(&*s).send_vectored(&slices) {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
                    r => Some(r?),
                }
            }
            _ => None,
        };
        let mut n = match tried {
            Some(n) => n,
            None => stream.write_vectored(&slices).await?,
        };
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while first < parts.len() && n >= parts[first].len() {
            n -= parts[first].len();
            first += 1;
        }
        if first < parts.len() {
            parts[first] = &parts[first][n..];
        }
    }
    Ok(())
}

/// Idle connections to instances, by instance id, and the way to open new ones.
pub(crate) struct Upstream {
    idle: pool::Pool<Conn>,
    instances: Arc<dyn Instances>,
}

/// The body of an answer.
enum AnswerBody {
    /// The whole body, read.
    Whole(Bytes),
    /// The body still to come on `conn` (whose buffer may already hold some of it).
    Rest { conn: Conn, framing: Framing },
}

/// An instance's answer, its head already cleaned for the client.
pub(crate) struct Answer {
    pub status: u16,
    head: Vec<u8>,
    /// The value of the taint header, which is not passed on.
    pub taint: Option<String>,
    body: AnswerBody,
    /// The connection may carry another request once the body is read.
    reuse: bool,
    /// Where the connection goes back to: the instance's id.
    instance: String,
}

/// A request as the upstream side needs it.
pub(crate) struct Exchange<'a> {
    /// The request as it goes to the instance: head and body, with room for the signature.
    pub bytes: &'a [u8],
    /// Where the signature goes in `bytes`, and what it vouches for.
    pub signed: Signed<'a>,
    /// A HEAD request: its response has no body whatever its headers say.
    pub head_only: bool,
    /// May be sent again after it may have reached an app (RFC 9110 §9.2.2).
    pub idempotent: bool,
    /// Its connection may be reused; not for an instance that serves one request only.
    pub pooled: bool,
    /// Whom it is for, as the audit records name them.
    pub user: &'a str,
    /// Its method and target as the client sent them, for the request lines (`requests.rs`
    /// cleans them and drops the query).
    pub method: &'a [u8],
    pub target: &'a [u8],
}

// === impl Answer ===

impl Answer {
    /// The body's length as far as it is known now: read whole, or declared; 0 for a body
    /// whose end only its framing will tell (the audit counts what it knows, never waits).
    pub(crate) fn body_len(&self) -> u64 {
        match &self.body {
            AnswerBody::Whole(b) => b.len() as u64,
            AnswerBody::Rest {
                framing: Framing::Length(n),
                ..
            } => *n,
            AnswerBody::Rest { .. } => 0,
        }
    }
}

// === impl Upstream ===

impl Upstream {
    pub(crate) fn new(instances: Arc<dyn Instances>) -> Self {
        Self {
            idle: pool::Pool::default(),
            instances,
        }
    }

    /// Forgets every idle connection to `instance` (it is gone).
    pub(crate) fn forget(&self, instance: &str) {
        self.idle.forget(instance);
    }

    /// `instance` entered (`true`) or left routing: leaving, its idle connections close and
    /// those still busy are not pooled again when they finish.
    pub(crate) fn routing(&self, instance: &str, routed: bool) {
        self.idle.routing(instance, routed);
    }

    async fn connect(&self, instance: &InstanceRecord) -> Result<Conn, GatewayError> {
        let stream = self
            .instances
            .connect(instance)
            .await
            .map_err(|e| connecting(&e))?;
        if let InstanceStream::Tcp(s) = &stream {
            let _ = s.set_nodelay(true);
        }
        Ok(Conn {
            stream,
            buf: BytesMut::with_capacity(8 * 1024),
            idle_since: Instant::now(),
            reused: false,
        })
    }

    /// Sends the request to `instance` and reads the response head, and the body if it is
    /// small. A pooled connection that turns out to be closed gets an idempotent request again
    /// on a new one. `sent` turns true when the request's first byte may have left: until
    /// then, the request may go to any other instance whatever it is.
    pub(crate) async fn send(
        &self,
        instance: &InstanceRecord,
        signer: &Signer,
        x: &Exchange<'_>,
        sent: &AtomicBool,
    ) -> Result<Answer, GatewayError> {
        let signature = x.signed.for_instance(signer);
        let mut fresh_only = !x.pooled;
        loop {
            let pooled = if fresh_only {
                None
            } else {
                self.idle.checkout(&instance.id)
            };
            let (mut conn, reused) = match pooled {
                Some(mut c) => {
                    c.reused = true;
                    (c, true)
                }
                None => (self.connect(instance).await?, false),
            };
            sent.store(true, Ordering::Relaxed);
            if let Err(e) = write_signed(&mut conn.stream, x.bytes, x.signed.at, &signature).await {
                // The app closed the idle connection. Part of the request may have gone out, so
                // only an idempotent one is sent again.
                if reused && x.idempotent {
                    fresh_only = true;
                    continue;
                }
                // The app accepted the connection and then dropped it: it is alive, and may
                // have read part of the request, so this is no refusal.
                return Err(GatewayError::Broken(Fault::io(Stage::Send, &e, reused)));
            }
            let head = match read_head(&mut conn, x.head_only).await? {
                Some(h) => h,
                // Closed before a byte of an answer on a reused connection: the app closed it as
                // it went idle. The request may have arrived, so only an idempotent one is sent
                // again, on a new connection.
                None if reused && x.idempotent => {
                    fresh_only = true;
                    continue;
                }
                None => {
                    return Err(GatewayError::Broken(Fault {
                        reused,
                        ..Fault::new(
                            Stage::Head,
                            "the instance closed the connection without answering",
                        )
                    }))
                }
            };
            return self.answer(instance, conn, head, x.pooled).await;
        }
    }

    /// The answer to a request whose head is read: its body read whole when it is small (and
    /// the connection pooled again), else left on the connection.
    async fn answer(
        &self,
        instance: &InstanceRecord,
        mut conn: Conn,
        head: ResponseHead,
        pooled: bool,
    ) -> Result<Answer, GatewayError> {
        let reuse = head.reuse && pooled;
        let small = match &head.framing {
            None => Some(0),
            Some(Framing::Length(n)) => usize::try_from(*n).ok().filter(|n| *n <= BUFFER_LIMIT),
            Some(_) => None,
        };
        let body = match (small, head.framing) {
            (Some(len), _) => {
                while conn.buf.len() < len {
                    if conn.read_more(Stage::Body).await? == 0 {
                        return Err(GatewayError::Broken(Fault::new(
                            Stage::Body,
                            "the instance closed the connection inside the body",
                        )));
                    }
                }
                let body = conn.buf.split_to(len).freeze();
                if reuse && conn.buf.is_empty() {
                    self.idle.checkin(&instance.id, conn);
                }
                AnswerBody::Whole(body)
            }
            (None, Some(framing)) => AnswerBody::Rest { conn, framing },
            (None, None) => AnswerBody::Whole(Bytes::new()),
        };
        Ok(Answer {
            status: head.status,
            head: head.bytes,
            taint: head.taint,
            body,
            reuse,
            instance: instance.id.clone(),
        })
    }
}

/// A failed connect: refused when the instance (or its sandbox's socket) is not there.
fn connecting(e: &std::io::Error) -> GatewayError {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused | K::NotFound | K::ConnectionReset | K::ConnectionAborted => {
            GatewayError::Refused(Fault::io(Stage::Connect, e, false))
        }
        _ => GatewayError::Unsent(Fault::io(Stage::Connect, e, false)),
    }
}

/// Reads one final response head; `None` when the connection closed or was reset before any
/// byte.
async fn read_head(conn: &mut Conn, head_only: bool) -> Result<Option<ResponseHead>, GatewayError> {
    loop {
        match head::parse(&conn.buf, head_only)? {
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
            return Err(GatewayError::Broken(Fault::new(
                Stage::Head,
                format!("the response head is larger than {MAX_RESPONSE_HEAD} bytes"),
            )));
        }
        let before = conn.buf.len();
        match conn.read_more(Stage::Head).await {
            Ok(0) | Err(_) if before == 0 => return Ok(None),
            Ok(0) => {
                return Err(GatewayError::Broken(Fault::new(
                    Stage::Head,
                    "the instance closed the connection inside the response head",
                )))
            }
            Err(e) => return Err(e),
            Ok(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn a_signed_request_arrives_whole_with_its_signature_in_place_however_it_is_split() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Larger than any socket buffer, so the writes come back partial.
        let mut bytes = vec![b'a'; 100];
        bytes.extend_from_slice(&[b'0'; 8]);
        bytes.extend((0..4_000_000u32).map(|i| (i % 251) as u8));
        let want = {
            let mut w = bytes.clone();
            w[100..108].copy_from_slice(b"SIGNATUR");
            w
        };
        let reader = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.unwrap();
            got
        });
        let mut stream =
            warden_core::InstanceStream::Tcp(tokio::net::TcpStream::connect(addr).await.unwrap());
        super::write_signed(&mut stream, &bytes, 100, b"SIGNATUR")
            .await
            .unwrap();
        drop(stream);
        assert!(reader.await.unwrap() == want);
    }

    /// A connection handed over as a plain socket (a start's first) takes its request in the
    /// first poll: nothing waits for tokio's I/O driver to say it is writable.
    #[tokio::test]
    async fn a_handed_over_connection_takes_its_request_at_once() {
        use std::io::Read;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let conn = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut app, _) = listener.accept().unwrap();
        conn.set_nonblocking(true).unwrap();
        let mut stream =
            warden_core::InstanceStream::Tcp(tokio::net::TcpStream::from_std(conn).unwrap());
        let bytes = b"GET / HTTP/1.1\r\nx-warden-signature: 00000000\r\n\r\n";
        let at = bytes.len() - 12;
        let mut write = std::pin::pin!(super::write_signed(&mut stream, bytes, at, b"SIGNATUR"));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(matches!(
            std::future::Future::poll(write.as_mut(), &mut cx),
            std::task::Poll::Ready(Ok(()))
        ));
        let mut got = vec![0u8; bytes.len()];
        app.read_exact(&mut got).unwrap();
        assert_eq!(
            got,
            b"GET / HTTP/1.1\r\nx-warden-signature: SIGNATUR\r\n\r\n"
        );
    }
}
