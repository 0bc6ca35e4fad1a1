//! `warden up`: every role in one process on the embedded store.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;

use crate::{demo, files};

/// Flags of `warden up`.
#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// Directory for the store, secrets and instance logs (created with mode 0700)
    #[arg(long, env = "WARDEN_DATA_DIR", default_value = "warden-data")]
    data_dir: PathBuf,
    /// Gateway address; port 0 picks a free one
    #[arg(long, default_value = "127.0.0.1:7700")]
    listen: SocketAddr,
    /// API address; port 0 picks a free one
    #[arg(long, default_value = "127.0.0.1:7701")]
    api_listen: SocketAddr,
    /// Store backend
    #[arg(long, default_value = "embedded")]
    store: String,
    /// Create a demo lattice, demo users and the demo app
    #[arg(long)]
    demo: bool,
    /// Lifetime of a login session, in seconds
    #[arg(long, default_value_t = 12 * 3600)]
    session_ttl_secs: u64,
    /// Open gateway connections beyond which new ones get 503
    #[arg(long, default_value_t = 10_000)]
    max_connections: usize,
    /// Time a client gets to send a request head before 408, in milliseconds
    #[arg(long, default_value_t = 15_000)]
    header_timeout_ms: u64,
    /// Time an instance gets to answer a forwarded request before the client gets 504, in
    /// milliseconds
    #[arg(long, default_value_t = 60_000)]
    upstream_timeout_ms: u64,
    /// TLS listen address (with --demo: 127.0.0.1:7443 and a self-signed certificate)
    #[arg(long)]
    tls_listen: Option<SocketAddr>,
    /// PEM certificate chain for TLS; repeat for several names (SNI picks, the first is default)
    #[arg(long = "tls-cert", value_name = "FILE")]
    tls_cert: Vec<PathBuf>,
    /// PEM private key of the --tls-cert in the same position
    #[arg(long = "tls-key", value_name = "FILE")]
    tls_key: Vec<PathBuf>,
    /// Admit every TLS handshake: switches handshake admission control off
    #[arg(long)]
    no_tls_admission: bool,
    /// Full TLS handshakes in progress at once [default: 64 per core]
    #[arg(long)]
    tls_handshake_concurrency: Option<usize>,
    /// Full TLS handshakes that may wait for a slot before the rest are refused [default: 64 per core]
    #[arg(long)]
    tls_handshake_queue: Option<usize>,
    /// Longest wait of a full TLS handshake in the queue, in milliseconds
    #[arg(long, default_value_t = 250)]
    tls_queue_wait_ms: u64,
    /// Time a client gets to finish its TLS handshake, in milliseconds
    #[arg(long, default_value_t = 10_000)]
    tls_handshake_timeout_ms: u64,
    /// Most app instances this node runs at once; beyond it requests get 503
    #[arg(long, default_value_t = 256)]
    max_instances: u32,
    /// Size in MiB at which an instance's log is cut back to its newer half (checked twice a
    /// second)
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    max_log_mb: u64,
    /// Sandbox limits through cgroups where warden may write a hierarchy (auto), or through
    /// rlimits only (off)
    #[arg(long, default_value = "auto", value_parser = ["auto", "off"])]
    cgroups: String,
    /// Bridge that sandboxes of apps with network "bridged" are attached to; created (as root)
    /// when first needed, removed at shutdown if warden created it
    #[arg(long, default_value = "warden0", value_parser = parse_bridge_name)]
    bridge: String,
    /// IPv4 network of the bridge: the bridge takes the first address, instances the rest
    #[arg(long, default_value = "10.213.0.0/16", value_parser = warden_agent::sandbox::bridge::BridgeConfig::parse_cidr)]
    bridge_cidr: (std::net::Ipv4Addr, u8),
}

/// Where `--demo` opens its TLS listener when none is given.
const DEMO_TLS_LISTEN: &str = "127.0.0.1:7443";

