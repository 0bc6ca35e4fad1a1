//! `warden audit`: this node's audit log, filtered, once or following; `audit verify`;
//! `audit export` as JSON lines for a SIEM.

use std::io::Write;
use std::time::Duration;

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{bail, Context};
use warden_api_types::{AuditEvent, AuditQuery, AuditRecord, NodeRecord, Verified};

use crate::client::Client;
use crate::logs::query_value;
use crate::Output;

/// Which records (every filter narrows).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Filter {
    /// Only records of this node's log (on a cluster; by default every live node's)
    #[arg(long)]
    pub node: Option<String>,
    /// Only records about this user
    #[arg(long)]
    pub user: Option<String>,
    /// Only records made by this actor: a change's (operator:NAME, "admin token"), or the user of a sign-in, access or refusal
    #[arg(long)]
    pub actor: Option<String>,
    /// Only records about this app
    #[arg(long)]
    pub app: Option<String>,
    /// Only records touching this label
    #[arg(long)]
    pub label: Option<String>,
    /// Only records of this kind: sign_in, access, refusal, taint, declassified, change, node, gap, pruned
    #[arg(long)]
    pub kind: Option<String>,
    /// Only records since this time: ms since the epoch, or an age such as 30s, 15m, 2h, 7d
    #[arg(long)]
    pub since: Option<String>,
    /// Only records before this time: ms since the epoch, or an age such as 30s, 15m, 2h, 7d
    #[arg(long)]
    pub until: Option<String>,
}

/// `warden audit`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Audit {
    /// Verify or export instead of listing.
    #[command(subcommand)]
    pub action: Option<AuditAction>,
    /// Which records to list.
    #[command(flatten)]
    pub filter: Filter,
    /// At most this many records, the newest
    #[arg(long, short = 'n', default_value_t = 100)]
    pub limit: usize,
    /// Keep printing new records as they come (Ctrl-C stops)
    #[arg(long, short = 'f')]
    pub follow: bool,
}

/// What else `warden audit` does.
// Parsed once per command: the size of a variant costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, clap::Subcommand)]
pub enum AuditAction {
    /// Check that every node's log is whole (chain and anchor), one line per node; exits
    /// non-zero naming each bad spot, or each node that could not be checked
    Verify {
        /// Read a stopped single-node warden's data dir (--data-dir) directly, its log files and
        /// embedded store, instead of asking a running API
        #[arg(long)]
        stopped: bool,
    },
    /// Write the records as JSON lines, node by node (every live node's), each oldest first
    Export {
        /// File to write, or - for stdout
        #[arg(long)]
        out: String,
        /// Which records to write.
        #[command(flatten)]
        filter: Filter,
    },
}

/// A time given as ms since the epoch, or as an age (`15m`: fifteen minutes ago).
fn time(s: &str) -> anyhow::Result<u64> {
    if let Ok(ms) = s.parse::<u64>() {
        return Ok(ms);
    }
    let (n, unit) = s.split_at(s.len().saturating_sub(1));
    let secs = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => 0,
    };
    let Ok(n) = n.parse::<u64>() else {
        bail!("{s:?} is not a time: give ms since the epoch or an age such as 30s, 15m, 2h, 7d");
    };
    if secs == 0 {
        bail!("{s:?} is not a time: give ms since the epoch or an age such as 30s, 15m, 2h, 7d");
    }
    Ok(warden_core::model::now_ms().saturating_sub(n * secs * 1000))
}

fn query(f: &Filter, after: Option<u64>, limit: usize) -> anyhow::Result<AuditQuery> {
    Ok(AuditQuery {
        node: f.node.clone(),
        user: f.user.clone(),
        actor: f.actor.clone(),
        app: f.app.clone(),
        label: f.label.clone(),
        kind: f.kind.clone(),
        since: f.since.as_deref().map(time).transpose()?,
        until: f.until.as_deref().map(time).transpose()?,
        after,
        limit: Some(limit),
    })
}

