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
    token: &str,
    m: &Sources,
) -> anyhow::Result<warden_api::Api> {
    let mut api =
        warden_api::Api::new(store.clone(), m.instances.clone(), token, cfg.argon2_cost())
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