/// The TLS settings the flags ask for, generating the demo certificate when needed.
fn tls_settings(args: &UpArgs) -> anyhow::Result<Option<warden_gateway::TlsSettings>> {
    if args.tls_cert.len() != args.tls_key.len() {
        anyhow::bail!(
            "give one --tls-key per --tls-cert (got {} certificates and {} keys)",
            args.tls_cert.len(),
            args.tls_key.len()
        );
    }
    let listen = match (args.tls_listen, args.demo) {
        (Some(a), _) => a,
        (None, true) => DEMO_TLS_LISTEN.parse()?,
        (None, false) if args.tls_cert.is_empty() => return Ok(None),
        (None, false) => {
            anyhow::bail!("--tls-cert needs --tls-listen ADDR to say where to serve TLS")
        }
    };
    let mut certs: Vec<warden_gateway::CertFiles> = args
        .tls_cert
        .iter()
        .zip(&args.tls_key)
        .map(|(cert, key)| warden_gateway::CertFiles {
            cert: cert.clone(),
            key: key.clone(),
        })
        .collect();
    if certs.is_empty() {
        if !args.demo {
            anyhow::bail!("--tls-listen needs a certificate: pass --tls-cert FILE --tls-key FILE");
        }
        certs.push(demo_certificate(&args.data_dir)?);
    }
    let mut admission = warden_gateway::AdmissionConfig {
        enabled: !args.no_tls_admission,
        ..Default::default()
    };
    if let Some(n) = args.tls_handshake_concurrency {
        admission.concurrency = n;
    }
    if let Some(n) = args.tls_handshake_queue {
        admission.queue = n;
    }
    admission.queue_wait = Duration::from_millis(args.tls_queue_wait_ms);
    Ok(Some(warden_gateway::TlsSettings {
        listen,
        certs,
        admission,
        handshake_timeout: Duration::from_millis(args.tls_handshake_timeout_ms.max(1)),
    }))
}

/// A self-signed certificate for localhost and 127.0.0.1, made once per data dir.
fn demo_certificate(dir: &Path) -> anyhow::Result<warden_gateway::CertFiles> {
    let tls_dir = dir.join("tls");
    files::ensure_private_dir(&tls_dir)?;
    let files = warden_gateway::CertFiles {
        cert: tls_dir.join("demo-cert.pem"),
        key: tls_dir.join("demo-key.pem"),
    };
    if !(files.cert.exists() && files.key.exists()) {
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
            .context("cannot generate the demo TLS certificate")?;
        files::write_private(&files.key, ck.key_pair.serialize_pem().as_bytes())?;
        files::write_private(&files.cert, ck.cert.pem().as_bytes())?;
    }
    Ok(files)
}

