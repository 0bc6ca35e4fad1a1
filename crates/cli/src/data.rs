//! `warden data ...`: what apps' databases hold.

use clap::Subcommand;
use warden_api_types::AppData;

use crate::{client, table, Output};

/// `warden data ...`
#[derive(Debug, Subcommand)]
pub enum DataCommand {
    /// Show an app's database: its size, each table's rows per label, and the rows a
    /// declassifier wrote below its label
    Show {
        /// App name (an app created with --data)
        app: String,
    },
}

/// Runs `warden data ...`.
pub(crate) async fn run(
    api: &client::Client,
    out: &Output,
    cmd: DataCommand,
) -> anyhow::Result<()> {
    match cmd {
        DataCommand::Show { app } => {
            let shown: AppData = api.call("GET", &format!("/v1/apps/{app}/data")).await?;
            out.value(&shown, |d| print!("{}", render(&app, d)));
        }
    }
    Ok(())
}

/// The table people read: one row per (table, label).
fn render(app: &str, d: &AppData) -> String {
    let mut text = format!("app {app}: database of {}\n", size(d.size_bytes));
    match &d.declassify_to {
        Some(l) => {
            text += &format!(
                "declassifier to {l}: {} rows written down\n",
                d.declassified_writes
            )
        }
        None => {
            text += &format!(
                "not a declassifier; {} rows written down\n",
                d.declassified_writes
            )
        }
    }
    if d.tables.is_empty() {
        text += "no labelled tables yet (a release migration makes them)\n";
        return text;
    }
    let rows = d.tables.iter().flat_map(|t| {
        let labels: Vec<Vec<String>> = t
            .rows_per_label
            .iter()
            .map(|(l, n)| vec![t.name.clone(), l.clone(), n.to_string()])
            .collect();
        if labels.is_empty() {
            vec![vec![t.name.clone(), "-".into(), "0".into()]]
        } else {
            labels
        }
    });
    text += &table::render(&["TABLE", "LABEL", "ROWS"], rows);
    text
}

/// Bytes for people: B, or KiB, MiB or GiB with one decimal.
fn size(bytes: i64) -> String {
    const UNITS: [(&str, f64); 3] = [
        ("GiB", 1_073_741_824.0),
        ("MiB", 1_048_576.0),
        ("KiB", 1024.0),
    ];
    let b = bytes as f64;
    UNITS.iter().find(|(_, n)| b >= *n).map_or_else(
        || format!("{bytes} B"),
        |(u, n)| format!("{:.1} {u}", b / n),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_api_types::TableRows;

    #[test]
    fn rows_per_label_are_one_line_each() {
        let d = AppData {
            size_bytes: 8 * 1_048_576,
            tables: vec![
                TableRows {
                    name: "notes".into(),
                    rows_per_label: [("SECRET".into(), 2), ("UNCLASSIFIED".into(), 1)].into(),
                },
                TableRows {
                    name: "empty".into(),
                    rows_per_label: Default::default(),
                },
            ],
            declassify_to: Some("UNCLASSIFIED".into()),
            declassified_writes: 1,
        };
        assert_eq!(
            render("stats", &d),
            "app stats: database of 8.0 MiB\n\
             declassifier to UNCLASSIFIED: 1 rows written down\n\
             TABLE  LABEL         ROWS\n\
             notes  SECRET        2\n\
             notes  UNCLASSIFIED  1\n\
             empty  -             0\n"
        );
    }
}
