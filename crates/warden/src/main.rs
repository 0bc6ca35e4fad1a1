//! `warden`: one binary for every role and the client.
//!
//! This file only parses flags and hands over: `up` runs the platform (see `up.rs`, with its
//! settings in `config/`), the client commands go to `warden-cli`, and the hidden `demo-app`
//! runs the demo app.
#![deny(unsafe_code)]

/// mimalloc for `up`, the C library's allocator for every other role (see `alloc.rs`).
#[global_allocator]
static ALLOCATOR: alloc::ByRole = alloc::ByRole;

mod alloc;
mod audit_cmd;
mod cluster;
mod config;
mod data;
mod demo;
mod files;
mod git_hook;
mod keys;
mod listen;
mod no_agent;
mod store_cmd;
mod up;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use warden_cli::{ClientArgs, ClientCommand};

/// warden: a self-hosted platform that runs web apps whose users must not see each other's data.
#[derive(Debug, Parser)]
#[command(name = "warden", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the platform: its roles (gateway, agent, API) in one process against one store
    Up(Box<config::UpArgs>),
    /// Manage apps
    Apps(AppsCmd),
    /// Manage users
    Users(UsersCmd),
    /// Inspect and kill instances
    Instances(InstancesCmd),
    /// The cluster's nodes
    Nodes(NodesCmd),
    /// Show or define the clearance lattice
    Lattice(LatticeCmd),
    /// Show the platform's state
    Status(ClientArgs),
    /// Print what an app's instances (or one instance) wrote, with instance, label and release
    Logs(LogsCmd),
    /// Show what apps' databases hold
    Data(DataCmd),
    /// Run a command once in a fresh process of an app's current release, attached to this terminal (no TTY)
    Run(RunCmd),
    /// Read the audit logs (who reached what, who changed what; every node's on a cluster), verify or export them
    Audit(Box<AuditCmd>),
    /// Push an app's source: build it once, try it, roll it out with no downtime
    Push(PushCmd),
    /// List an app's releases
    Releases(ReleasesCmd),
    /// Show an app's process types (web and its Procfile's others): instances kept and running per label
    Ps(PsCmd),
    /// Show or change an app's config vars (each change is a release)
    Config(ConfigCmd),
    /// Run an earlier release of an app again, without rebuilding
    Rollback(RollbackCmd),
    /// Log in as an operator (a local password); the session is kept for the next commands
    Login(LoginCmd),
    /// End the session of `warden login`
    Logout(ClientArgs),
    /// Manage operators: who may change warden through the API, with which roles
    Operators(OperatorsCmd),
    /// Your personal API tokens for automation: list, create, revoke
    Tokens(TokensCmd),
    /// Identity providers people sign in with: list, add, change, remove
    Oidc(OidcCmd),
    /// Back up a running warden's store, or restore a backup into a stopped one's data dir
    #[command(subcommand)]
    Store(store_cmd::StoreCommand),
    /// Print the URL to `git push` an app to (built and rolled out on push)
    GitRemote(GitRemoteCmd),
    /// warden's pre-receive hook (run by git as DATA_DIR/git/hooks/pre-receive, a link here)
    #[command(hide = true)]
    GitHook,
    /// Run the demo app (started by the agent; listens on 127.0.0.1:$PORT)
    #[command(hide = true)]
    DemoApp,
    /// Build a sandbox and run an app in it (started by the agent's sandbox driver in the
    /// instance's directory, which holds plan.json)
    #[command(hide = true)]
    SandboxInit,
    /// End what the agent that started this left running, once it is gone (started by the
    /// agent, with the agent's end of a pipe on standard input)
    #[command(hide = true)]
    Reaper {
        /// The agent's instance directory, where each instance's process group is recorded.
        instances: std::path::PathBuf,
    },
}

#[derive(Debug, clap::Args)]
struct AppsCmd {
    #[command(subcommand)]
    command: warden_cli::AppsCommand,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, clap::Args)]
struct LoginCmd {
    #[command(flatten)]
    login: warden_cli::LoginArgs,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, clap::Args)]
