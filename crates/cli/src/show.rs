//! `warden apps show APP`: what an app runs and how it stands, gathered from the spec, its
//! releases, the status and the instance records.

use serde_json::Value;

use crate::client::Client;
use crate::deploy::{describe, when};
use crate::{s, table, Output};

/// `warden apps show APP`: the spec, the release it runs and the last deploy, and per label
/// desired against running, per node.
pub(crate) async fn run(api: &Client, out: &Output, app: &str) -> anyhow::Result<()> {
    let spec = api.send("GET", &format!("/v1/apps/{app}"), None).await?;
    if out.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&spec).unwrap_or_default()
        );
        return Ok(());
    }
    let releases = api
        .send("GET", &format!("/v1/apps/{app}/releases"), None)
        .await
        .unwrap_or(Value::Null);
    let releases = releases.as_array().cloned().unwrap_or_default();
    let status = api
        .send("GET", "/v1/status", None)
        .await
        .unwrap_or(Value::Null);
    let st = status["apps"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["name"] == app)
        .cloned()
        .unwrap_or(Value::Null);
    println!("app {app}");
    let current = spec["release"]["number"].as_u64();
    match current.and_then(|n| releases.iter().find(|r| r["number"].as_u64() == Some(n))) {
        Some(r) => println!(
            "  release   {} ({}, {}), made {} by {}",
            s(&r["number"]),
            s(&r["kind"]),
            describe(&r["source"]),
            when(r["at_ms"].as_u64().unwrap_or(0)),
            s(&r["by"])
        ),
        None => println!("  release   none (the app runs its command as given)"),
    }
    if let Some(last) = releases.last() {
        if last["number"].as_u64() != current {
            println!(
                "  last deploy  release {} {}: {}",
                s(&last["number"]),
                s(&last["status"]),
                s(&last["error"]).lines().next().unwrap_or("")
            );
        }
    }
    let command = spec["command"]
        .as_array()
        .map(|c| c.iter().map(s).collect::<Vec<_>>().join(" "));
    println!(
        "  command   {}",
        command
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| "none: a static site".into())
    );
    if let Some(dir) = spec["static_dir"].as_str() {
        println!("  static    {} under {}", dir, s(&spec["static_prefix"]));
    }
    println!("  hosts     {}", or_dash(&s(&spec["hosts"])));
    println!("  groups    {}", or_dash(&s(&spec["groups"])));
    println!(
        "  lifetime  {}, start {}",
        s(&spec["lifetime"]),
        s(&spec["start"])
    );
    let config: Vec<String> = spec["env"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, _)| k.clone())
        .collect();
    println!("  config    {}", or_dash(&config.join(", ")));
    // Ready instances per label and node, from the records every node writes.
    let records = api
        .send("GET", "/v1/instances", None)
        .await
        .unwrap_or(Value::Null);
    let mut by_node: std::collections::BTreeMap<String, std::collections::BTreeMap<String, usize>> =
        std::collections::BTreeMap::new();
    for i in records.as_array().into_iter().flatten() {
        if i["app"] == app && i["state"] == "ready" {
            *by_node
                .entry(s(&i["label"]))
                .or_default()
                .entry(s(&i["node"]))
                .or_default() += 1;
        }
    }
    let mut labels: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();
    for key in ["desired", "instances", "ready"] {
        labels.extend(
            st[key]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, _)| k.clone()),
        );
    }
    if labels.is_empty() {
        println!("  no instances run");
    } else {
        let rows = labels.iter().map(|l| {
            let nodes: Vec<String> = by_node
                .get(l)
                .into_iter()
                .flatten()
                .map(|(node, n)| format!("{node}={n}"))
                .collect();
            vec![
                l.clone(),
                st["desired"][l]
                    .as_u64()
                    .map_or("-".into(), |n| n.to_string()),
                by_node
                    .get(l)
                    .map_or(0, |n| n.values().sum::<usize>())
                    .to_string(),
                s(&st["instances"][l]),
                or_dash(&nodes.join(" ")),
            ]
        });
        table::print(
            &["LABEL", "DESIRED", "READY", "RUNNING", "READY PER NODE"],
            rows,
        );
    }
    for c in st["crash_loops"].as_array().into_iter().flatten() {
        println!(
            "  {} on {}: {} crash(es), last {}",
            s(&c["label"]),
            s(&c["node"]),
            s(&c["crashes"]),
            s(&c["last_exit"])
        );
    }
    Ok(())
}

fn or_dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_owned()
    }
}
