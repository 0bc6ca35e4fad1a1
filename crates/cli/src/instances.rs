//! `warden instances list [--all]` and `kill`.

use clap::Subcommand;
use serde_json::{json, Value};

use crate::{client, s, table, Output};

/// `warden instances ...`
#[derive(Debug, Subcommand)]
pub enum InstancesCommand {
    /// List running instances
    List {
        /// Also every app's instances that crashed or failed to start, with how they ended
        #[arg(long)]
        all: bool,
    },
    /// Kill an instance
    Kill {
        /// Instance id
        id: String,
    },
}

pub(crate) async fn run(
    api: &client::Client,
    out: &Output,
    cmd: InstancesCommand,
) -> anyhow::Result<()> {
    match cmd {
        InstancesCommand::List { all } => {
            let mut v = api.send("GET", "/v1/instances", None).await?;
            let failed = if all {
                failed_instances(api).await?
            } else {
                Vec::new()
            };
            if out.json {
                if all {
                    v = json!({ "running": v, "failed": failed });
                }
                out.value(&v, |_| {});
                return Ok(());
            }
            let rows = v.as_array().into_iter().flatten().map(|i| {
                vec![
                    s(&i["id"]),
                    s(&i["app"]),
                    s(&i["label"]),
                    s(&i["state"]),
                    s(&i["node"]),
                    s(&i["addr"]),
                    s(&i["pid"]),
                ]
            });
            table::print(
                &["ID", "APP", "LABEL", "STATE", "NODE", "ADDR", "PID"],
                rows,
            );
            if all && !failed.is_empty() {
                println!();
                let rows = failed.iter().map(|f| {
                    vec![
                        f["instance"]
                            .as_str()
                            .filter(|i| !i.is_empty())
                            .unwrap_or("(no start)")
                            .to_owned(),
                        s(&f["app"]),
                        s(&f["label"]),
                        s(&f["state"]),
                        s(&f["node"]),
                        s(&f["last_exit"]),
                    ]
                });
                table::print(
                    &["FAILED", "APP", "LABEL", "STATE", "NODE", "HOW IT ENDED"],
                    rows,
                );
                for f in &failed {
                    let tail = s(&f["last_lines"]);
                    if !tail.trim().is_empty() {
                        println!(
                            "\n{} of {} ({}), last lines:",
                            f["instance"]
                                .as_str()
                                .filter(|i| !i.is_empty())
                                .unwrap_or("a start"),
                            s(&f["app"]),
                            s(&f["label"])
                        );
                        for line in tail.lines() {
                            println!("  {line}");
                        }
                    }
                }
            }
        }
        InstancesCommand::Kill { id } => {
            api.send("DELETE", &format!("/v1/instances/{id}"), None)
                .await?;
            out.done(format!("instance {id} killed"));
        }
    }
    Ok(())
}

/// Every app's instances that crashed or failed to start, as the nodes' health records say.
async fn failed_instances(api: &client::Client) -> anyhow::Result<Vec<Value>> {
    let status = api.send("GET", "/v1/status", None).await?;
    let mut out = Vec::new();
    for app in status["apps"].as_array().into_iter().flatten() {
        for c in app["crash_loops"].as_array().into_iter().flatten() {
            // The health record's fields, flattened into the report.
            let state = if c["crash_loop"] == true {
                "crash loop"
            } else {
                "crashed"
            };
            out.push(json!({
                "instance": c["last_instance"],
                "app": app["name"],
                "label": c["label"],
                "node": c["node"],
                "state": format!("{state} ({} in a row)", s(&c["crashes"])),
                "last_exit": c["last_exit"],
                "last_lines": c["last_lines"],
            }));
        }
    }
    Ok(out)
}