struct OperatorsCmd {
    #[command(subcommand)]
    command: warden_cli::OperatorsCommand,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, clap::Args)]
struct OidcCmd {
    #[command(subcommand)]
    command: warden_cli::OidcCommand,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, clap::Args)]
struct TokensCmd {
    #[command(subcommand)]
    command: warden_cli::TokensCommand,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, clap::Args)]
struct DataCmd {
    #[command(subcommand)]
    command: warden_cli::DataCommand,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, clap::Args)]
struct UsersCmd {
    #[command(subcommand)]
    command: warden_cli::UsersCommand,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, clap::Args)]
struct LatticeCmd {
    #[command(subcommand)]
    command: warden_cli::LatticeCommand,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, clap::Args)]
struct InstancesCmd {
    #[command(subcommand)]
    command: warden_cli::InstancesCommand,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, clap::Args)]
struct PushCmd {
    #[command(flatten)]
    push: warden_cli::Push,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, clap::Args)]
struct ReleasesCmd {
    /// App name
    app: String,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, clap::Args)]
struct PsCmd {
    /// App name
    app: String,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, clap::Args)]
struct ConfigCmd {
    #[command(subcommand)]
    command: warden_cli::ConfigCommand,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, clap::Args)]
struct GitRemoteCmd {
    /// App name
    app: String,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, clap::Args)]
struct RollbackCmd {
    /// App name
    app: String,
    /// Release number [default: the last one that served before the current]
    to: Option<u64>,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, clap::Args)]
struct NodesCmd {
    #[command(subcommand)]
    command: warden_cli::nodes::NodesCommand,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, clap::Args)]
struct AuditCmd {
    #[command(flatten)]
    audit: warden_cli::Audit,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, clap::Args)]
struct RunCmd {
    #[command(flatten)]
    run: warden_cli::Run,
    #[command(flatten)]
    client: ClientArgs,
}

#[derive(Debug, clap::Args)]
struct LogsCmd {
    #[command(flatten)]
    logs: warden_cli::Logs,
    #[command(flatten)]
    client: ClientArgs,
}

fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("WARDEN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
}

/// Client options given before the command (`warden --json status`, `warden --data-dir D apps
/// list`) move after its name, where the client commands take them; anything else is left for
/// clap to judge.
fn client_options_after_command(args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    const COMMANDS: [&str; 18] = [
        "apps",
        "git-remote",
        "login",
        "logout",
        "operators",
        "tokens",
        "users",
        "instances",
        "nodes",
        "lattice",
        "status",
        "logs",
        "push",
        "releases",
        "config",
        "rollback",
        "audit",
        "data",
    ];
    const WITH_VALUE: [&str; 4] = ["--api", "--token", "--config", "--data-dir"];
    let mut leading = Vec::new();
    let mut i = 1;
    while let Some(a) = args.get(i).and_then(|a| a.to_str()) {
        let name = a.split_once('=').map_or(a, |(n, _)| n);
        if a == "--json" || (WITH_VALUE.contains(&name) && a.contains('=')) {
            leading.push(i);
            i += 1;
        } else if WITH_VALUE.contains(&a) && args.get(i + 1).is_some() {
            leading.extend([i, i + 1]);
            i += 2;
        } else {
            break;
        }
    }
    let is_client = args
        .get(i)
        .and_then(|a| a.to_str())
        .is_some_and(|c| COMMANDS.contains(&c));
    if leading.is_empty() || !is_client {
        return args;
    }
    let mut out = vec![args[0].clone(), args[i].clone()];
    out.extend(leading.iter().map(|&k| args[k].clone()));
    out.extend(args[i + 1..].iter().cloned());
    out
}

/// The per-instance commands, recognised without clap: building clap's whole command tree
/// (every client command, `up`'s help with its defaults) leaves a quarter of a MiB of heap in
/// each instance's processes for their life. The agent runs them from `warden-instance` (see
/// `instance.rs`); `warden` keeps them for app commands that name it.
fn instance_command(args: &[std::ffi::OsString]) -> Option<Command> {
    match args {
        [_, c] if c == "demo-app" => Some(Command::DemoApp),
        [_, c] if c == "sandbox-init" => Some(Command::SandboxInit),
        [hook, ..] if git_hook::is_hook(hook) => Some(Command::GitHook),
        _ => None,
    }
}

