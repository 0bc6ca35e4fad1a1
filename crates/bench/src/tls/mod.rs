//! Seed 004's experiment, side by side: TLS handshake cost, and sessions under overload, for
//! warden with handshake admission control, warden without it, and nginx.
//!
//! 1. Handshake cost: connections per second, each a TLS handshake (all full, or all resumed)
//!    plus one tiny request, for ECDSA P-256 and RSA-2048 certificates and TLS 1.2 and 1.3.
//! 2. Overload: emulated clients as in the seed (§5.2). A client opens a session: a persistent
//!    HTTPS connection on which it sends requests with exponential think time between them; it
//!    then opens the session's next connection, which resumes the TLS session. No reply within
//!    the client timeout (or a refused handshake, after a think time) ends the session and the
//!    client starts a new one, and so a full handshake. Loads go from a quarter of the saturating
//!    client count to five times it. The seed's think time (7 s) and client timeout (10 s) are
//!    both divided by ten, so saturation comes within the descriptor limit while their ratio,
//!    which decides when timeouts set off the collapse, stays the seed's.
//!
//! 3. The floor of refusing: the same overload against `refuse-all` ([`refuser`]), which refuses
//!    every handshake with the least work a server can do; its busy core time per refusal is
//!    what any server pays, and with the refusal rate of a run it bounds how much of its peak
//!    a server can keep. Each run also reports how busy the server's and the generator's
//!    cores were and how late the generator's own timers fired.
//!
//! httperf (the seed's generator) multiplexes with select() and so cannot hold more than 1024
//! connections, nor run more than one core; this generator is a tokio program that can.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use rustls::SupportedProtocolVersion;
use warden_test_support::http::basic;

use crate::gateway::{prepare, tool_version, upstream};

mod client;
pub(crate) mod refuser;
mod servers;

use client::*;
use servers::*;

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
    #[arg(long, default_value_t = 700)]
    think_ms: u64,
    /// Client timeout in milliseconds: no reply within it and the client gives up its session
    /// (the seed: 10 s, with 7 s of think time)
    #[arg(long, default_value_t = 1000)]
    client_timeout_ms: u64,
    /// Connections per session (the first is a full handshake, the others resume)
    #[arg(long, default_value_t = 2)]
    connections_per_session: u32,
    /// Requests per connection
    #[arg(long, default_value_t = 5)]
    requests_per_connection: u32,
    /// Loads as multiples of the saturating client count
    #[arg(long, value_delimiter = ',', default_value = "0.25,0.5,1,1.5,2,3,4,5")]
    loads: Vec<f64>,
    /// Saturating client count; when not given, warden's session capacity is measured with
    /// clients that do not think, and the count that would ask for exactly that is used
    #[arg(long)]
    saturation_clients: Option<usize>,
    /// Which certificate the overload runs use. RSA-4096 by default: on one server core beside
    /// one generator core, only then does a full handshake cost the server much more than the
    /// client, so the server and not the generator is what saturates (with RSA-2048 the
    /// generator's own CPU ran out first)
    #[arg(long, default_value = "rsa4096", value_parser = ["rsa", "ecdsa", "rsa4096"])]
    overload_cert: String,
    /// Servers to measure, of warden, warden-no-admission and nginx; and refuse-all, the floor
    /// of refusing (overload runs only: every handshake refused with the least work possible)
    #[arg(long, value_delimiter = ',', default_value = "warden,warden-no-admission,nginx,refuse-all",
          value_parser = ["warden", "warden-no-admission", "nginx", "refuse-all"])]
    servers: Vec<String>,
    /// Extra flags for `warden up` (for example admission limits), repeatable
    #[arg(long = "warden-arg", allow_hyphen_values = true)]
    warden_args: Vec<String>,
    /// Skip the overload runs (handshake cost only)
    #[arg(long)]
    no_overload: bool,
    /// Skip the handshake-cost runs (overload only)
    #[arg(long)]
    no_handshakes: bool,
    /// Another warden binary whose handshake cost is measured in the same run, as NAME=PATH
    /// (reported as server `warden-NAME`), e.g. `aws-lc=target/aws-lc/release/warden`
    #[arg(long = "also-warden")]
    also_warden: Vec<String>,
}

