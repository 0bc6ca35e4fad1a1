//! Seed 004's experiment, side by side: TLS handshake cost, and sessions under overload, for
//! warden with handshake admission control, warden without it, and nginx.
//!
//! 1. Handshake cost: connections per second, each a TLS handshake (all full, or all resumed)
//!    plus one tiny request, for ECDSA P-256 and RSA-2048 certificates and TLS 1.2 and 1.3.
//! 2. Overload: emulated clients as in the seed (§5.2). A client opens a session: a persistent
//!    HTTPS connection on which it sends requests with exponential think time between them; it
//!    then opens the session's next connection, which resumes the TLS session. No reply within
//!    10 s (or a refused handshake) ends the session and the client starts a new one, and so a
//!    full handshake. Loads go from a quarter of the saturating client count to three times it.
//!
//! httperf (the seed's generator) multiplexes with select() and so cannot hold more than 1024
//! connections, nor run more than one core; this generator is a tokio program that can.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
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
use warden_test_support::http::basic;
use warden_test_support::{Launch, Warden};

use crate::gateway::{free_port, prepare, start_nginx, tool_version, upstream, Peer};

/// Flags of `warden-bench tls`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The warden binary to measure
    #[arg(long, default_value = "target/release/warden")]
    warden: PathBuf,
    /// Directory for CSV, certificates and the work files of nginx
    #[arg(long, default_value = "bench/out")]
    out: PathBuf,
    /// Seconds per handshake-cost run
    #[arg(long, default_value_t = 5)]
    handshake_seconds: u64,
    /// Concurrent connections during the handshake-cost runs
    #[arg(long, default_value_t = 32)]
    handshake_concurrency: usize,
    /// Seconds of each overload run that are measured (after the warm-up)
    #[arg(long, default_value_t = 30)]
    overload_seconds: u64,
    /// Seconds of each overload run before measuring starts, so timeouts can take hold
    #[arg(long, default_value_t = 10)]
    warmup_seconds: u64,
    /// Mean think time between a client's requests, in milliseconds (the seed used 7 s with a
    /// few hundred clients; shorter here so saturation comes within the file-descriptor limit)
    #[arg(long, default_value_t = 500)]
    think_ms: u64,
    /// Connections per session (the first is a full handshake, the others resume)
    #[arg(long, default_value_t = 2)]
    connections_per_session: u32,
    /// Requests per connection
    #[arg(long, default_value_t = 5)]
    requests_per_connection: u32,
    /// Loads as multiples of the saturating client count
    #[arg(long, value_delimiter = ',', default_value = "0.25,0.5,1,1.5,2,3")]
    loads: Vec<f64>,
    /// Saturating client count; when not given, warden's session capacity is measured with
    /// clients that do not think, and the count that would ask for exactly that is used
    #[arg(long)]
    saturation_clients: Option<usize>,
    /// Which certificate the overload runs use
    #[arg(long, default_value = "rsa", value_parser = ["rsa", "ecdsa"])]
    overload_cert: String,
    /// Extra flags for `warden up` (for example admission limits), repeatable
    #[arg(long = "warden-arg", allow_hyphen_values = true)]
    warden_args: Vec<String>,
    /// Skip the overload runs (handshake cost only)
    #[arg(long)]
    no_overload: bool,
    /// Another warden binary whose handshake cost is measured in the same run, as NAME=PATH
    /// (reported as server `warden-NAME`), e.g. `aws-lc=target/aws-lc/release/warden`
    #[arg(long = "also-warden")]
    also_warden: Vec<String>,
}

/// The per-request client timeout of the seed's httperf configuration.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

struct Certs {
    dir: PathBuf,
}

impl Certs {
    fn cert(&self, kind: &str) -> PathBuf {
        self.dir.join(format!("{kind}.pem"))
    }
    fn key(&self, kind: &str) -> PathBuf {
        self.dir.join(format!("{kind}.key"))
    }
}

