//! The listener an instance connects to, and each client's startup: negotiation, the
//! parameters it may set, the proxy's own login answer, then the relay.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{BufMut, BytesMut};
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use nix::unistd::{unlinkat, UnlinkatFlags};
use postgres_protocol::escape::escape_literal;
use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tracing::Instrument;

use super::pool::AcquireError;
use super::relay::{self, End, Owed};
use super::upstream::{self, ServerConn, StatementError, UpstreamError};
use super::wire::{self, Startup};
use super::{Heal, Pool, ProxyError, Target};

/// Startup parameters a client may set, applied on its server connection with `SET`, by
/// their canonical names (pgbouncer tracks the same ones). `user` and `database` are ignored:
/// the socket decides both. Anything else (`options`, `replication`, any GUC) is refused.
const ALLOWED: [&str; 7] = [
    "application_name",
    "client_encoding",
    "DateStyle",
    "TimeZone",
    "IntervalStyle",
    "extra_float_digits",
    "search_path",
];
const IGNORED: [&str; 2] = ["user", "database"];

static NEXT_LISTENER: AtomicU64 = AtomicU64::new(1);

/// One instance's socket. Dropping it stops accepting, ends its clients and removes the
/// socket file.
pub struct Listener {
    path: PathBuf,
    /// The socket's directory as it was at bind: the socket is removed through it, since the
    /// directory's parent may be the instance's own (a sandbox's `/data`), where the app can
    /// put a symlink in the directory's place by the time warden, as root, cleans up.
    dir: OwnedFd,
    task: JoinHandle<()>,
}

struct Shared {
    id: u64,
    target: Target,
    pool: Pool,
    /// One permit per client connected; past them, a client is refused.
    slots: Arc<Semaphore>,
    /// Refusals in flight (each waits for its client's startup); past them, a connection is
    /// closed at once, so a flood holds a bounded number of tasks.
    refusals: Arc<Semaphore>,
    /// Sets the role's password again when PostgreSQL refuses it.
    heal: Option<Heal>,
    /// One heal at a time, and how many were done: clients refused together heal once.
    healing: tokio::sync::Mutex<u64>,
}

// === impl Listener ===

impl Listener {
    /// Listens on `path` for clients that will reach `target` through `pool`. A stale socket
    /// at `path` is replaced; any other file there is an error. Must run inside a tokio
    /// runtime.
    pub fn bind(
        path: impl Into<PathBuf>,
        target: Target,
        pool: Pool,
    ) -> Result<Listener, ProxyError> {
        Self::bind_healing(path, target, pool, None)
    }

    /// As [`Listener::bind`]; a login PostgreSQL refuses for the role's password (SQLSTATE
    /// 28P01: an instance of the label changed it) runs `heal` and is tried once more.
    pub fn bind_healing(
        path: impl Into<PathBuf>,
        target: Target,
        pool: Pool,
        heal: Option<Heal>,
    ) -> Result<Listener, ProxyError> {
        let path = path.into();
        if let Ok(meta) = std::fs::symlink_metadata(&path) {
            use std::os::unix::fs::FileTypeExt;
            if !meta.file_type().is_socket() {
                return Err(ProxyError::PathTaken(path));
            }
            let _ = std::fs::remove_file(&path);
        }
        let listener = UnixListener::bind(&path).map_err(|source| ProxyError::Bind {
            path: path.clone(),
            source,
        })?;
        let dir = parent_dir(&path).map_err(|source| ProxyError::Bind {
            path: path.clone(),
            source,
        })?;
        let max = pool.limits().max_clients;
        let shared = Arc::new(Shared {
            id: NEXT_LISTENER.fetch_add(1, Ordering::Relaxed),
            target,
            pool,
            slots: Arc::new(Semaphore::new(max)),
            refusals: Arc::new(Semaphore::new(max)),
            heal,
            healing: tokio::sync::Mutex::new(0),
        });
        let span =
            tracing::info_span!("data_proxy", listener = shared.id, socket = %path.display());
        let task = tokio::spawn(accept_loop(listener, shared).instrument(span));
        Ok(Listener { path, dir, task })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        // Aborting the loop drops its JoinSet, which aborts every client task.
        self.task.abort();
        if let Some(name) = self.path.file_name() {
            let _ = unlinkat(&self.dir, name, UnlinkatFlags::NoRemoveDir);
        }
    }
}

