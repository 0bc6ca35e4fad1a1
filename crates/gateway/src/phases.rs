//! Per-connection phase analysis (seed 004 §6.2, Figure 5): how long a connection spends in its
//! handshake, reading requests (request, no service), being served (service), and idle between
//! requests on keep-alive.
//!
//! A small state machine per connection, driven by the bytes the socket yields and by the start
//! and end of each request's handling. With HTTP/2 several requests overlap; the connection
//! counts as in service while any of them is.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::metrics::Metrics;

enum State {
    /// Waiting for the next request since then.
    Idle(Instant),
    /// Reading a request whose first byte arrived then.
    Request(Instant),
    /// Serving requests since then.
    Service(Instant),
}

/// The phase clock of one connection.
pub(crate) struct Clock {
    state: Mutex<(State, usize)>,
    metrics: Arc<Metrics>,
}

impl Clock {
    pub fn new(metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new((State::Idle(Instant::now()), 0)),
            metrics,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (State, usize)> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn bytes_arrived(&self) {
        let mut s = self.lock();
        if let State::Idle(since) = s.0 {
            let now = Instant::now();
            self.metrics.conn_phase.idle.observe(secs(since, now));
            s.0 = State::Request(now);
        }
    }

    /// A request's handling begins.
    pub fn service_start(&self) {
        let mut s = self.lock();
        let now = Instant::now();
        match s.0 {
            State::Request(since) => self.metrics.conn_phase.request.observe(secs(since, now)),
            State::Idle(_) => {}
            State::Service(_) => {
                s.1 += 1;
                return;
            }
        }
        s.0 = State::Service(now);
        s.1 = 1;
    }

    /// A request's handling ended.
    pub fn service_end(&self) {
        let mut s = self.lock();
        if let State::Service(since) = s.0 {
            s.1 = s.1.saturating_sub(1);
            if s.1 == 0 {
                let now = Instant::now();
                self.metrics.conn_phase.service.observe(secs(since, now));
                s.0 = State::Idle(now);
            }
        }
    }

    /// Whether a request has begun arriving and is not being served yet: only then does a
    /// timed-out connection owe the client a 408.
    pub fn reading(&self) -> bool {
        matches!(self.lock().0, State::Request(_))
    }

    /// The connection closed: the keep-alive wait before the close counts as idle.
    pub fn closed(&self) {
        let s = self.lock();
        if let State::Idle(since) = s.0 {
            self.metrics
                .conn_phase
                .idle
                .observe(secs(since, Instant::now()));
        }
    }
}

fn secs(from: Instant, to: Instant) -> f64 {
    to.saturating_duration_since(from).as_secs_f64()
}

/// A stream that tells its clock when request bytes arrive.
pub(crate) struct Timed<S> {
    inner: S,
    clock: Arc<Clock>,
}

impl<S> Timed<S> {
    pub fn new(inner: S, clock: Arc<Clock>) -> Self {
        Self { inner, clock }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Timed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.clock.bytes_arrived();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Timed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