/// Parses the command line, with `up`'s help showing the defaults of the one place they live.
fn parse() -> Cli {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(command) = instance_command(&args) {
        return Cli { command };
    }
    let cmd = Cli::command().mut_subcommand("up", config::help_with_defaults);
    let matches = cmd.get_matches_from(client_options_after_command(args));
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// `warden status --json | head` closes the pipe before warden is done writing. Rust ignores
/// SIGPIPE, so the write fails and `println!` panics; like any Unix tool, stop quietly instead,
/// with the status a shell gives a command SIGPIPE ended (128 + 13).
fn quiet_on_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let message = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.contains("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

/// The TLS cryptography every part of this process uses (gateway, node port, etcd client):
/// aws-lc-rs when built with the `aws-lc` feature, else ring.
fn install_crypto_provider() {
    #[cfg(feature = "aws-lc")]
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    #[cfg(not(feature = "aws-lc"))]
    let provider = rustls::crypto::ring::default_provider();
    // Only fails if one is installed already, which is then the one used.
    let _ = provider.install_default();
}

/// The name of the TLS cryptography provider this binary was built with.
pub(crate) const CRYPTO: &str = if cfg!(feature = "aws-lc") {
    "aws-lc-rs"
} else {
    "ring"
};

fn main() -> std::process::ExitCode {
    // Before anything is opened: what the caller left open must never reach an instance.
    warden_sandbox::spawn::close_inherited_descriptors();
    if alloc::uses_mimalloc() {
        alloc::give_memory_back_at_once();
    }
    install_crypto_provider();
    let cli = parse();
    // Where the loader passes no arguments to constructors, every role keeps mimalloc.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    debug_assert_eq!(
        matches!(cli.command, Command::Up(_)),
        alloc::uses_mimalloc(),
        "the allocator is chosen by the first argument: up alone gets mimalloc"
    );
    if !matches!(cli.command, Command::Up(_)) {
        quiet_on_broken_pipe();
    }
    // The sandbox helper forks, so it must run before any runtime thread exists.
    if let Command::SandboxInit = &cli.command {
        let code = match std::env::current_dir() {
            Ok(dir) => warden_sandbox::init::main(&dir),
            Err(e) => {
                eprintln!("warden-sandbox: cannot find the instance directory: {e}");
                125
            }
        };
        return std::process::ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX));
    }
    // The reaper needs no runtime: it blocks on its pipe, then ends what its agent left.
    if let Command::Reaper { instances } = &cli.command {
        return std::process::ExitCode::from(warden_sandbox::leftovers::reaper_main(instances));
    }
    // The git hook needs no runtime: it waits on one socket.
    if let Command::GitHook = &cli.command {
        return std::process::ExitCode::from(git_hook::main());
    }
    // Not in sandbox-init above: its forks never exec, and the sandbox's init would hold it.
    warden_sandbox::image::hold_own_image();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(run(cli));
    // Dropping the runtime would wait for every blocking task, however long it runs; a stop
    // waits this long for them (they watch for their pushes being called off), then exits.
    runtime.shutdown_timeout(BLOCKING_GRACE);
    code
}

/// How long a stopping warden waits for its blocking tasks to finish.
const BLOCKING_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

