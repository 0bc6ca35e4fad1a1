//! `warden sandbox-init <instance-dir>`: builds one sandbox and runs the app inside it.
//!
//! Three processes, because namespaces are entered in steps:
//! - the helper (this process, started by the agent, same credentials) opens everything the
//!   sandbox will show (system directories, the program, the workdir, the instance's data
//!   directory) and binds the connection socket, while it can still see the host; then forks
//! - the child, which unshares user, mount, pid, net, ipc and uts namespaces; the helper writes
//!   its uid and gid maps from outside (ns root is the agent's own uid when unprivileged, a
//!   per-instance unprivileged uid when the agent is root); the child becomes ns root and forks
//! - init, pid 1 of the new pid namespace, which mounts a fresh root (tmpfs, read-only binds of
//!   the opened directories, the writable data directory, a private /tmp, a few device nodes,
//!   a new /proc), pivots into it and brings loopback up (and, in network mode `bridged`, the
//!   veth end the helper moved in: see [`super::bridge`]). The sandbox is now prepared: init
//!   says so on stdin (the agent's control socket) and waits there for the start message, the
//!   rest of the app's environment. A slot of the slot pool waits here until a request needs
//!   it; a JIT start sends the message at once. Then init forks the app. The app gets rlimits
//!   (those the instance's cgroups do not already enforce: see [`super::cgroup`]),
//!   no capabilities, no new privileges and the seccomp filter, then execs. Init stays to hand
//!   out connections to the app (see [`crate::connect`]) and to reap; when the app exits, init
//!   exits with its status and the kernel kills whatever is left in the namespace.
//!
//! Every process has a parent-death signal, so killing the helper tears the sandbox down.
//! Errors go to stderr, which is the instance's log, so `warden logs` and start errors show them.
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};

use super::{Go, Plan, CONN_SOCKET, DATA_DIR, DATA_MOUNT, PLAN_FILE, PREPARED};

/// Host directories shown read-only inside (those that exist; symlinks are recreated).
const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc",
];
/// Device nodes bound inside.
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];
/// First host uid of per-instance uids when the agent runs as root.
const UID_BASE: u32 = 200_000;
/// How many per-instance uids there are.
const UID_RANGE: u32 = 100_000;
/// Exit code when the sandbox could not be built.
const SETUP_FAILED: i32 = 125;

/// A host path opened before the namespaces hide it.
enum Shown {
    Dir { path: String, fd: OwnedFd },
    File { path: String, fd: OwnedFd },
    Link { path: String, target: PathBuf },
}

fn fail(what: &str, e: impl std::fmt::Display) -> i32 {
    eprintln!("warden-sandbox: {what}: {e}");
    SETUP_FAILED
}

