//! Who the sandbox runs as and what it may do: the user namespace's id maps, root inside that
//! means nothing outside; no-new-privileges, the securebits, the emptied bounding and ambient
//! sets and the seccomp filters, which init takes on once the sandbox is built ([`confine`])
//! and the app inherits; and the app's own limits, set just before it execs.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::path::{Path, PathBuf};

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use super::SetupError;
use crate::{spread::fnv, Plan, DATA_MOUNT};

/// First host uid of per-instance uids when the agent runs as root.
const UID_BASE: u32 = 200_000;
/// How many per-instance uids there are.
const UID_RANGE: u32 = 100_000;

/// The host uid and gid the sandbox of instance directory `dir` maps to its root: the agent's
/// own when it is unprivileged, one of its own per instance when the agent is root.
pub fn host_ids(dir: &Path, privileged: bool) -> (u32, u32) {
    if privileged {
        let id = UID_BASE + fnv(dir.to_string_lossy().as_bytes()) % UID_RANGE;
        (id, id)
    } else {
        (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        )
    }
}

/// Maps root of `child`'s new user namespace to `uid` and `gid`, from outside.
pub(super) fn write_maps(child: Pid, uid: u32, gid: u32, privileged: bool) -> std::io::Result<()> {
    let proc = PathBuf::from(format!("/proc/{child}"));
    if !privileged {
        // Unprivileged gid maps require giving up setgroups(2) first.
        std::fs::write(proc.join("setgroups"), "deny")?;
    }
    std::fs::write(proc.join("uid_map"), format!("0 {uid} 1\n"))?;
    std::fs::write(proc.join("gid_map"), format!("0 {gid} 1\n"))?;
    Ok(())
}

/// Becomes root of the user namespace whose maps the helper wrote.
pub(super) fn become_ns_root(privileged: bool) -> Result<(), SetupError> {
    let root = nix::unistd::Gid::from_raw(0);
    nix::unistd::setresgid(root, root, root).map_err(|e| SetupError::sys("setresgid", e))?;
    if privileged {
        nix::unistd::setgroups(&[]).map_err(|e| SetupError::sys("setgroups", e))?;
    }
    let root = nix::unistd::Uid::from_raw(0);
    nix::unistd::setresuid(root, root, root).map_err(|e| SetupError::sys("setresuid", e))
}

/// `s` as a C string, refused (never altered) when it holds a NUL; the agent checks the spec
/// before it gets here (`AppSpec::validate`), so this is the last line only.
fn cstr(what: &str, s: &str) -> Result<CString, SetupError> {
    CString::new(s).map_err(|_| SetupError::Exec(format!("{what} holds a NUL byte")))
}

/// The app's process made ready to exec, before the start message: its limits, stdin and
/// working directory set, its arguments made (under what init took on in [`confine`], which
/// it inherits). What is left for the message is its environment and the exec.
pub(super) struct ExecReady {
    argv: Vec<CString>,
}

impl ExecReady {
    pub(super) fn new(plan: &Plan) -> Result<Self, SetupError> {
        prepare_exec(plan)?;
        let argv = plan
            .argv
            .iter()
            .map(|a| cstr("an argument", a))
            .collect::<Result<Vec<CString>, _>>()?;
        if argv.is_empty() {
            return Err(SetupError::sys("execve", nix::errno::Errno::ENOENT));
        }
        Ok(Self { argv })
    }

    /// Execs the app with the plan's environment and `extra_env` over it. Returns only on
    /// failure.
    pub(super) fn exec(self, plan: &Plan, extra_env: BTreeMap<String, String>) -> SetupError {
        let env = match environment(plan, extra_env) {
            Ok(e) => e,
            Err(e) => return e,
        };
        match nix::unistd::execve(&self.argv[0], &self.argv, &env) {
            Err(nix::errno::Errno::ENOENT) if let Some(why) = not_visible(&plan.argv[0]) => {
                SetupError::Exec(why)
            }
            Err(e) => SetupError::sys(format!("execve {}", plan.argv[0]), e),
            Ok(never) => match never {},
        }
    }
}

