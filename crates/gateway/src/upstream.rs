//! Keep-alive HTTP/1.1 connections to instances, driven on the request's own task.
//!
//! hyper's pooled client runs every connection as a task of its own, so each forwarded request
//! crosses tasks (and often threads) several times: request in, response head out, body frames
//! through a channel. The gateway benchmark showed that hop costing about three times what it
//! costs nginx or haproxy. Here the request's task polls the connection itself while it waits
//! for the response, and reads a response of known, bounded length to the end before handing
//! the connection back to the pool. Responses of unknown or large length stream as before: their
//! connection gets its own task and is not reused.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::proxy::Failure;
use crate::respond::Body;

type Conn = Pin<Box<http1::Connection<TokioIo<TcpStream>, Full<Bytes>>>>;

struct Pooled {
    sender: http1::SendRequest<Full<Bytes>>,
    conn: Conn,
    idle_since: Instant,
}

impl Pooled {
    fn reusable(&self) -> bool {
        !self.sender.is_closed() && self.idle_since.elapsed() < IDLE_TIMEOUT
    }
}

/// Responses up to this size are read whole on the request's task; larger ones stream.
const BUFFER_LIMIT: u64 = 256 * 1024;
/// Idle connections older than this are not reused (the app may have closed them).
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_IDLE_PER_ADDR: usize = 1024;

/// How often check-ins sweep out connections that can no longer be reused.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Idle {
    by_addr: HashMap<String, Vec<Pooled>>,
    last_sweep: Option<Instant>,
}

/// Idle connections by instance address.
#[derive(Default)]
pub(crate) struct Pool {
    idle: Mutex<Idle>,
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
    fn lock(&self) -> std::sync::MutexGuard<'_, Idle> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn checkout(&self, addr: &str) -> Option<Pooled> {
        let mut idle = self.lock();
        let list = idle.by_addr.get_mut(addr)?;
        while let Some(p) = list.pop() {
            if p.reusable() {
                return Some(p);
            }
        }
        idle.by_addr.remove(addr);
        None
    }

    fn checkin(&self, addr: &str, mut p: Pooled) {
        if p.sender.is_closed() {
            return;
        }
        p.idle_since = Instant::now();
        let mut idle = self.lock();
        // Connections to instances that are gone would otherwise keep their sockets open until
        // someone asked for that address again, which for a stopped instance is never.
        if idle.last_sweep.is_none_or(|t| t.elapsed() >= SWEEP_EVERY) {
            idle.last_sweep = Some(Instant::now());
            idle.by_addr.retain(|_, list| {
                list.retain(Pooled::reusable);
                !list.is_empty()
            });
        }
        let list = idle.by_addr.entry(addr.to_owned()).or_default();
        if list.len() < MAX_IDLE_PER_ADDR {
            list.push(p);
        }
    }

    /// Forgets every idle connection to `addr` (its instance is gone).
    pub fn forget(&self, addr: &str) {
        self.lock().by_addr.remove(addr);
    }

    async fn connect(addr: &str) -> Result<Pooled, Failure> {
        // Plain `host:port`, or a sandbox's connection-handing socket.
        let tcp = warden_agent::connect(addr)
            .await
            .map_err(|e| Failure::Refused(e.to_string()))?;
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
            let (p, fresh) = match self.checkout(addr) {
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
            if let Some(conn) = conn {
                self.checkin(
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
