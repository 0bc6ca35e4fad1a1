//! A private PostgreSQL under warden's data dir: found, initialised once, started on a Unix
//! socket only, stopped with warden.
//!
//! Layout under `dir`: `pgdata/` (the cluster), `run/` (the socket directory, 0700, so only
//! the server's user and root reach it) and `server.log`. When warden runs as root the server
//! runs as the `postgres` system user (PostgreSQL refuses root) and those paths are its own.
//!
//! Dying with warden: the server runs in its own process group, stopped (fast shutdown, then
//! SIGKILL to the group) on [`PrivateServer::shutdown`] or drop. For a warden killed with
//! SIGKILL, it is started through util-linux's `setpriv --pdeathsig INT` (a parent-death
//! signal without `unsafe` here; SIGINT is PostgreSQL's fast shutdown), from a thread of its
//! own that lives as long as the server: the signal fires when the *thread* that forked the
//! child ends, so forking from tokio's blocking pool would stop the server when that pool
//! thread retires. Where `setpriv` is missing, or the server outlived warden anyway,
//! [`PrivateServer::start`] first looks at `postmaster.pid`: a server still running in this
//! data dir is stopped before a new one starts; a stale file is PostgreSQL's own to clear.
//!
//! Kept running: when the postmaster exits on its own (killed, crashed), the keeper thread
//! (`keeper.rs`) starts it again after a backoff (1 s, doubling while it keeps exiting, at
//! most 30 s), logged each time. Instances' sockets need nothing: the proxy reconnects at
//! their next client, and tells a client that comes meanwhile that it cannot reach the
//! database and retries by itself.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{chown, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::{Pid, Uid, User};
use tokio_postgres::Config;

use super::keeper::Keeper;
use super::{ServerError, PRIVATE_ADMIN};

/// The port: with `listen_addresses=''` it only names the socket file.
pub const PORT: u16 = 5432;

/// How long a start may take before warden gives up.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a fast shutdown may take before the group is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// A running private server; stopped on drop.
pub struct PrivateServer {
    dir: PathBuf,
    socket_dir: PathBuf,
    keeper: Option<Keeper>,
}

/// The OS user the server runs as.
struct RunAs {
    uid: u32,
    gid: u32,
    /// Its name, for messages.
    name: String,
    /// The OS user warden runs as, mapped to the admin role by peer authentication.
    warden_user: String,
}

// === impl PrivateServer ===

impl PrivateServer {
    /// Finds the server programs, initialises `dir/pgdata` if it is new, stops an orphaned
    /// server of the same dir, starts one and waits until it accepts connections.
    pub async fn start(dir: &Path) -> Result<Self, ServerError> {
        // Absolute before anything runs: initdb and postgres run with the data dir as their
        // working directory, where a relative path (warden's default data dir is one) would
        // name somewhere else.
        let dir = std::path::absolute(dir).map_err(|source| ServerError::Io {
            what: "resolving the private PostgreSQL's directory",
            path: dir.to_owned(),
            source,
        })?;
        let server = tokio::task::spawn_blocking(move || Self::start_blocking(&dir))
            .await
            .map_err(|e| ServerError::Io {
                what: "starting the private PostgreSQL",
                path: PathBuf::new(),
                source: std::io::Error::other(e.to_string()),
            })??;
        server.wait_ready().await?;
        Ok(server)
    }

    fn start_blocking(dir: &Path) -> Result<Self, ServerError> {
        let bindir = find_bindir()?;
        let run_as = run_as()?;
        let pgdata = dir.join("pgdata");
        let socket_dir = dir.join("run");
        // sun_path holds 108 bytes with its NUL; the file is `.s.PGSQL.5432` (and `.lock`).
        if socket_dir.as_os_str().len() + "/.s.PGSQL.5432.lock".len() >= 108 {
            return Err(ServerError::SocketPathTooLong(dir.to_owned()));
        }
        for d in [dir, &socket_dir] {
            std::fs::create_dir_all(d).map_err(io("creating a directory", d))?;
            own(d, &run_as)?;
        }
        reachable(&bindir, dir, &run_as)?;
        if !pgdata.join("PG_VERSION").exists() {
            initdb(&bindir, &pgdata, &run_as)?;
        }
        write_auth_files(&pgdata, &run_as)?;
        let postgres = bindir.join("postgres");
        let setpriv = has_setpriv();
        if !setpriv {
            tracing::warn!(
                "setpriv (util-linux) not found: the private PostgreSQL will not stop if warden \
                 is killed, only at warden's next start"
            );
        }
        let (dir2, postgres2) = (dir.to_owned(), postgres.clone());
        let make = move || server_command(&dir2, &postgres2, setpriv, &run_as);
        let keeper = Keeper::spawn(Box::new(make)).map_err(io("starting postgres", &postgres))?;
        let pid = keeper.status.pid().unwrap_or(0);
        tracing::info!(dir = %dir.display(), pid, "private PostgreSQL started");
        Ok(PrivateServer {
            dir: dir.to_owned(),
            socket_dir,
            keeper: Some(keeper),
        })
    }