/// Self-signed ECDSA P-256 and RSA-2048 certificates for `ecdsa.bench` and `rsa.bench`.
fn make_certs(dir: &Path) -> anyhow::Result<Certs> {
    std::fs::create_dir_all(dir)?;
    for (kind, keyopt) in [
        (
            "ecdsa",
            vec!["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"],
        ),
        ("rsa", vec!["-newkey", "rsa:2048"]),
    ] {
        let status = Command::new("openssl")
            .args(["req", "-x509", "-nodes", "-days", "30"])
            .args(&keyopt)
            .arg("-keyout")
            .arg(dir.join(format!("{kind}.key")))
            .arg("-out")
            .arg(dir.join(format!("{kind}.pem")))
            .args(["-subj", &format!("/CN={kind}.bench")])
            .args(["-addext", &format!("subjectAltName=DNS:{kind}.bench")])
            .args(["-addext", "basicConstraints=critical,CA:FALSE"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .context("running openssl (install it with `apt-get install openssl`)")?;
        if !status.success() {
            bail!("openssl could not make the {kind} certificate");
        }
    }
    Ok(Certs {
        dir: dir.to_owned(),
    })
}

fn nginx(
    dir: &Path,
    runner: &Path,
    certs: &Certs,
    upstream: u16,
    password: &str,
    workers: usize,
) -> anyhow::Result<(Peer, u16)> {
    let port = free_port()?;
    std::fs::write(dir.join("htpasswd"), format!("alice:{{PLAIN}}{password}\n"))?;
    let mut servers = String::new();
    for (kind, options) in [("ecdsa", " backlog=65535"), ("rsa", "")] {
        // Listen options may be given once per address.
        let _ = write!(
            servers,
            r#"
  server {{
    listen 127.0.0.1:{port} ssl{options};
    server_name {kind}.bench;
    ssl_certificate {cert};
    ssl_certificate_key {key};
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_cache shared:SSL:64m;
    ssl_session_timeout 1h;
    ssl_session_tickets on;
    keepalive_timeout 10s;
    keepalive_requests 1000000;
    location = /healthz {{ return 200 '{{"status":"ok"}}'; }}
    location /apps/demo/ {{
      auth_basic "bench";
      auth_basic_user_file {dir}/htpasswd;
      proxy_pass http://app/;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }}
  }}"#,
            cert = certs.cert(kind).display(),
            key = certs.key(kind).display(),
            dir = dir.display(),
        );
    }
    let conf = format!(
        r#"worker_processes {workers};
pid {dir}/nginx.pid;
error_log {dir}/nginx-error.log error;
worker_rlimit_nofile 20000;
events {{ worker_connections 16384; multi_accept on; }}
http {{
  access_log off;
  client_body_temp_path {dir}/nginx-body;
  proxy_temp_path {dir}/nginx-proxy;
  upstream app {{ server 127.0.0.1:{upstream}; keepalive 512; }}{servers}
}}
"#,
        dir = dir.display()
    );
    let path = dir.join("nginx-tls.conf");
    std::fs::write(&path, conf)?;
    let mut cmd = Command::new(runner);
    cmd.arg("nginx");
    start_nginx(cmd, &path, port)
}

/// CPUs for the servers and for the load generator: on a machine of n CPUs the servers get
/// the first n-1 and this process the last, so the client's own TLS work never competes with
/// the server it measures. `None` on a single CPU.
struct Pinning {
    servers: String,
    count: usize,
}

fn pin() -> anyhow::Result<Option<Pinning>> {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    if n < 2 {
        return Ok(None);
    }
    let mut mine = nix::sched::CpuSet::new();
    mine.set(n - 1)?;
    // Before any thread exists, so every later thread of this process inherits it.
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &mine)
        .context("pinning the load generator to its CPU")?;
    Ok(Some(Pinning {
        servers: if n == 2 {
            "0".into()
        } else {
            format!("0-{}", n - 2)
        },
        count: n - 1,
    }))
}

/// A script that runs `program` (or its arguments, when `program` is empty) on the servers'
/// CPUs; `Launch` and `Peer` take a program path, and exec keeps the pid theirs.
fn pinned(
    dir: &Path,
    name: &str,
    program: &str,
    pinning: &Option<Pinning>,
) -> anyhow::Result<PathBuf> {
    let prefix = match pinning {
        Some(p) => format!("taskset -c {} ", p.servers),
        None => String::new(),
    };
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\nexec {prefix}{program} \"$@\"\n"))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
    Ok(path)
}

fn start_warden(bin: &Path, certs: &Certs, admission: bool, extra: &[String]) -> Warden {
    let mut l = Launch::new(bin)
        .log("info")
        .arg("--max-connections")
        .arg("16000");
    for a in extra {
        l = l.arg(a);
    }
    for kind in ["ecdsa", "rsa"] {
        l = l
            .arg("--tls-cert")
            .arg(&certs.cert(kind).display().to_string())
            .arg("--tls-key")
            .arg(&certs.key(kind).display().to_string());
    }
    if !admission {
        l = l.arg("--no-tls-admission");
    }
    let w = l.start();
    if let Err(e) = crate::apps::demo_as_process(&w, bin) {
        panic!("{e:#}");
    }
    w
}

fn tls_port(w: &Warden) -> anyhow::Result<u16> {
    let url = w.tls.as_deref().context("warden opened no TLS listener")?;
    let port = url
        .trim_start_matches("https://")
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .with_context(|| format!("no port in {url}"))?;
    Ok(port)
}

/// A load generator's client: it does not verify the server's certificate (neither does wrk or
/// httperf), so its CPU goes to the handshake itself and the server, not the client, saturates.
#[derive(Debug)]
struct NoVerify(Arc<rustls::crypto::CryptoProvider>);

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

fn client_config(
    version: &'static SupportedProtocolVersion,
    resume: bool,
) -> anyhow::Result<Arc<ClientConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
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
struct Target {
    addr: SocketAddr,
    host: ServerName<'static>,
    path: &'static str,
    authorization: Option<String>,
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

/// Connects and handshakes; the socket closes with RST so that a run of short connections does
/// not use up the ephemeral ports in TIME_WAIT.
async fn connect(
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

async fn get(sender: &mut Sender, t: &Target) -> anyhow::Result<u16> {
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
struct Rate {
    per_sec: f64,
    resumed_fraction: f64,
    errors: u64,
}

/// Connections per second, each one handshake and one request. Every task has its own client
/// config, and so its own session cache: it resumes the session of its previous connection.
async fn handshake_rate(
    t: &Target,
    config: impl Fn() -> anyhow::Result<Arc<ClientConfig>>,
    concurrency: usize,
    seconds: u64,
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
    let n = done.load(Relaxed);
    Ok(Rate {
        per_sec: n as f64 / secs,
        resumed_fraction: resumed.load(Relaxed) as f64 / n.max(1) as f64,
        errors: errors.load(Relaxed),
    })
}

#[derive(Default)]
struct Counters {
    replies: AtomicU64,
    timeouts: AtomicU64,
    refused: AtomicU64,
    errors: AtomicU64,
    full: AtomicU64,
    resumed: AtomicU64,
    sessions: AtomicU64,
}

struct Session {
    think: Duration,
    connections: u32,
    requests: u32,
}

/// One emulated client until `end`; counts only what happens after `measure_from`.
async fn emulated_client(
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
                let mut sender = match tokio::time::timeout(CLIENT_TIMEOUT, connect(&t, &cfg)).await
                {
                    Err(_) => {
                        count(&c.timeouts);
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
                        CLIENT_TIMEOUT.saturating_sub(began.elapsed())
                    } else {
                        tokio::time::sleep(think(&s)).await;
                        CLIENT_TIMEOUT
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

struct Overload {
    replies_per_sec: f64,
    timeouts: u64,
    refused: u64,
    errors: u64,
    full: u64,
    resumed: u64,
    sessions: u64,
}

async fn overload(
    t: &Target,
    base: Arc<ClientConfig>,
    session: Arc<Session>,
    clients: usize,
    warmup: Duration,
    measure: Duration,
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
    for task in tasks {
        task.await?;
    }
    Ok(Overload {
        replies_per_sec: c.replies.load(Relaxed) as f64 / measure.as_secs_f64(),
        timeouts: c.timeouts.load(Relaxed),
        refused: c.refused.load(Relaxed),
        errors: c.errors.load(Relaxed),
        full: c.full.load(Relaxed),
        resumed: c.resumed.load(Relaxed),
        sessions: c.sessions.load(Relaxed),
    })
}

/// The client count that asks for as many sessions per second as warden can serve: measured
/// with 64 clients that never think, then scaled by how long a thinking client's session lasts.
async fn calibrate(t: &Target, base: Arc<ClientConfig>, s: &Session) -> anyhow::Result<usize> {
    let eager = Arc::new(Session {
        think: Duration::ZERO,
        connections: s.connections,
        requests: s.requests,
    });
    let measure = Duration::from_secs(5);
    let o = overload(t, base, eager, 64, Duration::from_secs(2), measure).await?;
    let sessions_per_sec = o.replies_per_sec / f64::from(s.connections * s.requests);
    let session_secs = s.think.as_secs_f64() * f64::from(s.connections * s.requests);
    let n = (sessions_per_sec * session_secs).round().max(1.0) as usize;
    eprintln!(
        "calibration: {sessions_per_sec:.0} sessions/s without think time; saturation at about {n} clients"
    );
    Ok(n)
}

fn version_name(v: &SupportedProtocolVersion) -> &'static str {
    if v.version == rustls::ProtocolVersion::TLSv1_3 {
        "1.3"
    } else {
        "1.2"
    }
}

pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let work = prepare(&args.warden, &args.out, "tls-work")?;
    let certs = make_certs(&work.join("certs"))?;
    let pinning = pin()?;
    let warden_bin = std::fs::canonicalize(&args.warden)?;
    let warden_bin = pinned(
        &work,
        "warden-pinned",
        &warden_bin.display().to_string(),
        &pinning,
    )?;
    let runner = pinned(&work, "run-pinned", "", &pinning)?;
    let server_cpus = pinning.as_ref().map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get()),
        |p| p.count,
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;

    // Each server runs alone, so the others' idle processes do not share its CPUs.
    let (_up, up_port) = upstream(&warden_bin)?;
    let mut servers: Vec<(String, PathBuf)> = ["warden", "warden-no-admission", "nginx"]
        .iter()
        .map(|s| (s.to_string(), warden_bin.clone()))
        .collect();
    for also in &args.also_warden {
        let (name, path) = also
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--also-warden {also:?} must be NAME=PATH"))?;
        let wrapper = pinned(
            &work,
            &format!("warden-{name}-pinned"),
            &std::fs::canonicalize(path)?.display().to_string(),
            &pinning,
        )?;
        servers.push((format!("warden-{name}"), wrapper));
    }
    let mut rates =
        String::from("server,cert,tls,handshake,connections_per_sec,resumed_fraction,errors\n");
    let mut over = String::from("server,cert,clients,load,replies_per_sec,timeouts,refused,errors,full_handshakes,resumed_handshakes,sessions\n");
    let rates_path = args.out.join("tls-handshakes.csv");
    let over_path = args.out.join("tls-overload.csv");
    let session = Arc::new(Session {
        think: Duration::from_millis(args.think_ms.max(1)),
        connections: args.connections_per_session.max(1),
        requests: args.requests_per_connection.max(1),
    });
    let mut saturation = args.saturation_clients;
    for (server, bin) in &servers {
        let server = server.as_str();
        // Binaries besides the first are measured for handshake cost only.
        let alternative = !matches!(server, "warden" | "warden-no-admission" | "nginx");
        let (w, peer);
        let (port, authorization) = if server == "nginx" {
            let pw = "bench-password-for-nginx";
            let (p, port) = nginx(&work, &runner, &certs, up_port, pw, server_cpus)?;
            peer = Some(p);
            w = None;
            (port, basic("alice", pw))
        } else {
            let admission = server == "warden" || alternative;
            let warden = start_warden(bin, &certs, admission, &args.warden_args);
            let pw = warden.password("alice");
            let port = tls_port(&warden)?;
            w = Some(warden);
            peer = None;
            (port, basic("alice", &pw))
        };
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        // Handshake cost is the same code with or without admission: measure it once.
        if server != "warden-no-admission" {
            for cert in ["ecdsa", "rsa"] {
                for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
                    for resume in [false, true] {
                        let t = Target {
                            addr,
                            host: ServerName::try_from(format!("{cert}.bench"))?,
                            path: "/healthz",
                            authorization: None,
                        };
                        let r = rt.block_on(handshake_rate(
                            &t,
                            || client_config(version, resume),
                            args.handshake_concurrency,
                            args.handshake_seconds,
                        ))?;
                        let kind = if resume { "resumed" } else { "full" };
                        eprintln!(
                            "handshake {server:<8} {cert:<5} TLS {} {kind:<7} {:>8.0} conn/s  resumed {:>5.1}%  errors {}",
                            version_name(version),
                            r.per_sec,
                            r.resumed_fraction * 100.0,
                            r.errors
                        );
                        let _ = writeln!(
                            rates,
                            "{server},{cert},{},{kind},{:.1},{:.3},{}",
                            version_name(version),
                            r.per_sec,
                            r.resumed_fraction,
                            r.errors
                        );
                        std::fs::write(&rates_path, &rates)?;
                    }
                }
            }
        }
        if args.no_overload || alternative {
            drop((w, peer));
            continue;
        }
        let t = Target {
            addr,
            host: ServerName::try_from(format!("{}.bench", args.overload_cert))?,
            path: "/apps/demo/",
            authorization: Some(authorization),
        };
        let base = client_config(&rustls::version::TLS13, true)?;
        let sat = match saturation {
            Some(n) => n,
            None => {
                let n = rt.block_on(calibrate(&t, base.clone(), &session))?;
                saturation = Some(n);
                n
            }
        };
        for &load in &args.loads {
            let clients = ((sat as f64 * load).round() as usize).clamp(1, 15_000);
            let o = rt.block_on(overload(
                &t,
                base.clone(),
                session.clone(),
                clients,
                Duration::from_secs(args.warmup_seconds),
                Duration::from_secs(args.overload_seconds.max(1)),
            ))?;
            eprintln!(
                "overload  {server:<19} {load:>4}x {clients:>6} clients {:>8.0} replies/s  timeouts {:>6}  refused {:>6}  errors {:>5}  full {:>6}  resumed {:>6}",
                o.replies_per_sec, o.timeouts, o.refused, o.errors, o.full, o.resumed
            );
            let _ = writeln!(
                over,
                "{server},{},{clients},{load},{:.1},{},{},{},{},{},{}",
                args.overload_cert,
                o.replies_per_sec,
                o.timeouts,
                o.refused,
                o.errors,
                o.full,
                o.resumed,
                o.sessions
            );
            std::fs::write(&over_path, &over)?;
        }
        drop((w, peer));
    }
    println!(
        "wrote {} and {} ({}; {}); servers on CPUs {}, load generator on the last; saturation taken as {} clients",
        rates_path.display(),
        over_path.display(),
        tool_version("nginx", &["-v"]),
        tool_version("openssl", &["version"]),
        pinning.as_ref().map_or("all (not pinned)", |p| p.servers.as_str()),
        saturation.unwrap_or(0)
    );
    Ok(())
}
