//! `warden nodes ...`: the cluster's live nodes.

use clap::Subcommand;

use crate::{client, s, table, Output};

/// `warden nodes ...`
#[derive(Debug, Subcommand)]
pub enum NodesCommand {
    /// List live nodes: roles, address, load and instances
    List,
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
                    ],
                    rows,
                );
            });
        }
    }
    Ok(())
}
