//! `warden up`'s settings: every one has a key in the config file (`--config FILE`, TOML) and
//! a flag of the same name (`listen` is `--listen`); flags override the file, and the
//! environment sets nothing (but the log filter, `WARDEN_LOG`). [`Config::default`] is the one
//! place every default lives; `docs/warden.example.toml` shows each key with its default.
//!
//! Settings are parsed into types that cannot hold a bad value ([`types`]); a bad value in the
//! file or on the command line is an error naming its key or flag.

mod flags;
pub mod types;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use flags::{help_with_defaults, UpArgs};
pub use types::{AdminToken, AuditMode};
use types::{BridgeName, Cgroups, Cidr, Human, HumanOrSecs, Role, Store};

/// Everything `warden up` can be told.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Directory for the store, secrets and instance logs (created with mode 0700).
    pub data_dir: PathBuf,
    /// The roles this process runs.
    pub roles: Vec<Role>,
    /// Store backend: "embedded" (one machine) or "etcd://HOST:PORT[,HOST:PORT...]".
    pub store: Store,
    /// PEM CA certificate of the etcd members (turns on TLS towards etcd).
    pub etcd_ca: Option<PathBuf>,
    /// PEM client certificate for etcd, with `etcd_key`.
    pub etcd_cert: Option<PathBuf>,
    /// PEM key of `etcd_cert`.
    pub etcd_key: Option<PathBuf>,
    /// etcd user, with `etcd_password_file`, when etcd's authentication is on.
    pub etcd_user: Option<String>,
    /// File holding the etcd user's password (never the password itself: it would show in `ps`).
    pub etcd_password_file: Option<PathBuf>,
    /// Create a demo lattice, demo users and the demo app.
    pub demo: bool,
    /// This node's name, unique in the cluster [absent: a random id kept in the data dir].
    pub node_name: Option<String>,
    /// With etcd, on every node but the first: a file holding the cluster's join token (the
    /// first node writes it to its data dir, file join-token).
    pub join_token_file: Option<PathBuf>,
    /// With etcd, on a node with the agent: the address of its node port, where the other
    /// nodes (and only they: mutual TLS) reach its instances [absent: 127.0.0.1, a free port,
    /// which only nodes on the same machine reach].
    pub advertise: Option<SocketAddr>,

    /// Gateway address; port 0 picks a free one.
    pub listen: SocketAddr,
    /// Open gateway connections beyond which new ones get 503.
    pub max_connections: usize,
    /// Largest request head the gateway accepts; larger ones get 431.
    pub max_header_bytes: usize,
    /// Largest request body the gateway accepts; larger ones get 413.
    pub max_body_bytes: usize,
    /// Time a client gets to send a request head before 408.
    pub header_timeout: Human,
    /// Time an instance gets to answer a forwarded request before the client gets 504.
    pub upstream_timeout: Human,
    /// Lifetime of a login session.
    pub session_ttl: Human,
    /// Lifetime of an operator's API session (`warden login`).
    pub operator_session_ttl: Human,
    /// The shared break-glass admin token: on (written to the data dir and accepted) or off.
    pub admin_token: AdminToken,

    /// TLS listen address [with --demo and no certificate: beside the gateway, its port + 2,
    /// with a self-signed certificate].
    pub tls_listen: Option<SocketAddr>,
    /// PEM certificate chains for TLS; several for several names (SNI picks, the first is the
    /// default).
    pub tls_cert: Vec<PathBuf>,
    /// PEM private keys, one per `tls_cert` in the same position.
    pub tls_key: Vec<PathBuf>,
    /// Handshake admission control: full handshakes beyond what the CPU can finish are refused
    /// at once (off: every handshake is admitted).
    pub tls_admission: bool,
    /// Full TLS handshakes in progress at once [absent: 64 per core].
    pub tls_handshake_concurrency: Option<usize>,
    /// Full TLS handshakes that may wait for a slot before the rest are refused [absent: 64 per
    /// core].
    pub tls_handshake_queue: Option<usize>,
    /// Longest wait of a full TLS handshake in the queue.
    pub tls_queue_wait: Human,
    /// Time a client gets to finish its TLS handshake.
    pub tls_handshake_timeout: Human,

    /// How long a verified password is trusted without running Argon2id again.
    pub auth_cache_ttl: Human,
    /// How long a refused password is answered from memory.
    pub auth_negative_ttl: Human,
    /// Failed sign-ins per client address per window before 429 (IPv6 by /64).
    pub auth_failures_per_addr: u32,
    /// Failed sign-ins per client address for one user per window before 429.
    pub auth_failures_per_addr_user: u32,
    /// Failed sign-ins for one user from every address together per window, beyond which the
    /// addresses that failed for that user get 429; an address that has not failed still has
    /// the user's password checked, so nobody can lock a user out.
    pub auth_failures_per_user: u32,
    /// The window of sign-in throttling.
    pub auth_window: Human,
    /// Whether people may sign in with a name and password (Basic, the sign-in page's form,
    /// JSON to `/login`); off, those are refused with 403 and only identity providers sign in.
    pub password_sign_in: bool,
    /// Argon2id memory of new password hashes, in KiB.
    pub argon2_memory_kib: u32,
    /// Argon2id passes of new password hashes.
    pub argon2_iterations: u32,
    /// Argon2id lanes of new password hashes.
    pub argon2_parallelism: u32,

    /// API address; port 0 picks a free one.
    pub api_listen: SocketAddr,
    /// Open API connections beyond which new ones get 503 (builds and instances can reach the
    /// API's port, so it is bounded like the gateway's).
    pub api_max_connections: usize,
    /// Time an API client gets to send a request head; an idle keep-alive connection is closed
    /// after it too.
    pub api_header_timeout: Human,
    /// Time an API client may leave its request body unsent or the answer unread before the
    /// connection is cut.
    pub api_idle_timeout: Human,
    /// The origin a TLS-terminating proxy in front of the API serves the dashboard at
    /// (`https://HOST[:PORT]`): the dashboard's cookies are then `Secure` and its forms are
    /// taken from that origin only [absent: the API's own, plain HTTP].
    pub ui_origin: Option<String>,

    /// Most app instances this node runs at once; beyond it requests get 503.
    pub max_instances: u32,
    /// Size in MiB at which an instance's log is cut back to its newer half (checked twice a
    /// second).
    pub max_log_mb: u64,
    /// Largest upload `warden push` may send to this node's API, in MiB; the unpacked tree may
    /// be at most four times as large.
    pub max_upload_mb: u64,
    /// Size in MiB at which the audit log's segment is closed and a new one begun.
    pub audit_segment_mb: u64,
    /// The audit log's older segments are dropped (each drop recorded) while they hold more
    /// than this many MiB.
    pub audit_retain_mb: u64,
    /// The audit log's segments last written more than this many days ago are dropped.
    pub audit_retain_days: u64,
    /// Whether this node keeps an audit log (on), refuses access while it cannot write
    /// (required), or keeps none (off: only to measure its cost).
    pub audit: AuditMode,
    /// How often the gateway writes its summed audit records (sign-ins, accesses, refusals),
    /// in milliseconds; what a crash can lose is at most this long.
    pub audit_flush_ms: u64,
    /// Longest a push's build may run (`"15m"`; a bare number is seconds).
    pub build_timeout: HumanOrSecs,
    /// Sandbox limits through cgroups where warden may write a hierarchy (auto), or through
    /// rlimits only (off).
    pub cgroups: Cgroups,
    /// Bridge that sandboxes of apps with network "bridged" are attached to; created (as root)
    /// when first needed, removed at shutdown if warden created it.
    pub bridge: BridgeName,
    /// IPv4 network of the bridge: the bridge takes the first address, instances the rest.
    pub bridge_cidr: Cidr,
    /// How long the node's records outlive it when it dies without deregistering.
    pub node_lease_ttl: Human,
    /// A node loaded above the cluster's mean load by more than this (a fraction of its
    /// capacity) gets no new instances (seed 003 §3.3.2).
    pub start_margin: f64,
    /// A node loaded above the mean by more than this moves instances to other nodes, each
    /// after its replacement is ready.
    pub shed_margin: f64,
    /// Read this node's load from a JSON file (`memory_used`, `cpu_busy`, `load_per_core`,
    /// fractions) instead of /proc: for load measured another way, or to try placement by load
    /// with several nodes on one machine.
    pub load_file: Option<PathBuf>,
    /// The PostgreSQL apps' databases live on (`postgres://ADMIN[:PASSWORD]@HOST/DB`; the
    /// password may come from `PGPASSWORD` instead). Unset: a private PostgreSQL under the data
    /// dir when its server programs are installed, else no data; `none`: no data.
    pub data: Option<types::DataUrl>,
    /// OpenID Connect providers people may sign in with at the gateway (`[[oidc]]` tables; in
    /// the file only: a table per provider does not fit a flag).
    pub oidc: Vec<types::OidcTable>,
}