    async fn wait_ready(&self) -> Result<(), ServerError> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let mut config = self.admin_config();
            config.dbname("postgres");
            if config.connect(tokio_postgres::NoTls).await.is_ok() {
                return Ok(());
            }
            // A server that exits before it is first ready is not waited for through the
            // keeper's restarts: what stops it (a bad setting, permissions) stays.
            let exited = self.keeper.as_ref().is_none_or(|k| k.status.exits() > 0);
            if exited || Instant::now() > deadline {
                let log = self.dir.join("server.log");
                return Err(ServerError::NotStarted {
                    tail: tail_of_file(&log, 20),
                    log,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The directory the server lives under.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory of the server's Unix socket.
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    /// The process id of the postmaster; `None` while it is being started again after an
    /// exit.
    pub fn pid(&self) -> Option<u32> {
        self.keeper.as_ref().and_then(|k| k.status.pid())
    }

    pub(super) fn admin_config(&self) -> Config {
        let mut c = Config::new();
        c.host_path(&self.socket_dir)
            .port(PORT)
            .user(PRIVATE_ADMIN)
            .dbname("postgres")
            .application_name("warden")
            .connect_timeout(Duration::from_secs(10));
        c
    }

    /// Fast shutdown, waited for off the async threads.
    pub async fn shutdown(mut self) {
        if let Some(keeper) = self.keeper.take() {
            let _ = tokio::task::spawn_blocking(move || keeper.stop()).await;
        }
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        if let Some(keeper) = self.keeper.take() {
            keeper.stop();
        }
    }
}

/// The command that starts the postmaster, made again at each (re)start: a server still
/// running in the data dir is stopped first, and the log is opened for appending.
fn server_command(
    dir: &Path,
    postgres: &Path,
    setpriv: bool,
    run_as: &RunAs,
) -> std::io::Result<Command> {
    let pgdata = dir.join("pgdata");
    stop_orphan(&pgdata);
    let log = super::log::open_log(&dir.join("server.log"), run_as.uid)?;
    let log2 = log.try_clone()?;
    let mut cmd = if setpriv {
        let mut c = Command::new("setpriv");
        c.args(["--pdeathsig", "INT", "--"]).arg(postgres);
        c
    } else {
        Command::new(postgres)
    };
    cmd.arg("-D")
        .arg(&pgdata)
        .arg("-k")
        .arg(dir.join("run"))
        .args(["-c", "listen_addresses=", "-p", &PORT.to_string()])
        .stdin(Stdio::null())
        // warden's own working directory may be closed to the server's user.
        .current_dir(dir)
        .stdout(log)
        .stderr(log2)
        // Its own group, so a stop reaches every backend even if the postmaster is gone.
        .process_group(0);
    if Uid::effective().is_root() {
        cmd.uid(run_as.uid).gid(run_as.gid);
    }
    Ok(cmd)
}

fn has_setpriv() -> bool {
    Command::new("setpriv")
        .arg("--help")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("--pdeathsig"))
}

/// Stops a server still running in `pgdata` (one a previous warden left). The pid in
/// `postmaster.pid` is trusted only if that process's working directory is `pgdata` (the
/// postmaster chdirs there), so a recycled pid is never signalled; a file naming a live
/// process elsewhere is stale (after a restart of the machine or container, its pid may be
/// anyone's) and is removed, since PostgreSQL would refuse to start over it.
fn stop_orphan(pgdata: &Path) {
    let pid_file = pgdata.join("postmaster.pid");
    let Ok(text) = std::fs::read_to_string(&pid_file) else {
        return;
    };
    let Some(pid) = text
        .lines()
        .next()
        .and_then(|l| l.trim().parse::<i32>().ok())
    else {
        return;
    };
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok();
    match (cwd, std::fs::canonicalize(pgdata)) {
        (Some(c), Ok(p)) if c == p && pid > 1 => {}
        (Some(_), Ok(_)) => {
            tracing::warn!(
                pid,
                "removing a stale postmaster.pid that names another process"
            );
            let _ = std::fs::remove_file(&pid_file);
            return;
        }
        // No such process (PostgreSQL clears that itself), or one we cannot look at.
        _ => return,
    }
    tracing::warn!(
        pid,
        "stopping the private PostgreSQL a previous warden left running"
    );
    let pid = Pid::from_raw(pid);
    let _ = kill(pid, Signal::SIGINT);
    let deadline = Instant::now() + STOP_TIMEOUT;
    while Instant::now() < deadline && alive(pid) {
        std::thread::sleep(Duration::from_millis(50));
    }
    if alive(pid) {
        let _ = killpg(pid, Signal::SIGKILL);
        let _ = kill(pid, Signal::SIGKILL);
        while alive(pid) && Instant::now() < deadline + STOP_TIMEOUT {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Running, not a zombie waiting for a parent that is not ours to reap it.
pub fn alive(pid: Pid) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

/// PostgreSQL's server programs: `pg_config --bindir` on PATH, else the highest
/// `/usr/lib/postgresql/*/bin`; 15 or later.
pub fn find_bindir() -> Result<PathBuf, ServerError> {
    let from_pg_config = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        .filter(|p| p.join("postgres").exists() && p.join("initdb").exists());
    let bindir = match from_pg_config {
        Some(p) => p,
        None => {
            let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| {
                    let v = e.file_name().to_str()?.parse::<u32>().ok()?;
                    let bin = e.path().join("bin");
                    (bin.join("postgres").exists() && bin.join("initdb").exists())
                        .then_some((v, bin))
                })
                .collect();
            found.sort();
            found.pop().map(|(_, p)| p).ok_or_else(|| {
                ServerError::ProgramsMissing(
                    "no pg_config on PATH and nothing under /usr/lib/postgresql".into(),
                )
            })?
        }
    };
    let out = Command::new(bindir.join("postgres"))
        .arg("--version")
        .output()
        .map_err(|e| ServerError::ProgramsMissing(format!("{}: {e}", bindir.display())))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let major = parse_major(&text).ok_or_else(|| {
        ServerError::ProgramsMissing(format!("unrecognised `postgres --version`: {text}"))
    })?;
    if major < 15 {
        return Err(ServerError::TooOld {
            found: major,
            bindir,
        });
    }
    Ok(bindir)
}

/// The major version of `postgres (PostgreSQL) 15.8 (Debian 15.8-0+deb12u1)`.
fn parse_major(version: &str) -> Option<u32> {
    let rest = version.split(')').nth(1)?.trim();
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

fn run_as() -> Result<RunAs, ServerError> {
    let me = Uid::effective();
    let warden_user = User::from_uid(me)
        .ok()
        .flatten()
        .map(|u| u.name)
        .unwrap_or_else(|| "root".into());
    if !me.is_root() {
        return Ok(RunAs {
            uid: me.as_raw(),
            gid: nix::unistd::Gid::effective().as_raw(),
            name: warden_user.clone(),
            warden_user,
        });
    }
    let pg = User::from_name("postgres").ok().flatten().ok_or_else(|| {
        ServerError::ProgramsMissing(
            "warden runs as root and there is no `postgres` system user to run the server as \
             (the postgresql package makes it)"
                .into(),
        )
    })?;
    Ok(RunAs {
        uid: pg.uid.as_raw(),
        gid: pg.gid.as_raw(),
        name: pg.name,
        warden_user,
    })
}

/// When the server runs as another user, that user must traverse every directory above
/// `dir`: tried for real (a `postgres --version` run as it, in `dir`, so ACLs count), and on
/// a refusal the first closed parent is named, instead of initdb's bare "Permission denied".
fn reachable(bindir: &Path, dir: &Path, run_as: &RunAs) -> Result<(), ServerError> {
    if !Uid::effective().is_root() {
        return Ok(());
    }
    let tried = Command::new(bindir.join("postgres"))
        .arg("--version")
        .current_dir(dir)
        .uid(run_as.uid)
        .gid(run_as.gid)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    match tried {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            Err(ServerError::Untraversable {
                user: run_as.name.clone(),
                dir: dir.to_owned(),
                blocked: closed_parent(dir, run_as.uid, run_as.gid)
                    .unwrap_or_else(|| dir.to_owned()),
            })
        }
        // Anything else is for the start itself to report.
        _ => Ok(()),
    }
}

/// The first directory from the root down to `dir` that `uid` (with group `gid` only: the
/// server runs without supplementary groups) may not enter, by its mode bits.
pub(crate) fn closed_parent(dir: &Path, uid: u32, gid: u32) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let mut ancestors: Vec<&Path> = dir.ancestors().collect();
    ancestors.reverse();
    ancestors.into_iter().find_map(|d| {
        let meta = std::fs::metadata(d).ok()?;
        let bit = if meta.uid() == uid {
            0o100
        } else if meta.gid() == gid {
            0o010
        } else {
            0o001
        };
        (meta.mode() & bit == 0).then(|| d.to_owned())
    })
}

fn own(path: &Path, run_as: &RunAs) -> Result<(), ServerError> {
    if Uid::effective().is_root() {
        chown(path, Some(run_as.uid), Some(run_as.gid)).map_err(io("chown", path))?;
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
        .map_err(io("chmod 0700", path))
}

fn initdb(bindir: &Path, pgdata: &Path, run_as: &RunAs) -> Result<(), ServerError> {
    // A pgdata without PG_VERSION is an initdb that was interrupted: start it again.
    if pgdata.exists() {
        std::fs::remove_dir_all(pgdata).map_err(io("removing a partial initdb", pgdata))?;
    }
    let mut cmd = Command::new(bindir.join("initdb"));
    cmd.arg("-D")
        .arg(pgdata)
        .args([
            "-U",
            PRIVATE_ADMIN,
            "-A",
            "peer",
            "-E",
            "UTF8",
            "--no-locale",
        ])
        .stdin(Stdio::null());
    if let Some(parent) = pgdata.parent() {
        cmd.current_dir(parent);
    }
    if Uid::effective().is_root() {
        cmd.uid(run_as.uid).gid(run_as.gid);
    }
    let out = cmd
        .output()
        .map_err(io("running initdb", &bindir.join("initdb")))?;
    if !out.status.success() {
        let mut all = String::from_utf8_lossy(&out.stdout).into_owned();
        all.push_str(&String::from_utf8_lossy(&out.stderr));
        return Err(ServerError::InitdbFailed {
            dir: pgdata.to_owned(),
            tail: last_lines(&all, 15),
        });
    }
    Ok(())
}

/// Only warden's OS user logs in as the admin (peer authentication, mapped); every other role
/// logs in with its SCRAM-SHA-256 password; nothing over TCP (it does not listen anyway).
fn write_auth_files(pgdata: &Path, run_as: &RunAs) -> Result<(), ServerError> {
    let hba = format!(
        "# Written by warden at every start.\n\
         local all {PRIVATE_ADMIN} peer map=warden\n\
         local all all scram-sha-256\n"
    );
    let ident = format!(
        "# Written by warden at every start.\nwarden {} {PRIVATE_ADMIN}\n",
        run_as.warden_user
    );
    for (name, text) in [("pg_hba.conf", hba), ("pg_ident.conf", ident)] {
        let path = pgdata.join(name);
        std::fs::write(&path, text).map_err(io("writing", &path))?;
        if Uid::effective().is_root() {
            chown(&path, Some(run_as.uid), Some(run_as.gid)).map_err(io("chown", &path))?;
        }
    }
    Ok(())
}

fn tail_of_file(path: &Path, n: usize) -> String {
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(8192)));
    let mut bytes = Vec::new();
    let _ = f.read_to_end(&mut bytes);
    last_lines(&String::from_utf8_lossy(&bytes), n)
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> ServerError + 'a {
    move |source| ServerError::Io {
        what,
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_major_version() {
        assert_eq!(
            parse_major("postgres (PostgreSQL) 15.8 (Debian 15.8-0+deb12u1)\n"),
            Some(15)
        );
        assert_eq!(parse_major("postgres (PostgreSQL) 9.6.24\n"), Some(9));
        assert_eq!(parse_major("nonsense"), None);
    }

    /// A parent closed to the server's user is named, with what to do about it.
    #[test]
    fn a_closed_parent_is_named_with_the_way_through() {
        let top = tempfile::tempdir().unwrap();
        let closed = top.path().join("closed");
        let dir = closed.join("data").join("postgres");
        std::fs::create_dir_all(&dir).unwrap();
        for d in [top.path(), &dir, &closed.join("data")] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o750)).unwrap();
        // A uid and gid that own nothing here: only the "other" bits count for them.
        let (uid, gid) = (4_000_123, 4_000_123);
        assert_eq!(closed_parent(&dir, uid, gid), Some(closed.clone()));
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o751)).unwrap();
        assert_eq!(closed_parent(&dir, uid, gid), None);
        let e = ServerError::Untraversable {
            user: "postgres".into(),
            dir: dir.clone(),
            blocked: closed.clone(),
        };
        let text = e.to_string();
        assert!(
            text.contains(&format!("chmod o+x {}", closed.display()))
                && text.contains("--data-dir")
                && text.contains("`postgres` user"),
            "{text}"
        );
    }
}
