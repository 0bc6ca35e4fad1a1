//! `warden apps ...`: register, list, show and remove apps.

use std::collections::BTreeMap;

use anyhow::bail;
use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::{json, Value};

use warden_api_types::{AppSpec, Restart, Restarted, Scale};

use crate::{client, label_counts, table, Output};

/// `warden apps ...`
#[derive(Debug, Subcommand)]
pub enum AppsCommand {
    /// Register an app: `warden apps create NAME [options] -- PROGRAM [ARGS...]`
    Create(Box<CreateApp>),
    /// List apps
    List,
    /// Show one app
    Show {
        /// App name
        name: String,
    },
    /// Remove an app and stop its instances; an app with --data loses its database (back it up
    /// first: pg_dump)
    Rm {
        /// App name
        name: String,
    },
    /// Change an app: `warden apps update NAME [options] [-- PROGRAM [ARGS...]]`. A changed
    /// command, environment or limit rolls out with no failed request
    Update(Box<UpdateApp>),
    /// Set how many instances of a label the cluster keeps running, spread over nodes:
    /// `warden apps scale APP [TYPE:]LABEL=COUNT...` (0 stops keeping the label; TYPE is a
    /// Procfile process type such as `worker`, `web` when left out)
    Scale {
        /// App name
        name: String,
        /// LABEL=COUNT (web) or TYPE:LABEL=COUNT, one or more; labels not named keep their counts
        #[arg(value_name = "[TYPE:]LABEL=COUNT", required = true)]
        counts: Vec<String>,
    },
    /// Replace an app's running instances with fresh ones of the same release, one by one
    /// (each new one ready before its old one stops; no request fails); no release is made
    Restart {
        /// App name
        name: String,
        /// Only the instances of this label
        #[arg(long)]
        label: Option<String>,
    },
}

/// Flags both `create` and `update` take; each goes into the request body only when given.
#[derive(Debug, Args)]
pub struct Tuning {
    /// Stop instances idle this long, in milliseconds (0 keeps them)
    #[arg(long)]
    idle_timeout_ms: Option<u64>,
    /// Most instances of the app per node
    #[arg(long)]
    max_instances: Option<u32>,
    /// Memory limit of each sandboxed instance, in MiB (cgroup limit, else address space)
    #[arg(long)]
    memory_mb: Option<u64>,
    /// Process limit of each sandboxed instance
    #[arg(long)]
    processes: Option<u64>,
    /// CPU cap of each sandboxed instance in thousandths of a core (needs the cpu cgroup)
    #[arg(long)]
    millicpus: Option<u64>,
    /// How a request that finds no instance gets one: jit (default), slot or warm
    #[arg(long, value_parser = ["jit", "slot", "warm"])]
    start: Option<String>,
    /// Path an instance must answer 2xx or 3xx before it counts as ready (default: accepting
    /// a connection is enough)
    #[arg(long)]
    health_path: Option<String>,
    /// Directory of static files the gateway serves itself, without an instance
    #[arg(long, value_name = "DIR")]
    static_dir: Option<std::path::PathBuf>,
    /// Path prefix within the app under which --static-dir is served (default /static/)
    #[arg(long, value_name = "PREFIX")]
    static_prefix: Option<String>,
}

impl Tuning {
    /// Writes the flags given into `body` (a spec, or a merge patch of one).
    fn write(self, body: &mut Value) -> anyhow::Result<()> {
        for (key, v) in [
            ("idle_timeout_ms", self.idle_timeout_ms),
            ("max_instances", self.max_instances.map(u64::from)),
        ] {
            if let Some(v) = v {
                body[key] = json!(v);
            }
        }
        for (key, v) in [
            ("memory_mb", self.memory_mb),
            ("processes", self.processes),
            ("millicpus", self.millicpus),
        ] {
            if let Some(v) = v {
                body["limits"][key] = json!(v);
            }
        }
        for (key, v) in [
            ("start", self.start),
            ("health_path", self.health_path),
            ("static_prefix", self.static_prefix),
        ] {
            if let Some(v) = v {
                body[key] = json!(v);
            }
        }
        if let Some(dir) = self.static_dir {
            // The gateway serves it from wherever it runs: a relative path would mean nothing
            // there.
            let dir = std::path::absolute(&dir)
                .with_context(|| format!("--static-dir {}", dir.display()))?;
            body["static_dir"] = json!(dir.display().to_string());
        }
        Ok(())
    }
}