fn path(q: &AuditQuery) -> String {
    let mut parts = Vec::new();
    let mut add = |k: &str, v: Option<String>| {
        if let Some(v) = v {
            parts.push(format!("{k}={}", query_value(&v)));
        }
    };
    add("node", q.node.clone());
    add("user", q.user.clone());
    add("actor", q.actor.clone());
    add("app", q.app.clone());
    add("label", q.label.clone());
    add("kind", q.kind.clone());
    add("since", q.since.map(|t| t.to_string()));
    add("until", q.until.map(|t| t.to_string()));
    add("after", q.after.map(|t| t.to_string()));
    add("limit", q.limit.map(|t| t.to_string()));
    format!("/v1/audit?{}", parts.join("&"))
}

/// `ms` since the epoch as `YYYY-MM-DDTHH:MM:SSZ`.
fn utc(ms: u64) -> String {
    format!("{}Z", crate::deploy::when(ms).replacen(' ', "T", 1))
}

/// What a record says, in one line for a person.
fn describe(e: &AuditEvent) -> String {
    match e {
        AuditEvent::Change {
            actor,
            method,
            route,
            target,
            outcome,
            ..
        } => format!(
            "{actor}: {method} {route}{} -> {outcome}",
            target
                .as_deref()
                .map(|t| format!(" ({t})"))
                .unwrap_or_default()
        ),
        other => serde_json::to_string(other).unwrap_or_default(),
    }
}

fn print(out: &Output, r: &AuditRecord) {
    if out.json {
        println!("{}", serde_json::to_string(r).unwrap_or_default());
    } else {
        println!(
            "{} {:<12} {:>6} {:<12} {}",
            utc(r.at_ms),
            r.node,
            r.seq,
            r.event.kind(),
            describe(&r.event)
        );
    }
}

/// `warden audit`.
pub(crate) async fn run(api: &Client, out: &Output, a: Audit) -> anyhow::Result<()> {
    match a.action {
        Some(AuditAction::Verify { .. }) => return verify(api, out).await,
        Some(AuditAction::Export { out: to, filter }) => return export(api, &filter, &to).await,
        None => {}
    }
    let started = warden_core::model::now_ms();
    let records: Vec<AuditRecord> = api
        .call("GET", &path(&query(&a.filter, None, a.limit)?))
        .await?;
    if out.json && !a.follow {
        println!("{}", serde_json::to_string_pretty(&records)?);
        return Ok(());
    }
    for r in &records {
        print(out, r);
    }
    if !a.follow {
        return Ok(());
    }
    follow(api, out, &a.filter, records, started).await
}

/// Every live node's id: sequence numbers are per node, so a
/// follower or an export keeps one cursor per node.
async fn node_ids(api: &Client) -> anyhow::Result<BTreeSet<String>> {
    let live: Vec<NodeRecord> = api.call("GET", "/v1/nodes").await?;
    if live.is_empty() {
        bail!("no node is live (`warden nodes list` is empty): no log to read");
    }
    Ok(live.into_iter().map(|n| n.id).collect())
}

/// Prints new records as they come, node by node after each node's last seq printed; a node
/// not seen yet from `started` on (its clock's time: a node whose clock lags the CLI's by more
/// than the listing took may miss records written meanwhile).
async fn follow(
    api: &Client,
    out: &Output,
    f: &Filter,
    printed: Vec<AuditRecord>,
    started: u64,
) -> anyhow::Result<()> {
    let mut cursors = BTreeMap::new();
    // A notice that a node's log could not be read (seq 0) is no cursor.
    for r in printed.into_iter().filter(|r| r.seq > 0) {
        cursors.insert(r.node, r.seq);
    }
    let mut unreadable = BTreeSet::new();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let live = node_ids(api).await?;
        let mut new = Vec::new();
        for id in live
            .iter()
            .filter(|id| f.node.as_ref().is_none_or(|n| n == *id))
        {
            let mut q = query(f, cursors.get(id).copied(), 10_000)?;
            q.node = Some(id.clone());
            if q.after.is_none() {
                q.since = Some(q.since.unwrap_or(0).max(started));
            }
            match api.call::<Vec<AuditRecord>>("GET", &path(&q)).await {
                Ok(page) => {
                    unreadable.remove(id);
                    new.extend(page);
                }
                // Said once, not skipped silently; the follower goes on with the others.
                Err(e) if unreadable.insert(id.clone()) => eprintln!("node {id}: {e:#}"),
                Err(_) => {}
            }
        }
        new.sort_by(|a, b| (a.at_ms, &a.node, a.seq).cmp(&(b.at_ms, &b.node, b.seq)));
        for r in new {
            print(out, &r);
            cursors.insert(r.node, r.seq);
        }
    }
}

