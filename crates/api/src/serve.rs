//! The API's listener, with the gateway's kind of limits: builds and `process` instances can
//! reach the API's port, so nothing sent to it may hold warden's descriptors for long.
//!
//! - At most [`Limits::max_connections`] connections at once; one more is answered 503 at once
//!   and closed, without a task of its own.
//! - A request head must arrive within [`Limits::header_timeout`], counted from when the
//!   connection waits for one (so an idle keep-alive connection is closed after it too).
//! - A client that stops sending its request body, or stops reading the answer, for
//!   [`Limits::idle_timeout`] is cut off. Time the API itself takes (a build that prints
//!   nothing) does not count.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use http::Request;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::time::Sleep;

use crate::Api;

/// The limits of the API's listener. Their defaults live in the `warden` binary's settings.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Open connections beyond which new ones get 503.
    pub max_connections: usize,
    /// Time a client gets to send a request head.
    pub header_timeout: Duration,
    /// Time a client may leave its request body unsent or the answer unread.
    pub idle_timeout: Duration,
}

/// Serves the API on `listener` within `limits` until `shutdown` turns true; then lets the
/// open connections finish their requests.
pub async fn serve(
    listener: TcpListener,
    api: Api,
    limits: Limits,
    mut shutdown: watch::Receiver<bool>,
) -> io::Result<()> {
    let flush = tokio::spawn(api.refusals_task(shutdown.clone()));
    let (refusals, audit) = (api.refusals.clone(), api.audit.clone());
    let mut api = api;
    api.stopping = Some(shutdown.clone());
    let router = api.router();
    let max = limits.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let slots = Arc::new(Semaphore::new(max));
    let refusal = over_limit();
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    warden_core::log_limited!(warn, error = %e, "the API cannot accept a connection; retrying");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            () = stopped(&mut shutdown) => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refuse(&stream, &refusal);
            continue;
        };
        let router = router.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            connection(stream, peer, router, limits, shutdown).await;
            tracing::trace!(%peer, "api connection closed");
            drop(slot);
        });
    }
    drop(listener);
    // Every connection holds a slot until it ends.
    let _ = slots
        .acquire_many(u32::try_from(max).unwrap_or(u32::MAX))
        .await;
    // Once more after the last request: refusals of requests still in flight at the stop.
    let _ = flush.await;
    refusals.flush(&*audit);
    Ok(())
}

/// Returns once `shutdown` turns true (or its sender is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|s| *s).await;
}

/// The answer to a connection over the limit.
fn over_limit() -> Vec<u8> {
    let body = r#"{"error":"the API has too many open connections; retry in a second"}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Answers a connection over the limit and closes it, without waiting on it. What the client
/// sent already is read first, so that closing sends a FIN after the answer, not a reset.
fn refuse(stream: &TcpStream, answer: &[u8]) {
    let mut sink = [0u8; 4096];
    // Bounded: a client that keeps sending must not hold the accept loop.
    for _ in 0..16 {
        if !matches!(stream.try_read(&mut sink), Ok(n) if n > 0) {
            break;
        }
    }
    let _ = stream.try_write(answer);
}

async fn connection(
    stream: TcpStream,
    peer: std::net::SocketAddr,
    router: axum::Router,
    limits: Limits,
    mut shutdown: watch::Receiver<bool>,
) {
    let _ = stream.set_nodelay(true);
    // A client that vanishes (a laptop asleep, a NAT that forgot it) sends no FIN: without
    // probes an upgraded connection, and the one-off command on it, would stay for ever.
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(std::time::Duration::from_secs(60))
        .with_interval(std::time::Duration::from_secs(10))
        .with_retries(6);
    let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive);
    let idle = limits.idle_timeout;
    let svc = TowerToHyperService::new(router);
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let mut req = req.map(|b| axum::body::Body::new(Stalling::new(b, idle)));
        // The client's address, for the audit records of refused tokens.
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(peer));
        hyper::service::Service::call(&svc, req)
    });
    let io = TokioIo::new(WriteStall::new(stream, idle));
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(io, svc)
        // `POST /v1/apps/{name}/run` carries its command's stdio over the upgraded connection.
        .with_upgrades();
    tokio::pin!(conn);
    let ended = tokio::select! {
        r = conn.as_mut() => Some(r),
        () = stopped(&mut shutdown) => None,
    };
    let ended = match ended {
        Some(r) => r,
        None => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = ended {
        tracing::debug!(error = %e, "api connection ended with an error");
    }
}

// === Stalling ===

/// A request body that fails when the client sends nothing of it for the idle timeout.
struct Stalling {
    inner: Incoming,
    idle: Duration,
    deadline: Option<Pin<Box<Sleep>>>,
}

impl Stalling {
    fn new(inner: Incoming, idle: Duration) -> Self {
        Self {
            inner,
            idle,
            deadline: None,
        }
    }
}

impl HttpBody for Stalling {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(r) => {
                this.deadline = None;
                Poll::Ready(r.map(|f| f.map_err(io::Error::other)))
            }
            Poll::Pending => {
                let idle = this.idle;
                let deadline = this
                    .deadline
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
                match deadline.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the client sent nothing of the request body for {idle:?}"),
                    )))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

// === WriteStall ===

/// A connection whose writes fail when the client reads nothing for the idle timeout.
struct WriteStall {
    inner: TcpStream,
    idle: Duration,
    deadline: Option<Pin<Box<Sleep>>>,
}

impl WriteStall {
    fn new(inner: TcpStream, idle: Duration) -> Self {
        Self {
            inner,
            idle,
            deadline: None,
        }
    }

    /// After a write that made no progress: an error once the client has read nothing for the
    /// idle timeout.
    fn stalled<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let idle = self.idle;
        let deadline = self
            .deadline
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing of the answer for {idle:?}"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for WriteStall {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for WriteStall {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Pending => self.stalled(cx),
            ready => {
                self.deadline = None;
                ready
            }
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write_vectored(cx, bufs) {
            Poll::Pending => self.stalled(cx),
            ready => {
                self.deadline = None;
                ready
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;

    #[tokio::test]
    async fn a_client_that_reads_nothing_is_cut_off_after_the_idle_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let client = TcpStream::connect(addr).await.expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        let mut server = WriteStall::new(server, Duration::from_millis(200));
        let chunk = vec![0u8; 64 * 1024];
        // The client never reads: once the kernel's buffers are full, writes stall, and the
        // stall ends in an error rather than a connection held for ever.
        let cut = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                if let Err(e) = server.write_all(&chunk).await {
                    return e;
                }
            }
        })
        .await
        .expect("a stalled write is cut off");
        assert_eq!(cut.kind(), io::ErrorKind::TimedOut, "{cut}");
        drop(client);
    }
}
