//! The load generator: TLS clients that measure handshake rates and emulate the seed's
//! sessions under overload.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rand::Rng;
use rustls::client::Resumption;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, HandshakeKind, SupportedProtocolVersion};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::servers::Cpus;
use super::CLIENT_TIMEOUT;
use crate::cpu::Cores;

/// How busy each side's cores were over a measured window.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Busy {
    /// Busy core-seconds of the servers' cores (the server, its upstream, and the kernel's
    /// work on their sockets).
    pub(super) server_secs: f64,
    /// Busy fraction of the servers' cores and of the generator's.
    pub(super) server: f64,
    pub(super) generator: f64,
}

impl Busy {
    fn between(a: &Cores, b: &Cores, cpus: Option<&Cpus>) -> Busy {
        let Some(c) = cpus else {
            return Busy::default();
        };
        let (server_secs, server) = b.busy_since(a, &c.servers);
        Busy {
            server_secs,
            server,
            generator: b.busy_since(a, &c.generator).1,
        }
    }
}

/// httperf), so its CPU goes to the handshake itself and the server, not the client, saturates.
#[derive(Debug)]
pub(super) struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

pub(super) fn client_config(
    version: &'static SupportedProtocolVersion,
    resume: bool,
) -> anyhow::Result<Arc<ClientConfig>> {
    // aws-lc-rs, with X25519 the only key share offered (the one every server here picks
    // anyway; no post-quantum hybrid share to make and send), so that one generator core
    // outlasts the server it overloads. P-256 is listed too: a TLS 1.2 server (OpenSSL) serves
    // its ECDSA P-256 certificate only to a client that lists that curve.
    let mut provider = rustls::crypto::aws_lc_rs::default_provider();
    provider.kx_groups = vec![
        rustls::crypto::aws_lc_rs::kx_group::X25519,
        rustls::crypto::aws_lc_rs::kx_group::SECP256R1,
    ];
    let provider = Arc::new(provider);
    let mut cfg = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[version])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NoVerify(provider)))
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    cfg.resumption = if resume {
        Resumption::in_memory_sessions(4096)
    } else {
        Resumption::disabled()
    };
    Ok(Arc::new(cfg))
}

