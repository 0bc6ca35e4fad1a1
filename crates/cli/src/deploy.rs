//! `warden push`, `releases`, `config` and `rollback`: deploying an app from its source.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::Subcommand;
use http_body_util::BodyExt;
use serde_json::Value;
use warden_api_types::{
    AppSpec, ConfigChange, Release, ReleaseEvent, ReleaseSource, Rollback, UploadLimits,
};

use crate::client::Client;
use crate::{table, w, Output};

/// `warden config ...`
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Show an app's config vars
    Show {
        /// App name
        app: String,
    },
    /// Set config vars: a new release of the current code, tried before it serves
    Set {
        /// App name
        app: String,
        /// KEY=VALUE (repeatable)
        #[arg(required = true)]
        pairs: Vec<String>,
    },
    /// Remove config vars: a new release of the current code
    Unset {
        /// App name
        app: String,
        /// KEY (repeatable)
        #[arg(required = true)]
        keys: Vec<String>,
    },
}

/// What to push.
#[derive(Debug, clap::Args)]
pub struct Push {
    /// App name (created if it does not exist)
    pub app: String,
    /// Directory of the app's source [default: the current directory]
    #[arg(conflicts_with = "git")]
    pub dir: Option<PathBuf>,
    /// Push a commit of this git repository (a local path or a URL) instead of a directory
    #[arg(long)]
    pub git: Option<String>,
    /// Branch, tag or commit of --git [default: the repository's HEAD]
    #[arg(long = "ref", requires = "git")]
    pub git_ref: Option<String>,
    /// How to build, instead of telling from the files
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(warden_core::BuildKind::NAMES))]
    pub kind: Option<String>,
    /// Only users in this group may reach the app (repeatable); without it the app's groups
    /// stay as they are (a new app: every signed-in user, at their clearance)
    #[arg(long = "group", value_name = "GROUP")]
    pub groups: Vec<String>,
}

/// Who is deploying, for the release record.
fn who() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| {
            use std::os::unix::fs::MetadataExt;
            let uid = std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid());
            std::fs::read_to_string("/etc/passwd")
                .ok()
                .and_then(|p| {
                    p.lines()
                        .map(|l| l.split(':').collect::<Vec<_>>())
                        .find(|f| f.len() > 2 && f[2] == uid.to_string())
                        .map(|f| f[0].to_owned())
                })
                .unwrap_or_else(|| format!("uid {uid}"))
        });
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    format!("{user}@{}", host.trim())
}

