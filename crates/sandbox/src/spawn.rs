//! Starting an instance's process: a clean environment, its own process group, its output in
//! its log, tied to the agent's life; and stopping that group. Every driver spawns through here.
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;

use std::sync::Arc;

use tokio::process::{Child, Command};

use crate::process::{signal_group, Children, Process};

pub use warden_core::INSTANCE_PATH;

/// A command with a clean environment and output appended to `log`.
pub fn command(
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
    let port = env.get("PORT").map_or("", String::as_str);
    let mut cmd = Command::new(program);
    cmd.args(args.iter().map(|a| expand_port(a, port)))
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

/// `arg` with `$PORT` and `${PORT}` replaced by `port`: commands are run without a shell, and
/// an app's command line naming its port (`gunicorn -b 127.0.0.1:$PORT app:app`) is the common
/// case. `$PORTS` or `$PORT_X` are other names and stay as they are.
pub fn expand_port(arg: &str, port: &str) -> String {
    let mut out = String::with_capacity(arg.len());
    let mut rest = arg;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i..];
        if let Some(tail) = after.strip_prefix("${PORT}") {
            out.push_str(port);
            rest = tail;
        } else if let Some(tail) = after
            .strip_prefix("$PORT")
            .filter(|t| !t.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_'))
        {
            out.push_str(port);
            rest = tail;
        } else {
            out.push('$');
            rest = &after[1..];
        }
    }
    out.push_str(rest);
    out
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

/// Marks every descriptor warden inherited (all above stderr) close-on-exec, so none of them
/// reaches an instance: a file or directory the shell that started warden left open would
/// otherwise be open in every app, and a directory descriptor reaches the host's tree past any
/// mount namespace. Call it first thing, before warden opens anything of its own (its own
/// descriptors are close-on-exec from the start).
pub fn close_inherited_descriptors() {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: F_SETFD on a descriptor number changes only its close-on-exec flag; one that
        // is not open (the directory listing's own, closed by now) fails with EBADF.
        unsafe {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
}

/// Marks every descriptor above stderr close-on-exec, in a child between fork and exec: the
/// second guard, after [`close_inherited_descriptors`], against anything opened without the
/// flag. Needs Linux 5.11; on older kernels the first guard stands alone.
fn close_on_exec_from_3() {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
    // SAFETY: close_range(2) takes plain integers and touches only the descriptor table; it is
    // async-signal-safe.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            CLOSE_RANGE_CLOEXEC,
        );
    }
}

/// Spawns `cmd` for the instance in `dir` in its own process group, tied to the agent's life by
/// a parent-death signal, with no descriptor but stdin, stdout and stderr. The group is
/// recorded beside `dir`, so that an agent started after this one died ends what is left of it
/// (see [`crate::leftovers`]). The child is returned in its handle, known to `children`.
pub fn spawn(cmd: Command, dir: &Path, children: &Arc<Children>) -> std::io::Result<Process> {
    recorded(on_forking_thread(with_death_signal(cmd))?, dir, children)
}

/// Spawns `warden-instance sandbox-init` (`cmd`) for the instance in `dir` as [`spawn`] does,
/// but with nothing to run between fork and exec: the image ties itself to the agent's life
/// and closes every descriptor it was given past stdio ([`crate::init::main`]), so the C
/// library starts it without copying warden (`posix_spawn`, a `vfork`). A fork of warden
/// copies its page tables with its memory map locked (0.5 to 0.75 ms for a warden just
/// started, more as it grows) and leaves every page of warden write-protected: the first
/// write to each, afterwards, takes a fault, 17 to 38 of them on the path of a slot start's
/// request (docs/BENCHMARKS.md, "Sandboxes started without a fork of warden").
pub fn spawn_self_tied(
    cmd: Command,
    dir: &Path,
    children: &Arc<Children>,
) -> std::io::Result<Process> {
    recorded(on_forking_thread(cmd)?, dir, children)
}

