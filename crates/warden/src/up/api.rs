//! The API's state: the part every node that makes releases needs (an agent node makes them
//! for the API of another node too, whether or not it serves the API itself), and the HTTP
//! API served on it.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::sync::watch;

use super::backup_key;
use super::sources::Sources;
use crate::config::Config;

/// The API's state as releases need it: this node's builds if it runs the agent, else (on a
/// cluster) the agent nodes that build.
pub(super) fn release_api(
    cfg: &Config,
    store: &Arc<dyn warden_store::Store>,
    token: Option<&str>,
    m: &Sources,
) -> anyhow::Result<warden_api::Api> {
    let mut api =
        warden_api::Api::new(store.clone(), m.instances.clone(), token, cfg.argon2_cost())
            .with_session_ttl(cfg.operator_session_ttl.0)
            .with_ui_origin(cfg.ui_origin.as_deref())
            .protecting(cfg.data_dir.clone())
            .with_backup_key(&backup_key(&cfg.data_dir)?);
    let max = cfg.max_upload_mb * 1024 * 1024;
    if let Some(agent) = &m.agent {
        let builder = agent.builder(cfg.build_timeout.0, max * 4);
        api = api.with_builds(Arc::new(builder), max, agent.node());
    } else {
        // Uploads an earlier run with the agent left: nothing here will ever build them.
        let _ = std::fs::remove_dir_all(cfg.data_dir.join("uploads"));
        if let Some(forwarder) = &m.forwarder {
            api = api.with_remote_releases(forwarder.clone(), max);
        }
    }
    Ok(api)
}

/// The break-glass admin token: made on first start and kept in `DATA_DIR/admin-token`, or,
/// with `admin_token = "off"`, `None` and no such file (one left from before is removed, so a
/// copy of it opens nothing). Off is refused while no owner operator exists: nobody could
/// change anything, nor make the first owner.
pub(super) async fn admin_token(
    cfg: &Config,
    store: &dyn warden_store::Store,
) -> anyhow::Result<Option<String>> {
    let path = cfg.data_dir.join("admin-token");
    if cfg.admin_token == crate::config::AdminToken::On {
        return Ok(Some(crate::files::load_or_create(
            &path,
            warden_core::id::secret_token,
        )?));
    }
    let listing = store
        .list(warden_core::keys::OPERATORS)
        .await
        .context("cannot list the operators")?;
    let owner = listing.entries.iter().any(|e| {
        warden_store::decode::<warden_core::OperatorRecord>(&e.key, &e.value)
            .is_ok_and(|o| o.roles.contains(&warden_core::Role::Owner))
    });
    if !owner {
        anyhow::bail!(
            "--admin-token off would leave nobody able to change warden: no operator has the owner role. Start with the admin token on, make an owner (`warden operators add NAME --role owner --password-stdin`), then start again with --admin-token off"
        );
    }
    match std::fs::remove_file(&path) {
        Ok(()) => tracing::info!("the admin token is off; removed {}", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot remove {}", path.display())),
    }
    Ok(None)
}

/// Serves the API (`api`, from [`release_api`]) on `cfg.api_listen` until `stop_rx` turns
/// true; its address and task.
pub(super) async fn serve_api(
    cfg: &Config,
    mut api: warden_api::Api,
    gateway: &Option<warden_gateway::Gateway>,
    m: &Sources,
    stop_rx: watch::Receiver<bool>,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(cfg.api_listen)
        .await
        .with_context(|| format!("cannot listen for the API on {}", cfg.api_listen))?;
    let addr = listener.local_addr()?;
    if let Some(g) = gateway {
        let sync = g.view_sync();
        api = api.with_sync(Arc::new(move |key, rev| {
            let sync = sync.clone();
            Box::pin(async move { sync.caught_up(&key, rev).await })
        }));
    }
    if let Some(g) = gateway {
        api = api.with_requests(g.requests());
    }
    let (gw_metrics, agent_metrics) = (gateway.as_ref().map(|g| g.metrics()), m.agent.clone());
    let (node_port_stats, checker_stats) = (m.node_port_stats.clone(), m.checker_stats.clone());
    let peers = m.peers.clone();
    let audit = api.audit.clone();
    api = api.with_metrics(Arc::new(move || {
        let mut text = gw_metrics.as_ref().map(|m| m.render()).unwrap_or_default();
        text += &super::audit::render(&*audit);
        if let Some(a) = &agent_metrics {
            text += &a.render_metrics();
        }
        if let Some(s) = &node_port_stats {
            text += &s.render();
        }
        if let Some(s) = &checker_stats {
            text += &s.render();
        }
        if let Some(p) = &peers {
            text += &warden_cluster::liveness::render(p);
        }
        text
    }));
    api = api.with_audit_flush(std::time::Duration::from_millis(cfg.audit_flush_ms));
    let limits = warden_api::Limits {
        max_connections: cfg.api_max_connections,
        header_timeout: cfg.api_header_timeout.0,
        idle_timeout: cfg.api_idle_timeout.0,
    };
    let task = tokio::spawn(async move {
        let _ = warden_api::serve(listener, api, limits, stop_rx).await;
    });
    Ok((addr, task))
}
