//! The command-line client: `warden apps|users|instances|nodes|data|status`.
//!
//! It talks to the api role over HTTP and owns only presentation: tables for people, `--json`
//! for scripts, and errors that say what to do next. It never touches the store directly. The
//! token is read from a flag, the environment, the session of `warden login`, a config file or
//! (the break-glass admin token) the data directory, and is never printed.
#![forbid(unsafe_code)]

mod apps;
pub mod audit;
mod client;
mod config;
mod data;
mod deploy;
mod git_remote;
mod instances;
mod login;
mod logs;
pub mod nodes;
mod oidc;
mod operators;
mod pack;
mod phases;
mod ps;
mod run;
mod session;
mod show;
mod shown;
mod status;
mod table;

use std::collections::BTreeMap;
use std::io::Read;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use serde_json::{json, Value};
use warden_api_types::{BackupHead, Lattice, NewUser, UserChange, UserView};

pub use apps::{AppsCommand, CreateApp, UpdateApp};
pub use audit::Audit;
pub use config::Endpoint;
pub use data::DataCommand;
pub use deploy::{ConfigCommand, Push};
pub use instances::InstancesCommand;
pub use login::LoginArgs;
pub use logs::Logs;
pub use oidc::OidcCommand;
pub use operators::{OperatorsCommand, TokensCommand};
pub use run::Run;

/// How to reach the API.
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// API base URL, e.g. http://127.0.0.1:7701 [default: from the config file or DATA_DIR/endpoints.json]
    #[arg(long, env = "WARDEN_API", global = true)]
    pub api: Option<String>,
    /// Token [default: the session of `warden login`, the config file, or DATA_DIR/admin-token]
    #[arg(long, env = "WARDEN_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// Config file with `api = "..."` and `token = "..."` or `token_file = "..."`
    #[arg(long, env = "WARDEN_CONFIG", global = true)]
    pub config: Option<std::path::PathBuf>,
    /// Data directory of a local `warden up`, used to find the API and token when nothing else says
    #[arg(
        long,
        env = "WARDEN_DATA_DIR",
        global = true,
        default_value = "warden-data"
    )]
    pub data_dir: std::path::PathBuf,
    /// Print JSON instead of tables
    #[arg(long, global = true)]
    pub json: bool,
}

/// `warden users ...`
#[derive(Debug, Subcommand)]
pub enum UsersCommand {
    /// Add a user. Without --password-stdin a password is generated and printed once.
    Add {
        /// Login name
        name: String,
        /// Clearance label, e.g. SECRET
        #[arg(long)]
        clearance: String,
        /// Group (repeatable)
        #[arg(long = "group")]
        groups: Vec<String>,
        /// Read the password from standard input (first line)
        #[arg(long)]
        password_stdin: bool,
    },
    /// Change a user's password, clearance or groups; every session of the user ends
    Set {
        /// Login name
        name: String,
        /// Read the new password from standard input (first line)
        #[arg(long)]
        password_stdin: bool,
        /// New clearance label
        #[arg(long)]
        clearance: Option<String>,
        /// New group, replacing the old ones (repeatable)
        #[arg(long = "group", conflicts_with = "no_groups")]
        groups: Vec<String>,
        /// Remove the user from every group
        #[arg(long)]
        no_groups: bool,
    },
    /// List users
    List,
    /// Show a user; for a provider user, the provider and the claims and rules that decided
    /// the clearance
    Show {
        /// Login name
        name: String,
    },
    /// Remove a user; every session of the user ends
    Rm {
        /// Login name
        name: String,
    },
}

/// `warden lattice ...`
#[derive(Debug, Subcommand)]
pub enum LatticeCommand {
    /// Show the clearance lattice
    Show,
    /// Define the clearance lattice (refused while users hold clearances it cannot express)
    Set {
        /// Levels, lowest first, comma-separated: --levels "UNCLASSIFIED,SECRET,TOP SECRET"
        #[arg(long, value_delimiter = ',')]
        levels: Vec<String>,
        /// Categories, comma-separated: --categories "A,B,C"
        #[arg(long, value_delimiter = ',')]
        categories: Vec<String>,
    },
}

