//! Keep-alive HTTP/1.1 connections to instances, driven on the request's own task.
//!
//! hyper's pooled client runs every connection as a task of its own, so each forwarded request
//! crosses tasks (and often threads) several times: request in, response head out, body frames
//! through a channel. The gateway benchmark showed that hop costing about three times what it
//! costs nginx or haproxy. Here the request's task polls the connection itself while it waits
//! for the response, and reads a response of known, bounded length to the end before handing
//! the connection back to the pool. Responses of unknown or large length stream as before: their
//! connection gets its own task and is not reused.

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::idle::IDLE_TIMEOUT;
use crate::proxy::Failure;
use crate::respond::Body;

type Conn = Pin<Box<http1::Connection<TokioIo<TcpStream>, Full<Bytes>>>>;

struct Pooled {
    sender: http1::SendRequest<Full<Bytes>>,
    conn: Conn,
    idle_since: Instant,
}

impl crate::idle::Idle for Pooled {
    fn reusable(&self) -> bool {
        !self.sender.is_closed() && !self.stale()
    }

    fn stale(&self) -> bool {
        self.idle_since.elapsed() >= IDLE_TIMEOUT
    }

    fn touch(&mut self) {
        self.idle_since = Instant::now();
    }
}

/// Responses up to this size are read whole on the request's task; larger ones stream.
const BUFFER_LIMIT: u64 = 256 * 1024;
/// Idle connections by instance address.
#[derive(Default)]
pub(crate) struct Pool {
    idle: crate::idle::Pool<Pooled>,
}

/// Runs `f` while also driving `conn`. A connection that ends is dropped at once: that fails
/// whatever `f` still waits for on it (a queued request comes back unsent) instead of leaving
/// `f` waiting on a channel nobody reads.
async fn drive<F: Future>(conn: &mut Option<Conn>, f: F) -> F::Output {
    tokio::pin!(f);
    loop {
        let Some(c) = conn.as_mut() else {
            return f.await;
        };
        tokio::select! {
            biased;
            out = &mut f => return out,
            _ = c.as_mut() => *conn = None,
        }
    }
}

impl Pool {
    /// Forgets every idle connection to `addr` (its instance is gone).
    pub fn forget(&self, addr: &str) {
        self.idle.forget(addr);
    }

    async fn connect(addr: &str) -> Result<Pooled, Failure> {
        // Plain `host:port`, or a sandbox's connection-handing socket.
        let tcp = warden_agent::connect(addr)
            .await
            .map_err(|e| Failure::connecting(&e))?;
        let _ = tcp.set_nodelay(true);
        let (sender, conn) = http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| Failure::Refused(e.to_string()))?;
        Ok(Pooled {
            sender,
            conn: Box::pin(conn),
            idle_since: Instant::now(),
        })
    }

    /// Sends `req` to the instance at `addr`. A pooled connection that turns out to be closed
    /// hands the request back unsent, and the next one (or a new one) gets it.
    pub async fn send(
        &self,
        req: Request<Full<Bytes>>,
        addr: &str,
    ) -> Result<Response<Body>, Failure> {
        let mut req = req;
        loop {
            let (p, fresh) = match self.idle.checkout(addr) {
                Some(p) => (p, false),
                None => (Self::connect(addr).await?, true),
            };
            let Pooled {
                mut sender,
                conn,
                idle_since,
            } = p;
            let mut conn = Some(conn);
            let sent = sender.try_send_request(req);
            let resp = match drive(&mut conn, sent).await {
                Ok(resp) => resp,
                Err(mut e) => match e.take_message() {
                    Some(unsent) if !fresh => {
                        req = unsent;
                        continue;
                    }
                    Some(_) => return Err(Failure::Refused(e.into_error().to_string())),
                    None => return Err(Failure::Other(e.into_error().to_string())),
                },
            };
            let (parts, body) = resp.into_parts();
            let small = hyper::body::Body::size_hint(&body)
                .exact()
                .is_some_and(|n| n <= BUFFER_LIMIT);
            if !small {
                // Stream it: the connection gets its own task and is not reused.
                if let Some(conn) = conn {
                    tokio::spawn(conn);
                }
                return Ok(Response::from_parts(parts, body.boxed()));
            }
            let body = drive(&mut conn, body.collect())
                .await
                .map_err(|e| Failure::Other(format!("reading the response body: {e}")))?
                .to_bytes();
            if let Some(conn) = conn.filter(|_| !sender.is_closed()) {
                self.idle.checkin(
                    addr,
                    Pooled {
                        sender,
                        conn,
                        idle_since,
                    },
                );
            }
            return Ok(Response::from_parts(parts, crate::respond::full(body)));
        }
    }
}
