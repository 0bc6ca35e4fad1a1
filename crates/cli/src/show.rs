//! `warden apps show APP`: what an app runs and how it stands, gathered from the spec, its
//! releases, the status and the instance records.

use std::collections::{BTreeMap, BTreeSet};

use warden_api_types::{AppSpec, AppStatus, InstanceRecord, InstanceState, Release, Status};

use crate::client::Client;
use crate::deploy::{describe, when};
use crate::{table, w, Output};

/// `warden apps show APP`: the spec, the release it runs and the last deploy, and per label
/// desired against running, per node.
pub(crate) async fn run(api: &Client, out: &Output, app: &str) -> anyhow::Result<()> {
    let spec: AppSpec = api.call("GET", &format!("/v1/apps/{app}")).await?;
    if out.json {
        let v = serde_json::to_value(&spec)?;
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return Ok(());
    }
    // What cannot be had is shown as nothing rather than failing the whole view.
    let releases: Vec<Release> = api
        .call("GET", &format!("/v1/apps/{app}/releases"))
        .await
        .unwrap_or_default();
    let st: Option<AppStatus> = api
        .call::<Status>("GET", "/v1/status")
        .await
        .ok()
        .and_then(|s| s.apps.into_iter().find(|a| a.name == app));
    println!("app {app}");
    let current = spec.release.as_ref().map(|r| r.number);
    match current.and_then(|n| releases.iter().find(|r| r.number == n)) {
        Some(r) => println!(
            "  release   {} ({}, {}), made {} by {}",
            r.number,
            w(&r.kind),
            describe(&r.source),
            when(r.at_ms),
            r.by
        ),
        None => println!("  release   none (the app runs its command as given)"),
    }
    if let Some(last) = releases.last() {
        if Some(last.number) != current {
            println!(
                "  last deploy  release {} {}: {}",
                last.number,
                w(&last.status),
                last.error
                    .as_deref()
                    .unwrap_or_default()
                    .lines()
                    .next()
                    .unwrap_or("")
            );
        }
    }
    let command = spec.command.join(" ");
    println!(
        "  command   {}",
        Some(command)
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| "none: a static site".into())
    );
    if let Some(dir) = &spec.static_dir {
        println!("  static    {} under {}", dir, spec.static_prefix);
    }
    println!("  hosts     {}", or_dash(&spec.hosts.join(",")));
    println!("  groups    {}", or_dash(&spec.groups.join(",")));
    println!(
        "  lifetime  {}, start {}",
        w(&spec.lifetime),
        w(&spec.start)
    );
    let config: Vec<String> = spec.env.keys().cloned().collect();
    println!("  config    {}", or_dash(&config.join(", ")));
    if spec.data {
        let mark = spec
            .declassify_to
            .as_deref()
            .map_or(String::new(), |l| format!("; a declassifier to {l}"));
        println!("  data      its own database (`warden data show {app}`){mark}");
    }
    // Ready instances per label and node, from the records every node writes.
    let records: Vec<InstanceRecord> = api.call("GET", "/v1/instances").await.unwrap_or_default();
    let mut by_node: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for i in &records {
        if i.app == app && i.state == InstanceState::Ready {
            *by_node
                .entry(i.label.clone())
                .or_default()
                .entry(i.node.clone())
                .or_default() += 1;
        }
    }
    let mut labels: BTreeSet<String> = BTreeSet::new();
    if let Some(st) = &st {
        labels.extend(st.desired.keys().cloned());
        labels.extend(st.instances.keys().cloned());
        labels.extend(st.ready.keys().cloned());
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
            let st = st.as_ref();
            vec![
                l.clone(),
                st.and_then(|st| st.desired.get(l))
                    .map_or("-".into(), |n| n.to_string()),
                by_node
                    .get(l)
                    .map_or(0, |n| n.values().sum::<usize>())
                    .to_string(),
                st.and_then(|st| st.instances.get(l))
                    .map_or(String::new(), |n| n.to_string()),
                or_dash(&nodes.join(" ")),
            ]
        });
        table::print(
            &["LABEL", "DESIRED", "READY", "RUNNING", "READY PER NODE"],
            rows,
        );
    }
    for c in st.iter().flat_map(|st| &st.crash_loops) {
        println!(
            "  {} on {}: {} crash(es), last {}",
            c.label, c.node, c.health.crashes, c.health.last_exit
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