/// A client command.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum ClientCommand {
    /// Show or define the clearance lattice
    #[command(subcommand)]
    Lattice(LatticeCommand),
    /// Manage apps
    #[command(subcommand)]
    Apps(AppsCommand),
    /// Manage users
    #[command(subcommand)]
    Users(UsersCommand),
    /// Inspect and kill instances
    #[command(subcommand)]
    Instances(InstancesCommand),
    /// The cluster's nodes
    #[command(subcommand)]
    Nodes(nodes::NodesCommand),
    /// Show the platform's state
    Status,
    /// Push an app's source: build it once, try it, and roll it out with no downtime
    Push(Push),
    /// List an app's releases
    Releases {
        /// App name
        app: String,
    },
    /// Show or change an app's config vars (each change is a release)
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Run an earlier release again, without rebuilding
    Rollback {
        /// App name
        app: String,
        /// Release number [default: the last one that served before the current]
        to: Option<u64>,
    },
    /// Print what an app's instances (or one instance) wrote, with instance, label and release
    Logs(Logs),
    /// Show an app's process types (web and its Procfile's others): instances kept and running per label
    Ps {
        /// App name
        app: String,
    },
    /// Show what apps' databases hold
    #[command(subcommand)]
    Data(DataCommand),
    /// Run a command once in a fresh process of an app's current release, attached to this terminal (no TTY)
    Run(Run),
    /// Read the audit logs (who reached what, who changed what; every node's on a cluster), verify or export them
    Audit(Audit),
    /// Log in as an operator; the session is kept for the next commands
    Login(LoginArgs),
    /// End the session of `warden login`
    Logout,
    /// Manage operators: who may change warden, with which roles
    #[command(subcommand)]
    Operators(OperatorsCommand),
    /// Your personal API tokens for automation
    #[command(subcommand)]
    Tokens(TokensCommand),
    /// Identity providers people sign in with (OpenID Connect)
    #[command(subcommand)]
    Oidc(OidcCommand),
    /// Print the URL to `git push` an app to (built and rolled out on push)
    GitRemote {
        /// App name
        app: String,
    },
}

/// Runs a client command.
pub async fn run(args: &ClientArgs, cmd: ClientCommand) -> anyhow::Result<()> {
    // Neither needs (nor may need) a token from the usual places.
    match cmd {
        ClientCommand::Login(l) => return login::login(args, l).await,
        ClientCommand::Logout => return login::logout(args).await,
        _ => {}
    }
    let endpoint = config::resolve(args)?;
    if let ClientCommand::GitRemote { app } = &cmd {
        return git_remote::print(&endpoint, app, args.json);
    }
    let api = client::Client::new(endpoint);
    let out = Output { json: args.json };
    match cmd {
        ClientCommand::Apps(c) => apps::run(&api, &out, c).await,
        ClientCommand::Users(c) => users(&api, &out, c).await,
        ClientCommand::Instances(c) => instances::run(&api, &out, c).await,
        ClientCommand::Nodes(c) => nodes::run(&api, &out, c).await,
        ClientCommand::Status => status::status(&api, &out).await,
        ClientCommand::Push(p) => deploy::push(&api, &out, &args.data_dir, p).await,
        ClientCommand::Releases { app } => deploy::releases(&api, &out, &app).await,
        ClientCommand::Config(c) => deploy::config(&api, &out, &args.data_dir, c).await,
        ClientCommand::Rollback { app, to } => {
            deploy::rollback(&api, &out, &args.data_dir, &app, to).await
        }
        ClientCommand::Lattice(c) => lattice(&api, &out, c).await,
        ClientCommand::Logs(l) => logs::run(&api, &out, l).await,
        ClientCommand::Ps { app } => ps::run(&api, &out, &app).await,
        ClientCommand::Data(c) => data::run(&api, &out, c).await,
        ClientCommand::Run(r) => run::run(&api, r).await,
        ClientCommand::Audit(a) => audit::run(&api, &out, a).await,
        ClientCommand::Operators(c) => operators::operators(&api, &out, c).await,
        ClientCommand::Tokens(c) => operators::tokens(&api, &out, c).await,
        ClientCommand::Oidc(c) => oidc::run(&api, &out, c).await,
        ClientCommand::Login(_) | ClientCommand::Logout | ClientCommand::GitRemote { .. } => Ok(()),
    }
}

