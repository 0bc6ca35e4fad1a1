//! The socket each instance reaches its database through.
//!
//! An instance gets `DATABASE_URL=postgresql:///<db>?host=<dir>`; behind `<dir>/.s.PGSQL.5432`
//! is a [`Listener`] of this module. It authenticates to PostgreSQL on the instance's behalf
//! (SCRAM-SHA-256, as the role its [`Target`] names), so the instance holds no password: the
//! socket is its credential. The client's `user` and `database` startup parameters are
//! ignored: the socket decides both, whatever a client library sends by default.
//!
//! Server connections are pooled per role ([`Pool`]) as pgbouncer's session mode does: a
//! client has one server connection for its whole life; when it leaves, the connection is
//! reset with `DISCARD ALL` and kept idle only if the reset answered ReadyForQuery idle (a
//! client that left inside a transaction or mid-query leaves a connection that is closed).
//!
//! What the proxy guarantees whatever a client sends: every NotificationResponse from the
//! server is dropped (LISTEN/NOTIFY would be a channel between labels); every message is
//! bounded ([`Limits::max_message`]); connections per listener are bounded and a startup must
//! arrive in time, so a flood costs only that listener; server connections are bounded per
//! app, and so are the clients waiting for one ([`Limits::max_server_per_app`]), so a flood
//! through every instance of an app costs only that app. A server that is down or
//! unreachable costs a client a prompt error (within [`Limits::server_timeout`]), never a
//! hang, and the next client connects again. Logs and errors never contain the
//! role's password: [`Target`]'s `Debug` leaves it out.
//!
//! A role may change its own password (`ALTER ROLE CURRENT_USER PASSWORD`, which PostgreSQL
//! lets every role do and no event trigger sees), which would stop every other instance of its
//! label from logging in. A listener bound with a [`Heal`] ([`Listener::bind_healing`]) heals
//! that by itself: when PostgreSQL refuses the password (28P01), it has the heal set the
//! role's password again and logs in once more.
//!
//! Split by direction: `downstream.rs` (the listener and a client's startup), `relay.rs`
//! (messages both ways), `upstream.rs` (a server connection: connect, SCRAM, reset),
//! `pool.rs` (idle connections and the cancel keys handed out), `wire.rs` (framing).

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

mod downstream;
mod pool;
mod relay;
mod upstream;
mod wire;

pub use downstream::Listener;
pub use pool::Pool;

/// Which role the proxy logs in as, where, and to which database.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Target {
    /// The role (`wl_<h>`): a role for exactly one label (and user).
    pub role: String,
    /// The role's password, derived by the caller; only ever sent through SCRAM.
    pub password: String,
    /// The server.
    pub server: ServerAddr,
    /// The database (`warden_app_<name>`).
    pub database: String,
}

impl fmt::Debug for Target {
    // By hand so the password never reaches a log line or an error.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Target")
            .field("role", &self.role)
            .field("server", &self.server)
            .field("database", &self.database)
            .finish_non_exhaustive()
    }
}

/// Sets the listener's role's password (and attributes) to warden's again, after PostgreSQL
/// refused it: the caller's administrator does it (`Admin::reset_role`). The error says why
/// it could not.
pub type Heal =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// Where PostgreSQL listens.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ServerAddr {
    /// A Unix socket directory and port: the socket is `<dir>/.s.PGSQL.<port>`.
    Unix {
        /// The directory (PostgreSQL's `unix_socket_directories`).
        dir: PathBuf,
        /// The port number in the socket's name.
        port: u16,
    },
    /// A TCP address, `host:port` (loopback or a private network to the database).
    Tcp(String),
}

impl fmt::Display for ServerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServerAddr::Unix { dir, port } => write!(f, "{}/.s.PGSQL.{port}", dir.display()),
            ServerAddr::Tcp(addr) => f.write_str(addr),
        }
    }
}

/// The proxy's bounds; `Default` gives the production ones.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Clients connected at once through one listener; past it, a new client gets
    /// `too many connections`.
    pub max_clients: usize,
    /// The largest message body a client may send; past it, that client gets an error and
    /// is closed.
    pub max_message: usize,
    /// How long a client has to send its startup packet.
    pub startup_timeout: Duration,
    /// Idle server connections kept per role.
    pub max_idle: usize,
    /// How long a server connection is kept idle before it is closed.
    pub idle_timeout: Duration,
    /// How long connecting and authenticating to PostgreSQL, or resetting a connection, may
    /// take before it counts as unreachable.
    pub server_timeout: Duration,
    /// Server connections one app (its database) may have open, busy or idle, over all its
    /// roles and instances: no app can take every connection of the server.
    pub max_server_per_app: usize,
    /// Clients of one app that may wait for a server connection when it has all of its own;
    /// past them, a client gets `too many connections` at once.
    pub max_waiting_per_app: usize,
    /// How long a client waits for a server connection before it gets `too many
    /// connections`.
    pub queue_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_clients: 100,
            // PostgreSQL allows 1 GB; an app that needs more than this per message (a huge
            // bytea in one parameter) is better served by COPY, which is many messages.
            max_message: 64 << 20,
            startup_timeout: Duration::from_secs(5),
            // At least the role's busiest moment: clients that reconnect at once find the
            // connections of those just gone still in their reset, and a bound below that
            // churns backends (pgbench -C with 8 clients: 3,800 tps at 8, 4,500 at 50).
            max_idle: 32,
            idle_timeout: Duration::from_secs(60),
            server_timeout: Duration::from_secs(10),
            // As many as one role may have (`schema::CONNECTION_LIMIT`), so the pool's bound
            // is met before PostgreSQL's, and under the app's database limit (48): with a
            // private server's 100, others still have most of them.
            max_server_per_app: 32,
            max_waiting_per_app: 64,
            queue_timeout: Duration::from_secs(5),
        }
    }
}

/// Why a listener could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The socket path exists and is not a socket, so it is not ours to replace.
    #[error("{0} exists and is not a socket; remove it or pick another path")]
    PathTaken(PathBuf),
    /// Binding the socket failed.
    #[error("cannot listen on {path}: {source}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The OS's reason.
        source: std::io::Error,
    },
}