/// The per-request client timeout of the seed's httperf configuration.
pub(super) const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// Each emulated client holds one socket; refuse a load the descriptor limit cannot hold rather
/// than measure a smaller one under its name.
fn check_descriptors(clients: usize) -> anyhow::Result<()> {
    let (soft, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)?;
    // Room for the runtime, the server's pipes and the handshake-cost connections.
    let room = usize::try_from(soft)
        .unwrap_or(usize::MAX)
        .saturating_sub(512);
    if clients > room {
        anyhow::bail!(
            "{clients} emulated clients need {clients} sockets but the descriptor limit is {soft} \
             (hard limit {hard}): raise it with `ulimit -n {hard}` (bench/tls.sh does), or pass \
             smaller --loads or a longer --think-ms"
        );
    }
    Ok(())
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
    let mut servers: Vec<(String, PathBuf)> = args
        .servers
        .iter()
        .map(|s| (s.clone(), warden_bin.clone()))
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
        String::from("server,cert,tls,handshake,connections_per_sec,resumed_fraction,errors,server_core_us_per_connection,server_core_busy,generator_core_busy\n");
    let mut over = String::from("server,cert,clients,load,replies_per_sec,timeouts,refused,errors,full_handshakes,resumed_handshakes,sessions,server_core_busy,generator_core_busy,server_core_us_per_refusal,generator_late_ms_p99,generator_late_ms_max\n");
    let cpus = pinning.as_ref().map(|p| &p.cpus);
    let rates_path = args.out.join("tls-handshakes.csv");
    let over_path = args.out.join("tls-overload.csv");
    let session = Arc::new(Session {
        think: Duration::from_millis(args.think_ms.max(1)),
        timeout: Duration::from_millis(args.client_timeout_ms.max(1)),
        connections: args.connections_per_session.max(1),
        requests: args.requests_per_connection.max(1),
    });
    let mut saturation = args.saturation_clients;
    for (server, bin) in &servers {
        let server = server.as_str();
        // Binaries besides the three are measured for handshake cost only.
        let alternative = !matches!(
            server,
            "warden" | "warden-no-admission" | "nginx" | "refuse-all"
        );
        let (w, peer);
        let (port, authorization) = if server == "refuse-all" {
            let (p, port) = refuse_all(&runner)?;
            peer = Some(p);
            w = None;
            (port, basic("alice", "refused-anyway"))
        } else if server == "nginx" {
            let pw = "bench-password-for-nginx";
            let (p, port) = nginx(&work, &runner, &certs, up_port, pw, server_cpus)?;
            peer = Some(p);
            w = None;
            (port, basic("alice", pw))
        } else {
            let admission = server == "warden";
            let warden = start_warden(bin, &certs, admission, &args.warden_args);
            let pw = warden.password("alice");
            let port = tls_port(&warden)?;
            w = Some(warden);
            peer = None;
            (port, basic("alice", &pw))
        };
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        // Handshake cost is measured without admission control, as nginx has none: 32 clients
        // making RSA-4096 handshakes back to back keep the runtime behind, and admission
        // would refuse some of them (the overload runs show what admission does).
        if !matches!(server, "warden" | "refuse-all") && !args.no_handshakes {
            for cert in CERT_KINDS {
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
                            cpus,
                        ))?;
                        let kind = if resume { "resumed" } else { "full" };
                        eprintln!(
                            "handshake {server:<8} {cert:<5} TLS {} {kind:<7} {:>8.0} conn/s  resumed {:>5.1}%  errors {}  server core {:>6.1} us/conn, {:>3.0}% busy; generator core {:>3.0}% busy",
                            version_name(version),
                            r.per_sec,
                            r.resumed_fraction * 100.0,
                            r.errors,
                            r.server_us,
                            r.busy.server * 100.0,
                            r.busy.generator * 100.0
                        );
                        let _ = writeln!(
                            rates,
                            "{server},{cert},{},{kind},{:.1},{:.3},{},{:.1},{:.3},{:.3}",
                            version_name(version),
                            r.per_sec,
                            r.resumed_fraction,
                            r.errors,
                            r.server_us,
                            r.busy.server,
                            r.busy.generator
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
            None if server == "refuse-all" => anyhow::bail!(
                "refuse-all serves no session to calibrate with: list it after warden, or pass \
                 --saturation-clients"
            ),
            None => {
                let n = rt.block_on(calibrate(&t, base.clone(), &session))?;
                saturation = Some(n);
                n
            }
        };
        for &load in &args.loads {
            let clients = ((sat as f64 * load).round() as usize).max(1);
            check_descriptors(clients)?;
            let o = rt.block_on(overload(
                &t,
                base.clone(),
                session.clone(),
                clients,
                Duration::from_secs(args.warmup_seconds),
                Duration::from_secs(args.overload_seconds.max(1)),
                cpus,
            ))?;
            // The servers' busy core time over the refusals: their whole cost for refuse-all,
            // an upper bound for a server that also served sessions.
            let per_refusal = o.busy.server_secs * 1e6 / o.refused.max(1) as f64;
            eprintln!(
                "overload  {server:<19} {load:>4}x {clients:>6} clients {:>8.0} replies/s  timeouts {:>6} (in handshakes: new {}, resumed {})  refused {:>6}  errors {:>5}  full {:>6}  resumed {:>6}  cores busy: server {:>3.0}%, generator {:>3.0}%; server core per refusal {:.1} us (if refusals were all it did); generator's timers late by {:.0} ms (p99), {:.0} ms (most)",
                o.replies_per_sec, o.timeouts, o.handshake_timeouts[0], o.handshake_timeouts[1], o.refused, o.errors, o.full, o.resumed,
                o.busy.server * 100.0, o.busy.generator * 100.0, per_refusal,
                o.generator_late_ms[0], o.generator_late_ms[1]
            );
            let _ = writeln!(
                over,
                "{server},{},{clients},{load},{:.1},{},{},{},{},{},{},{:.3},{:.3},{:.1},{:.1},{:.1}",
                args.overload_cert,
                o.replies_per_sec,
                o.timeouts,
                o.refused,
                o.errors,
                o.full,
                o.resumed,
                o.sessions,
                o.busy.server,
                o.busy.generator,
                per_refusal,
                o.generator_late_ms[0],
                o.generator_late_ms[1]
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