struct Output {
    json: bool,
}

impl Output {
    /// Prints `v` as JSON for `--json` (through a `Value`, so that keys come sorted as they
    /// always did), else as `human` says.
    fn value<T: serde::Serialize>(&self, v: &T, human: impl FnOnce(&T)) {
        if self.json {
            let v = serde_json::to_value(v).unwrap_or_default();
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        } else {
            human(v);
        }
    }

    fn done(&self, what: String) {
        if self.json {
            println!("{}", json!({ "ok": true }));
        } else {
            println!("{what}");
        }
    }
}

/// A field as the CLI has always printed it: strings bare, lists joined with commas, nothing
/// for null, anything else as JSON.
fn w<T: serde::Serialize>(field: &T) -> String {
    s(&serde_json::to_value(field).unwrap_or_default())
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        Value::Array(a) => a.iter().map(s).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// `LABEL=COUNT` pairs of `--flag`, as a map.
pub(crate) fn label_counts(
    flag: &str,
    pairs: Vec<String>,
) -> anyhow::Result<BTreeMap<String, u32>> {
    let mut counts = BTreeMap::new();
    for kv in pairs {
        let Some((label, n)) = kv.rsplit_once('=') else {
            bail!("--{flag} {kv:?} must be LABEL=COUNT")
        };
        let n: u32 = n
            .parse()
            .map_err(|_| anyhow::anyhow!("--{flag} {kv:?}: COUNT must be a number"))?;
        counts.insert(label.to_owned(), n);
    }
    Ok(counts)
}

/// `warden users show`'s text.
fn show_user(u: &UserView) {
    println!("user:       {}", u.name);
    println!("clearance:  {}", u.clearance);
    println!("groups:     {}", u.groups.join(","));
    match &u.provider {
        None => println!("signs in:   with a password"),
        Some(p) => {
            println!(
                "signs in:   through identity provider {} (subject {})",
                p.id, p.subject
            );
            if !p.issuer.is_empty() {
                // The name is this account's: another issuer's or subject's sign-in is refused.
                println!("issuer:     {}", p.issuer);
            }
            let claims: Vec<String> = p.claims.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
            println!("claims:     {}", claims.join(" "));
            println!("rules:      {}", p.rules.join(", "));
        }
    }
}

async fn users(api: &client::Client, out: &Output, cmd: UsersCommand) -> anyhow::Result<()> {
    match cmd {
        UsersCommand::Add {
            name,
            clearance,
            groups,
            password_stdin,
        } => {
            let (password, generated) = if password_stdin {
                (password_from_stdin()?, false)
            } else {
                (warden_auth::generate_password(), true)
            };
            let body = NewUser {
                name,
                password: password.clone(),
                clearance,
                groups,
            };
            let user: UserView = api.call_with("POST", "/v1/users", &body).await?;
            // The generated password is shown once, in the output only.
            let mut v = serde_json::to_value(&user)?;
            if generated {
                v["password"] = json!(password);
            }
            out.value(&v, |_| {
                println!("user {} added with clearance {}", user.name, user.clearance);
                if generated {
                    println!("password (shown once): {password}");
                }
            });
        }
        UsersCommand::List => {
            let users: Vec<UserView> = api.call("GET", "/v1/users").await?;
            out.value(&users, |users| {
                let rows = users
                    .iter()
                    .map(|u| vec![u.name.clone(), u.clearance.clone(), u.groups.join(",")]);
                table::print(&["NAME", "CLEARANCE", "GROUPS"], rows);
            });
        }
        UsersCommand::Show { name } => {
            let user: UserView = api.call("GET", &format!("/v1/users/{name}")).await?;
            out.value(&user, show_user);
        }
        UsersCommand::Set {
            name,
            password_stdin,
            clearance,
            groups,
            no_groups,
        } => {
            let mut body = UserChange::default();
            if password_stdin {
                body.password = Some(password_from_stdin()?);
            }
            body.clearance = clearance;
            if !groups.is_empty() || no_groups {
                body.groups = Some(groups);
            }
            if body == UserChange::default() {
                bail!("say what changes: --password-stdin, --clearance or --group/--no-groups");
            }
            let user: UserView = api
                .call_with("PATCH", &format!("/v1/users/{name}"), &body)
                .await?;
            out.value(&user, |u| {
                println!(
                    "user {} changed (clearance {}, groups {}); their sessions ended",
                    u.name,
                    u.clearance,
                    u.groups.join(",")
                )
            });
        }
        UsersCommand::Rm { name } => {
            api.act("DELETE", &format!("/v1/users/{name}")).await?;
            out.done(format!("user {name} removed; their sessions ended"));
        }
    }
    Ok(())
}

/// The first line of standard input.
fn password_from_stdin() -> anyhow::Result<String> {
    let mut line = String::new();
    std::io::stdin()
        .read_to_string(&mut line)
        .context("reading the password from standard input")?;
    Ok(line.lines().next().unwrap_or("").to_owned())
}

async fn lattice(api: &client::Client, out: &Output, cmd: LatticeCommand) -> anyhow::Result<()> {
    let v: Lattice = match cmd {
        LatticeCommand::Show => api.call("GET", "/v1/lattice").await?,
        LatticeCommand::Set { levels, categories } => {
            let trim = |v: Vec<String>| {
                v.into_iter()
                    .map(|s| s.trim().to_owned())
                    .filter(|s| !s.is_empty())
                    .collect::<Vec<_>>()
            };
            let body = Lattice {
                levels: trim(levels),
                categories: trim(categories),
            };
            api.call_with("PUT", "/v1/lattice", &body).await?
        }
    };
    out.value(&v, |v| {
        let (levels, cats) = (&v.levels, &v.categories);
        println!(
            "levels:     {}",
            if levels.is_empty() {
                "-".into()
            } else {
                levels.join(" < ")
            }
        );
        println!(
            "categories: {}",
            if cats.is_empty() {
                "-".into()
            } else {
                cats.join(", ")
            }
        );
    });
    Ok(())
}

/// `warden store backup FILE`: a consistent snapshot of every durable record, written to
/// `file` with mode 0600 (it holds password hashes) through a temporary file and a rename, so
/// `file` is either the whole backup or untouched.
pub async fn backup(args: &ClientArgs, file: &std::path::Path) -> anyhow::Result<()> {
    let endpoint = config::resolve(args)?;
    let api = client::Client::new(endpoint);
    let backup: Value = api.call("GET", "/v1/store/backup").await?;
    // Written as it came (sealed: its digest and MAC cover it); read only to say what it holds.
    let head: BackupHead = api.read(&serde_json::to_vec(&backup)?)?;
    let (records, revision) = (head.records.len(), head.revision);
    write_private(file, &serde_json::to_vec(&backup)?)?;
    println!(
        "backed up {records} records at store revision {revision} to {}",
        file.display()
    );
    Ok(())
}

/// Writes `bytes` to `file` with mode 0600 through a new temporary file beside it (never one a
/// link stands for: it is created, not opened) and a rename: `file` is either whole or as it
/// was. For what holds secrets: backups, the session of `warden login`.
pub(crate) fn write_private(file: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = file.with_extension("partial");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("cannot create {}", tmp.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, file).with_context(|| format!("cannot write {}", file.display()))
}