/// The directory `path` names an entry of, opened so the entry can be named through it later
/// whatever then stands at the directory's path.
fn parent_dir(path: &Path) -> std::io::Result<OwnedFd> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    Ok(nix::fcntl::open(dir, flags, Mode::empty())?)
}

async fn accept_loop(listener: UnixListener, shared: Arc<Shared>) {
    let mut clients = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    if let Ok(slot) = shared.slots.clone().try_acquire_owned() {
                        let span = tracing::info_span!("client", role = %shared.target.role);
                        clients.spawn(client(stream, shared.clone(), slot).instrument(span));
                    } else if let Ok(permit) = shared.refusals.clone().try_acquire_owned() {
                        clients.spawn(refuse(stream, shared.clone(), permit));
                    }
                    // Else the stream is dropped: closed at once.
                }
                Err(e) => {
                    // Out of descriptors, most likely: wait rather than spin.
                    warden_core::log_limited!(warn, error = %e, "accepting a data client failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            },
            Some(_) = clients.join_next(), if !clients.is_empty() => {}
        }
    }
}

/// A client past the listener's bound: its startup is read (a cancel is still honoured),
/// then it is told `too many connections`.
async fn refuse(mut stream: UnixStream, shared: Arc<Shared>, _permit: OwnedSemaphorePermit) {
    if negotiate(&mut stream, &shared).await.is_some() {
        let max = shared.pool.limits().max_clients;
        let msg = format!("too many connections to this data socket (at most {max})");
        fatal(
            &mut stream,
            "53300",
            &msg,
            "close idle connections or pool them in the app",
        )
        .await;
    }
}

async fn client(mut stream: UnixStream, shared: Arc<Shared>, _slot: OwnedSemaphorePermit) {
    let Some(params) = negotiate(&mut stream, &shared).await else {
        return;
    };
    let sets = match allowed(&params) {
        Ok(sets) => sets,
        Err(refused) => {
            let msg = refused.to_string();
            let hint = format!(
                "it takes {}; the role and database are the socket's",
                ALLOWED.join(", ")
            );
            return fatal(&mut stream, "0A000", &msg, &hint).await;
        }
    };
    let target = &shared.target;
    let mut conn = match acquire(&shared).await {
        Ok(conn) => conn,
        Err(e @ AcquireError::Full { .. }) => {
            warden_core::log_limited!(warn, error = %e, "a data client refused: its app has every server connection it may have");
            let hint =
                "close idle connections or pool them in the app; other apps are not affected";
            return fatal(&mut stream, "53300", &e.to_string(), hint).await;
        }
        Err(AcquireError::Upstream(e)) => {
            warden_core::log_limited!(warn, error = %e, "no server connection for a data client");
            let (code, msg) = unreachable(&e);
            return fatal(&mut stream, code, &msg, "retry in a moment").await;
        }
    };
    match conn.apply(&sets, shared.pool.limits().server_timeout).await {
        Ok(()) => {}
        Err(StatementError::Sql { code, message }) => {
            fatal(
                &mut stream,
                &code,
                &message,
                "fix the client's startup parameters",
            )
            .await;
            return shared.pool.release(target, conn, true).await;
        }
        Err(e @ StatementError::Broken(_)) => {
            let msg = format!("warden cannot reach the app's database: {e}; it retries by itself");
            return fatal(&mut stream, "08006", &msg, "retry in a moment").await;
        }
    }
    let mine = shared
        .pool
        .register_cancel(shared.id, &target.server, conn.key);
    let mut hello = BytesMut::new();
    wire::put_message(&mut hello, b'R', &0i32.to_be_bytes());
    for (k, v) in &conn.params {
        wire::put_parameter(&mut hello, k, v);
    }
    let mut key = BytesMut::with_capacity(8);
    key.put_i32(mine.0);
    key.put_i32(mine.1);
    wire::put_message(&mut hello, b'K', &key);
    wire::put_message(&mut hello, b'Z', b"I");
    let (end, owed) = match stream.write_all(&hello).await {
        Ok(()) => relay::run(&mut stream, &mut conn, shared.pool.limits().max_message).await,
        Err(e) => (End::Io(e), Owed::Nothing),
    };
    drop(stream);
    let forwarding = shared.pool.unregister_cancel(mine);
    let timeout = shared.pool.limits().server_timeout;
    let (clean, busy) = match owed {
        Owed::Nothing => (true, false),
        Owed::Answers(n) => {
            let drained = conn.drain(n, timeout).await;
            (drained, !drained)
        }
        Owed::Unusable { busy } => (false, busy),
    };
    if busy && !matches!(end, End::ServerGone) {
        // The server may still run what the departed client sent (PostgreSQL notices a
        // closed socket only when it next writes): cancel it rather than leave a backend
        // working for no one.
        upstream::cancel(&target.server, conn.key, timeout).await;
    }
    // A cancel the client sent may still be on its way to the server; pooled now, it could
    // stop the next client's query. One not done with in time closes the connection instead.
    let clean = match forwarding {
        Some(f) if clean => f.settled(timeout).await,
        _ => clean,
    };
    match &end {
        End::Io(e) => tracing::debug!(error = %e, clean, "data client ended by an I/O error"),
        end => tracing::debug!(?end, clean, "data client done"),
    }
    shared.pool.release(target, conn, clean).await;
}

