//! `warden logs`: an app's instances' output with the instance, label and release on each
//! line (and a release's build output), and the requests the gateway answered for it
//! (`router` lines), or one instance's output, once or following.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::bail;
use serde_json::json;

use crate::client::Client;
use warden_api_types::{AppLogEntry, AppSpec, RouterLine, RouterLines};

use crate::Output;

/// What `warden logs` prints.
#[derive(Debug, clap::Args)]
pub struct Logs {
    /// App name, or the id of one instance (`warden instances list` shows them)
    pub target: String,
    /// How many of the app's last lines to print in all (and as many request lines): the
    /// newest of the instance whose log was written last, then of the one before it, and so on
    #[arg(long, short = 'n', default_value_t = 100)]
    pub lines: usize,
    /// Which lines: the instances' output (`app`), the gateway's request lines (`router`), or
    /// both (the default). `--label` and `--instance` filter request lines too, `--release`
    /// does not
    #[arg(long, value_enum)]
    pub source: Option<Source>,
    /// Keep printing new lines as they come (Ctrl-C stops)
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Only instances of this release, after the release's build output
    #[arg(long)]
    pub release: Option<u64>,
    /// Only instances serving this label
    #[arg(long)]
    pub label: Option<String>,
    /// Only this instance of the app
    #[arg(long)]
    pub instance: Option<String>,
}

/// Where lines come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Source {
    /// The instances' output.
    App,
    /// The gateway's request lines.
    Router,
}

/// The longest end of `old` that [`unseen`] looks for in `new`: enough to tell lines apart,
/// few enough that a follow of 10,000 lines stays cheap.
const OVERLAP: usize = 100;

/// The lines of `new` after the end of `old` found in it: what a follow has not printed. The
/// end may be anywhere in `new`, not only at its start: `lines` is the app's total, so an
/// instance's window grows again (with lines printed before) when the others fall quiet.
fn unseen<'a>(old: &[String], new: &'a [String]) -> &'a [String] {
    let max = old.len().min(new.len()).min(OVERLAP);
    for k in (1..=max).rev() {
        let end = &old[old.len() - k..];
        if let Some(j) = (k..=new.len()).find(|&j| new[j - k..j] == *end) {
            return &new[j..];
        }
    }
    new
}

pub(crate) fn query_value(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `warden logs`.
pub(crate) async fn run(api: &Client, out: &Output, l: Logs) -> anyhow::Result<()> {
    let app = api
        .call::<AppSpec>("GET", &format!("/v1/apps/{}", l.target))
        .await
        .is_ok();
    if !app {
        if l.follow || l.release.is_some() || l.label.is_some() || l.instance.is_some() {
            bail!("no app named {:?}; `warden apps list` shows them", l.target);
        }
        let text = api
            .get_text(&format!(
                "/v1/instances/{}/logs?lines={}",
                l.target, l.lines
            ))
            .await?;
        if out.json {
            println!("{}", json!({ "id": l.target, "lines": text }));
        } else {
            print!("{text}");
            if !text.is_empty() && !text.ends_with('\n') {
                println!();
            }
        }
        return Ok(());
    }
    if let Some(n) = l.release {
        let build = api
            .get_text(&format!("/v1/apps/{}/releases/{n}/log", l.target))
            .await?;
        for line in build.lines() {
            print_line(out, "build", "", Some(n), line);
        }
    }
    let mut query = format!("?lines={}", l.lines);
    if let Some(n) = l.release {
        query += &format!("&release={n}");
    }
    if let Some(label) = &l.label {
        query += &format!("&label={}", query_value(label));
    }
    if let Some(i) = &l.instance {
        query += &format!("&instance={}", query_value(i));
    }
    let path = format!("/v1/apps/{}/logs{query}", l.target);
    let requests = format!("/v1/apps/{}/requests?lines={}", l.target, l.lines);
    let (app_lines, router) = (
        l.source != Some(Source::Router),
        l.source != Some(Source::App),
    );
    let mut seen: HashMap<String, Vec<String>> = HashMap::new();
    let mut seen_requests: Option<Vec<String>> = None;
    loop {
        let entries: Vec<AppLogEntry> = if app_lines {
            api.call("GET", &path).await?
        } else {
            Vec::new()
        };
        for e in entries {
            let id = e.instance.clone();
            let new: Vec<String> = e.text.lines().map(str::to_owned).collect();
            let first = !seen.contains_key(&id);
            let old = seen.entry(id.clone()).or_default();
            if first {
                if let Some(note) = &e.note {
                    eprintln!("instance {id} ({}): {note}", e.label);
                }
            }
            for line in unseen(old, &new) {
                print_line(out, &id, &e.label, e.release, line);
            }
            *old = new;
        }
        if router {
            let got: RouterLines = api.call("GET", &requests).await?;
            if seen_requests.is_none() {
                if let Some(note) = &got.note {
                    eprintln!("router: {note}");
                }
            }
            let wanted = |r: &&RouterLine| {
                l.label.as_ref().is_none_or(|x| &r.label == x)
                    && l.instance.as_ref().is_none_or(|x| &r.instance == x)
            };
            let new: Vec<String> = got.lines.iter().filter(wanted).map(router_text).collect();
            let old = seen_requests.get_or_insert_with(Vec::new);
            for line in unseen(old, &new) {
                print_line(out, "router", "", None, line);
            }
            *old = new;
        }
        if !l.follow {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A request line as printed: time, method, path, status, duration, instance and label.
fn router_text(r: &RouterLine) -> String {
    format!(
        "{} {} {} {} {}ms instance={} label={}",
        r.at, r.method, r.path, r.status, r.duration_ms, r.instance, r.label
    )
}

fn print_line(out: &Output, instance: &str, label: &str, release: Option<u64>, line: &str) {
    if out.json {
        println!(
            "{}",
            json!({ "instance": instance, "label": label, "release": release, "line": line })
        );
        return;
    }
    let release = release.map_or(String::new(), |n| format!(" r{n}"));
    let label = if label.is_empty() {
        String::new()
    } else {
        format!(" {label}")
    };
    println!(
        "[{instance}{label}{release}] {}",
        crate::deploy::printable(line)
    );
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_follow_prints_only_what_it_has_not() {
        let v = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            super::unseen(&v(&["a", "b"]), &v(&["a", "b", "c"])),
            v(&["c"])
        );
        assert_eq!(
            super::unseen(&v(&["a", "b"]), &v(&["b", "c", "d"])),
            v(&["c", "d"])
        );
        assert_eq!(super::unseen(&v(&[]), &v(&["x"])), v(&["x"]));
        assert_eq!(super::unseen(&v(&["x"]), &v(&["y"])), v(&["y"]));
        // A window that grew back over lines printed before prints only what is new.
        assert_eq!(
            super::unseen(&v(&["c"]), &v(&["a", "b", "c", "d"])),
            v(&["d"])
        );
        assert_eq!(
            super::unseen(&v(&["p", "p"]), &v(&["p", "p", "p"])),
            v(&["p"])
        );
    }
}