/// A default duration; never zero.
const fn secs(s: u64) -> Human {
    Human(std::time::Duration::from_secs(s))
}

impl Default for Config {
    fn default() -> Self {
        let cost = warden_auth::Argon2Cost::RFC9106_SECOND;
        Self {
            data_dir: "warden-data".into(),
            roles: Role::ALL.to_vec(),
            store: Store(warden_store::Backend::Embedded),
            etcd_ca: None,
            etcd_cert: None,
            etcd_key: None,
            etcd_user: None,
            etcd_password_file: None,
            demo: false,
            node_name: None,
            join_token_file: None,
            advertise: None,
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 7700)),
            max_connections: 10_000,
            max_header_bytes: 16 * 1024,
            max_body_bytes: 10 * 1024 * 1024,
            header_timeout: secs(15),
            upstream_timeout: secs(60),
            session_ttl: secs(12 * 3600),
            operator_session_ttl: secs(12 * 3600),
            admin_token: AdminToken::On,
            tls_listen: None,
            tls_cert: Vec::new(),
            tls_key: Vec::new(),
            tls_admission: true,
            tls_handshake_concurrency: None,
            tls_handshake_queue: None,
            tls_queue_wait: Human(std::time::Duration::from_millis(250)),
            tls_handshake_timeout: secs(10),
            auth_cache_ttl: secs(300),
            auth_negative_ttl: secs(30),
            auth_failures_per_addr: 50,
            auth_failures_per_addr_user: 10,
            auth_failures_per_user: 100,
            auth_window: secs(60),
            password_sign_in: true,
            argon2_memory_kib: cost.memory_kib,
            argon2_iterations: cost.iterations,
            argon2_parallelism: cost.parallelism,
            api_listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 7701)),
            api_max_connections: 256,
            api_header_timeout: secs(15),
            api_idle_timeout: secs(60),
            ui_origin: None,
            max_instances: 256,
            max_log_mb: 8,
            max_upload_mb: 256,
            audit_segment_mb: 64,
            audit_retain_mb: 1024,
            audit_retain_days: 365,
            audit: AuditMode::On,
            audit_flush_ms: 60_000,
            build_timeout: HumanOrSecs(std::time::Duration::from_secs(900)),
            cgroups: Cgroups::Auto,
            bridge: BridgeName("warden0".into()),
            bridge_cidr: Cidr(Ipv4Addr::new(10, 213, 0, 0), 16),
            node_lease_ttl: secs(5),
            start_margin: 0.1,
            shed_margin: 0.2,
            load_file: None,
            data: None,
            oidc: Vec::new(),
        }
    }
}

