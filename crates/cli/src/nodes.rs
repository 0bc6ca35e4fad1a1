//! `warden nodes ...`: the cluster's live nodes.

use clap::Subcommand;

use warden_api_types::{InstanceRecord, NodeRecord};

use crate::{client, table, Output};

/// `warden nodes ...`
#[derive(Debug, Subcommand)]
pub enum NodesCommand {
    /// List live nodes: roles, address, load and instances
    List,
    /// Move every instance off a node, with no failed request, and place nothing new there
    /// until undrained
    Drain {
        /// Node name
        name: String,
        /// Wait until the node runs no instance (at most this many seconds)
        #[arg(long, value_name = "SECONDS")]
        wait: Option<u64>,
        /// Drain a node that is not running yet (it starts drained)
        #[arg(long)]
        ahead: bool,
    },
    /// Let a drained node take instances again
    Undrain {
        /// Node name
        name: String,
    },
}

pub(crate) async fn run(
    api: &client::Client,
    out: &Output,
    cmd: NodesCommand,
) -> anyhow::Result<()> {
    match cmd {
        NodesCommand::List => {
            let nodes: Vec<NodeRecord> = api.call("GET", "/v1/nodes").await?;
            out.value(&nodes, |nodes| {
                let rows = nodes.iter().map(|n| {
                    let pct = |x: f64| format!("{:.0}%", x * 100.0);
                    vec![
                        n.id.clone(),
                        n.roles.join(","),
                        n.advertise.as_deref().unwrap_or("-").to_owned(),
                        n.hostname.clone(),
                        pct(n.load.cpu_busy),
                        pct(n.load.memory_used),
                        n.load.instances.to_string(),
                        drain_state(n.draining, n.load.instances as usize),
                    ]
                });
                table::print(
                    &[
                        "NAME",
                        "ROLES",
                        "NODE PORT",
                        "HOST",
                        "CPU",
                        "MEMORY",
                        "INSTANCES",
                        "STATE",
                    ],
                    rows,
                );
            });
        }
        NodesCommand::Drain { name, wait, ahead } => {
            let query = if ahead { "?ahead=true" } else { "" };
            api.act("POST", &format!("/v1/nodes/{name}/drain{query}"))
                .await?;
            if let Some(secs) = wait {
                wait_empty(api, &name, std::time::Duration::from_secs(secs)).await?;
                out.done(format!("node {name} is drained and runs no instance"));
            } else {
                out.done(format!(
                    "node {name} is draining: its instances move to other nodes (`warden status` shows them go)"
                ));
            }
        }
        NodesCommand::Undrain { name } => {
            api.act("DELETE", &format!("/v1/nodes/{name}/drain"))
                .await?;
            out.done(format!("node {name} takes instances again"));
        }
    }
    Ok(())
}

/// Waits until `name` runs no instance, or fails after `limit`. Both what the node publishes
/// of its load (each second, so it may not count an instance started since) and the instance
/// records (written behind a start) must say none is left.
async fn wait_empty(
    api: &client::Client,
    name: &str,
    limit: std::time::Duration,
) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let nodes: Vec<NodeRecord> = api.call("GET", "/v1/nodes").await?;
        let Some(node) = nodes.iter().find(|n| n.id == name) else {
            // Stopped meanwhile (its instances stop with it), or never running.
            return Ok(());
        };
        let records: Vec<InstanceRecord> = api.call("GET", "/v1/instances").await?;
        let recorded = records.iter().filter(|r| r.node == name).count();
        let recorded = u32::try_from(recorded).unwrap_or(u32::MAX);
        let left = node.load.instances.max(recorded);
        if left == 0 {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            anyhow::bail!(
                "node {name} still runs {left} instances after {}s; it keeps draining (`warden status` shows what is moving)",
                limit.as_secs()
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

/// A node's state as the lists show it: a drain that has moved every instance away is
/// `drained`, one still moving them says how many are left.
pub(crate) fn drain_state(draining: bool, instances: usize) -> String {
    match (draining, instances) {
        (false, _) => "ready".to_owned(),
        (true, 0) => "drained".to_owned(),
        (true, n) => format!("draining ({n} left)"),
    }
}