/// The app's environment: the plan's, with `extra_env` over it.
pub(super) fn environment(
    plan: &Plan,
    extra_env: BTreeMap<String, String>,
) -> Result<Vec<CString>, SetupError> {
    let mut env = plan.env.clone();
    env.extend(extra_env);
    env.iter()
        .map(|(k, v)| cstr(&format!("variable {k:?}"), &format!("{k}={v}")))
        .collect()
}

/// Why `program` cannot be run in here although the agent found it on the host: it links out
/// of what the sandbox shows, or names an interpreter on its first line (`#!`) that does not
/// (a virtualenv made with a Python outside /usr is the common case).
fn not_visible(program: &str) -> Option<String> {
    use std::io::Read;
    const SHOWN: &str = "the sandbox shows /usr, /bin, /sbin, /lib*, /etc, the app's working directory and the program itself";
    let path = Path::new(program);
    if !path.exists() {
        let target = std::fs::read_link(path).ok()?;
        return Some(format!(
            "{program} is a link to {}, which is outside what {SHOWN}; point the command at a file inside them",
            target.display()
        ));
    }
    let mut head = [0u8; 256];
    let n = std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut head))
        .ok()?;
    let line = head[..n].split(|b| *b == b'\n').next()?;
    let interpreter = String::from_utf8_lossy(line.strip_prefix(b"#!")?);
    let interpreter = interpreter.split_whitespace().next()?;
    (!Path::new(interpreter).exists()).then(|| {
        format!(
            "{program} names the interpreter {interpreter} on its first line, and {SHOWN}, not that; install the interpreter under /usr, or make the virtualenv with /usr/bin/python3 -m venv --copies"
        )
    })
}

/// What init does to itself once the sandbox is built, before the start message, and the app's
/// process inherits: no way to regain privileges at exec ([`drop_privileges`]), then the
/// seccomp `filters`.
pub(super) fn confine(filters: &[seccompiler::BpfProgram]) -> Result<(), SetupError> {
    drop_privileges()?;
    for f in filters {
        crate::seccomp::install(f).map_err(|e| SetupError::Seccomp(e.to_string()))?;
    }
    Ok(())
}

/// Everything the app's process does to itself before exec, before the start message comes;
/// [`confine`] came before, in init.
fn prepare_exec(plan: &Plan) -> Result<(), SetupError> {
    use nix::sys::resource::{setrlimit, Resource};
    use nix::sys::signal::{signal, SigHandler};
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    // The Rust runtime ignores SIGPIPE, and an ignored signal survives exec; the app gets the
    // default like any process started by a shell.
    // SAFETY: restoring the default disposition installs no handler.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
    // An attached one-off's helper ignores SIGINT (see `init::main`): the app must not.
    // SAFETY: as above.
    let _ = unsafe { signal(Signal::SIGINT, SigHandler::SigDfl) };
    match &plan.stdin {
        Some(socket) => stdin_from_socket(socket)?,
        None => stdin_from_dev_null()?,
    }
    let dir = plan.workdir.as_deref().unwrap_or(DATA_MOUNT);
    nix::unistd::chdir(dir).map_err(|e| SetupError::sys(format!("chdir {dir}"), e))?;
    let l = &plan.limits;
    let mib = l.memory_mb.saturating_mul(1024 * 1024);
    let mut limits = vec![(Resource::RLIMIT_CORE, 0), (Resource::RLIMIT_NOFILE, 4096)];
    // The cgroup counts what the sandbox really uses, tmpfs files included; an address-space
    // limit on top would only break apps that reserve more than they touch.
    if !plan.enforced.memory {
        limits.push((Resource::RLIMIT_AS, mib));
    }
    if !plan.enforced.pids && nix::unistd::getuid().is_root() && l.processes > 0 {
        // Counted per host uid: exact when the agent runs as root (one uid per instance).
        limits.push((Resource::RLIMIT_NPROC, l.processes));
    }
    if l.cpu_seconds > 0 {
        limits.push((Resource::RLIMIT_CPU, l.cpu_seconds));
    }
    for (r, v) in limits {
        setrlimit(r, v, v).map_err(|e| SetupError::sys(format!("setrlimit {r:?}"), e))?;
    }
    Ok(())
}