/// Runs the helper; returns the exit code of the app (or of a failed setup).
pub fn main(dir: &Path) -> i32 {
    let plan_path = dir.join(PLAN_FILE);
    let plan: Plan = match std::fs::read(&plan_path)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
        Ok(p) => p,
        Err(e) => return fail(&format!("cannot read {}", plan_path.display()), e),
    };
    let _ = std::fs::remove_file(&plan_path);
    let privileged = nix::unistd::geteuid().is_root();
    let (uid, gid) = if privileged {
        let id = UID_BASE + fnv(dir.to_string_lossy().as_bytes()) % UID_RANGE;
        (id, id)
    } else {
        (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        )
    };
    let data = dir.join(DATA_DIR);
    if privileged {
        if let Err(e) = std::os::unix::fs::chown(&data, Some(uid), Some(gid)) {
            return fail("cannot hand the data directory to the sandbox uid", e);
        }
    }
    let socket = dir.join(CONN_SOCKET);
    let _ = std::fs::remove_file(&socket);
    let listener = match UnixListener::bind(&socket) {
        Ok(l) => l,
        Err(e) => return fail(&format!("cannot bind {}", socket.display()), e),
    };
    let (to_helper_r, to_helper_w) = match nix::unistd::pipe() {
        Ok(p) => p,
        Err(e) => return fail("pipe", e),
    };
    let (to_child_r, to_child_w) = match nix::unistd::pipe() {
        Ok(p) => p,
        Err(e) => return fail("pipe", e),
    };
    // SAFETY: this process is single-threaded (the runtime is never started for sandbox-init),
    // so the child may run arbitrary code after fork.
    match unsafe { fork() } {
        Err(e) => fail("fork", e),
        Ok(ForkResult::Child) => {
            drop((to_helper_r, to_child_w));
            let code = child(&plan, &data, listener, to_helper_w, to_child_r, privileged);
            std::process::exit(code)
        }
        Ok(ForkResult::Parent { child }) => {
            drop((to_helper_w, to_child_r, listener));
            let mut byte = [0u8; 1];
            let unshared = std::fs::File::from(to_helper_r)
                .read(&mut byte)
                .unwrap_or(0)
                == 1;
            if unshared {
                if let Err(e) = write_maps(child, uid, gid, privileged) {
                    let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
                    let _ = waitpid(child, None);
                    return fail("cannot map the sandbox's user ids", e);
                }
                // The outer process joins before it forks init, so that everything inside the
                // sandbox is counted against the instance's limits.
                for procs in &plan.cgroup_procs {
                    if let Err(e) = std::fs::write(procs, child.as_raw().to_string()) {
                        let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
                        let _ = waitpid(child, None);
                        return fail(
                            &format!("cannot put the sandbox into {}", procs.display()),
                            e,
                        );
                    }
                }
                if let Some(b) = &plan.bridged {
                    // The child's network namespace exists now; init configures the inner end.
                    if let Err(e) = super::bridge::attach(b, child.as_raw().unsigned_abs()) {
                        let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
                        let _ = waitpid(child, None);
                        return fail(
                            &format!("cannot wire the sandbox to bridge {}", b.bridge),
                            e,
                        );
                    }
                }
                let _ = std::fs::File::from(to_child_w).write_all(b"m");
            }
            exit_code(waitpid(child, None))
        }
    }
}

/// FNV-1a: a stable spread of names over small ranges (uids, interface names), not security.
pub(crate) fn fnv(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
}

fn exit_code(status: nix::Result<WaitStatus>) -> i32 {
    match status {
        Ok(WaitStatus::Exited(_, code)) => code,
        Ok(WaitStatus::Signaled(_, sig, _)) => 128 + sig as i32,
        _ => SETUP_FAILED,
    }
}

fn open_path(path: &Path) -> std::io::Result<OwnedFd> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(path)?;
    Ok(OwnedFd::from(f))
}

fn under_system_dir(path: &str) -> bool {
    SYSTEM_DIRS
        .iter()
        .any(|d| path == *d || path.starts_with(&format!("{d}/")))
}

fn open_shown(plan: &Plan, data: &Path) -> std::io::Result<Vec<Shown>> {
    let mut shown = Vec::new();
    for d in SYSTEM_DIRS {
        let p = Path::new(d);
        match std::fs::symlink_metadata(p) {
            Ok(m) if m.file_type().is_symlink() => shown.push(Shown::Link {
                path: (*d).into(),
                target: std::fs::read_link(p)?,
            }),
            Ok(m) if m.is_dir() => shown.push(Shown::Dir {
                path: (*d).into(),
                fd: open_path(p)?,
            }),
            _ => {}
        }
    }
    let program = &plan.argv[0];
    if !under_system_dir(program) {
        shown.push(Shown::File {
            path: program.clone(),
            fd: open_path(Path::new(program))?,
        });
    }
    if let Some(w) = &plan.workdir {
        if !under_system_dir(w) {
            shown.push(Shown::Dir {
                path: w.clone(),
                fd: open_path(Path::new(w))?,
            });
        }
    }
    shown.push(Shown::Dir {
        path: DATA_MOUNT.into(),
        fd: open_path(data)?,
    });
    Ok(shown)
}

fn write_maps(child: Pid, uid: u32, gid: u32, privileged: bool) -> std::io::Result<()> {
    let proc = PathBuf::from(format!("/proc/{child}"));
    if !privileged {
        // Unprivileged gid maps require giving up setgroups(2) first.
        std::fs::write(proc.join("setgroups"), "deny")?;
    }
    std::fs::write(proc.join("uid_map"), format!("0 {uid} 1\n"))?;
    std::fs::write(proc.join("gid_map"), format!("0 {gid} 1\n"))?;
    Ok(())
}

