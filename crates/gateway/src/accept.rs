//! Accepting connections: the listeners, the connection limit, and for TLS the first record,
//! handshake admission control (seed 004 §8) and the handshake itself, before the connection
//! goes downstream.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tracing::Instrument;

use crate::client::Client;
use crate::downstream;
use crate::phases::Clock;
use crate::prefixed::Prefixed;
use crate::shared::SharedTcp;
use crate::state::State;
use crate::tls;

/// Accept queue length asked of the kernel (which caps it at net.core.somaxconn). tokio's
/// default of 1024 overflows in a burst of new clients; a dropped SYN is retried by the client
/// only after a second or more, which under overload turns into client timeouts.
const LISTEN_BACKLOG: u32 = 65_535;

/// A fatal `internal_error` alert: the cheapest clear "not now" a TLS client understands.
const TLS_REFUSAL: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x50];

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

/// Accepts on `listener` until `shutdown` turns true; `slots` is the connection limit shared
/// by every listener.
pub(crate) async fn run(
    listener: TcpListener,
    state: Arc<State>,
    slots: Arc<Semaphore>,
    mut shutdown: watch::Receiver<bool>,
    tls: bool,
) {
    // A descriptor held in reserve: out of descriptors, it is let go to accept the waiting
    // client and tell it 503 at once, rather than leaving it unanswered in the backlog
    // (libuv's and nginx's way).
    let mut reserve = std::fs::File::open("/dev/null").ok();
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    let out_of_descriptors = matches!(e.raw_os_error(), Some(EMFILE | ENFILE));
                    if out_of_descriptors && reserve.take().is_some() {
                        refuse_one(&listener, tls, &state).await;
                        reserve = std::fs::File::open("/dev/null").ok();
                    }
                    warden_core::log_limited!(warn, error = %e, "accept failed; answering 503 to waiting clients while out of descriptors");
                    // Back off instead of spinning.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = async { let _ = shutdown.wait_for(|s| *s).await; } => return,
        };
        // A full handshake that waited out its budget in the backlog is refused here, before
        // it takes a slot or a task: under overload such refusals come by the thousand a second.
        let early = if tls {
            match early_tls(&state, &stream) {
                Some(e) => Some(e),
                None => continue,
            }
        } else {
            None
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            state.metrics.refused_connections.inc();
            if !tls {
                tokio::spawn(async move {
                    let mut stream = stream;
                    let _ = stream.write_all(OVER_LIMIT).await;
                });
            }
            continue;
        };
        let state = state.clone();
        let span = tracing::debug_span!("conn", %peer, tls);
        tokio::spawn(
            async move {
                state.metrics.connections.inc();
                if let Some(early) = early {
                    with_tls(state.clone(), stream, peer, early).await;
                } else {
                    plain(state.clone(), stream, peer).await;
                }
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

/// Accepts one waiting client, if any, and closes it with a 503 (plain) or at once (TLS).
async fn refuse_one(listener: &TcpListener, tls: bool, state: &State) {
    let accepted = tokio::select! {
        biased;
        r = listener.accept() => r.ok(),
        () = std::future::ready(()) => None,
    };
    if let Some((stream, _)) = accepted {
        state.metrics.refused_connections.inc();
        if !tls {
            let _ = stream.try_write(OVER_LIMIT);
        }
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

/// The first bytes of a TLS connection read in the accept loop, and when they arrived.
struct Early {
    buf: BytesMut,
    arrived: Option<Instant>,
}

/// One read without waiting, in the accept loop. `None` when the connection was refused here: a
/// whole ClientHello for a full handshake that already waited longer than admission's queue wait.
/// The refusal costs one write and a close: no task, no slot, no timer.
fn early_tls(state: &State, stream: &TcpStream) -> Option<Early> {
    let tls = state.tls.as_ref()?;
    let mut early = Early {
        buf: BytesMut::with_capacity(2048),
        arrived: None,
    };
    // Nothing yet, an error or the end of the stream: the connection's task sorts it out.
    let Ok((_, arrived)) = tls::arrival::try_read_stamped(stream, &mut early.buf) else {
        return Some(early);
    };
    early.arrived = arrived;
    let waited = arrived.map(|a| a.elapsed());
    if tls.admission.too_late(waited) && tls::hello::first_record_read(&early.buf) {
        let kind = tls::hello::classify(&early.buf, |id| tls.sessions.contains(id));
        if kind == (tls::hello::First::Tls { resumption: false }) {
            state.metrics.tls.refused.inc();
            let _ = stream.try_write(&TLS_REFUSAL);
            return None;
        }
    }
    Some(early)
}

async fn with_tls(state: Arc<State>, stream: TcpStream, peer: SocketAddr, early: Early) {
    let Some(tls) = state.tls.as_ref() else {
        return;
    };
    let _ = stream.set_nodelay(true);
    let m = &state.metrics;
    let started = Instant::now();
    let Early {
        mut buf,
        mut arrived,
    } = early;
    let read = async {
        while !tls::hello::first_record_read(&buf) {
            let (n, at) = tls::arrival::read_stamped(&stream, &mut buf).await?;
            if n == 0 {
                return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
            }
            arrived = arrived.or(at);
        }
        Ok(())
    };
    match tokio::time::timeout(state.config.header_timeout, read).await {
        Ok(Ok(())) => {}
        _ => return,
    }
    let first = buf;
    let resumption = match tls::hello::classify(&first, |id| tls.sessions.contains(id)) {
        tls::hello::First::NotTls => {
            tls::answer_plain_http(Prefixed::new(first, stream), tls.names.clone()).await;
            return;
        }
        tls::hello::First::Tls { resumption } => resumption,
    };
    // Resumption attempts are always admitted: they are cheap and finish sessions.
    let admitted = if resumption {
        None
    } else {
        match tls.admission.admit_full(arrived.map(|a| a.elapsed())).await {
            Some(a) => Some(a),
            None => {
                m.tls.refused.inc();
                let mut stream = stream;
                let _ = stream.write_all(&TLS_REFUSAL).await;
                return;
            }
        }
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.config.clone());
    let io = Prefixed::new(first, stream);
    let conn = match tokio::time::timeout(tls.handshake_timeout, acceptor.accept(io)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            m.tls.failed.inc();
            tracing::debug!(error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            m.tls.failed.inc();
            tracing::debug!("TLS handshake timed out");
            return;
        }
    };
    drop(admitted);
    let took = started.elapsed().as_secs_f64();
    if conn.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
        m.tls.resumed.inc();
        m.conn_phase.handshake_resumed.observe(took);
    } else {
        m.tls.full.inc();
        m.conn_phase.handshake_full.observe(took);
        if resumption {
            m.tls.resumption_missed.inc();
        }
    }
    let clock = Clock::new(state.metrics.clone());
    let client = Client::new(peer, true);
    if conn.get_ref().1.alpn_protocol() == Some(b"h2") {
        downstream::serve_http2(state, conn, client, clock).await;
    } else {
        downstream::serve_http1(state, conn, client, None, clock).await;
    }
}