/// Why the settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read the config file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The config file is not valid TOML for these settings.
    #[error("config file {}: {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong, and where.
        message: String,
    },
    /// A setting has a value that cannot work.
    #[error("{key}: {reason}")]
    Invalid {
        /// The setting (config key; the flag is `--` and the key with '-' for '_').
        key: &'static str,
        /// Why, and what would do.
        reason: String,
    },
}

// === impl Config ===

impl Config {
    /// Reads a config file; every key it leaves out keeps its default.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text).map_err(|message| ConfigError::Parse {
            path: path.to_owned(),
            message,
        })
    }

    /// Parses the text of a config file.
    pub fn parse(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// Checks what the types alone cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, reason: &str| {
            Err(ConfigError::Invalid {
                key,
                reason: reason.to_owned(),
            })
        };
        let etcd = matches!(self.store.0, warden_store::Backend::Etcd(_));
        let etcd_keys = [
            ("etcd_ca", self.etcd_ca.is_some()),
            ("etcd_cert", self.etcd_cert.is_some()),
            ("etcd_key", self.etcd_key.is_some()),
            ("etcd_user", self.etcd_user.is_some()),
            ("etcd_password_file", self.etcd_password_file.is_some()),
        ];
        if let Some(o) = &self.ui_origin {
            let host = o.strip_prefix("https://").unwrap_or("");
            let bad = |c: char| matches!(c, '/' | '?' | '#' | '@') || c.is_whitespace();
            if host.is_empty() || host.contains(bad) {
                return invalid(
                    "ui_origin",
                    "is the origin a TLS proxy serves the dashboard at: https://HOST or https://HOST:PORT, no path",
                );
            }
        }
        if self.advertise.is_some() && !etcd {
            return invalid(
                "advertise",
                "only means something with store = \"etcd://...\"",
            );
        }
        if !(0.0..=1.0).contains(&self.start_margin) || !(0.0..=1.0).contains(&self.shed_margin) {
            return invalid(
                "start_margin",
                "start_margin and shed_margin are fractions of a node's capacity, from 0 to 1",
            );
        }
        if self.shed_margin < self.start_margin {
            return invalid(
                "shed_margin",
                "must be at least start_margin, or a node would shed instances it may start",
            );
        }
        if self.join_token_file.is_some() && !etcd {
            return invalid(
                "join_token_file",
                "only means something with store = \"etcd://...\"",
            );
        }
        if let Some(name) = &self.node_name {
            if let Err(e) = warden_core::name::validate_name("node", name) {
                return invalid("node_name", &e.to_string());
            }
        }
        if let Some((key, _)) = etcd_keys.iter().find(|(_, set)| *set && !etcd) {
            return invalid(key, "only means something with store = \"etcd://...\"");
        }
        if self.etcd_cert.is_some() != self.etcd_key.is_some() {
            return invalid(
                "etcd_key",
                "give etcd_cert and etcd_key together, or neither",
            );
        }
        if self.etcd_cert.is_some() && self.etcd_ca.is_none() {
            return invalid(
                "etcd_ca",
                "a client certificate needs etcd_ca to check the members",
            );
        }
        if self.etcd_user.is_some() != self.etcd_password_file.is_some() {
            return invalid(
                "etcd_password_file",
                "give etcd_user and etcd_password_file together, or neither",
            );
        }
        if self.roles.is_empty() {
            return invalid(
                "roles",
                "name at least one role: gateway, agent, api, checker",
            );
        }
        if self.roles.contains(&Role::Checker) && !etcd {
            return invalid(
                "roles",
                "the checker probes the instances of a cluster: it runs with store = \"etcd://...\" (on one machine the agent removes the records of its dead instances itself)",
            );
        }
        if !(1..=1_048_576).contains(&self.max_log_mb) {
            return invalid("max_log_mb", "use 1 to 1048576 (MiB)");
        }
        if !(1..=65_536).contains(&self.audit_segment_mb) {
            return invalid("audit_segment_mb", "use 1 to 65536 (MiB)");
        }
        if self.audit_retain_mb < self.audit_segment_mb {
            return invalid(
                "audit_retain_mb",
                "keep at least one segment: use audit_segment_mb or more (MiB)",
            );
        }
        if !(1..=36_500).contains(&self.audit_retain_days) {
            return invalid("audit_retain_days", "use 1 to 36500 (days)");
        }
        if !(100..=3_600_000).contains(&self.audit_flush_ms) {
            return invalid("audit_flush_ms", "use 100 to 3600000 (ms)");
        }
        if !(1..=65_536).contains(&self.max_upload_mb) {
            return invalid("max_upload_mb", "use 1 to 65536 (MiB)");
        }
        if self.build_timeout.0 > std::time::Duration::from_secs(86_400) {
            return invalid("build_timeout", "use at most 24h");
        }
        if self.tls_cert.len() != self.tls_key.len() {
            return Err(ConfigError::Invalid {
                key: "tls_key",
                reason: format!(
                    "give one key per certificate (got {} certificates and {} keys)",
                    self.tls_cert.len(),
                    self.tls_key.len()
                ),
            });
        }
        if self.tls_listen.is_some() && self.tls_cert.is_empty() && !self.demo {
            return invalid(
                "tls_listen",
                "a TLS listener needs a certificate: give tls_cert and tls_key (--tls-cert FILE --tls-key FILE)",
            );
        }
        if self.tls_listen.is_none() && !self.tls_cert.is_empty() && !self.demo {
            return invalid(
                "tls_cert",
                "a certificate needs tls_listen (--tls-listen ADDR) to say where to serve TLS",
            );
        }
        for (key, n) in [
            ("max_connections", self.max_connections),
            ("api_max_connections", self.api_max_connections),
            ("max_header_bytes", self.max_header_bytes),
            ("max_body_bytes", self.max_body_bytes),
        ] {
            if n == 0 {
                return invalid(key, "use a value above 0");
            }
        }
        if let Err(e) = self.argon2_cost().hasher() {
            return Err(ConfigError::Invalid {
                key: "argon2_memory_kib",
                reason: e.to_string(),
            });
        }
        Ok(())
    }

    /// Whether this process runs `role`.
    pub fn runs(&self, role: Role) -> bool {
        self.roles.contains(&role)
    }

    /// The cost of new password hashes.
    pub fn argon2_cost(&self) -> warden_auth::Argon2Cost {
        warden_auth::Argon2Cost {
            memory_kib: self.argon2_memory_kib,
            iterations: self.argon2_iterations,
            parallelism: self.argon2_parallelism,
        }
    }

    /// Where TLS is served: as given, or with `--demo` beside the gateway (its port + 2, or a
    /// free port when the gateway's is 0), so that several wardens on one machine never
    /// collide.
    pub fn store_backend(&self) -> warden_store::Backend {
        match &self.store.0 {
            warden_store::Backend::Etcd(o) => {
                warden_store::Backend::Etcd(warden_store::EtcdOptions {
                    endpoints: o.endpoints.clone(),
                    tls: self.etcd_ca.clone().map(|ca| warden_store::EtcdTls {
                        ca,
                        cert: self.etcd_cert.clone(),
                        key: self.etcd_key.clone(),
                    }),
                    user: self.etcd_user.clone(),
                    password_file: self.etcd_password_file.clone(),
                })
            }
            other => other.clone(),
        }
    }

    /// Where this node's node port listens and is reached.
    pub fn advertise(&self) -> SocketAddr {
        self.advertise
            .unwrap_or_else(|| SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
    }

    /// Where the gateway serves TLS, if anywhere.
    pub fn tls_listen(&self) -> Option<SocketAddr> {
        self.tls_listen.or_else(|| {
            self.demo.then(|| {
                let port = match self.listen.port() {
                    0 => 0,
                    p => p.checked_add(2).unwrap_or(0),
                };
                SocketAddr::new(self.listen.ip(), port)
            })
        })
    }

    /// The authentication settings of the gateway.
    pub fn auth(&self) -> warden_gateway::AuthConfig {
        warden_gateway::AuthConfig {
            cache_ttl: self.auth_cache_ttl.0,
            negative_ttl: self.auth_negative_ttl.0,
            failures_per_user: self.auth_failures_per_user,
            failures_per_addr: self.auth_failures_per_addr,
            failures_per_addr_user: self.auth_failures_per_addr_user,
            window: self.auth_window.0,
            argon2: self.argon2_cost(),
            password_sign_in: self.password_sign_in,
        }
    }

    /// Handshake admission control of the TLS listener.
    pub fn admission(&self) -> warden_gateway::AdmissionConfig {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        warden_gateway::AdmissionConfig {
            enabled: self.tls_admission,
            concurrency: self.tls_handshake_concurrency.unwrap_or(64 * cores),
            queue: self.tls_handshake_queue.unwrap_or(64 * cores),
            queue_wait: self.tls_queue_wait.0,
        }
    }
}

#[cfg(test)]
mod tests;
