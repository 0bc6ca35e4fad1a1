//! The `process` driver: an app instance is a plain child process listening on a loopback port.
//!
//! Needs no privileges. Isolation is limited to a clean environment and a process group of its
//! own; the `sandbox` driver adds namespaces, seccomp and limits on top of the same spawn.
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::Path;
use std::process::Stdio;

use tokio::process::{Child, Command};

use crate::driver::{Driver, Launch, Started};

/// PATH given to instances; the agent's own environment (which may hold credentials such as
/// WARDEN_TOKEN) is never passed on.
pub(crate) const INSTANCE_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// A free loopback port. Another process could take it before the instance binds; the instance
/// then exits at once and the start fails with its message, never a hang.
pub(crate) fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

/// Loopback address of `port`.
pub(crate) fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// The `process` driver: a plain child process on a loopback port.
pub(crate) struct ProcessDriver;

impl Driver for ProcessDriver {
    fn start(&self, l: &Launch<'_>) -> Result<Started, String> {
        let port = free_port().map_err(|e| format!("no free loopback port: {e}"))?;
        let mut env = l.env.clone();
        env.insert("PORT".into(), port.to_string());
        env.insert("WARDEN_DATA_DIR".into(), l.dir.display().to_string());
        let mut cmd = command(&l.spec.command, &env, l.log).map_err(|e| e.to_string())?;
        if let Some(dir) = &l.spec.workdir {
            cmd.current_dir(dir);
        }
        let child = spawn(cmd).map_err(|e| e.to_string())?;
        Ok(Started {
            child,
            addr: loopback(port).to_string(),
            held: Default::default(),
        })
    }
}

/// A command with a clean environment and output appended to `log`.
pub(crate) fn command(
    argv: &[String],
    env: &BTreeMap<String, String>,
    log: &Path,
) -> std::io::Result<Command> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command"))?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .env("PATH", INSTANCE_PATH)
        .envs(env)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .kill_on_drop(false);
    Ok(cmd)
}

/// The open-file soft limit warden started with, restored for instances; 0 until raised.
static STARTING_NOFILE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Raises the soft limit of open files to the hard one, as nginx's worker_rlimit_nofile and
/// Go's runtime do: every client connection, pooled upstream connection and instance holds
/// descriptors, and the common soft default of 1024 would cap the node far below its memory.
/// Instances get the limit warden started with back, as Go gives its children.
pub fn raise_open_file_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => {
                STARTING_NOFILE.store(soft, std::sync::atomic::Ordering::Relaxed);
                tracing::debug!(from = soft, to = hard, "raised the open-file limit");
            }
            Err(e) => tracing::warn!(soft, hard, error = %e, "could not raise the open-file limit"),
        },
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "could not read the open-file limit"),
    }
}

/// Spawns `cmd` in its own process group, tied to the agent's life by a parent-death signal.
pub(crate) fn spawn(mut cmd: Command) -> std::io::Result<Child> {
    // SAFETY: the closure runs in the forked child before exec and only calls prctl(2),
    // getrlimit(2) and setrlimit(2), which are async-signal-safe; it allocates nothing and
    // touches no locks (the atomic load is lock-free).
    unsafe {
        cmd.pre_exec(|| {
            // If warden dies, even by SIGKILL, the kernel kills the instance: no orphans. The
            // signal is tied to the forking thread, and instances are spawned from the runtime's
            // worker threads, which live as long as warden does.
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                .map_err(std::io::Error::from)?;
            let soft = STARTING_NOFILE.load(std::sync::atomic::Ordering::Relaxed);
            if soft > 0 {
                let (_, hard) =
                    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                        .map_err(std::io::Error::from)?;
                nix::sys::resource::setrlimit(
                    nix::sys::resource::Resource::RLIMIT_NOFILE,
                    soft,
                    hard,
                )
                .map_err(std::io::Error::from)?;
            }
            Ok(())
        });
    }
    cmd.spawn()
}

/// Sends `signal` to the instance's whole process group.
pub(crate) fn signal_group(pid: u32, signal: nix::sys::signal::Signal) {
    if let Ok(pid) = i32::try_from(pid) {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), signal);
    }
}

/// Adds a line of warden's own to an instance's log, where `warden logs` shows it beside the
/// app's output.
pub(crate) fn append_log(path: &Path, line: &str) {
    use std::io::Write;
    let written = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut f| writeln!(f, "{line}"));
    if let Err(e) = written {
        tracing::warn!(log = %path.display(), error = %e, "could not add to an instance's log");
    }
}

/// Cuts `path` back to its newer half, from a line start, once it is larger than `max` bytes,
/// with a first line saying so. Apps append (O_APPEND) straight to the file, so their next
/// write lands at the new end; a line written while the cut runs may be lost, as with
/// logrotate's copytruncate. Returns whether the log was cut.
pub(crate) fn cap_log(path: &Path, max: u64) -> std::io::Result<bool> {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    let len = f.metadata()?.len();
    if len <= max {
        return Ok(false);
    }
    // One byte more than kept: if it is a newline, the kept part starts a line.
    let keep = max / 2 + 1;
    f.seek(SeekFrom::Start(len - keep))?;
    let mut tail = Vec::with_capacity(keep as usize);
    Read::by_ref(&mut f).take(keep).read_to_end(&mut tail)?;
    let from = tail.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
    let note = format!(
        "warden: this log reached {len} bytes (the limit is {max}, warden up --max-log-mb); older lines were dropped\n"
    );
    f.seek(SeekFrom::Start(0))?;
    f.write_all(note.as_bytes())?;
    f.write_all(&tail[from..])?;
    f.set_len((note.len() + tail.len() - from) as u64)?;
    Ok(true)
}

/// The last `lines` lines of a log file, for error messages.
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(4096)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_over_its_cap_keeps_its_newer_half_from_a_line_start() {
        let dir = std::env::temp_dir().join(format!("warden-cap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("x.log");
        let lines: String = (0..1000).map(|i| format!("line {i:04}\n")).collect();
        std::fs::write(&log, &lines).unwrap();
        assert!(!cap_log(&log, 20_000).unwrap());
        assert!(cap_log(&log, 4_000).unwrap());
        let text = std::fs::read_to_string(&log).unwrap();
        let mut rest = text.lines();
        assert!(rest
            .next()
            .unwrap()
            .starts_with("warden: this log reached 10000 bytes"));
        let kept: Vec<&str> = rest.collect();
        assert_eq!(kept.first(), Some(&"line 0800"));
        assert_eq!(kept.last(), Some(&"line 0999"));
        assert_eq!(kept.len(), 200);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