/// Flags of `warden apps update`: only what is given changes.
#[derive(Debug, Args)]
pub struct UpdateApp {
    /// App name
    name: String,
    /// New program and arguments
    #[arg(last = true)]
    command: Vec<String>,
    /// Set an environment variable, KEY=VALUE (repeatable)
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Remove an environment variable (repeatable)
    #[arg(long = "unset-env", value_name = "KEY")]
    unset_env: Vec<String>,
    /// Host names routed to the app, replacing the present ones (repeatable)
    #[arg(long = "host")]
    hosts: Vec<String>,
    /// Groups allowed to use the app, replacing the present ones (repeatable)
    #[arg(long = "group")]
    groups: Vec<String>,
    /// Instances kept running for a label, LABEL=COUNT (repeatable; 0 stops keeping it)
    #[arg(long = "desired", value_name = "LABEL=COUNT")]
    desired: Vec<String>,
    /// Mark the app a declassifier to LABEL (an app with --data: its instances may write rows
    /// at LABEL, below their own, each write recorded), or `none` to take the mark away
    #[arg(long, value_name = "LABEL|none")]
    declassify_to: Option<String>,
    #[command(flatten)]
    tuning: Tuning,
}

impl UpdateApp {
    /// The merge patch the API takes (RFC 7396), from the flags given.
    fn patch(self) -> anyhow::Result<Value> {
        let mut p = json!({});
        if !self.command.is_empty() {
            p["command"] = json!(self.command);
        }
        let mut env = serde_json::Map::new();
        for kv in self.env {
            let Some((k, v)) = kv.split_once('=') else {
                bail!("--env {kv:?} must be KEY=VALUE")
            };
            env.insert(k.to_owned(), json!(v));
        }
        for k in self.unset_env {
            env.insert(k, Value::Null);
        }
        if !env.is_empty() {
            p["env"] = Value::Object(env);
        }
        if !self.hosts.is_empty() {
            p["hosts"] = json!(self.hosts);
        }
        if !self.groups.is_empty() {
            p["groups"] = json!(self.groups);
        }
        let desired = label_counts("desired", self.desired)?;
        if !desired.is_empty() {
            let counts: serde_json::Map<String, Value> = desired
                .into_iter()
                .map(|(l, n)| (l, if n == 0 { Value::Null } else { json!(n) }))
                .collect();
            p["desired"] = Value::Object(counts);
        }
        match self.declassify_to.as_deref() {
            Some("none") => p["declassify_to"] = Value::Null,
            Some(label) => p["declassify_to"] = json!(label),
            None => {}
        }
        self.tuning.write(&mut p)?;
        if p.as_object().is_some_and(serde_json::Map::is_empty) {
            bail!("nothing to change: give at least one option (`warden apps update --help`)");
        }
        Ok(p)
    }
}