/// Puts /dev/null on descriptor 0, whether or not 0 is open now. With 0 closed (init gave its
/// control socket back), opening /dev/null yields 0 itself: duplicating it onto itself and
/// dropping the file would close it again, and the app's first socket would become its stdin.
pub(super) fn stdin_from_dev_null() -> Result<(), SetupError> {
    use std::os::fd::{AsRawFd, IntoRawFd};
    let null = std::fs::File::open("/dev/null")
        .map_err(|e| SetupError::path("open", Path::new("/dev/null"), e))?;
    if null.as_raw_fd() == 0 {
        // Opened close-on-exec, like every file std opens: clear that, and keep it open for
        // good.
        nix::fcntl::fcntl(
            &null,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
        )
        .map_err(|e| SetupError::sys("stdin from /dev/null", e))?;
        let _stdin = null.into_raw_fd();
        return Ok(());
    }
    // dup2 leaves the copy without close-on-exec.
    nix::unistd::dup2_stdin(&null).map_err(|e| SetupError::sys("stdin from /dev/null", e))
}

/// Puts a connection to the agent's socket at `path` on descriptor 0: a one-off process's
/// stdin, which the agent feeds from its client. Read-only: the app answers on stdout.
fn stdin_from_socket(path: &str) -> Result<(), SetupError> {
    let conn = std::os::unix::net::UnixStream::connect(path)
        .map_err(|e| SetupError::path("connect to the stdin socket", Path::new(path), e))?;
    let _ = conn.shutdown(std::net::Shutdown::Write);
    // dup2 leaves the copy without close-on-exec; the original closes when `conn` drops.
    nix::unistd::dup2_stdin(&conn).map_err(|e| SetupError::sys("stdin from the socket", e))
}

/// Root inside the namespace must not mean capabilities: lock root's special treatment off,
/// empty the bounding and ambient sets, and forbid gaining privileges through exec.
fn drop_privileges() -> Result<(), SetupError> {
    const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
    const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;
    const SECBIT_NO_SETUID_FIXUP: libc::c_ulong = 1 << 2;
    const SECBIT_NO_SETUID_FIXUP_LOCKED: libc::c_ulong = 1 << 3;
    const SECBIT_KEEP_CAPS_LOCKED: libc::c_ulong = 1 << 5;
    const SECBIT_NO_CAP_AMBIENT_RAISE: libc::c_ulong = 1 << 6;
    const SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED: libc::c_ulong = 1 << 7;
    let bits = SECBIT_NOROOT
        | SECBIT_NOROOT_LOCKED
        | SECBIT_NO_SETUID_FIXUP
        | SECBIT_NO_SETUID_FIXUP_LOCKED
        | SECBIT_KEEP_CAPS_LOCKED
        | SECBIT_NO_CAP_AMBIENT_RAISE
        | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
    let last_cap = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse::<libc::c_ulong>().ok())
        .unwrap_or(63);
    // SAFETY: prctl with integer arguments only.
    unsafe {
        if libc::prctl(libc::PR_SET_SECUREBITS, bits, 0, 0, 0) < 0 {
            return Err(SetupError::Io {
                what: "PR_SET_SECUREBITS".into(),
                source: std::io::Error::last_os_error(),
            });
        }
        for cap in 0..=last_cap {
            // Caps beyond what the kernel knows fail with EINVAL; ignore those.
            libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
        }
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        );
    }
    nix::sys::prctl::set_no_new_privs().map_err(|e| SetupError::sys("no_new_privs", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_instance_uids_lie_in_their_range() {
        let (uid, gid) = host_ids(Path::new("/data/instances/abc"), true);
        assert_eq!(uid, gid);
        assert!((UID_BASE..UID_BASE + UID_RANGE).contains(&uid));
        assert_ne!(uid, host_ids(Path::new("/data/instances/abd"), true).0);
    }
}