/// A server connection for the listener's role. A login refused for the role's password is
/// healed (once for every client refused at the same time) and tried once more: a password an
/// instance set for its role stops no other instance of its label.
async fn acquire(shared: &Shared) -> Result<ServerConn, AcquireError> {
    let before = *shared.healing.lock().await;
    let refused = match shared.pool.acquire(&shared.target).await {
        Err(AcquireError::Upstream(e)) if e.bad_password() => e,
        done => return done,
    };
    let Some(heal) = &shared.heal else {
        return Err(refused.into());
    };
    {
        let mut healed = shared.healing.lock().await;
        // Healed by another client meanwhile: the password is warden's again already.
        if *healed == before {
            let role = &shared.target.role;
            warden_core::log_limited!(warn, %role, "PostgreSQL refused the role's password (an instance may have changed it); setting it again");
            let timeout = shared.pool.limits().server_timeout;
            match tokio::time::timeout(timeout, heal()).await {
                Ok(Ok(())) => *healed += 1,
                Ok(Err(why)) => {
                    warden_core::log_limited!(warn, %role, error = %why, "setting the role's password again failed");
                    return Err(refused.into());
                }
                Err(_) => {
                    warden_core::log_limited!(warn, %role, "setting the role's password again timed out");
                    return Err(refused.into());
                }
            }
        }
    }
    shared.pool.acquire(&shared.target).await
}

/// The startup phase, within the startup timeout: encryption requests answered 'N', a
/// cancel handled, anything but protocol 3.0 refused. The parameters of a 3.0 startup, or
/// `None` when the client has been answered already.
async fn negotiate(stream: &mut UnixStream, shared: &Shared) -> Option<Vec<(String, String)>> {
    let limits = shared.pool.limits();
    let work = async {
        // An SSLRequest may be followed by a GSSENCRequest; a third is not a client.
        for _ in 0..3 {
            match wire::read_startup(stream).await {
                Ok(Startup::Encryption) => stream.write_all(b"N").await.ok()?,
                Ok(Startup::Params(params)) => return Some(params),
                Ok(Startup::Cancel { pid, secret }) => {
                    if let Some((addr, key, _forwarded)) =
                        shared.pool.find_cancel(shared.id, (pid, secret))
                    {
                        upstream::cancel(&addr, key, limits.server_timeout).await;
                    }
                    return None;
                }
                Ok(Startup::Unsupported(v)) => {
                    let msg = format!(
                        "unsupported frontend protocol {}.{}: the data socket speaks 3.0",
                        v >> 16,
                        v & 0xffff
                    );
                    fatal(
                        stream,
                        "0A000",
                        &msg,
                        "use a client of PostgreSQL 7.4 or later",
                    )
                    .await;
                    return None;
                }
                Err(e) => {
                    fatal(
                        stream,
                        "08P01",
                        &format!("invalid startup packet: {e}"),
                        "use a PostgreSQL client",
                    )
                    .await;
                    return None;
                }
            }
        }
        None
    };
    tokio::time::timeout(limits.startup_timeout, work)
        .await
        .ok()
        .flatten()
}