fn load_or_create(path: &Path, make: impl FnOnce() -> String) -> anyhow::Result<String> {
    if let Some(v) = files::read_private(path)? {
        let v = v.trim().to_owned();
        if !v.is_empty() {
            return Ok(v);
        }
    }
    let v = make();
    files::write_private(path, v.as_bytes())?;
    Ok(v)
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Runs until SIGINT or SIGTERM, then stops every instance before returning.
pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    warden_agent::raise_open_file_limit();
    let dir = &args.data_dir;
    files::ensure_private_dir(dir)?;
    let endpoints = dir.join("endpoints.json");
    let _ = std::fs::remove_file(&endpoints);
    let store = warden_store::open(&args.store, dir).context("cannot open the store")?;
    let token = load_or_create(&dir.join("admin-token"), warden_core::id::secret_token)?;
    let node = load_or_create(&dir.join("node-id"), warden_core::id::short_id)?;
    let demo_users = if args.demo {
        Some(demo::setup(&*store, dir).await?)
    } else {
        None
    };

    let agent = warden_agent::Agent::start(
        store.clone(),
        warden_agent::AgentConfig {
            node: node.clone(),
            log_dir: dir.join("logs"),
            instance_dir: dir.join("instances"),
            lease_ttl: Duration::from_secs(10),
            max_instances: args.max_instances,
            max_log_bytes: args.max_log_mb * 1024 * 1024,
            cgroups: args.cgroups == "auto",
            bridge: warden_agent::sandbox::bridge::BridgeConfig {
                name: args.bridge.clone(),
                network: args.bridge_cidr.0,
                prefix: args.bridge_cidr.1,
            },
        },
    )
    .await
    .context("cannot start the agent")?;
    let mut gw_config = warden_gateway::GatewayConfig::new(args.listen);
    gw_config.session_ttl = Duration::from_secs(args.session_ttl_secs);
    gw_config.max_connections = args.max_connections;
    gw_config.header_timeout = Duration::from_millis(args.header_timeout_ms.max(1));
    gw_config.upstream_timeout = Duration::from_millis(args.upstream_timeout_ms.max(1));
    gw_config.tls = tls_settings(&args)?;
    let gateway = warden_gateway::Gateway::bind(gw_config, store.clone(), agent.clone())
        .await
        .context("cannot start the gateway")?;
    let api_listener = tokio::net::TcpListener::bind(args.api_listen)
        .await
        .with_context(|| format!("cannot listen for the API on {}", args.api_listen))?;
    let gateway_addr = gateway.local_addr()?;
    let tls_addr = gateway.tls_addr();
    let api_addr = api_listener.local_addr()?;

    let (stop_tx, stop_rx) = watch::channel(false);
    let sync = gateway.view_sync();
    let metrics = gateway.metrics();
    let agent_metrics = agent.clone();
    let api = warden_api::Api::new(store.clone(), Some(agent.clone()), &token)
        .with_sync(Arc::new(move |key, rev| {
            let sync = sync.clone();
            Box::pin(async move { sync.caught_up(&key, rev).await })
        }))
        .with_metrics(Arc::new(move || {
            metrics.render() + &agent_metrics.render_metrics()
        }));
    let gateway_task = tokio::spawn(gateway.serve(stop_rx.clone()));
    let api_task = tokio::spawn(warden_api::serve(api_listener, api, stop_rx));

    let mut ep = serde_json::json!({ "gateway": format!("http://{gateway_addr}"), "api": format!("http://{api_addr}") });
    if let Some(a) = tls_addr {
        ep["tls"] = format!("https://{a}").into();
    }
    files::write_private(&endpoints, ep.to_string().as_bytes())?;
    welcome(
        dir,
        &args.store,
        &node,
        gateway_addr,
        tls_addr,
        api_addr,
        demo_users.as_deref(),
    );
    tracing::info!(%gateway_addr, %api_addr, node = %node, "warden is up");

    shutdown_signal().await;
    tracing::info!("stopping: no new requests, stopping instances");
    let _ = stop_tx.send(true);
    agent.shutdown().await;
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let _ = gateway_task.await;
        let _ = api_task.await;
    })
    .await;
    let _ = std::fs::remove_file(&endpoints);
    Ok(())
}

fn welcome(
    dir: &Path,
    store: &str,
    node: &str,
    gw: SocketAddr,
    tls: Option<SocketAddr>,
    api: SocketAddr,
    users: Option<&[demo::DemoUser]>,
) {
    println!(
        "warden is up (node {node}, {store} store in {})",
        dir.display()
    );
    println!("  gateway      http://{gw}/apps/<app>/");
    if let Some(t) = tls {
        println!("  gateway TLS  https://{t}/apps/<app>/");
    }
    println!("  api          http://{api}/v1/   (OpenAPI: /v1/openapi.json)");
    println!("  admin token  {}", dir.join("admin-token").display());
    if let Some(users) = users {
        println!("  demo users   {}", dir.join("demo-users.json").display());
        for u in users {
            println!(
                "    {:<6} {:<13} groups: {}",
                u.name,
                u.clearance,
                if u.groups.is_empty() {
                    "-".into()
                } else {
                    u.groups.join(",")
                }
            );
        }
        if let Some(a) = users.first() {
            println!("try:");
            println!("  curl -u {}:{} http://{gw}/apps/demo/", a.name, a.password);
            let cert = dir.join("tls").join("demo-cert.pem");
            if let (Some(t), true) = (tls, cert.exists()) {
                println!(
                    "  curl --cacert {} -u {}:{} https://localhost:{}/apps/demo/",
                    cert.display(),
                    a.name,
                    a.password,
                    t.port()
                );
            }
        }
    }
    println!("stop with Ctrl-C; instances stop with warden.");
}

fn parse_bridge_name(s: &str) -> Result<String, String> {
    warden_agent::sandbox::bridge::BridgeConfig::validate_name(s).map(|()| s.to_owned())
}
