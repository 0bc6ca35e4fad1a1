//! Accepting connections: the listeners, the connection limit, and the accept loop of plain
//! HTTP. The TLS listener's loop, with the first record, admission control (seed 004 §8) and
//! the handshake, is `tls::accept`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tracing::Instrument;

use crate::client::Client;
use crate::downstream;
use crate::phases::Clock;
use crate::shared::SharedTcp;
use crate::state::State;

/// Accept queue length asked of the kernel (which caps it at net.core.somaxconn). tokio's
/// default of 1024 overflows in a burst of new clients; a dropped SYN is retried by the client
/// only after a second or more, which under overload turns into client timeouts.
const LISTEN_BACKLOG: u32 = 65_535;

/// The answer to a plain connection over the limit; costs one write.
const OVER_LIMIT: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

/// A listening socket on `addr`.
pub(crate) fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Accepts plain HTTP on `listener` until `shutdown` turns true; `slots` is the connection limit
/// shared by every listener. (The TLS listener has its own loop: `tls::accept`.)
pub(crate) async fn run(
    listener: TcpListener,
    state: Arc<State>,
    slots: Arc<Semaphore>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut reserve = Reserve::new();
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    reserve.accept_failed(&listener, &state, e, OVER_LIMIT).await;
                    continue;
                }
            },
            _ = async { let _ = shutdown.wait_for(|s| *s).await; } => return,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            state.metrics.refused_connections.inc();
            tokio::spawn(async move {
                let mut stream = stream;
                let _ = stream.write_all(OVER_LIMIT).await;
            });
            continue;
        };
        let state = state.clone();
        let span = tracing::debug_span!("conn", %peer, tls = false);
        tokio::spawn(
            async move {
                state.metrics.connections.inc();
                plain(state.clone(), stream, peer).await;
                state.metrics.connections.dec();
                drop(slot);
            }
            .instrument(span),
        );
    }
}

/// `EMFILE` and `ENFILE` (Linux): the process's or the system's descriptors are all in use.
const EMFILE: i32 = 24;
const ENFILE: i32 = 23;

/// A descriptor held in reserve: out of descriptors, it is let go to accept the waiting client
/// and answer it at once, rather than leave it unanswered in the backlog (libuv's and nginx's
/// way).
pub(crate) struct Reserve(Option<std::fs::File>);

impl Reserve {
    pub(crate) fn new() -> Self {
        Self(std::fs::File::open("/dev/null").ok())
    }

    /// After a failed accept: out of descriptors, accepts one waiting client with the reserve
    /// and closes it after writing `answer` (a 503, or nothing for TLS); then backs off instead
    /// of spinning.
    pub(crate) async fn accept_failed(
        &mut self,
        listener: &TcpListener,
        state: &State,
        e: std::io::Error,
        answer: &[u8],
    ) {
        let out_of_descriptors = matches!(e.raw_os_error(), Some(EMFILE | ENFILE));
        if out_of_descriptors && self.0.take().is_some() {
            let waiting = tokio::select! {
                biased;
                r = listener.accept() => r.ok(),
                () = std::future::ready(()) => None,
            };
            if let Some((stream, _)) = waiting {
                state.metrics.refused_connections.inc();
                let _ = stream.try_write(answer);
            }
            self.0 = std::fs::File::open("/dev/null").ok();
        }
        warden_core::log_limited!(warn, error = %e, "accept failed; closing waiting clients at once while out of descriptors");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn plain(state: Arc<State>, stream: TcpStream, peer: SocketAddr) {
    let _ = stream.set_nodelay(true);
    // A second handle on the socket lets hyper's path answer 408 after it gives up on a slow
    // head; it shares the descriptor.
    let stream = SharedTcp(Arc::new(stream));
    let spare = stream.clone();
    let clock = Clock::new(state.metrics.clone());
    let client = Client::new(peer, false);
    downstream::serve_http1(state, stream, client, Some(spare), clock).await;
}
