//! `warden up`: the roles the settings name, in one process, against one store.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;
use warden_core::identity::IdentityKey;
use warden_core::Instances;

use crate::config::types::Role;
use crate::config::{Config, UpArgs};
use crate::{cluster, demo, files, no_agent};

mod api;
pub(crate) mod audit;
mod declassified;
mod oidc;
mod sources;
mod tls;

fn gateway_config(
    cfg: &Config,
    identity: &IdentityKey,
    cluster_identity: Option<&str>,
) -> anyhow::Result<warden_gateway::GatewayConfig> {
    Ok(warden_gateway::GatewayConfig {
        listen: cfg.listen,
        session_ttl: cfg.session_ttl.0,
        max_connections: fit_to_descriptors(cfg.max_connections),
        max_body_bytes: cfg.max_body_bytes,
        max_header_bytes: cfg.max_header_bytes,
        header_timeout: cfg.header_timeout.0,
        upstream_timeout: cfg.upstream_timeout.0,
        auth: cfg.auth(),
        tls: tls::settings(cfg)?,
        identity: identity.clone(),
        private: warden_gateway::PrivateData::data_dir(&cfg.data_dir),
        peers: None,
        audit_flush: Duration::from_millis(cfg.audit_flush_ms),
        csrf_key: crate::keys::csrf_key(&cfg.data_dir, cluster_identity)?,
        providers: Vec::new(),
        oidc: None,
    })
}

/// A data dir that was set up before (it has an admin token or an identity key) whose store file is missing or
/// empty has lost its state: starting afresh would silently drop every app and user.
fn refuse_lost_store(dir: &Path) -> anyhow::Result<()> {
    let file = dir.join("store.redb");
    if !dir.join("admin-token").exists() && !dir.join("identity-key").exists() {
        return Ok(());
    }
    let lost = match std::fs::metadata(&file) {
        Ok(m) if m.len() == 0 => "is empty",
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "is missing",
        Err(e) => {
            return Err(e).with_context(|| format!("cannot read {}", file.display()));
        }
    };
    anyhow::bail!(
        "the store file {} {lost}, but this data dir was set up before (it has an admin token or identity key): its apps and users would be lost. Restore the store from a backup (`warden store restore BACKUP --data-dir {}`), or move the data dir away to start afresh",
        file.display(),
        dir.display()
    )
}

/// `max` client connections, or fewer if the process's descriptor limit cannot hold them: each
/// takes one descriptor, and the limit must leave room for connections to instances, their
/// logs, the store and the listeners. Says so when it lowers the limit.
fn fit_to_descriptors(max: usize) -> usize {
    let Ok((soft, _)) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
    else {
        return max;
    };
    let soft = usize::try_from(soft).unwrap_or(usize::MAX);
    // Headroom: an eighth of the limit, and at least 256.
    let headroom = (soft / 8).max(256);
    let fits = soft.saturating_sub(headroom).max(16);
    if max <= fits {
        return max;
    }
    tracing::warn!(
        max_connections = max,
        open_file_limit = soft,
        lowered_to = fits,
        "--max-connections does not fit the open-file limit with room for instances, logs and the store; raise the limit (ulimit -n, systemd LimitNOFILE=) to allow more"
    );
    fits
}

/// The node's identity key, made on first start (`identity-key`, mode 0600). Every gateway
/// that forwards to this node's instances must hold the same key.
fn identity_key(dir: &Path) -> anyhow::Result<IdentityKey> {
    let path = dir.join("identity-key");
    let text = files::load_or_create(&path, warden_core::id::secret_token)?;
    IdentityKey::from_hex(&text).with_context(|| {
        format!(
            "{} is damaged; remove it and start warden again to make a new one",
            path.display()
        )
    })
}

/// The key this warden seals backups under (`backup-key`, mode 0600), made on first start. The
/// operator keeps a copy with the backups: `warden store restore` needs it to trust one.
fn backup_key(dir: &Path) -> anyhow::Result<String> {
    files::load_or_create(&dir.join(BACKUP_KEY_FILE), warden_core::id::secret_token)
}