async fn verify(api: &Client, out: &Output) -> anyhow::Result<()> {
    let all: Vec<Verified> = api.call("GET", "/v1/audit/verify").await?;
    if out.json {
        println!("{}", serde_json::to_string_pretty(&all)?);
    }
    let mut bad = Vec::new();
    for v in &all {
        match fault(v) {
            Some(why) => bad.push(why),
            None if !out.json => println!("{}", whole(v)),
            None => {}
        }
    }
    match bad.len() {
        0 => Ok(()),
        1 => bail!("{}", bad[0]),
        n => bail!(
            "{n} nodes' audit logs are not whole:\n  {}",
            bad.join("\n  ")
        ),
    }
}

/// Prints what verify found (JSON with `json`); an error naming the first bad spot if the log
/// is not whole.
pub fn report(v: &Verified, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(v)?);
    }
    match fault(v) {
        None if !json => println!("{}", whole(v)),
        None => {}
        Some(why) => bail!("{why}"),
    }
    Ok(())
}

/// A whole log, in words.
fn whole(v: &Verified) -> String {
    format!(
        "the audit log of node {} is whole: {} records to seq {}{}",
        v.node,
        v.records,
        v.head_seq,
        v.anchor_seq
            .map(|s| format!(", anchored at seq {s}"))
            .unwrap_or_else(|| ", not anchored yet".into())
    )
}

/// What is wrong with a log (or why it was not checked), in words; none if it is whole.
fn fault(v: &Verified) -> Option<String> {
    // `ok` decides: an answer that says not ok without saying why is no whole log.
    let Some(p) = v.problem.as_ref() else {
        return (!v.ok).then(|| {
            format!(
                "the audit log of node {} is not whole, and its answer did not say where",
                v.node
            )
        });
    };
    Some(match p.what.as_str() {
        "unreachable" | "not live" => format!(
            "the audit log of node {} was not checked ({}): {}",
            v.node, p.what, p.detail
        ),
        _ => format!(
            "the audit log of node {} is not whole: {} at {} line {} (seq {}): {}",
            v.node,
            p.what,
            p.file,
            p.line,
            p.seq.map_or("-".into(), |s| s.to_string()),
            p.detail
        ),
    })
}

async fn export(api: &Client, f: &Filter, to: &str) -> anyhow::Result<()> {
    let mut w: Box<dyn Write> = match to {
        "-" => Box::new(std::io::stdout().lock()),
        file => Box::new(std::io::BufWriter::new(
            std::fs::File::create(file).with_context(|| format!("cannot write {file}"))?,
        )),
    };
    // Sequence numbers are per node: each node's records are paged through in turn. A node
    // whose log cannot be read does not stop the others', but fails the export at its end.
    let ids = node_ids(api).await?;
    let mut unread = Vec::new();
    for id in ids
        .iter()
        .filter(|id| f.node.as_ref().is_none_or(|n| n == *id))
    {
        let mut after = Some(0);
        loop {
            let mut q = query(f, after, 10_000)?;
            q.node = Some(id.clone());
            let page: Vec<AuditRecord> = match api.call("GET", &path(&q)).await {
                Ok(p) => p,
                Err(e) => {
                    unread.push(format!("node {id}: {e:#}"));
                    break;
                }
            };
            for r in &page {
                writeln!(w, "{}", serde_json::to_string(r)?)
                    .with_context(|| format!("cannot write {to}"))?;
            }
            match page.last() {
                Some(r) if page.len() == 10_000 => after = Some(r.seq),
                _ => break,
            }
        }
    }
    w.flush().with_context(|| format!("cannot write {to}"))?;
    if !unread.is_empty() {
        bail!(
            "{to} lacks these nodes' records (their logs could not be read):\n  {}",
            unread.join("\n  ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_not_ok_is_a_fault_even_without_a_problem() {
        let v = Verified {
            node: "n1".into(),
            ok: false,
            records: 3,
            head_seq: 3,
            anchor_seq: Some(3),
            problem: None,
        };
        assert!(fault(&v).is_some_and(|f| f.contains("n1")));
        let whole = Verified { ok: true, ..v };
        assert_eq!(fault(&whole), None);
    }
}