/// The second process: enters the namespaces and waits for init.
fn child(
    plan: &Plan,
    data: &Path,
    listener: UnixListener,
    to_helper: OwnedFd,
    from_helper: OwnedFd,
    privileged: bool,
) -> i32 {
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    let flags = CloneFlags::CLONE_NEWUSER
        | CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWNET
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWUTS;
    if let Err(e) = unshare(flags) {
        let hint = if e == nix::errno::Errno::EPERM || e == nix::errno::Errno::ENOSPC {
            "; user namespaces are not allowed here. Allow them (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0, or on Ubuntu kernel.apparmor_restrict_unprivileged_userns=0), run warden as root, or use driver \"process\""
        } else {
            ""
        };
        return fail("cannot create the namespaces", format!("{e}{hint}"));
    }
    if std::fs::File::from(to_helper).write_all(b"u").is_err() {
        return SETUP_FAILED;
    }
    let mut byte = [0u8; 1];
    if std::fs::File::from(from_helper)
        .read(&mut byte)
        .unwrap_or(0)
        != 1
    {
        return SETUP_FAILED;
    }
    // Opened here, in the new mount namespace (a bind's source must be a mount of the
    // namespace that binds it) but before becoming ns root, while this process still has the
    // agent's own access to the host's paths.
    let shown = match open_shown(plan, data) {
        Ok(s) => s,
        Err(e) => return fail("cannot open what the sandbox shows", e),
    };
    let root = nix::unistd::Gid::from_raw(0);
    if let Err(e) = nix::unistd::setresgid(root, root, root) {
        return fail("setresgid", e);
    }
    if privileged {
        if let Err(e) = nix::unistd::setgroups(&[]) {
            return fail("setgroups", e);
        }
    }
    let root = nix::unistd::Uid::from_raw(0);
    if let Err(e) = nix::unistd::setresuid(root, root, root) {
        return fail("setresuid", e);
    }
    // SAFETY: still single-threaded.
    match unsafe { fork() } {
        Err(e) => fail("fork", e),
        Ok(ForkResult::Child) => std::process::exit(init(plan, shown, listener)),
        Ok(ForkResult::Parent { child }) => {
            drop(listener);
            exit_code(waitpid(child, None))
        }
    }
}

fn cstr(s: &str) -> CString {
    CString::new(s.replace('\0', "")).unwrap_or_default()
}

/// Flags a read-only bind must keep: in a user namespace the kernel refuses a remount that
/// would drop nosuid, nodev, noexec or the atime flags of the original mount.
fn kept_flags(path: &Path) -> MsFlags {
    use nix::sys::statvfs::FsFlags;
    let Ok(st) = nix::sys::statvfs::statvfs(path) else {
        return MsFlags::empty();
    };
    let f = st.flags();
    let mut m = MsFlags::empty();
    for (fs, ms) in [
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if f.contains(fs) {
            m |= ms;
        }
    }
    m
}

fn bind(source: &Path, target: &Path, read_only: bool) -> Result<(), String> {
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| format!("bind {} on {}: {e}", source.display(), target.display()))?;
    if read_only {
        let flags =
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | kept_flags(target);
        mount(None::<&str>, target, None::<&str>, flags, None::<&str>)
            .map_err(|e| format!("read-only remount of {}: {e}", target.display()))?;
    }
    Ok(())
}

fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Builds the root under `stage` from what the helper opened.
fn build_root(stage: &Path, shown: &[Shown]) -> Result<(), String> {
    let io = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
    // The private /tmp comes first: a program or workdir under the host's /tmp is bound on top
    // of it afterwards instead of being hidden by it.
    let tmp = stage.join("tmp");
    std::fs::create_dir_all(&tmp).map_err(|e| io("mkdir", &tmp, e))?;
    mount(
        Some("tmpfs"),
        &tmp,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=1777,size=64m"),
    )
    .map_err(|e| format!("mount /tmp: {e}"))?;
    for s in shown {
        match s {
            Shown::Link { path, target } => {
                let at = stage.join(path.trim_start_matches('/'));
                std::os::unix::fs::symlink(target, &at).map_err(|e| io("symlink", &at, e))?;
            }
            Shown::Dir { path, fd } => {
                let at = stage.join(path.trim_start_matches('/'));
                std::fs::create_dir_all(&at).map_err(|e| io("mkdir", &at, e))?;
                bind(&fd_path(fd), &at, path != DATA_MOUNT)?;
            }
            Shown::File { path, fd } => {
                let at = stage.join(path.trim_start_matches('/'));
                if let Some(parent) = at.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| io("mkdir", parent, e))?;
                }
                std::fs::write(&at, b"").map_err(|e| io("create", &at, e))?;
                bind(&fd_path(fd), &at, true)?;
            }
        }
    }
    let dev = stage.join("dev");
    std::fs::create_dir_all(&dev).map_err(|e| io("mkdir", &dev, e))?;
    for d in DEVICES {
        let at = stage.join(d.trim_start_matches('/'));
        if Path::new(d).exists() {
            std::fs::write(&at, b"").map_err(|e| io("create", &at, e))?;
            bind(Path::new(d), &at, false)?;
        }
    }
    for d in ["proc", ".old"] {
        let at = stage.join(d);
        std::fs::create_dir_all(&at).map_err(|e| io("mkdir", &at, e))?;
    }
    Ok(())
}

/// Pid 1 of the sandbox.
fn init(plan: &Plan, shown: Vec<Shown>, listener: UnixListener) -> i32 {
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    match setup(plan, &shown) {
        Ok(()) => {}
        Err(e) => return fail("cannot build the sandbox", e),
    }
    drop(shown);
    // Compiled now, so that a prepared slot leaves only the app's own start for the request.
    let filters = match super::seccomp::filters() {
        Ok(f) => f,
        Err(e) => return fail("cannot build the seccomp filter", e),
    };
    // The sandbox is prepared: everything from here on is the app's own start.
    let env = match await_go() {
        Ok(Some(env)) => env,
        // The agent let go of an unused slot.
        Ok(None) => return 0,
        Err(e) => return fail("cannot read the start message", e),
    };
    // SAFETY: single-threaded.
    match unsafe { fork() } {
        Err(e) => fail("fork", e),
        Ok(ForkResult::Child) => {
            drop(listener);
            let e = exec_app(plan, env, &filters);
            eprintln!("warden-sandbox: cannot start {}: {e}", plan.argv[0]);
            std::process::exit(127)
        }
        Ok(ForkResult::Parent { child }) => serve(listener, child, plan.port),
    }
}

/// Tells the agent over stdin (its control socket) that the sandbox is prepared, then waits for
/// the start message: the rest of the app's environment. `None` if the agent closed the socket
/// without one.
fn await_go() -> Result<Option<BTreeMap<String, String>>, String> {
    // SAFETY: fd 0 is the control socket the agent gave sandbox-init as stdin; nothing else in
    // this process owns it.
    let mut control = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(0) });
    // An agent that already sent its message and closed its end makes this fail; the message
    // is still there to read.
    let _ = control.write_all(&[PREPARED]);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match control.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // An agent that closed its end with our "prepared" byte unread resets the socket
            // after its message arrived: the message is whole.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && !buf.is_empty() => break,
            Err(e) => return Err(e.to_string()),
        }
    }
    if buf.is_empty() {
        return Ok(None);
    }
    let go: Go = serde_json::from_slice(&buf).map_err(|e| e.to_string())?;
    Ok(Some(go.env))
}