/// The file in the data dir that holds the backup key.
pub const BACKUP_KEY_FILE: &str = "backup-key";

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

/// Where the running roles listen, for `endpoints.json` and the welcome text.
#[derive(Default)]
struct Endpoints {
    gateway: Option<SocketAddr>,
    tls: Option<SocketAddr>,
    api: Option<SocketAddr>,
}

/// Runs until SIGINT or SIGTERM, then stops every instance before returning.
pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    let cfg = args.into_config()?;
    warden_sandbox::spawn::raise_open_file_limit();
    let dir = &cfg.data_dir;
    files::ensure_data_dir(dir)?;
    let endpoints_file = dir.join("endpoints.json");
    let _ = std::fs::remove_file(&endpoints_file);
    let backend = cfg.store_backend();
    let clustered = matches!(backend, warden_store::Backend::Etcd(_));
    if !clustered {
        refuse_lost_store(dir)?;
    }
    let store = warden_store::open(&backend, dir)
        .await
        .with_context(|| format!("cannot open the store {backend}"))?;
    let joined = match clustered {
        true => Some(cluster::join(&*store, dir, cfg.join_token_file.as_deref()).await?),
        false => {
            files::protect_store_file(dir)?;
            None
        }
    };
    let token = api::admin_token(&cfg, &*store).await?;
    let node = match &cfg.node_name {
        Some(name) => name.clone(),
        None => files::load_or_create(&dir.join("node-id"), warden_core::id::short_id)?,
    };
    let identity = identity_key(dir)?;

    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = Vec::new();
    // Before every role, so each records from its first request.
    let audit_log = match cfg.audit {
        crate::config::AuditMode::On | crate::config::AuditMode::Required => {
            let secrets = joined.as_ref().map(|j| &j.secrets);
            Some(audit::open(&cfg, &node, &store, secrets)?)
        }
        crate::config::AuditMode::Off => None,
    };
    let audit: Arc<dyn warden_core::audit::Audit> = match &audit_log {
        Some(log) => {
            tasks.push(tokio::spawn(log.anchor_task(stop_rx.clone())));
            log.clone()
        }
        None => Arc::new(warden_core::audit::NoAudit),
    };
    let data = match crate::data::open(&cfg, joined.as_ref().map(|j| &j.secrets)).await? {
        Ok(d) => {
            tasks.push(tokio::spawn(crate::data::follow_lattice(
                store.clone(),
                d.clone(),
                stop_rx.clone(),
            )));
            Ok(d)
        }
        Err(why) => Err(why),
    };
    if let (Ok(d), true) = (&data, audit.kept()) {
        tasks.push(tokio::spawn(declassified::follow(
            store.clone(),
            d.clone(),
            audit.clone(),
            Duration::from_millis(cfg.audit_flush_ms),
            stop_rx.clone(),
        )));
    }
    // After the data server: the demo app gets data where the node has it.
    let demo_users = if cfg.demo {
        let data = data.as_ref().ok().map(|d| &**d);
        Some(demo::setup(&*store, dir, cfg.argon2_cost(), clustered, data).await?)
    } else {
        None
    };
    let data_plane = data
        .as_ref()
        .ok()
        .map(|d| d.clone() as Arc<dyn warden_core::data::DataPlane>);
    let sources = sources::sources(
        &cfg,
        data_plane.clone(),
        &store,
        joined.as_ref(),
        &node,
        &identity,
        &audit,
        &stop_rx,
        &mut tasks,
    )
    .await?;
    let (agent, instances) = (sources.agent.clone(), sources.instances.clone());
    // The API's check of identity providers: where a gateway runs, which holds the key.
    let mut oidc_check: Option<Arc<dyn warden_api::routes::oidc_providers::OidcCheck>> = None;
    let gateway = match cfg.runs(Role::Gateway) {
        true => {
            let source: Arc<dyn Instances> = match instances.clone() {
                Some(i) => i,
                None => Arc::new(no_agent::NoAgent),
            };
            let cluster_identity = joined.as_ref().map(|j| j.secrets.identity_key.as_str());
            let mut config = gateway_config(&cfg, &identity, cluster_identity)?;
            config.peers = sources.peers.clone();
            let (o, from_file) = oidc::providers(&cfg, joined.as_ref().map(|j| &j.secrets))?;
            // Providers added through the API join (and leave) while the gateway runs.
            let following =
                oidc::api::follow(store.clone(), o.clone(), from_file.clone(), stop_rx.clone())
                    .await?;
            tasks.push(tokio::spawn(following));
            oidc_check = Some(Arc::new(oidc::api::Checker {
                oidc: o.clone(),
                config: from_file,
            }));
            config.oidc = Some(o);
            // A button per provider on the sign-in page.
            config.providers = config
                .oidc
                .as_ref()
                .map(|o| o.buttons())
                .unwrap_or_default()
                .into_iter()
                .map(|(id, label)| warden_gateway::SignInButton { id, label })
                .collect();
            if let (Some(tls), Some(j)) = (config.tls.as_mut(), &joined) {
                tls.tickets = Some(cluster::shared_tickets(store.clone(), &j.secrets).await?);
            }
            Some(
                warden_gateway::Gateway::bind(config, store.clone(), source, audit.clone())
                    .await
                    .context("cannot start the gateway")?,
            )
        }
        false => None,
    };
    let mut at = Endpoints::default();
    if cfg.runs(Role::Api) || agent.is_some() {
        let mut releases = api::release_api(&cfg, &store, token.as_deref(), &sources)?.with_audit(
            // On a cluster, the API reads and verifies every node's log; records go to this one.
            sources
                .cluster_audit
                .clone()
                .unwrap_or_else(|| audit.clone()),
        );
        if let Some(d) = &data_plane {
            releases = releases.with_data(d.clone());
        }
        if let Some(c) = oidc_check.take() {
            releases = releases.with_oidc(c);
        }
        // Releases an earlier run left unfinished are resumed or failed, and uploads none of
        // them waits for removed, before a new push comes in (through this API or another
        // node's: until then the node port answers that this node is starting).
        warden_api::resume(&releases).await;
        if let Some(made_here) = &sources.node_releases {
            made_here.set(Arc::new(warden_api::NodeReleases::new(releases.clone())));
        }
        if cfg.runs(Role::Api) {
            let identity = joined.as_ref().map(|j| j.secrets.identity_key.as_str());
            let mut releases = releases.with_ui_key(crate::keys::ui_key(&cfg.data_dir, identity)?);
            if let Some(idp) = oidc::operator_providers(&cfg, joined.as_ref().map(|j| &j.secrets))?
            {
                releases = releases.with_identity_providers(idp);
            }
            let (addr, task) = api::serve_api(&cfg, releases, &gateway, &sources, stop_rx).await?;
            at.api = Some(addr);
            tasks.push(task);
        }
    }
    if let Some(g) = gateway {
        at.gateway = Some(g.local_addr()?);
        at.tls = g.tls_addr();
        tasks.push(tokio::spawn(g.serve(stop_tx.subscribe())));
    }

    write_endpoints(&endpoints_file, &at)?;
    let driver = agent.as_ref().map(|a| {
        let (d, why) = a.default_driver();
        let name = match d {
            warden_core::DriverKind::Sandbox => "sandbox",
            warden_core::DriverKind::Process => "process (no isolation)",
        };
        format!("{name}: {why}")
    });
    let data_at = match &data {
        Ok(d) => warden_core::data::DataPlane::describe(&**d),
        Err(why) => why.clone(),
    };
    welcome(
        &cfg,
        &node,
        &at,
        [driver.as_deref(), Some(&data_at)],
        demo_users.as_deref(),
    );
    if let Some(path) = joined.as_ref().and_then(|j| j.made_token.as_ref()) {
        println!(
            "  join token   {} (other nodes: warden up --store {} --join-token-file FILE)",
            path.display(),
            cfg.store
        );
    }
    tracing::info!(node = %node, roles = ?cfg.roles, tls_crypto = crate::CRYPTO, "warden is up");

    shutdown_signal().await;
    if let Some(a) = &agent {
        // Everything still serves meanwhile: the instances leave through their drains.
        a.drain_for_stop().await;
    }
    tracing::info!("stopping: no new requests, stopping instances");
    let _ = stop_tx.send(true);
    if let Some(a) = &agent {
        a.shutdown().await;
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        for t in tasks {
            let _ = t.await;
        }
    })
    .await;
    let _ = std::fs::remove_file(&endpoints_file);
    // Last: what the roles recorded while stopping is in it.
    if let Some(log) = audit_log {
        log.close().await;
    }
    drop(data_plane);
    if let Ok(d) = data {
        d.shutdown().await;
    }
    Ok(())
}

