//! The TLS listener's accept loop, then per connection the first record, admission control
//! (seed 004 §8) and the handshake, before the connection goes downstream.
//!
//! Under overload most connections to the TLS port are refused: full handshakes whose hello
//! waited past admission's budget, by the ten thousand a second. One refusal is cheap (an
//! accept, a read, a write, a close); what makes refusals expensive is waiting for their turn.
//! When the loop took its turn like any task (tokio's budget makes it yield after 128 accepts),
//! it waited behind signatures, the backlog filled, every hello in it went stale, and the kernel
//! dropped new SYNs, which clients resend only after a second. So the loop drains the whole
//! backlog each time it runs, refusing stale full handshakes right there: no task, no slot, no
//! timer. That needs the hello to be there when the connection is accepted: the binary sets
//! `TCP_DEFER_ACCEPT` on the listener ([`crate::TlsSettings::tune_listener`]), without which
//! nearly every connection was accepted a few microseconds before its hello and a refusal
//! went through a task after all, at twice the cost. (A thread of its own, tried, had fewer
//! timeouts at 5x overload but cost every connection a wake-up of another thread, and
//! resumptions, where little cryptography is left, fell to 0.5-0.9x nginx's rate:
//! docs/BENCHMARKS.md.)

use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tracing::Instrument;

use crate::accept::Reserve;
use crate::client::Client;
use crate::downstream;
use crate::phases::Clock;
use crate::prefixed::Prefixed;
use crate::state::State;
use crate::tls;

/// A fatal `internal_error` alert: the cheapest clear "not now" a TLS client understands.
const TLS_REFUSAL: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x50];

/// Connections accepted in one turn at most: the kernel's backlog (somaxconn, 4096 here) at
/// about 16 µs each is a 65 ms turn; this keeps it near 16 ms.
const DRAIN: usize = 1024;

/// Accepts on `listener` until `shutdown` turns true; `slots` is the connection limit shared
/// by every listener.
pub(crate) async fn run(
    listener: TcpListener,
    state: Arc<State>,
    slots: Arc<Semaphore>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut reserve = Reserve::new();
    let mut in_a_row = 0;
    loop {
        // Unconstrained: the whole backlog in one turn (see the module's doc), but never more
        // than DRAIN in a row, so a flood faster than the loop cannot keep the thread from
        // everything else.
        in_a_row += 1;
        if in_a_row > DRAIN {
            in_a_row = 0;
            tokio::task::yield_now().await;
        }
        // Biased: under a flood the accept is always ready, and a stop must still be seen.
        let accepted = tokio::select! {
            biased;
            _ = async { let _ = shutdown.wait_for(|s| *s).await; } => return,
            r = tokio::task::unconstrained(listener.accept()) => r,
        };
        match accepted {
            Ok((stream, peer)) => one(&state, &slots, stream, peer, &shutdown),
            Err(e) => reserve.accept_failed(&listener, &state, e, &[]).await,
        }
    }
}

/// One accepted connection: refused here, or given a task, which gives up its handshake when
/// `shutdown` turns true.
fn one(
    state: &Arc<State>,
    slots: &Arc<Semaphore>,
    stream: TcpStream,
    peer: SocketAddr,
    shutdown: &watch::Receiver<bool>,
) {
    let Some(early) = early_tls(state, &stream) else {
        return;
    };
    let Ok(slot) = slots.clone().try_acquire_owned() else {
        state.metrics.refused_connections.inc();
        return;
    };
    let state = state.clone();
    let shutdown = shutdown.clone();
    let span = tracing::debug_span!("conn", %peer, tls = true);
    tokio::spawn(
        async move {
            state.metrics.connections.inc();
            with_tls(state.clone(), stream, peer, early, shutdown).await;
            state.metrics.connections.dec();
            drop(slot);
        }
        .instrument(span),
    );
}

/// Whether the client of `stream` has closed or reset its side: a TLS client never half-closes
/// before its handshake is done, so the end of its stream means it left. One non-blocking
/// peek; nothing is consumed.
fn client_gone(stream: &TcpStream) -> bool {
    use nix::sys::socket::{recv, MsgFlags};
    let mut byte = [0u8; 1];
    match recv(
        stream.as_raw_fd(),
        &mut byte,
        MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
    ) {
        Ok(0) => true,
        Ok(_) | Err(nix::errno::Errno::EAGAIN) | Err(nix::errno::Errno::EINTR) => false,
        Err(_) => true,
    }
}

/// The first bytes of a TLS connection read in the accept loop, and when they arrived.
struct Early {
    buf: BytesMut,
    arrived: Option<Instant>,
}

/// One read without waiting, in the accept loop. `None` when the connection was refused here: a
/// whole ClientHello for a full handshake that already waited longer than admission's queue
/// wait, or came while the runtime is behind. The refusal costs one write and a close: no task,
/// no slot, no timer.
fn early_tls(state: &State, stream: &TcpStream) -> Option<Early> {
    let tls = state.tls.as_ref()?;
    let mut early = Early {
        buf: BytesMut::with_capacity(2048),
        arrived: None,
    };
    // Nothing yet (no deferred accept, or a client silent for its whole deferral), an error
    // or the end of the stream: the connection's task sorts it out.
    let Ok((_, arrived)) = tls::arrival::read_stamped_now(stream, &mut early.buf) else {
        return Some(early);
    };
    early.arrived = arrived;
    let waited = arrived.map(|a| a.elapsed());
    if tls.admission.too_late(waited) && tls::hello::first_record_read(&early.buf) {
        let kind = tls::hello::classify(&early.buf, |id| tls.sessions.contains(id));
        if kind == (tls::hello::First::Tls { resumption: false }) {
            state.metrics.tls.refused.inc();
            // Non-blocking (MSG_DONTWAIT): a full socket buffer drops the alert, not the thread.
            let _ = nix::sys::socket::send(
                stream.as_raw_fd(),
                &TLS_REFUSAL,
                nix::sys::socket::MsgFlags::MSG_DONTWAIT | nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
            );
            return None;
        }
    }
    Some(early)
}

async fn with_tls(
    state: Arc<State>,
    stream: TcpStream,
    peer: SocketAddr,
    early: Early,
    mut shutdown: watch::Receiver<bool>,
) {
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
    // Admission, then the handshake, given up as soon as the gateway stops: biased, so a stop is
    // seen before the next step of the handshake, which may be a signature.
    let handshake = async {
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
                    return None;
                }
            }
        };
        // A client that left while its hello waited (for a slot, or in the backlog of a
        // gateway too busy to accept) would cost a signature for nobody.
        if client_gone(&stream) {
            m.tls.abandoned.inc();
            return None;
        }
        let acceptor = tokio_rustls::TlsAcceptor::from(tls.config.clone());
        let io = Prefixed::new(first, stream);
        let conn = match tokio::time::timeout(tls.handshake_timeout, acceptor.accept(io)).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                m.tls.failed.inc();
                tracing::debug!(error = %e, "TLS handshake failed");
                return None;
            }
            Err(_) => {
                m.tls.failed.inc();
                tracing::debug!("TLS handshake timed out");
                return None;
            }
        };
        Some((conn, admitted))
    };
    let (conn, admitted) = tokio::select! {
        biased;
        _ = shutdown.wait_for(|s| *s) => {
            m.tls.abandoned.inc();
            return;
        }
        done = handshake => match done {
            Some(done) => done,
            None => return,
        },
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