fn setup(plan: &Plan, shown: &[Shown]) -> Result<(), String> {
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("make mounts private: {e}"))?;
    // Any directory works as the staging point: the helper already opened everything the
    // sandbox shows, so hiding the host's /tmp in this mount namespace costs nothing.
    let stage = Path::new("/tmp");
    mount(
        Some("tmpfs"),
        stage,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=0755,size=4m"),
    )
    .map_err(|e| format!("mount the new root: {e}"))?;
    build_root(stage, shown)?;
    // Before the pivot: the kernel allows a new proc mount in a user namespace only while a
    // fully visible one exists in the mount namespace, and the host's goes with the old root.
    if let Err(e) = mount(
        Some("proc"),
        &stage.join("proc"),
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    ) {
        // Some container runtimes mask parts of /proc, and the kernel then refuses a fresh
        // proc mount in a user namespace. The app runs without /proc rather than not at all.
        eprintln!("warden-sandbox: no /proc inside ({e}); continuing without it");
    }
    nix::unistd::pivot_root(stage, &stage.join(".old")).map_err(|e| format!("pivot_root: {e}"))?;
    nix::unistd::chdir("/").map_err(|e| format!("chdir /: {e}"))?;
    umount2("/.old", MntFlags::MNT_DETACH).map_err(|e| format!("detach the old root: {e}"))?;
    let _ = std::fs::remove_dir("/.old");
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None::<&str>,
    )
    .map_err(|e| format!("make the root read-only: {e}"))?;
    nix::unistd::sethostname(&plan.hostname).map_err(|e| format!("sethostname: {e}"))?;
    loopback_up().map_err(|e| format!("bring loopback up: {e}"))?;
    if let Some(b) = &plan.bridged {
        super::bridge::configure_inside(b)
            .map_err(|e| format!("configure {}: {e}", super::bridge::INSIDE_IF))?;
    }
    Ok(())
}

/// Sets IFF_UP on `lo`, the only interface of a fresh network namespace.
fn loopback_up() -> std::io::Result<()> {
    // Any socket will do for the ioctl; binding the wildcard works while lo is still down.
    let sock = std::net::UdpSocket::bind("0.0.0.0:0")?;
    let fd = sock.as_raw_fd();
    // SAFETY: ifreq is plain old data; all zeroes is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (i, b) in b"lo".iter().enumerate() {
        ifr.ifr_name[i] = *b as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS and SIOCSIFFLAGS read and write the ifreq we own.
    unsafe {
        if libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut ifr) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        ifr.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        if libc::ioctl(fd, libc::SIOCSIFFLAGS, &ifr) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// In the app's process: limits, no privileges, seccomp, exec. Returns only on failure.
fn exec_app(
    plan: &Plan,
    extra_env: BTreeMap<String, String>,
    filters: &[seccompiler::BpfProgram],
) -> String {
    use nix::sys::resource::{setrlimit, Resource};
    use nix::sys::signal::{signal, SigHandler};
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    // The Rust runtime ignores SIGPIPE, and an ignored signal survives exec; the app gets the
    // default like any process started by a shell.
    // SAFETY: restoring the default disposition installs no handler.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
    match std::fs::File::open("/dev/null") {
        Ok(null) => {
            if let Err(e) = nix::unistd::dup2_stdin(&null) {
                return format!("stdin from /dev/null: {e}");
            }
        }
        Err(e) => return format!("open /dev/null: {e}"),
    }
    let dir = plan.workdir.as_deref().unwrap_or(DATA_MOUNT);
    if let Err(e) = nix::unistd::chdir(dir) {
        return format!("chdir {dir}: {e}");
    }
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
        if let Err(e) = setrlimit(r, v, v) {
            return format!("setrlimit {r:?}: {e}");
        }
    }
    if let Err(e) = drop_privileges() {
        return e;
    }
    for f in filters {
        if let Err(e) = seccompiler::apply_filter(f) {
            return format!("seccomp: {e}");
        }
    }
    let argv: Vec<CString> = plan.argv.iter().map(|a| cstr(a)).collect();
    let mut env = plan.env.clone();
    env.extend(extra_env);
    let env: Vec<CString> = env.iter().map(|(k, v)| cstr(&format!("{k}={v}"))).collect();
    match nix::unistd::execve(&argv[0], &argv, &env) {
        Err(e) => e.to_string(),
        Ok(never) => match never {},
    }
}

/// Root inside the namespace must not mean capabilities: lock root's special treatment off,
/// empty the bounding and ambient sets, and forbid gaining privileges through exec.
fn drop_privileges() -> Result<(), String> {
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
            return Err(format!(
                "PR_SET_SECUREBITS: {}",
                std::io::Error::last_os_error()
            ));
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
    nix::sys::prctl::set_no_new_privs().map_err(|e| format!("no_new_privs: {e}"))
}