/// Flags of `warden apps create`.
#[derive(Debug, Args)]
pub struct CreateApp {
    /// App name (a-z, 0-9, '-', '_')
    name: String,
    /// Program and arguments; it must listen on 127.0.0.1:$PORT
    #[arg(required = true, last = true)]
    command: Vec<String>,
    /// Extra environment, KEY=VALUE (repeatable)
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Host name routed to this app (repeatable)
    #[arg(long = "host")]
    hosts: Vec<String>,
    /// Group allowed to use the app (repeatable; none: every authenticated user)
    #[arg(long = "group")]
    groups: Vec<String>,
    /// Working directory of instances
    #[arg(long)]
    workdir: Option<String>,
    /// How long the gateway waits for a new instance, in milliseconds
    #[arg(long)]
    start_timeout_ms: Option<u64>,
    /// How instances run: sandbox (isolated) or process (a plain process under an unprivileged
    /// uid, no isolation); left out, the node's default, the sandbox wherever it can make one
    #[arg(long, value_parser = ["sandbox", "process"])]
    driver: Option<String>,
    /// Whom one instance serves: shared (default), per_user or per_request
    #[arg(long, value_parser = ["shared", "per_user", "per_request"])]
    lifetime: Option<String>,
    /// Instances kept running for a label, LABEL=COUNT (repeatable)
    #[arg(long = "desired", value_name = "LABEL=COUNT")]
    desired: Vec<String>,
    /// Prepared sandboxes kept per node with --start slot
    #[arg(long)]
    slots: Option<u32>,
    /// Spare running instances kept per node for a label with --start warm, LABEL=COUNT
    /// (repeatable)
    #[arg(long = "warm", value_name = "LABEL=COUNT")]
    warm: Vec<String>,
    /// Network of sandboxed instances: isolated (default, loopback only) or bridged (a veth
    /// on the node's bridge for egress; warden must run as root)
    #[arg(long, value_parser = ["isolated", "bridged"])]
    network: Option<String>,
    /// A database of the app's own: every instance gets DATABASE_URL to a socket that logs in
    /// as its label's role (rows are labelled; read down, never written down). `apps rm` drops
    /// the database: back it up with pg_dump first
    #[arg(long)]
    data: bool,
    /// Mark the app a declassifier to LABEL (needs --data): its instances may write rows at
    /// LABEL, below their own, and each such write is recorded
    #[arg(long, value_name = "LABEL")]
    declassify_to: Option<String>,
    #[command(flatten)]
    tuning: Tuning,
}

// === impl CreateApp ===

impl CreateApp {
    /// The app spec the API takes, from the flags given (the API fills in the rest).
    fn body(self) -> anyhow::Result<Value> {
        let CreateApp {
            name,
            command,
            env,
            hosts,
            groups,
            workdir,
            start_timeout_ms,
            driver,
            lifetime,
            desired,
            slots,
            warm,
            network,
            data,
            declassify_to,
            tuning,
        } = self;
        let mut envs = BTreeMap::new();
        for kv in env {
            let Some((k, v)) = kv.split_once('=') else {
                bail!("--env {kv:?} must be KEY=VALUE")
            };
            envs.insert(k.to_owned(), v.to_owned());
        }
        let mut body = json!({ "name": name, "command": command, "env": envs, "hosts": hosts, "groups": groups });
        if let Some(w) = workdir {
            body["workdir"] = json!(w);
        }
        if let Some(t) = start_timeout_ms {
            body["start_timeout_ms"] = json!(t);
        }
        for (key, pairs) in [("desired", desired), ("warm", warm)] {
            let counts = label_counts(key, pairs)?;
            if !counts.is_empty() {
                body[key] = json!(counts);
            }
        }
        if let Some(v) = slots {
            body["slots"] = json!(v);
        }
        if data {
            body["data"] = json!(true);
        }
        for (key, v) in [
            ("declassify_to", declassify_to),
            ("driver", driver),
            ("lifetime", lifetime),
            ("network", network),
        ] {
            if let Some(v) = v {
                body[key] = json!(v);
            }
        }
        tuning.write(&mut body)?;
        Ok(body)
    }
}

