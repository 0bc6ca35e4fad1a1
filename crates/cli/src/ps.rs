//! `warden ps APP`: the app's process types (`web` and its Procfile's others) with how many
//! instances each keeps and runs per label.

use warden_api_types::ProcessType;

use crate::client::Client;
use crate::{table, Output};

/// Prints app `app`'s process types.
pub(crate) async fn run(api: &Client, out: &Output, app: &str) -> anyhow::Result<()> {
    let types: Vec<ProcessType> = api.call("GET", &format!("/v1/apps/{app}/ps")).await?;
    out.value(&types, |types| {
        let rows = types.iter().flat_map(|t| {
            let command = t.command.last().cloned().unwrap_or_default();
            let mut rows: Vec<Vec<String>> = t
                .labels
                .iter()
                .map(|l| {
                    vec![
                        t.kind.clone(),
                        l.label.clone(),
                        l.desired.to_string(),
                        l.running.to_string(),
                        command.clone(),
                    ]
                })
                .collect();
            if rows.is_empty() {
                rows.push(vec![
                    t.kind.clone(),
                    "-".into(),
                    "0".into(),
                    "0".into(),
                    command,
                ]);
            }
            rows
        });
        table::print(&["TYPE", "LABEL", "DESIRED", "RUNNING", "COMMAND"], rows);
        if types.iter().any(|t| t.kind != "web") {
            println!(
                "(`warden apps scale {app} TYPE:LABEL=N` keeps N instances of a type at a label)"
            );
        }
    });
    Ok(())
}
