//! The flags of `warden up`: one per config key, each overriding the file's value, and the
//! help text's defaults taken from [`Config::default`].

use std::net::SocketAddr;
use std::path::PathBuf;

use super::types::{AuditMode, BridgeName, Cgroups, Cidr, Human, HumanOrSecs, Role, Store};
use super::{Config, ConfigError};

/// Flags of `warden up`. Each sets the config key of its name ('-' for '_').
#[derive(Debug, Default, clap::Args)]
pub struct UpArgs {
    /// Read settings from this TOML file first (docs/warden.example.toml lists every key)
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Directory for the store, secrets and instance logs (created with mode 0700)
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Roles this process runs, separated by commas
    #[arg(long, value_delimiter = ',')]
    roles: Option<Vec<Role>>,
    /// Store backend: embedded, or etcd://HOST:PORT[,HOST:PORT...]
    #[arg(long)]
    store: Option<Store>,
    /// PEM CA certificate of the etcd members (turns on TLS towards etcd)
    #[arg(long, value_name = "FILE")]
    etcd_ca: Option<PathBuf>,
    /// PEM client certificate for etcd, with --etcd-key
    #[arg(long, value_name = "FILE")]
    etcd_cert: Option<PathBuf>,
    /// PEM key of --etcd-cert
    #[arg(long, value_name = "FILE")]
    etcd_key: Option<PathBuf>,
    /// etcd user, with --etcd-password-file
    #[arg(long)]
    etcd_user: Option<String>,
    /// File holding the etcd user's password
    #[arg(long, value_name = "FILE")]
    etcd_password_file: Option<PathBuf>,
    /// Create a demo lattice, demo users and the demo app
    #[arg(long)]
    demo: bool,
    /// This node's name, unique in the cluster [default: a random id kept in the data dir]
    #[arg(long)]
    node_name: Option<String>,
    /// With etcd, on every node but the first: a file holding the cluster's join token
    #[arg(long, value_name = "FILE")]
    join_token_file: Option<PathBuf>,
    /// With etcd, on an agent node: its node port's address, where other nodes reach its
    /// instances over mutual TLS [default: 127.0.0.1 and a free port]
    #[arg(long, value_name = "ADDR")]
    advertise: Option<SocketAddr>,
    /// Gateway address; port 0 picks a free one
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Open gateway connections beyond which new ones get 503; lowered at start, with a warning,
    /// to what the open-file limit holds with room for instances, logs and the store
    #[arg(long)]
    max_connections: Option<usize>,
    /// Largest request head accepted; larger ones get 431
    #[arg(long)]
    max_header_bytes: Option<usize>,
    /// Largest request body accepted; larger ones get 413
    #[arg(long)]
    max_body_bytes: Option<usize>,
    /// Time a client gets to send a request head before 408
    #[arg(long)]
    header_timeout: Option<Human>,
    /// Time an instance gets to answer before the client gets 504
    #[arg(long)]
    upstream_timeout: Option<Human>,
    /// Lifetime of a login session
    #[arg(long)]
    session_ttl: Option<Human>,
    /// Lifetime of an operator's API session (`warden login`)
    #[arg(long)]
    operator_session_ttl: Option<Human>,
    /// The shared break-glass admin token: on, or off (only operators' tokens open the API;
    /// needs an owner operator first)
    #[arg(long)]
    admin_token: Option<super::types::AdminToken>,
    /// TLS listen address (with --demo: beside the gateway, its port + 2)
    #[arg(long)]
    tls_listen: Option<SocketAddr>,
    /// PEM certificate chain for TLS; repeat for several names (SNI picks, the first is default)
    #[arg(long = "tls-cert", value_name = "FILE")]
    tls_cert: Vec<PathBuf>,
    /// PEM private key of the --tls-cert in the same position
    #[arg(long = "tls-key", value_name = "FILE")]
    tls_key: Vec<PathBuf>,
    /// Admit every TLS handshake: switches handshake admission control off (tls_admission = false)
    #[arg(long)]
    no_tls_admission: bool,
    /// Full TLS handshakes in progress at once [default: 64 per core]
    #[arg(long)]
    tls_handshake_concurrency: Option<usize>,
    /// Full TLS handshakes that may wait for a slot before the rest are refused [default: 64 per core]
    #[arg(long)]
    tls_handshake_queue: Option<usize>,
    /// Longest wait of a full TLS handshake before it is refused, counted from the arrival of its ClientHello (time spent in the kernel's backlog counts)
    #[arg(long)]
    tls_queue_wait: Option<Human>,
    /// Time a client gets to finish its TLS handshake
    #[arg(long)]
    tls_handshake_timeout: Option<Human>,
    /// How long a verified password is trusted without running Argon2id again
    #[arg(long)]
    auth_cache_ttl: Option<Human>,
    /// How long a refused password is answered from memory
    #[arg(long)]
    auth_negative_ttl: Option<Human>,
    /// Failed sign-ins per client address per window before 429
    #[arg(long)]
    auth_failures_per_addr: Option<u32>,
    /// Failed sign-ins per client address for one user per window before 429
    #[arg(long)]
    auth_failures_per_addr_user: Option<u32>,
    /// Failed sign-ins for one user from everywhere per window, beyond which addresses that
    /// failed for that user get 429 (others are still checked)
    #[arg(long)]
    auth_failures_per_user: Option<u32>,
    /// The window of sign-in throttling
    #[arg(long)]
    auth_window: Option<Human>,
    /// Refuse names and passwords (Basic, the sign-in form, JSON) with 403: people sign in
    /// only through identity providers (password_sign_in = false)
    #[arg(long)]
    no_password_sign_in: bool,
    /// Argon2id memory of new password hashes, in KiB
    #[arg(long)]
    argon2_memory_kib: Option<u32>,
    /// Argon2id passes of new password hashes
    #[arg(long)]
    argon2_iterations: Option<u32>,
    /// Argon2id lanes of new password hashes
    #[arg(long)]
    argon2_parallelism: Option<u32>,
    /// API address; port 0 picks a free one
    #[arg(long)]
    api_listen: Option<SocketAddr>,
    /// Open API connections beyond which new ones get 503
    #[arg(long)]
    api_max_connections: Option<usize>,
    /// Time an API client gets to send a request head (idle keep-alive connections too)
    #[arg(long)]
    api_header_timeout: Option<Human>,
    /// Time an API client may leave its request body unsent or the answer unread
    #[arg(long)]
    api_idle_timeout: Option<Human>,
    /// The origin a TLS proxy in front of the API serves the dashboard at (`https://HOST[:PORT]`):
    /// its cookies get Secure and its forms are taken from there only
    #[arg(long)]
    ui_origin: Option<String>,
    /// Most app instances this node runs at once; beyond it requests get 503
    #[arg(long)]
    max_instances: Option<u32>,
    /// Size in MiB at which an instance's log is cut back to its newer half
    #[arg(long)]
    max_log_mb: Option<u64>,
    /// Largest upload `warden push` may send to this API, in MiB
    #[arg(long)]
    max_upload_mb: Option<u64>,
    /// Longest a push's build may run, like 15m (a bare number is seconds)
    #[arg(long)]
    build_timeout: Option<HumanOrSecs>,
    /// Size in MiB at which the audit log begins a new segment
    #[arg(long)]
    audit_segment_mb: Option<u64>,
    /// MiB of older audit segments kept; older ones are dropped (and the drop recorded)
    #[arg(long)]
    audit_retain_mb: Option<u64>,
    /// Days an audit segment is kept after its last write
    #[arg(long)]
    audit_retain_days: Option<u64>,
    /// Keep an audit log and serve with an alarm when it cannot write (on), refuse access and
    /// changes while it cannot (required), or record nothing (off: only to measure its cost)
    #[arg(long)]
    audit: Option<AuditMode>,
    /// How often the gateway and the API write their summed audit records, in milliseconds
    #[arg(long)]
    audit_flush_ms: Option<u64>,
    /// Sandbox limits through cgroups where possible (auto), or rlimits only (off)
    #[arg(long)]
    cgroups: Option<Cgroups>,
    /// Bridge for sandboxes of network "bridged"; created when first needed (as root)
    #[arg(long)]
    bridge: Option<BridgeName>,
    /// IPv4 network of the bridge: the bridge takes the first address, instances the rest
    #[arg(long)]
    bridge_cidr: Option<Cidr>,
    /// How long the node's records outlive it when it dies without deregistering
    #[arg(long)]
    node_lease_ttl: Option<Human>,
    /// A node loaded above the cluster mean by more than this fraction gets no new instances
    #[arg(long)]
    start_margin: Option<f64>,
    /// A node loaded above the cluster mean by more than this fraction sheds instances
    #[arg(long)]
    shed_margin: Option<f64>,
    /// Read this node's load from a JSON file instead of /proc
    #[arg(long)]
    load_file: Option<PathBuf>,
    /// PostgreSQL for apps' databases: postgres://ADMIN@HOST/DB, or ADMIN:PASSWORD@ where it needs one (default: a private one under the data dir when PostgreSQL is installed; none: no data)
    #[arg(long)]
    data: Option<super::types::DataUrl>,
}

