//! `warden nodes ...`: the cluster's live nodes.

use clap::Subcommand;

use crate::{client, s, table, Output};

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
            let v = api.send("GET", "/v1/nodes", None).await?;
            out.value(&v, |v| {
                let rows = v.as_array().into_iter().flatten().map(|n| {
                    let roles: Vec<String> =
                        n["roles"].as_array().into_iter().flatten().map(s).collect();
                    let pct = |x: &serde_json::Value| {
                        format!("{:.0}%", x.as_f64().unwrap_or(0.0) * 100.0)
                    };
                    vec![
                        s(&n["id"]),
                        roles.join(","),
                        n["advertise"].as_str().unwrap_or("-").to_owned(),
                        s(&n["hostname"]),
                        pct(&n["load"]["cpu_busy"]),
                        pct(&n["load"]["memory_used"]),
                        s(&n["load"]["instances"]),
                        if n["draining"].as_bool() == Some(true) {
                            "draining".to_owned()
                        } else {
                            "ready".to_owned()
                        },
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
            api.send("POST", &format!("/v1/nodes/{name}/drain{query}"), None)
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
            api.send("DELETE", &format!("/v1/nodes/{name}/drain"), None)
                .await?;
            out.done(format!("node {name} takes instances again"));
        }
    }
    Ok(())
}

/// Waits until `name` runs no instance, or fails after `limit`.
async fn wait_empty(
    api: &client::Client,
    name: &str,
    limit: std::time::Duration,
) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let v = api.send("GET", "/v1/nodes", None).await?;
        let Some(node) = v
            .as_array()
            .into_iter()
            .flatten()
            .find(|n| n["id"].as_str() == Some(name))
        else {
            // Stopped meanwhile (its instances stop with it), or never running.
            return Ok(());
        };
        let left = node["load"]["instances"].as_u64().unwrap_or(0);
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
