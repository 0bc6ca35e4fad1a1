//! Where this node's gateway and API get instances: the agent if this node runs one (and the
//! reaper of its instances' processes), and on a cluster the node port every node serves, the
//! instances of every node, the checker, and every node's audit log for the API.

use std::sync::Arc;

use anyhow::Context;
use tokio::sync::watch;
use warden_core::identity::IdentityKey;
use warden_core::InstanceAdmin;

use crate::cluster;
use crate::config::types::{Cgroups, Role};
use crate::config::Config;

/// The agent's end of its reaper's pipe, held for the life of the process: the kernel closes it
/// when the process ends, however it ends, and the reaper then ends what the instances left.
static REAPER: std::sync::OnceLock<std::os::fd::OwnedFd> = std::sync::OnceLock::new();

pub(super) fn role_names(cfg: &Config) -> Vec<String> {
    cfg.roles.iter().map(ToString::to_string).collect()
}

fn agent_config(cfg: &Config, node: &str, identity: &IdentityKey) -> warden_agent::AgentConfig {
    warden_agent::AgentConfig {
        node: node.to_owned(),
        roles: role_names(cfg),
        advertise: None,
        log_dir: cfg.data_dir.join("logs"),
        instance_dir: cfg.data_dir.join("instances"),
        slug_dir: cfg.data_dir.join("slugs"),
        lease_ttl: cfg.node_lease_ttl.0,
        max_instances: cfg.max_instances,
        max_log_bytes: cfg.max_log_mb * 1024 * 1024,
        cgroups: cfg.cgroups == Cgroups::Auto,
        bridge: warden_sandbox::bridge::BridgeConfig {
            name: cfg.bridge.0.clone(),
            network: cfg.bridge_cidr.0,
            prefix: cfg.bridge_cidr.1,
        },
        identity: identity.clone(),
        start_margin: cfg.start_margin,
        shed_margin: cfg.shed_margin,
        load_file: cfg.load_file.clone(),
        data: None,
    }
}

/// Where this node's gateway and API get instances, with what runs beside them.
pub(super) struct Sources {
    pub(super) agent: Option<warden_agent::Agent>,
    pub(super) instances: Option<Arc<dyn InstanceAdmin>>,
    pub(super) node_port_stats: Option<Arc<warden_cluster::NodePortStats>>,
    pub(super) checker_stats: Option<Arc<warden_cluster::CheckerStats>>,
    /// On a cluster, which other nodes answer this one.
    pub(super) peers: Option<Arc<warden_core::Peers>>,
    /// On an agent node of a cluster, the releases its node port makes for other nodes (set
    /// once the API's state is made).
    pub(super) node_releases: Option<Arc<warden_core::LocalReleases>>,
    /// On a cluster node without the agent, where its API has releases made.
    pub(super) forwarder: Option<Arc<dyn warden_core::Releases>>,
    /// On a cluster, every node's audit log, for the API to read and verify.
    pub(super) cluster_audit: Option<Arc<dyn warden_core::audit::Audit>>,
}

