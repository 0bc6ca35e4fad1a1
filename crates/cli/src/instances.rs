//! `warden instances list [--all]` and `kill`.

use clap::Subcommand;
use serde_json::json;
use warden_api_types::{InstanceRecord, Status};

use crate::{client, table, w, Output};

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
            let running: Vec<InstanceRecord> = api.call("GET", "/v1/instances").await?;
            let failed = if all {
                failed_instances(api).await?
            } else {
                Vec::new()
            };
            if out.json {
                let v = if all {
                    json!({ "running": running, "failed": failed })
                } else {
                    serde_json::to_value(&running)?
                };
                out.value(&v, |_| {});
                return Ok(());
            }
            let rows = running.iter().map(|i| {
                vec![
                    i.id.clone(),
                    i.app.clone(),
                    i.label.clone(),
                    w(&i.state),
                    i.node.clone(),
                    i.addr.to_string(),
                    i.pid.to_string(),
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
                        f.instance.as_deref().unwrap_or("(no start)").to_owned(),
                        f.app.clone(),
                        f.label.clone(),
                        f.state.clone(),
                        f.node.clone(),
                        f.last_exit.clone(),
                    ]
                });
                table::print(
                    &["FAILED", "APP", "LABEL", "STATE", "NODE", "HOW IT ENDED"],
                    rows,
                );
                for f in &failed {
                    if !f.last_lines.trim().is_empty() {
                        println!(
                            "\n{} of {} ({}), last lines:",
                            f.instance.as_deref().unwrap_or("a start"),
                            f.app,
                            f.label
                        );
                        for line in f.last_lines.lines() {
                            println!("  {line}");
                        }
                    }
                }
            }
        }
        InstancesCommand::Kill { id } => {
            api.act("DELETE", &format!("/v1/instances/{id}")).await?;
            out.done(format!("instance {id} killed"));
        }
    }
    Ok(())
}

/// An instance that crashed or failed to start, as `instances list --all` shows it. Its
/// fields are in alphabetical order, as `--json` has always printed them.
#[derive(serde::Serialize)]
struct Failed {
    app: String,
    /// None when no instance started.
    instance: Option<String>,
    label: String,
    last_exit: String,
    last_lines: String,
    node: String,
    state: String,
}

/// Every app's instances that crashed or failed to start, as the nodes' health records say.
async fn failed_instances(api: &client::Client) -> anyhow::Result<Vec<Failed>> {
    let status: Status = api.call("GET", "/v1/status").await?;
    let mut out = Vec::new();
    for app in &status.apps {
        for c in &app.crash_loops {
            let state = if c.health.crash_loop {
                "crash loop"
            } else {
                "crashed"
            };
            out.push(Failed {
                instance: Some(c.health.last_instance.clone()).filter(|i| !i.is_empty()),
                app: app.name.clone(),
                label: c.label.clone(),
                node: c.node.clone(),
                state: format!("{state} ({} in a row)", c.health.crashes),
                last_exit: c.health.last_exit.clone(),
                last_lines: c.health.last_lines.clone(),
            });
        }
    }
    Ok(out)
}
