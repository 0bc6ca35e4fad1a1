//! The PostgreSQL warden administers: one it is pointed at ([`Server::external`]) or a private
//! one it runs under its data dir ([`Server::private`], see [`private`]).
//!
//! Either way warden talks to it as an admin role (a superuser: it makes databases and roles
//! and revokes catalog functions from PUBLIC) through [`Server::admin`]. Logs and errors never
//! contain a password: [`Server`]'s `Debug` names only the user, host and database.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use tokio_postgres::config::Host;
use tokio_postgres::{Client, Config, NoTls};

mod keeper;
mod log;
pub mod private;

pub use private::PrivateServer;

/// The admin role of a private server; it logs in by peer authentication only.
pub const PRIVATE_ADMIN: &str = "warden_admin";

/// A PostgreSQL warden administers.
pub enum Server {
    /// A server warden is pointed at (`postgres://ADMIN@HOST/DB`).
    External(External),
    /// A server warden runs under its data dir, reachable only over a Unix socket.
    Private(PrivateServer),
}

/// An external server's admin connection settings. The password is kept for connecting and
/// never printed.
#[derive(Clone)]
pub struct External {
    config: Config,
}

/// Where a role reaches the server: a Unix socket directory or a TCP host, and a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// The directory holding the server's `.s.PGSQL.<port>` socket.
    Socket {
        /// The socket directory.
        dir: PathBuf,
        /// The port, which names the socket file.
        port: u16,
    },
    /// A TCP host and port.
    Tcp {
        /// Host name or address.
        host: String,
        /// Port.
        port: u16,
    },
}

/// Why the server could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The URL given is not a usable PostgreSQL URL.
    #[error("the data URL is not usable: {0}; write postgres://ADMIN[:PASSWORD]@HOST[:PORT]/DB")]
    BadUrl(String),
    /// PostgreSQL's server programs were not found.
    #[error(
        "PostgreSQL's server programs (initdb, postgres) were not found: {0}; install them \
         (Debian and Ubuntu: apt-get install postgresql) or give warden a server's URL"
    )]
    ProgramsMissing(String),
    /// The installed PostgreSQL is older than 15.
    #[error(
        "PostgreSQL {found} is installed at {bindir}; warden needs 15 or later (install a \
         newer postgresql package or give warden a server's URL)"
    )]
    TooOld {
        /// The major version found.
        found: u32,
        /// Where its programs are.
        bindir: PathBuf,
    },
    /// The socket's path would not fit a Unix socket address.
    #[error(
        "the private PostgreSQL's socket under {0} would be longer than a Unix socket path may \
         be (about 100 bytes); use a shorter data dir"
    )]
    SocketPathTooLong(PathBuf),
    /// The server's OS user cannot enter a directory above the data dir.
    #[error(
        "the private PostgreSQL runs as the `{user}` user, which cannot enter {blocked} (above \
         its directory {dir}); let it through with `chmod o+x {blocked}`, or give warden a \
         --data-dir whose parent directories other users may enter"
    )]
    Untraversable {
        /// The user the server runs as.
        user: String,
        /// The server's directory.
        dir: PathBuf,
        /// The first directory on the way that the user may not enter.
        blocked: PathBuf,
    },
    /// `initdb` failed.
    #[error("initdb failed for {dir}; its last lines:\n{tail}")]
    InitdbFailed {
        /// The data directory.
        dir: PathBuf,
        /// The last lines of its output.
        tail: String,
    },
    /// The private server did not come up.
    #[error("the private PostgreSQL did not start (its log is {log}); its last lines:\n{tail}")]
    NotStarted {
        /// The server's log file.
        log: PathBuf,
        /// The last lines of the log.
        tail: String,
    },
    /// A file or process operation on the private server's directory failed.
    #[error("{what} ({path}): {source}")]
    Io {
        /// What warden was doing.
        what: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Connecting as the admin failed.
    #[error("cannot connect to PostgreSQL as the admin ({server}): {source}")]
    Connect {
        /// The server, without password.
        server: String,
        /// The cause.
        source: tokio_postgres::Error,
    },
}

// === impl Server ===