/// Sets `$cfg.$key` from `$args.$key` when the flag was given.
macro_rules! overlay {
    ($args:ident, $cfg:ident: $($key:ident),+ $(,)?) => {
        $(if let Some(v) = $args.$key { $cfg.$key = v; })+
    };
}

// === impl UpArgs ===

impl UpArgs {
    /// The settings: defaults, then the config file, then these flags; checked.
    pub fn into_config(self) -> Result<Config, ConfigError> {
        let mut cfg = match &self.config {
            Some(path) => Config::load(path)?,
            None => Config::default(),
        };
        self.overlay(&mut cfg);
        cfg.validate()?;
        Ok(cfg)
    }

    fn overlay(self, cfg: &mut Config) {
        let a = self;
        overlay!(a, cfg:
            data_dir, roles, store, listen, max_connections, max_header_bytes, max_body_bytes,
            header_timeout, upstream_timeout, session_ttl, operator_session_ttl, admin_token,
            tls_queue_wait,
            tls_handshake_timeout, auth_cache_ttl,
            auth_negative_ttl, auth_failures_per_user, auth_failures_per_addr,
            auth_failures_per_addr_user, auth_window,
            argon2_memory_kib, argon2_iterations, argon2_parallelism, api_listen,
            api_max_connections, api_header_timeout, api_idle_timeout,
            max_instances, max_log_mb, max_upload_mb, audit_segment_mb, audit_retain_mb,
            audit_retain_days, audit, audit_flush_ms, build_timeout, cgroups, bridge, bridge_cidr, node_lease_ttl,
            start_margin, shed_margin,
        );
        if a.load_file.is_some() {
            cfg.load_file = a.load_file;
        }
        if a.data.is_some() {
            cfg.data = a.data;
        }
        if a.ui_origin.is_some() {
            cfg.ui_origin = a.ui_origin;
        }
        for (flag, key) in [
            (
                a.tls_handshake_concurrency,
                &mut cfg.tls_handshake_concurrency,
            ),
            (a.tls_handshake_queue, &mut cfg.tls_handshake_queue),
        ] {
            if flag.is_some() {
                *key = flag;
            }
        }
        if a.tls_listen.is_some() {
            cfg.tls_listen = a.tls_listen;
        }
        for (flag, key) in [
            (a.etcd_ca, &mut cfg.etcd_ca),
            (a.etcd_cert, &mut cfg.etcd_cert),
            (a.etcd_key, &mut cfg.etcd_key),
            (a.etcd_password_file, &mut cfg.etcd_password_file),
            (a.join_token_file, &mut cfg.join_token_file),
        ] {
            if flag.is_some() {
                *key = flag;
            }
        }
        if a.etcd_user.is_some() {
            cfg.etcd_user = a.etcd_user;
        }
        if a.advertise.is_some() {
            cfg.advertise = a.advertise;
        }
        if a.node_name.is_some() {
            cfg.node_name = a.node_name;
        }

        if a.demo {
            cfg.demo = true;
        }
        if a.no_tls_admission {
            cfg.tls_admission = false;
        }
        if a.no_password_sign_in {
            cfg.password_sign_in = false;
        }
        if !a.tls_cert.is_empty() || !a.tls_key.is_empty() {
            cfg.tls_cert = a.tls_cert;
            cfg.tls_key = a.tls_key;
        }
    }
}

/// `up`'s help with each flag's default from [`Config::default`] added, so the defaults are
/// written in one place only.
pub fn help_with_defaults(up: clap::Command) -> clap::Command {
    let Ok(toml::Value::Table(defaults)) = toml::Value::try_from(Config::default()) else {
        return up;
    };
    let ids: Vec<(String, String)> = up
        .get_arguments()
        .filter_map(|a| Some((a.get_id().to_string(), a.get_long()?.replace('-', "_"))))
        .collect();
    ids.into_iter().fold(up, |up, (id, key)| {
        let Some(value) = defaults.get(&key) else {
            return up;
        };
        let shown = match value {
            toml::Value::String(s) => s.clone(),
            toml::Value::Array(a) if a.is_empty() => return up,
            toml::Value::Array(a) => a
                .iter()
                .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
                .collect::<Vec<_>>()
                .join(","),
            toml::Value::Boolean(_) => return up,
            other => other.to_string(),
        };
        up.mut_arg(id, |a| {
            let help = a.get_help().map(ToString::to_string).unwrap_or_default();
            a.help(format!("{help} [default: {shown}]"))
        })
    })
}
