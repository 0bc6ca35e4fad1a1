//! `warden status`: nodes, apps desired against ready per label, what converges or moves,
//! and the gateway's phases.

use std::collections::BTreeMap;

use serde_json::Value;
use warden_api_types::Status;

use crate::{client, nodes, phases, table, w, Output};

pub(crate) async fn status(api: &client::Client, out: &Output) -> anyhow::Result<()> {
    let status: Status = api.call("GET", "/v1/status").await?;
    let gateway = api.text("/metrics").await.map(|t| phases::summary(&t));
    // `--json` shows the status with the gateway's phases beside it.
    let mut v = serde_json::to_value(&status)?;
    if let Some(g) = &gateway {
        v["gateway"] = g.clone();
    }
    out.value(&v, |_| print_status(&status, gateway.as_ref()));
    Ok(())
}

/// `label=count` pairs joined with spaces, or `-` for none.
fn by_label<N: std::fmt::Display>(m: &BTreeMap<String, N>) -> String {
    let text = m
        .iter()
        .map(|(l, n)| format!("{l}={n}"))
        .collect::<Vec<_>>()
        .join(" ");
    if text.is_empty() {
        "-".into()
    } else {
        text
    }
}

fn print_status(v: &Status, gateway: Option<&Value>) {
    println!(
        "nodes: {}   users: {}   store revision: {}",
        v.nodes, v.users, v.revision
    );
    let rows = v.apps.iter().map(|a| {
        vec![
            a.name.clone(),
            by_label(&a.instances),
            by_label(&a.desired),
            by_label(&a.ready),
            by_label(&a.spares),
        ]
    });
    table::print(
        &["APP", "RUNNING BY LABEL", "DESIRED", "KEPT READY", "SPARE"],
        rows,
    );
    if let Some(node) = &v.scheduler {
        println!("scheduler: {node}");
    }
    match &v.data {
        Some(d) => println!("data lives in: {d}"),
        None => println!("data lives in: none (apps cannot have data; install postgresql or start warden with --data)"),
    }
    if let Some(a) = &v.audit {
        println!("audit log: {a}");
    }
    for a in &v.apps {
        for (label, nodes) in &a.placed {
            let want = u64::from(a.desired.get(label).copied().unwrap_or(0));
            let ready = a.ready.get(label).copied().unwrap_or(0) as u64;
            let state = if ready == want {
                "converged"
            } else {
                "converging"
            };
            println!(
                "  {} {label}: {ready}/{want} ready, placed {} ({state})",
                a.name,
                by_label(nodes)
            );
        }
        // Instances requests started are on top of the kept ones: say so, or RUNNING looks
        // like more than was asked for.
        for (label, &running) in &a.instances {
            let kept = a.ready.get(label).copied().unwrap_or(0);
            if running > kept {
                println!(
                    "  {} {label}: {} of {running} running were started by requests, beside the {kept} kept; the app's lifetime ends them",
                    a.name,
                    running - kept
                );
            }
        }
        if a.outdated > 0 {
            println!(
                "  {}: rolling out, {} instance(s) of the old spec still serving",
                a.name, a.outdated
            );
        }
        for m in &a.moving {
            println!(
                "  {} {}: moving {} -> {} ({})",
                a.name,
                m.label,
                m.from,
                m.to,
                w(&m.why)
            );
        }
    }
    if !v.by_node.is_empty() {
        println!();
        let rows = v.by_node.iter().map(|n| {
            let apps: Vec<String> = n
                .instances
                .iter()
                .map(|(app, labels)| format!("{app}: {}", by_label(labels)))
                .collect();
            let name = if n.draining {
                let left = n.instances.values().flat_map(|l| l.values()).sum();
                format!("{} ({})", n.name, nodes::drain_state(true, left))
            } else {
                n.name.clone()
            };
            vec![
                name,
                n.roles.join(","),
                format!("{:.0}%", n.load * 100.0),
                if apps.is_empty() {
                    "-".into()
                } else {
                    apps.join("; ")
                },
            ]
        });
        table::print(
            &["NODE", "ROLES", "LOAD", "INSTANCES BY APP AND LABEL"],
            rows,
        );
    }
    for a in &v.apps {
        for c in &a.crash_loops {
            let what = if c.health.crash_loop {
                "CRASH LOOP"
            } else {
                "restarting"
            };
            println!();
            // An empty instance is left out of the record's JSON: no instance started.
            let instance = Some(&c.health.last_instance)
                .filter(|i| !i.is_empty())
                .map(|i| format!(" (last instance {i})"))
                .unwrap_or_default();
            println!(
                "{what}: app {} label {} on node {}: {} crashes in a row, last {}{instance}",
                a.name, c.label, c.node, c.health.crashes, c.health.last_exit
            );
            for line in c.health.last_lines.lines() {
                println!("    | {line}");
            }
        }
    }
    for d in &v.damaged {
        println!();
        println!(
            "DAMAGED record {}: {} (skipped everywhere; restore it from a backup, or delete and create it again)",
            d.key, d.reason
        );
    }
    if let Some(g) = gateway.filter(|g| g.is_object()) {
        println!();
        phases::print(g);
    }
}