impl Server {
    /// A server warden is pointed at. The password comes from the URL or, if the URL has
    /// none, from `PGPASSWORD`.
    pub fn external(url: &str) -> Result<Self, ServerError> {
        let mut config = Config::from_str(url).map_err(|e| ServerError::BadUrl(e.to_string()))?;
        if config.get_user().is_none() {
            return Err(ServerError::BadUrl("it names no admin user".into()));
        }
        if config.get_hosts().is_empty() {
            return Err(ServerError::BadUrl("it names no host".into()));
        }
        if config.get_password().is_none() {
            if let Ok(pw) = std::env::var("PGPASSWORD") {
                config.password(pw);
            }
        }
        config.connect_timeout(Duration::from_secs(10));
        config.application_name("warden");
        Ok(Server::External(External { config }))
    }

    /// Runs (or adopts after a crash) a private server under `dir`; see [`PrivateServer::start`].
    pub async fn private(dir: &Path) -> Result<Self, ServerError> {
        Ok(Server::Private(PrivateServer::start(dir).await?))
    }

    /// Where roles reach the server.
    pub fn endpoint(&self) -> Endpoint {
        match self {
            Server::External(e) => {
                let port = e.config.get_ports().first().copied().unwrap_or(5432);
                match e.config.get_hosts().first() {
                    Some(Host::Tcp(h)) => Endpoint::Tcp {
                        host: h.clone(),
                        port,
                    },
                    Some(Host::Unix(p)) => Endpoint::Socket {
                        dir: p.clone(),
                        port,
                    },
                    // `external` refuses a URL without host.
                    None => Endpoint::Tcp {
                        host: "localhost".into(),
                        port,
                    },
                }
            }
            Server::Private(p) => Endpoint::Socket {
                dir: p.socket_dir().to_owned(),
                port: private::PORT,
            },
        }
    }

    /// A connection as the admin to `dbname` (the URL's database, or `postgres` for a private
    /// server, when `None`). Its connection task ends when the client is dropped.
    pub async fn admin(&self, dbname: Option<&str>) -> Result<Client, ServerError> {
        let mut config = match self {
            Server::External(e) => e.config.clone(),
            Server::Private(p) => p.admin_config(),
        };
        if let Some(db) = dbname {
            config.dbname(db);
        }
        // Only PostgreSQL's own functions and operators resolve in warden's SQL: an app's owner
        // may put objects in `public` of its database, and warden's connections are superuser.
        config.options("-c search_path=pg_catalog,pg_temp");
        let (client, connection) =
            config
                .connect(NoTls)
                .await
                .map_err(|source| ServerError::Connect {
                    server: format!("{self:?}"),
                    source,
                })?;
        // The connection future owns the socket; it returns when the client is dropped or the
        // server goes away, and its error then shows up on the client's next query.
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "admin connection to PostgreSQL ended");
            }
        });
        Ok(client)
    }

    /// Stops a private server (fast shutdown) and waits for it; nothing for an external one.
    pub async fn shutdown(self) {
        if let Server::Private(p) = self {
            p.shutdown().await;
        }
    }
}

impl fmt::Debug for Server {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Server::External(e) => write!(f, "external {e:?}"),
            Server::Private(p) => write!(f, "private PostgreSQL under {}", p.dir().display()),
        }
    }
}

impl fmt::Debug for External {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.config;
        let host = match c.get_hosts().first() {
            Some(Host::Tcp(h)) => h.clone(),
            Some(Host::Unix(p)) => p.display().to_string(),
            None => String::new(),
        };
        write!(
            f,
            "postgres://{}@{}/{}",
            c.get_user().unwrap_or(""),
            host,
            c.get_dbname().unwrap_or("")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_debug_redacts_the_password() {
        let s = Server::external("postgres://admin:hunter2@db.internal:5433/app").expect("url");
        let shown = format!("{s:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("admin@db.internal/app"), "{shown}");
        assert_eq!(
            s.endpoint(),
            Endpoint::Tcp {
                host: "db.internal".into(),
                port: 5433
            }
        );
    }

    #[test]
    fn external_refuses_a_url_without_user() {
        assert!(matches!(
            Server::external("postgres://db.internal/app"),
            Err(ServerError::BadUrl(_))
        ));
    }
}