fn write_endpoints(path: &Path, at: &Endpoints) -> anyhow::Result<()> {
    let mut ep = serde_json::json!({});
    if let Some(a) = at.gateway {
        ep["gateway"] = format!("http://{a}").into();
    }
    if let Some(a) = at.tls {
        ep["tls"] = format!("https://{a}").into();
    }
    if let Some(a) = at.api {
        ep["api"] = format!("http://{a}").into();
    }
    files::write_private(path, ep.to_string().as_bytes())
}

fn welcome(
    cfg: &Config,
    node: &str,
    at: &Endpoints,
    [driver, data]: [Option<&str>; 2],
    users: Option<&[demo::DemoUser]>,
) {
    let dir = &cfg.data_dir;
    let roles: Vec<String> = cfg.roles.iter().map(ToString::to_string).collect();
    println!(
        "warden is up (node {node}, {} store in {}, roles {})",
        cfg.store,
        dir.display(),
        roles.join(",")
    );
    if let Some(gw) = at.gateway {
        println!("  gateway      http://{gw}/apps/<app>/");
    }
    if let Some(t) = at.tls {
        println!("  gateway TLS  https://{t}/apps/<app>/");
    }
    if let Some(api) = at.api {
        println!("  api          http://{api}/v1/   (OpenAPI: /v1/openapi.json)");
        match cfg.admin_token {
            crate::config::AdminToken::On => {
                println!("  admin token  {}", dir.join("admin-token").display())
            }
            crate::config::AdminToken::Off => {
                println!("  admin token  off (operators sign in with `warden login`)")
            }
        }
    }
    if let Some(d) = driver {
        println!("  apps run in  {d}");
    }
    if let Some(d) = data {
        println!("  data lives in {d}");
    }
    if let Some(users) = users {
        demo_users(dir, at, users);
    }
    println!("stop with Ctrl-C; instances stop with warden.");
}

fn demo_users(dir: &Path, at: &Endpoints, users: &[demo::DemoUser]) {
    println!("  demo users   {}", dir.join("demo-users.json").display());
    for u in users {
        let groups = if u.groups.is_empty() {
            "-".into()
        } else {
            u.groups.join(",")
        };
        println!("    {:<6} {:<13} groups: {groups}", u.name, u.clearance);
    }
    let (Some(a), Some(gw)) = (users.first(), at.gateway) else {
        return;
    };
    println!("try:");
    println!("  curl -u {}:{} http://{gw}/apps/demo/", a.name, a.password);
    let cert = dir.join("tls").join("demo-cert.pem");
    if let (Some(t), true) = (at.tls, cert.exists()) {
        println!(
            "  curl --cacert {} -u {}:{} https://localhost:{}/apps/demo/",
            cert.display(),
            a.name,
            a.password,
            t.port()
        );
    }
}