/// `child`, spawned for the instance in `dir`, recorded beside it and known to `children`; or,
/// if it cannot be recorded, killed.
fn recorded(mut child: Child, dir: &Path, children: &Arc<Children>) -> std::io::Result<Process> {
    if let Some(pid) = child.id() {
        if let Err(e) = crate::leftovers::record(dir, pid) {
            // Unrecorded, it could outlive a crash of the agent unseen: not started at all.
            signal_group(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = child.start_kill();
            return Err(std::io::Error::new(
                e.kind(),
                format!(
                    "cannot record the instance's processes beside {}: {e}",
                    dir.display()
                ),
            ));
        }
    }
    Ok(Process::new(child, children))
}

/// Runs `cmd.spawn()` on the one thread that forks every instance, which lives as long as
/// warden. A parent-death signal fires when the *thread* that forked exits, not the process:
/// a child forked on one of the runtime's blocking threads, which end after a while idle, would
/// be killed with it.
fn on_forking_thread(cmd: Command) -> std::io::Result<Child> {
    type Job = Box<dyn FnOnce() + Send>;
    static FORKER: std::sync::OnceLock<Option<std::sync::mpsc::Sender<Job>>> =
        std::sync::OnceLock::new();
    let forker = FORKER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("warden-forker".into())
            .spawn(move || rx.into_iter().for_each(|job| job()))
            .ok()
            .map(|_| tx)
    });
    let Some(forker) = forker else {
        return Err(std::io::Error::other(
            "the thread that starts instances could not be created; restart warden",
        ));
    };
    // The child is registered with this runtime's reaper.
    let runtime = tokio::runtime::Handle::try_current();
    let (reply, answer) = std::sync::mpsc::sync_channel(1);
    let mut cmd = cmd;
    let job: Job = Box::new(move || {
        let _entered = runtime.as_ref().ok().map(tokio::runtime::Handle::enter);
        let _ = reply.send(cmd.spawn());
    });
    forker.send(job).map_err(|_| {
        std::io::Error::other("the thread that starts instances is gone; restart warden")
    })?;
    answer.recv().map_err(|_| {
        std::io::Error::other("the thread that starts instances is gone; restart warden")
    })?
}

/// `cmd` with its child tied to the agent's life, its descriptors and open-file limit set.
fn with_death_signal(mut cmd: Command) -> Command {
    // SAFETY: the closure runs in the forked child before exec and only calls prctl(2),
    // getrlimit(2), setrlimit(2) and close_range(2), which are async-signal-safe; it allocates
    // nothing and touches no locks (the atomic load is lock-free).
    unsafe {
        cmd.pre_exec(|| {
            close_on_exec_from_3();
            // If warden dies, even by SIGKILL, the kernel kills the instance. The signal is tied
            // to the forking thread: see `on_forking_thread`.
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
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_is_expanded_in_arguments_and_nothing_else_is() {
        assert_eq!(expand_port("127.0.0.1:$PORT", "8000"), "127.0.0.1:8000");
        assert_eq!(expand_port("--port=${PORT}", "8000"), "--port=8000");
        assert_eq!(expand_port("$PORT$PORT", "1"), "11");
        assert_eq!(
            expand_port("$PORTS $PORT_X $HOME $", "1"),
            "$PORTS $PORT_X $HOME $"
        );
        assert_eq!(expand_port("naïve $PORT", "2"), "naïve 2");
    }

    /// A child spawned from a thread that then ends (a blocking thread of the runtime, idle for
    /// a while) lives on: its parent-death signal is tied to the thread that forks every child,
    /// not to the caller's.
    #[tokio::test]
    async fn an_instance_outlives_the_thread_that_asked_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let instance = dir.path().join("0123456789abcdef");
        std::fs::create_dir(&instance).unwrap();
        let log = dir.path().join("log");
        let runtime = tokio::runtime::Handle::current();
        let (child, tid) = std::thread::spawn(move || {
            let _entered = runtime.enter();
            let cmd = command(&["sleep".into(), "30".into()], &BTreeMap::new(), &log).unwrap();
            (
                spawn(cmd, &instance, &Children::new()).unwrap(),
                nix::unistd::gettid(),
            )
        })
        .join()
        .unwrap();
        let pid = child.id().unwrap();
        assert!(crate::leftovers::pid_file(&dir.path().join("0123456789abcdef")).exists());
        // Once the thread is reaped (its /proc entry gone), the kernel has sent the death
        // signals tied to it: the child would be dead or have SIGKILL pending.
        let task = format!("/proc/self/task/{tid}");
        for _ in 0..1000 {
            if !std::path::Path::new(&task).exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!std::path::Path::new(&task).exists(), "the thread ended");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        signal_group(pid, nix::sys::signal::Signal::SIGKILL);
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_owned())
                .unwrap_or_default()
        };
        let killed = |mask: String| u64::from_str_radix(&mask, 16).unwrap_or(0) & (1 << 8) != 0;
        let state = field("State:");
        assert!(state.starts_with('S') || state.starts_with('R'), "{status}");
        assert!(
            !killed(field("SigPnd:")) && !killed(field("ShdPnd:")),
            "{status}"
        );
    }
}
