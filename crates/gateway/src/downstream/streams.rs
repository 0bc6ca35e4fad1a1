//! A connection's HTTP/2 streams, run on the connection's own task.
//!
//! hyper hands each HTTP/2 stream to an executor. With tokio's, every stream became a task of
//! its own: spawned (an allocation, a registration, a copy of the stream's future), woken by
//! the upstream, then waking the connection's task to write its response. Here the executor
//! only queues the stream, and the connection's task polls it beside the connection, as the
//! lane does with its requests: no spawn, and no crossing between tasks on the way out.
//!
//! hyper queues streams only from inside the connection's poll (and upgrades from inside a
//! stream's), so the queue is drained right after each of them, without a wake-up.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;

type Queued = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The executor hyper is given: a queue the connection's task empties.
#[derive(Clone, Default)]
pub(super) struct Streams(Arc<Mutex<Vec<Queued>>>);

impl<F> hyper::rt::Executor<F> for Streams
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, fut: F) {
        // A stream that panics ends alone, as its own task did, not with its connection.
        let fut = AssertUnwindSafe(fut).catch_unwind().map(|r| {
            if r.is_err() {
                tracing::error!("an HTTP/2 stream panicked; its connection goes on");
            }
        });
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Box::pin(fut));
    }
}

impl Streams {
    fn take(&self) -> Vec<Queued> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn is_empty(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }
}

/// Drives `conn` and the streams it queues on `streams` until the connection is over and every
/// stream has finished (a stream whose connection is gone ends at its next poll: hyper sees
/// the reset).
pub(super) fn drive<C: Future>(conn: C, streams: Streams) -> Drive<C> {
    Drive {
        conn: Some(Box::pin(conn)),
        streams,
        running: FuturesUnordered::new(),
        done: None,
    }
}

/// The future [`drive`] returns.
pub(super) struct Drive<C: Future> {
    /// Dropped as soon as it is over, as hyper's connection was before: its streams learn
    /// then that it is gone.
    conn: Option<Pin<Box<C>>>,
    streams: Streams,
    running: FuturesUnordered<Queued>,
    done: Option<C::Output>,
}

impl<C: Future> Future for Drive<C>
where
    C::Output: Unpin,
{
    type Output = C::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<C::Output> {
        let me = self.get_mut();
        if let Some(conn) = &mut me.conn {
            if let Poll::Ready(out) = conn.as_mut().poll(cx) {
                me.done = Some(out);
                me.conn = None;
            }
        }
        loop {
            me.running.extend(me.streams.take());
            while let Poll::Ready(Some(())) = me.running.poll_next_unpin(cx) {}
            // A stream polled just now may have queued an upgrade, which must be polled too.
            if me.streams.is_empty() {
                break;
            }
        }
        match me.done.take() {
            Some(out) if me.running.is_empty() => Poll::Ready(out),
            done => {
                me.done = done;
                Poll::Pending
            }
        }
    }
}