/// Init's loop: hand out connections to the app, reap children, and exit with the app.
fn serve(listener: UnixListener, app: Pid, port: u16) -> i32 {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use nix::sys::signal::{SigSet, SigmaskHow};
    use nix::sys::signalfd::{SfdFlags, SignalFd};
    let mut chld = SigSet::empty();
    chld.add(Signal::SIGCHLD);
    if let Err(e) = nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&chld), None) {
        return fail("block SIGCHLD", e);
    }
    let sfd = match SignalFd::with_flags(&chld, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC) {
        Ok(s) => s,
        Err(e) => return fail("signalfd", e),
    };
    let _ = listener.set_nonblocking(true);
    loop {
        // Reap everything that has exited; the app's end is the sandbox's end.
        loop {
            match waitpid(None, Some(nix::sys::wait::WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(s) if s.pid() == Some(app) => {
                    if let WaitStatus::Signaled(_, sig, _) = s {
                        let hint = match sig {
                            Signal::SIGKILL => " (killed; this is also how the CPU-time limit ends an app)",
                            Signal::SIGXCPU => " (CPU-time limit reached)",
                            Signal::SIGABRT => " (aborted; a failed allocation at the memory limit ends Rust and C++ apps this way)",
                            Signal::SIGSYS => " (a forbidden system call)",
                            _ => "",
                        };
                        eprintln!("warden-sandbox: the app was killed by {sig}{hint}");
                    }
                    return exit_code(Ok(s));
                }
                Ok(_) => {}
            }
        }
        let mut fds = [
            PollFd::new(listener.as_fd(), PollFlags::POLLIN),
            PollFd::new(sfd.as_fd(), PollFlags::POLLIN),
        ];
        if let Err(e) = poll(&mut fds, PollTimeout::NONE) {
            if e != nix::errno::Errno::EINTR {
                return fail("poll", e);
            }
        }
        while sfd.read_signal().ok().flatten().is_some() {}
        while let Ok((conn, _)) = listener.accept() {
            hand_over(&conn, port);
        }
    }
}

/// Starts a connection to the app inside and sends the socket to the caller, or the errno.
///
/// The connect does not block: on loopback it usually completes at once, but with the app's
/// accept queue full the kernel retries the handshake for seconds, and init, which serves every
/// hand-over of the sandbox in turn, must not wait for it. The caller waits for the socket to
/// become writable and reads its error, as for any non-blocking connect.
fn hand_over(conn: &std::os::unix::net::UnixStream, port: u16) {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let _ = conn.set_nonblocking(false);
    match connect_nonblocking(port) {
        Ok(tcp) => {
            let fds = [tcp.as_raw_fd()];
            let payload = [crate::net::HANDED, 0];
            let iov = [std::io::IoSlice::new(&payload)];
            let cmsg = [ControlMessage::ScmRights(&fds)];
            let _ = sendmsg::<()>(conn.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None);
        }
        Err(errno) => {
            let payload = [b'e', u8::try_from(errno as i32).unwrap_or(u8::MAX)];
            let _ = (&*conn).write_all(&payload);
        }
    }
}

/// A TCP socket connected, or connecting, to the app's port on the sandbox's loopback.
fn connect_nonblocking(port: u16) -> Result<OwnedFd, nix::errno::Errno> {
    use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, SockaddrIn};
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    match connect(fd.as_raw_fd(), &SockaddrIn::new(127, 0, 0, 1, port)) {
        Ok(()) | Err(nix::errno::Errno::EINPROGRESS) => Ok(fd),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_dir_prefixes_match_whole_components() {
        assert!(under_system_dir("/usr/bin/python3"));
        assert!(under_system_dir("/etc"));
        assert!(!under_system_dir("/usrlocal/app"));
        assert!(!under_system_dir("/work/app"));
    }

    #[test]
    fn per_instance_uids_spread() {
        let a = fnv(b"/data/instances/abc");
        let b = fnv(b"/data/instances/abd");
        assert_ne!(a % UID_RANGE, b % UID_RANGE);
    }
}