/// A scratch clone of `url` at `git_ref`, and the commit it holds.
fn checkout(url: &str, git_ref: Option<&str>) -> anyhow::Result<(tempdir::Dir, String)> {
    let dir = tempdir::Dir::new()?;
    let git = |args: &[&str]| -> anyhow::Result<String> {
        let out = std::process::Command::new("git")
            .args(args)
            .output()
            .context("cannot run git; install it to push with --git")?;
        if !out.status.success() {
            bail!(
                "git {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    let path = dir.path().display().to_string();
    git(&["clone", "--quiet", "--no-checkout", "--", url, &path])?;
    git(&[
        "-C",
        &path,
        "checkout",
        "--quiet",
        git_ref.unwrap_or("HEAD"),
        "--",
    ])?;
    let commit = git(&["-C", &path, "rev-parse", "HEAD"])?;
    Ok((dir, commit))
}

/// `url` without a user and password (`https://user:token@host/…`): the release record shows
/// where the code came from, never how to log in there.
fn without_credentials(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            format!("{scheme}://{host}{path}")
        }
        None => url.to_owned(),
    }
}

/// A line from a build or an app, for a terminal: control characters (escape sequences a
/// hostile dependency might print) become U+FFFD, tabs stay.
pub(crate) fn printable(line: &str) -> String {
    line.chars()
        .map(|c| {
            if c.is_control() && c != '\t'
                || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
            {
                '\u{fffd}'
            } else {
                c
            }
        })
        .collect()
}

/// A directory removed when dropped.
mod tempdir {
    pub(crate) struct Dir(std::path::PathBuf);

    impl Dir {
        pub(crate) fn new() -> anyhow::Result<Self> {
            let p = std::env::temp_dir().join(format!(
                "warden-push-{}-{}",
                std::process::id(),
                warden_core::id::short_id()
            ));
            std::fs::create_dir(&p)?;
            Ok(Self(p))
        }
        pub(crate) fn path(&self) -> &std::path::Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Where the gateway of a local `warden up` listens, to print a URL to try.
fn gateway(data_dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(data_dir.join("endpoints.json")).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    v["gateway"].as_str().map(str::to_owned)
}

/// `warden push`.
pub(crate) async fn push(
    api: &Client,
    out: &Output,
    data_dir: &Path,
    p: Push,
) -> anyhow::Result<()> {
    let (_clone, dir, from) = match &p.git {
        Some(url) => {
            let (clone, commit) = checkout(url, p.git_ref.as_deref())?;
            let dir = clone.path().to_owned();
            (
                Some(clone),
                dir,
                format!("{}@{commit}", without_credentials(url)),
            )
        }
        None => {
            let dir = p.dir.clone().unwrap_or_else(|| PathBuf::from("."));
            // As the kernel resolves it (`..`, `.` and links gone), so `releases` shows one
            // name per directory however the pusher wrote it.
            let abs = std::fs::canonicalize(&dir)
                .or_else(|_| std::path::absolute(&dir))
                .unwrap_or_else(|_| dir.clone());
            (None, dir, abs.display().to_string())
        }
    };
    let (archive, files) = crate::pack::pack(&dir)?;
    if !out.json {
        eprintln!(
            "-----> packed {files} files of {from} ({} bytes)",
            archive.len()
        );
    }
    if let Some(max) = api
        .call::<UploadLimits>("GET", "/v1/limits")
        .await
        .ok()
        .map(|l| l.max_upload_bytes)
    {
        if archive.len() as u64 > max {
            bail!(
                "the packed source is {} bytes, larger than this API takes ({max} bytes); leave out what the app does not need (.gitignore, .wardenignore), or raise warden up --max-upload-mb",
                archive.len()
            );
        }
    }
    let mut query = format!("?from={}", encode(&from));
    if let Some(k) = &p.kind {
        query += &format!("&kind={k}");
    }
    if !p.groups.is_empty() {
        query += &format!("&groups={}", encode(&p.groups.join(",")));
    }
    let tty = !out.json && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let body = api
        .stream(
            "POST",
            &format!("/v1/apps/{}/releases{query}", p.app),
            "application/gzip",
            &[("x-warden-by", who())],
            archive.into(),
            move |sent, total| {
                if tty {
                    eprint!("\r-----> uploading {sent} of {total} bytes");
                    if sent == total {
                        eprintln!();
                    }
                }
            },
        )
        .await?;
    follow(api, body, out, &p.app, data_dir).await
}

/// Percent-encodes a query value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z'
            | b'a'..=b'z'
            | b'0'..=b'9'
            | b'-'
            | b'_'
            | b'.'
            | b'~'
            | b'/'
            | b':'
            | b'@' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Prints a release's progress as it comes; fails when the release failed.
async fn follow(
    api: &Client,
    mut body: hyper::body::Incoming,
    out: &Output,
    app: &str,
    data_dir: &Path,
) -> anyhow::Result<()> {
    let mut pending = Vec::new();
    let mut last: Option<ReleaseEvent> = None;
    // The latest lines shown, so a failure's "last lines" are not shown twice.
    let mut shown = crate::shown::Shown::default();
    while let Some(frame) = body.frame().await {
        let frame = frame.context(
            "the API's answer broke off; `warden releases APP` shows how the release ended",
        )?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        pending.extend_from_slice(&data);
        while let Some(i) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=i).collect();
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let event: ReleaseEvent = api.read(&line)?;
            if out.json {
                // Through a `Value`: keys sorted, as the API sends them.
                println!("{}", serde_json::to_value(&event)?);
            } else if let ReleaseEvent::Log { log } = &event {
                println!("{}", printable(log));
                shown.push(log);
            }
            if !matches!(event, ReleaseEvent::Log { .. }) {
                last = Some(event);
            }
        }
    }
    let (r, path, rolled_out) = match last {
        Some(ReleaseEvent::Done {
            done,
            path,
            rolled_out,
        }) => (done, path, rolled_out),
        Some(ReleaseEvent::Failed { failed: r }) => bail!(
            "release {} of {app} failed; the app keeps serving what it served before:\n{}",
            r.number,
            shown
                .without_repeated_tail(r.error.as_deref().unwrap_or_default())
                .lines()
                .map(printable)
                .collect::<Vec<_>>()
                .join("\n")
        ),
        Some(ReleaseEvent::Lost { lost }) => bail!("{}", printable(&lost)),
        Some(ReleaseEvent::Saved { saved }) => {
            if !out.json {
                println!("{}", printable(&saved));
            }
            return Ok(());
        }
        _ => bail!("the API stopped answering before the release ended; `warden releases {app}` shows how it ended"),
    };
    if !out.json {
        if !rolled_out {
            println!(
                "release {} of {app} takes new requests; instances of earlier releases are still handing over (`warden status`)",
                r.number
            );
        } else {
            println!("release {} of {app} serves", r.number);
        }
        // Who may reach it, so that an app open to every signed-in user is never a surprise.
        if let Ok(spec) = api.call::<AppSpec>("GET", &format!("/v1/apps/{app}")).await {
            if spec.groups.is_empty() {
                println!(
                    "reachable by every signed-in user, each at their clearance; `warden push {app} --group GROUP` or `warden apps update {app} --group GROUP` limits it"
                );
            } else {
                println!(
                    "reachable by users in {} {}, each at their clearance",
                    if spec.groups.len() == 1 {
                        "group"
                    } else {
                        "groups"
                    },
                    spec.groups.join(", ")
                );
            }
        }
        match gateway(data_dir) {
            Some(g) => println!("try: curl -u USER:PASSWORD {g}{path}"),
            None => println!("try: curl -u USER:PASSWORD http://GATEWAY{path}"),
        }
    }
    Ok(())
}

/// `warden releases APP`.
pub(crate) async fn releases(api: &Client, out: &Output, app: &str) -> anyhow::Result<()> {
    let list: Vec<Release> = api.call("GET", &format!("/v1/apps/{app}/releases")).await?;
    let spec = api
        .call::<AppSpec>("GET", &format!("/v1/apps/{app}"))
        .await
        .ok();
    let current = spec.and_then(|s| s.release).map(|r| r.number);
    out.value(&list, |list| {
        let rows = list.iter().map(|r| {
            let source = describe(&r.source);
            let digest = r
                .slug
                .as_deref()
                .unwrap_or_default()
                .chars()
                .take(12)
                .collect::<String>();
            // The phase its delivery reached; a failure says why (records made before
            // reasons were kept have none).
            let mut status = match &r.reason {
                Some(reason) => format!("{} ({})", w(&r.status), w(reason).replace('_', " ")),
                None => w(&r.status),
            };
            if Some(r.number) == current {
                status = "serving".into();
            }
            vec![
                r.number.to_string(),
                status,
                w(&r.kind),
                digest,
                r.by.clone(),
                when(r.at_ms),
                source,
            ]
        });
        table::print(
            &["RELEASE", "STATUS", "KIND", "SLUG", "BY", "WHEN", "SOURCE"],
            rows,
        );
    });
    Ok(())
}

pub(crate) use warden_core::model::utc_text as when;

/// `warden config ...`.
pub(crate) async fn config(
    api: &Client,
    out: &Output,
    data_dir: &Path,
    cmd: ConfigCommand,
) -> anyhow::Result<()> {
    let (app, body) = match cmd {
        ConfigCommand::Show { app } => {
            let config: BTreeMap<String, String> =
                api.call("GET", &format!("/v1/apps/{app}/config")).await?;
            out.value(&config, |config| {
                for (k, val) in config {
                    println!("{k}={val}");
                }
            });
            return Ok(());
        }
        ConfigCommand::Set { app, pairs } => {
            let mut set = BTreeMap::new();
            for kv in pairs {
                let Some((k, v)) = kv.split_once('=') else {
                    bail!("{kv:?} must be KEY=VALUE");
                };
                set.insert(k.to_owned(), v.to_owned());
            }
            (
                app,
                ConfigChange {
                    set,
                    ..ConfigChange::default()
                },
            )
        }
        ConfigCommand::Unset { app, keys } => (
            app,
            ConfigChange {
                unset: keys,
                ..ConfigChange::default()
            },
        ),
    };
    let body = api
        .stream(
            "POST",
            &format!("/v1/apps/{app}/config"),
            "application/json",
            &[("x-warden-by", who())],
            serde_json::to_vec(&body)?.into(),
            |_, _| {},
        )
        .await?;
    follow(api, body, out, &app, data_dir).await
}

/// `warden rollback APP [N]`.
pub(crate) async fn rollback(
    api: &Client,
    out: &Output,
    data_dir: &Path,
    app: &str,
    to: Option<u64>,
) -> anyhow::Result<()> {
    let body = api
        .stream(
            "POST",
            &format!("/v1/apps/{app}/rollback"),
            "application/json",
            &[("x-warden-by", who())],
            serde_json::to_vec(&Rollback { to, expect: None })?.into(),
            |_, _| {},
        )
        .await?;
    follow(api, body, out, app, data_dir).await
}

/// A release's source in words.
pub(crate) fn describe(src: &ReleaseSource) -> String {
    match src {
        ReleaseSource::Push { from, .. } => format!("push {from}"),
        ReleaseSource::Config { changed } => format!("config {}", changed.join(",")),
        ReleaseSource::Rollback { to } => format!("rollback to {to}"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn dates_are_civil_utc() {
        assert_eq!(super::when(0), "1970-01-01 00:00:00");
        assert_eq!(super::when(1_795_000_000_000), "2026-11-18 11:06:40");
    }

    #[test]
    fn git_urls_lose_their_credentials_and_output_its_escapes() {
        assert_eq!(
            super::without_credentials("https://me:tok@git.example.com/a/b.git"),
            "https://git.example.com/a/b.git"
        );
        assert_eq!(super::without_credentials("/srv/repo"), "/srv/repo");
        assert_eq!(super::printable("a\u{1b}[2Jb\tc"), "a\u{fffd}[2Jb\tc");
    }
}