/// Starts the agent if this node runs one and, on a cluster, the node port, the instances of
/// every node, and the checker if this node runs it.
#[allow(clippy::too_many_arguments)]
pub(super) async fn sources(
    cfg: &Config,
    data: Option<Arc<dyn warden_core::data::DataPlane>>,
    store: &Arc<dyn warden_store::Store>,
    joined: Option<&cluster::Joined>,
    node: &str,
    identity: &IdentityKey,
    audit: &Arc<dyn warden_core::audit::Audit>,
    stop_rx: &watch::Receiver<bool>,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) -> anyhow::Result<Sources> {
    // On a cluster every node serves a node port: an agent node its instances, and every node
    // its audit log to the others' APIs (a gateway-only node's log holds the sign-ins and
    // accesses it decided, and must be read and verified with the rest).
    let node_port = match joined.is_some() {
        true => Some(cluster::bind_node_port(cfg.advertise()).await?),
        false => None,
    };
    let advertise = node_port.as_ref().map(|p| p.advertise.to_string());
    let agent = match cfg.runs(Role::Agent) {
        true => {
            let mut config = agent_config(cfg, node, identity);
            config.data = data;
            config.advertise = advertise.clone();
            let instance_dir = config.instance_dir.clone();
            let agent = warden_agent::Agent::start(store.clone(), config)
                .await
                .context("cannot start the agent")?;
            // Whatever kills this process, its instances' own processes die soon after.
            match warden_sandbox::leftovers::start_reaper(&instance_dir) {
                Ok(pipe) => {
                    let _ = REAPER.set(pipe);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start the reaper: if warden is killed, its instances' own child processes live on until it starts again")
                }
            }
            Some(agent)
        }
        false => None,
    };
    let local: Option<Arc<dyn InstanceAdmin>> =
        agent.clone().map(|a| Arc::new(a) as Arc<dyn InstanceAdmin>);
    let (mut node_port_stats, mut checker_stats, mut peers) = (None, None, None);
    let (mut node_releases, mut forwarder, mut cluster_audit) = (None, None, None);
    let instances = match joined {
        Some(j) => {
            let made_here = agent
                .as_ref()
                .map(|_| Arc::new(warden_core::LocalReleases::default()));
            let wired = cluster::instances(
                store.clone(),
                &j.secrets,
                node,
                local,
                node_port,
                cluster::PortServes {
                    slugs: agent.as_ref().map(|a| a.slug_dir()),
                    releases: made_here
                        .clone()
                        .map(|r| r as Arc<dyn warden_core::Releases>),
                    audit: audit.clone(),
                },
                stop_rx.clone(),
            )
            .await?;
            node_releases = made_here;
            if agent.is_none() {
                // Releases are made where the build runs: on an agent node.
                forwarder = Some(Arc::new(warden_cluster::ReleaseForwarder::new(
                    node.to_owned(),
                    wired.client.clone(),
                    wired.directory.clone(),
                    wired.peers.clone(),
                )) as Arc<dyn warden_core::Releases>);
            }
            tasks.extend(wired.served);
            if let Some(a) = &agent {
                // Releases built on another node come from there.
                a.set_slug_source(Arc::new(warden_cluster::SlugFetcher::new(
                    wired.client.clone(),
                    wired.directory.clone(),
                    node.to_owned(),
                )));
            }
            if audit.kept() {
                cluster_audit = Some(Arc::new(warden_cluster::ClusterAudit::new(
                    node.to_owned(),
                    audit.clone(),
                    wired.client.clone(),
                    wired.directory.clone(),
                    store.clone(),
                )) as Arc<dyn warden_core::audit::Audit>);
                tasks.push(tokio::spawn(warden_cluster::watch_nodes(
                    node.to_owned(),
                    wired.directory.clone(),
                    audit.clone(),
                    stop_rx.clone(),
                )));
            }
            node_port_stats = Some(wired.stats);
            peers = Some(wired.peers);
            if cfg.runs(Role::Checker) {
                let stats = Arc::new(warden_cluster::CheckerStats::default());
                checker_stats = Some(stats.clone());
                let checker = warden_cluster::Checker::new(
                    store.clone(),
                    wired.client,
                    wired.directory,
                    stats,
                );
                tasks.push(tokio::spawn(checker.run(stop_rx.clone())));
            }
            Some(wired.instances)
        }
        None => local,
    };
    if agent.is_none() {
        // A node without the agent still registers, so the cluster knows its roles.
        let info = warden_cluster::node::NodeInfo {
            id: node.to_owned(),
            roles: role_names(cfg),
            advertise,
            ..Default::default()
        };
        let me = warden_cluster::node::Node::register(store.clone(), info, cfg.node_lease_ttl.0)
            .await
            .context("cannot register the node")?;
        me.publish(0).await.context("cannot register the node")?;
        tasks.push(tokio::spawn(warden_cluster::node::heartbeat(
            Arc::new(me),
            stop_rx.clone(),
        )));
    }
    Ok(Sources {
        agent,
        instances,
        node_port_stats,
        checker_stats,
        peers,
        node_releases,
        forwarder,
        cluster_audit,
    })
}