/// Runs `warden apps ...`.
pub(crate) async fn run(
    api: &client::Client,
    out: &Output,
    cmd: AppsCommand,
) -> anyhow::Result<()> {
    match cmd {
        AppsCommand::Create(create) => {
            let spec: AppSpec = api.call_with("POST", "/v1/apps", &create.body()?).await?;
            out.value(&spec, |v| {
                println!("app {} created; it is served at /apps/{}/", v.name, v.name)
            });
        }
        AppsCommand::List => {
            let apps: Vec<AppSpec> = api.call("GET", "/v1/apps").await?;
            out.value(&apps, |apps| {
                let rows = apps.iter().map(|a| {
                    vec![
                        a.name.clone(),
                        a.command.join(",").replace(',', " "),
                        a.groups.join(","),
                        a.hosts.join(","),
                    ]
                });
                table::print(&["NAME", "COMMAND", "GROUPS", "HOSTS"], rows);
            });
        }
        AppsCommand::Show { name } => crate::show::run(api, out, &name).await?,
        AppsCommand::Rm { name } => {
            api.act("DELETE", &format!("/v1/apps/{name}")).await?;
            out.done(format!("app {name} removed; its instances are stopping"));
        }
        AppsCommand::Update(update) => {
            let name = update.name.clone();
            let spec: AppSpec = api
                .call_with("PATCH", &format!("/v1/apps/{name}"), &update.patch()?)
                .await?;
            out.value(&spec, |_| {
                println!(
                    "app {name} updated; instances of a changed command or environment are replaced as their successors become ready (`warden status` shows them go)"
                )
            });
        }
        AppsCommand::Scale { name, counts } => {
            for (process, counts) in by_process(counts) {
                let desired = crate::label_counts("scale", counts)?;
                let spec: AppSpec = api
                    .call_with(
                        "POST",
                        &format!("/v1/apps/{name}/scale"),
                        &Scale {
                            desired,
                            process: process.clone(),
                        },
                    )
                    .await?;
                out.value(&spec, |v| scaled(&name, process.as_deref(), v));
            }
        }
        AppsCommand::Restart { name, label } => {
            let r: Restarted = api
                .call_with(
                    "POST",
                    &format!("/v1/apps/{name}/restart"),
                    &Restart { label },
                )
                .await?;
            out.value(&r, |r| {
                let which = r
                    .label
                    .as_ref()
                    .map_or(String::new(), |l| format!(" of label {l}"));
                let release = r
                    .release
                    .map_or(String::new(), |n| format!(" of release {n}"));
                println!(
                    "app {}: {} instance(s){which} are being replaced by fresh ones{release}, each ready before its old one stops; no release is made (`warden status` shows them go)",
                    r.app, r.replacing
                );
            });
        }
    }
    Ok(())
}

/// `apps scale`'s `[TYPE:]LABEL=COUNT` arguments grouped by process type (`None`: web). A
/// prefix is a type when it is named like one and what follows is not a label's category
/// set (`SECRET:{a}=1` is a label).
fn by_process(args: Vec<String>) -> BTreeMap<Option<String>, Vec<String>> {
    let mut out: BTreeMap<Option<String>, Vec<String>> = BTreeMap::new();
    for arg in args {
        let typed = arg.split_once(':').filter(|(t, rest)| {
            warden_core::validate_process_type(t).is_ok() && !rest.trim_start().starts_with('{')
        });
        match typed {
            Some(("web", rest)) => out.entry(None).or_default().push(rest.to_owned()),
            Some((t, rest)) => out
                .entry(Some(t.to_owned()))
                .or_default()
                .push(rest.to_owned()),
            None => out.entry(None).or_default().push(arg),
        }
    }
    out
}

/// What `apps scale` says about one process type's counts.
fn scaled(name: &str, process: Option<&str>, v: &AppSpec) {
    let counts: Vec<String> = v.desired.iter().map(|(l, n)| format!("{l}={n}")).collect();
    let what = match process {
        Some(t) => format!("app {name}'s {t}"),
        None => format!("app {name}"),
    };
    if counts.is_empty() {
        println!("{what} keeps no instance running when idle");
    } else if process.is_some() {
        println!(
            "{what} keeps {} running; `warden ps {name}` shows them converging",
            counts.join(" ")
        );
    } else {
        println!(
            "{what} keeps {} running (instances that requests start come on top, until its lifetime ends them); `warden status` shows them converging",
            counts.join(" ")
        );
    }
}