/// Where and how to ask one server.
#[derive(Clone)]
pub(super) struct Target {
    pub(super) addr: SocketAddr,
    pub(super) host: ServerName<'static>,
    pub(super) path: &'static str,
    pub(super) authorization: Option<String>,
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

/// Connects and handshakes; the socket closes with RST so that a run of short connections does
/// not use up the ephemeral ports in TIME_WAIT.
pub(super) async fn connect(
    t: &Target,
    cfg: &Arc<ClientConfig>,
) -> std::io::Result<(Sender, Option<HandshakeKind>)> {
    let tcp = TcpStream::connect(t.addr).await?;
    let _ = tcp.set_nodelay(true);
    let _ = tcp.set_zero_linger();
    let tls = TlsConnector::from(cfg.clone())
        .connect(t.host.clone(), tcp)
        .await?;
    let kind = tls.get_ref().1.handshake_kind();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(conn);
    Ok((sender, kind))
}

pub(super) async fn get(sender: &mut Sender, t: &Target) -> anyhow::Result<u16> {
    let mut req =
        http::Request::get(t.path).header(http::header::HOST, t.host.to_str().as_ref() as &str);
    if let Some(a) = &t.authorization {
        req = req.header(http::header::AUTHORIZATION, a.as_str());
    }
    let resp = sender.send_request(req.body(Empty::new())?).await?;
    let status = resp.status().as_u16();
    resp.into_body().collect().await?;
    Ok(status)
}

/// One handshake-cost figure.
pub(super) struct Rate {
    pub(super) per_sec: f64,
    pub(super) busy: Busy,
    /// Busy time of the servers' cores per connection, in microseconds: the server's cost,
    /// whichever side ran out of CPU first.
    pub(super) server_us: f64,
    pub(super) resumed_fraction: f64,
    pub(super) errors: u64,
}

/// Connections per second, each one handshake and one request. Every task has its own client
/// config, and so its own session cache: it resumes the session of its previous connection.
pub(super) async fn handshake_rate(
    t: &Target,
    config: impl Fn() -> anyhow::Result<Arc<ClientConfig>>,
    concurrency: usize,
    seconds: u64,
    cpus: Option<&Cpus>,
) -> anyhow::Result<Rate> {
    let (mut s, _) = connect(t, &config()?).await.context("first connection")?;
    let status = get(&mut s, t).await?;
    if status != 200 {
        bail!("{} answered {status} on {}", t.addr, t.path);
    }
    drop(s);
    let done = Arc::new(AtomicU64::new(0));
    let resumed = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let start = Instant::now();
    let cores = Cores::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (t, cfg) = (t.clone(), config()?);
        let (done, resumed, errors) = (done.clone(), resumed.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let one = async {
                    let (mut s, kind) = connect(&t, &cfg).await?;
                    get(&mut s, &t).await?;
                    anyhow::Ok(kind)
                };
                match tokio::time::timeout(CLIENT_TIMEOUT, one).await {
                    Ok(Ok(kind)) => {
                        done.fetch_add(1, Relaxed);
                        if kind == Some(HandshakeKind::Resumed) {
                            resumed.fetch_add(1, Relaxed);
                        }
                    }
                    _ => {
                        errors.fetch_add(1, Relaxed);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await?;
    }
    let secs = start.elapsed().as_secs_f64();
    let busy = Busy::between(&cores, &Cores::now(), cpus);
    let n = done.load(Relaxed);
    Ok(Rate {
        per_sec: n as f64 / secs,
        busy,
        server_us: busy.server_secs * 1e6 / n.max(1) as f64,
        resumed_fraction: resumed.load(Relaxed) as f64 / n.max(1) as f64,
        errors: errors.load(Relaxed),
    })
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) replies: AtomicU64,
    pub(super) timeouts: AtomicU64,
    /// Of the timeouts, those before the handshake ended: of a new session, of a resumption.
    pub(super) handshake_timeouts: [AtomicU64; 2],
    pub(super) refused: AtomicU64,
    pub(super) errors: AtomicU64,
    pub(super) full: AtomicU64,
    pub(super) resumed: AtomicU64,
    pub(super) sessions: AtomicU64,
}

pub(super) struct Session {
    pub(super) think: Duration,
    /// No reply within this ends the session (httperf's client timeout).
    pub(super) timeout: Duration,
    pub(super) connections: u32,
    pub(super) requests: u32,
}

/// The period of the timer that measures how late the generator runs.
const LAG_TICK: Duration = Duration::from_millis(10);

/// One emulated client until `end`; counts only what happens after `measure_from`.
pub(super) async fn emulated_client(
    t: Target,
    base: Arc<ClientConfig>,
    s: Arc<Session>,
    c: Arc<Counters>,
    measure_from: Instant,
    end: Instant,
) {
    let think = |s: &Session| {
        let u: f64 = rand::thread_rng().gen_range(f64::EPSILON..1.0);
        s.think.mul_f64(-u.ln()).min(s.think * 20)
    };
    let counting = || Instant::now() >= measure_from;
    let count = |a: &AtomicU64| {
        if counting() {
            a.fetch_add(1, Relaxed);
        }
    };
    // Clients arrive spread over one session length, not all at once.
    let spread = s.think * (s.connections * s.requests);
    let first = spread.mul_f64(rand::thread_rng().gen::<f64>());
    if tokio::time::timeout_at(end.into(), tokio::time::sleep(first))
        .await
        .is_err()
    {
        return;
    }
    let run = async {
        loop {
            // A new session: a fresh client with no TLS session to resume.
            let cfg = {
                let mut cfg = (*base).clone();
                cfg.resumption = Resumption::in_memory_sessions(4);
                Arc::new(cfg)
            };
            count(&c.sessions);
            'session: for conn in 0..s.connections {
                if conn > 0 {
                    tokio::time::sleep(think(&s)).await;
                }
                let began = Instant::now();
                let mut sender = match tokio::time::timeout(s.timeout, connect(&t, &cfg)).await {
                    Err(_) => {
                        count(&c.timeouts);
                        count(&c.handshake_timeouts[usize::from(conn > 0)]);
                        break 'session;
                    }
                    Ok(Err(_)) => {
                        count(&c.refused);
                        tokio::time::sleep(think(&s)).await;
                        break 'session;
                    }
                    Ok(Ok((sender, kind))) => {
                        if kind == Some(HandshakeKind::Resumed) {
                            count(&c.resumed);
                        } else {
                            count(&c.full);
                        }
                        sender
                    }
                };
                for r in 0..s.requests {
                    let budget = if r == 0 {
                        s.timeout.saturating_sub(began.elapsed())
                    } else {
                        tokio::time::sleep(think(&s)).await;
                        s.timeout
                    };
                    match tokio::time::timeout(budget, get(&mut sender, &t)).await {
                        Ok(Ok(200)) => count(&c.replies),
                        Ok(_) => {
                            count(&c.errors);
                            break 'session;
                        }
                        Err(_) => {
                            count(&c.timeouts);
                            break 'session;
                        }
                    }
                }
            }
        }
    };
    let _ = tokio::time::timeout_at(end.into(), run).await;
}

pub(super) struct Overload {
    pub(super) replies_per_sec: f64,
    pub(super) busy: Busy,
    /// How late a 10 ms timer of the generator fired: 99th percentile and most, in ms.
    pub(super) generator_late_ms: [f64; 2],
    pub(super) timeouts: u64,
    pub(super) handshake_timeouts: [u64; 2],
    pub(super) refused: u64,
    pub(super) errors: u64,
    pub(super) full: u64,
    pub(super) resumed: u64,
    pub(super) sessions: u64,
}

pub(super) async fn overload(
    t: &Target,
    base: Arc<ClientConfig>,
    session: Arc<Session>,
    clients: usize,
    warmup: Duration,
    measure: Duration,
    cpus: Option<&Cpus>,
) -> anyhow::Result<Overload> {
    let c = Arc::new(Counters::default());
    let measure_from = Instant::now() + warmup;
    let end = measure_from + measure;
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            tokio::spawn(emulated_client(
                t.clone(),
                base.clone(),
                session.clone(),
                c.clone(),
                measure_from,
                end,
            ))
        })
        .collect();
    // The cores are read when measuring starts and when it ends, not when the last client
    // has wound down.
    let window = tokio::spawn(async move {
        tokio::time::sleep_until(measure_from.into()).await;
        let a = Cores::now();
        // How late the generator's own timers fire: a client's timeout is a timer too, so
        // while the generator's core is out of time its clients time out on their own.
        let mut late = Vec::new();
        while Instant::now() + LAG_TICK < end {
            let due = Instant::now() + LAG_TICK;
            tokio::time::sleep_until(due.into()).await;
            late.push(due.elapsed().as_secs_f64() * 1e3);
        }
        tokio::time::sleep_until(end.into()).await;
        late.sort_by(f64::total_cmp);
        (a, Cores::now(), late)
    });
    for task in tasks {
        task.await?;
    }
    let (a, b, late) = window.await?;
    let generator_late_ms = if late.is_empty() {
        [0.0; 2]
    } else {
        [crate::percentile(&late, 0.99), late[late.len() - 1]]
    };
    Ok(Overload {
        replies_per_sec: c.replies.load(Relaxed) as f64 / measure.as_secs_f64(),
        busy: Busy::between(&a, &b, cpus),
        generator_late_ms,
        timeouts: c.timeouts.load(Relaxed),
        handshake_timeouts: [
            c.handshake_timeouts[0].load(Relaxed),
            c.handshake_timeouts[1].load(Relaxed),
        ],
        refused: c.refused.load(Relaxed),
        errors: c.errors.load(Relaxed),
        full: c.full.load(Relaxed),
        resumed: c.resumed.load(Relaxed),
        sessions: c.sessions.load(Relaxed),
    })
}

/// The client count that asks for as many sessions per second as warden can serve: measured
/// with 64 clients that never think, then scaled by how long a thinking client's session lasts.
pub(super) async fn calibrate(
    t: &Target,
    base: Arc<ClientConfig>,
    s: &Session,
) -> anyhow::Result<usize> {
    let eager = Arc::new(Session {
        think: Duration::ZERO,
        timeout: s.timeout,
        connections: s.connections,
        requests: s.requests,
    });
    let measure = Duration::from_secs(5);
    let o = overload(t, base, eager, 64, Duration::from_secs(2), measure, None).await?;
    let sessions_per_sec = o.replies_per_sec / f64::from(s.connections * s.requests);
    let session_secs = s.think.as_secs_f64() * f64::from(s.connections * s.requests);
    let n = (sessions_per_sec * session_secs).round().max(1.0) as usize;
    eprintln!(
        "calibration: {sessions_per_sec:.0} sessions/s without think time; saturation at about {n} clients"
    );
    Ok(n)
}