/// A startup parameter the data socket does not take.
#[derive(Debug, thiserror::Error)]
#[error("the data socket does not take the startup parameter \"{0}\"")]
struct Refused(String);

/// The `SET` statements for a client's parameters, or the first refused name.
fn allowed(params: &[(String, String)]) -> Result<String, Refused> {
    let mut sets = String::new();
    for (name, value) in params {
        if IGNORED.contains(&name.as_str()) {
            continue;
        }
        // Canonical names only ever reach SQL; the value is quoted as a literal.
        let canonical = ALLOWED
            .iter()
            .find(|a| a.eq_ignore_ascii_case(name))
            .ok_or_else(|| Refused(name.clone()))?;
        sets.push_str(&format!("SET {canonical} = {};", escape_literal(value)));
    }
    Ok(sets)
}

/// The SQLSTATE and message for a server connection that could not be had: PostgreSQL's own
/// code when it is starting or stopping (57P03 and kin) or out of connections (53300), else
/// connection_failure (08006). Either way the client is told the proxy connects again.
fn unreachable(e: &UpstreamError) -> (&str, String) {
    let code = match e {
        UpstreamError::Refused { code, .. } if code.starts_with("57P") || code == "53300" => {
            code.as_str()
        }
        _ => "08006",
    };
    let msg = format!("warden cannot reach the app's database: {e}; it retries by itself");
    (code, msg)
}

/// Tells the client why it is refused; it is closed after.
async fn fatal(stream: &mut UnixStream, code: &str, msg: &str, hint: &str) {
    let mut out = BytesMut::new();
    wire::put_error(&mut out, "FATAL", code, msg, Some(hint));
    let _ = stream.write_all(&out).await;
    let _ = stream.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::{Limits, ServerAddr};

    /// The socket's directory sits in the instance's own (a sandbox's `/data`): a symlink the
    /// app puts in the directory's place never leads warden's cleanup, as root, to another
    /// file of the name (the private server's socket, say), and its own socket still goes.
    #[tokio::test]
    async fn a_dropped_listener_removes_its_own_socket_never_a_linked_one() {
        let top = tempfile::tempdir().expect("a temporary directory");
        let (dir, moved, victim) = (
            top.path().join(".pg"),
            top.path().join("moved"),
            top.path().join("victim"),
        );
        for d in [&dir, &victim] {
            std::fs::create_dir(d).expect("a directory");
        }
        std::fs::write(victim.join(".s.PGSQL.5432"), b"").expect("the victim");
        let target = Target {
            role: "r".into(),
            password: "p".into(),
            server: ServerAddr::Unix {
                dir: top.path().into(),
                port: 1,
            },
            database: "d".into(),
        };
        let pool = Pool::new(Limits::default());
        let l = Listener::bind(dir.join(".s.PGSQL.5432"), target, pool).expect("bound");
        std::fs::rename(&dir, &moved).expect("moved");
        std::os::unix::fs::symlink(&victim, &dir).expect("linked");
        drop(l);
        assert!(
            victim.join(".s.PGSQL.5432").exists(),
            "the linked file went"
        );
        assert!(
            !moved.join(".s.PGSQL.5432").exists(),
            "its own socket is left"
        );
    }
}