async fn run(cli: Cli) -> std::process::ExitCode {
    let result = match cli.command {
        Command::Up(args) => {
            init_logs();
            up::run(*args).await
        }
        Command::Apps(c) => warden_cli::run(&c.client, ClientCommand::Apps(c.command)).await,
        Command::Users(c) => warden_cli::run(&c.client, ClientCommand::Users(c.command)).await,
        Command::Instances(c) => {
            warden_cli::run(&c.client, ClientCommand::Instances(c.command)).await
        }
        Command::Nodes(c) => warden_cli::run(&c.client, ClientCommand::Nodes(c.command)).await,
        Command::Lattice(c) => warden_cli::run(&c.client, ClientCommand::Lattice(c.command)).await,
        Command::Status(c) => warden_cli::run(&c, ClientCommand::Status).await,
        Command::Logs(c) => warden_cli::run(&c.client, ClientCommand::Logs(c.logs)).await,
        Command::Run(c) => warden_cli::run(&c.client, ClientCommand::Run(c.run)).await,
        Command::Data(c) => warden_cli::run(&c.client, ClientCommand::Data(c.command)).await,
        Command::Audit(c) => {
            let c = *c;
            match c.audit.action {
                Some(warden_cli::audit::AuditAction::Verify { stopped: true }) => {
                    audit_cmd::verify_stopped(&c.client.data_dir, c.client.json).await
                }
                _ => warden_cli::run(&c.client, ClientCommand::Audit(c.audit)).await,
            }
        }
        Command::Push(c) => warden_cli::run(&c.client, ClientCommand::Push(c.push)).await,
        Command::Releases(c) => {
            warden_cli::run(&c.client, ClientCommand::Releases { app: c.app }).await
        }
        Command::Ps(c) => warden_cli::run(&c.client, ClientCommand::Ps { app: c.app }).await,
        Command::Config(c) => warden_cli::run(&c.client, ClientCommand::Config(c.command)).await,
        Command::Rollback(c) => {
            let cmd = ClientCommand::Rollback {
                app: c.app,
                to: c.to,
            };
            warden_cli::run(&c.client, cmd).await
        }
        Command::Login(c) => warden_cli::run(&c.client, ClientCommand::Login(c.login)).await,
        Command::Logout(c) => warden_cli::run(&c, ClientCommand::Logout).await,
        Command::Operators(c) => {
            warden_cli::run(&c.client, ClientCommand::Operators(c.command)).await
        }
        Command::Tokens(c) => warden_cli::run(&c.client, ClientCommand::Tokens(c.command)).await,
        Command::Oidc(c) => warden_cli::run(&c.client, ClientCommand::Oidc(c.command)).await,
        Command::Store(c) => store_cmd::run(c).await,
        Command::DemoApp => demo::run_app().await,
        Command::GitRemote(c) => {
            warden_cli::run(&c.client, ClientCommand::GitRemote { app: c.app }).await
        }
        Command::SandboxInit | Command::Reaper { .. } | Command::GitHook => Ok(()),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::client_options_after_command as reorder;

    fn v(args: &[&str]) -> Vec<std::ffi::OsString> {
        args.iter().map(Into::into).collect()
    }

    #[test]
    fn the_agents_commands_skip_clap_and_anything_else_goes_to_it() {
        use super::{instance_command, Command};
        assert!(matches!(
            instance_command(&v(&["warden", "demo-app"])),
            Some(Command::DemoApp)
        ));
        assert!(matches!(
            instance_command(&v(&["/x/warden", "sandbox-init"])),
            Some(Command::SandboxInit)
        ));
        for args in [
            &["warden", "demo-app", "--help"][..],
            &["warden", "up"],
            &["warden"],
            &["warden", "demo"],
        ] {
            assert!(instance_command(&v(args)).is_none(), "{args:?}");
        }
    }

    #[test]
    fn client_options_before_the_command_go_after_it() {
        assert_eq!(
            reorder(v(&["warden", "--json", "--data-dir", "d", "apps", "list"])),
            v(&["warden", "apps", "--json", "--data-dir", "d", "list"])
        );
        assert_eq!(
            reorder(v(&["warden", "--api=http://x", "status"])),
            v(&["warden", "status", "--api=http://x"])
        );
        assert_eq!(
            reorder(v(&["warden", "--json", "data", "show", "notes"])),
            v(&["warden", "data", "--json", "show", "notes"])
        );
        // Not a client command, or nothing to move: as given.
        for args in [
            &["warden", "--data-dir", "d", "up"][..],
            &["warden", "status", "--json"],
            &["warden", "--bogus", "status"],
            &["warden", "--data-dir"],
        ] {
            assert_eq!(reorder(v(args)), v(args));
        }
    }
}
