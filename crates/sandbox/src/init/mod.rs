//! `warden-instance sandbox-init`, run in the instance's directory: builds one sandbox and runs
//! the app inside it.
//!
//! This module runs the three processes; `mounts` builds the file system, `privileges`
//! sets who the sandbox runs as and what the app may do, `handover` is init's loop.
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
//!   veth end the helper moved in: see [`crate::bridge`]). It then takes on no new privileges,
//!   the emptied capability sets and the seccomp filters itself, for the app to inherit, and
//!   forks the app's process, which takes rlimits (those the instance's cgroups do not already
//!   enforce: see [`crate::cgroup`]), its stdin and working directory. The sandbox is now
//!   prepared: init says so on stdin (the agent's control socket), and the app's process waits
//!   there for the start message, the rest of the app's environment. A slot of the slot pool
//!   waits here until a request needs it; a JIT start sends the message at once. The app's
//!   process reads it itself and execs the app, which leaves it no capabilities; a pipe closed
//!   on exec tells init, which from then on says when the app listens. Init stays to hand
//!   out connections to the app (see [`crate::connect`]) and to reap; when the app exits, init
//!   exits with its status and the kernel kills whatever is left in the namespace.
//!
//! Every process has a parent-death signal, so killing the helper tears the sandbox down.
//! Errors go to stderr, which is the instance's log, so `warden logs` and start errors show them.
#![allow(unsafe_code)]

mod handover;
mod mounts;
mod privileges;

pub use handover::ANNOUNCE_FOR;
pub use privileges::host_ids;

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use nix::sched::{unshare, CloneFlags};
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult};

use crate::{Go, Plan, CONN_SOCKET, DATA_DIR, PLAN_FILE, PREPARED};
use mounts::Shown;

/// Exit code when the sandbox could not be built.
const SETUP_FAILED: i32 = 125;

/// Why a step of building the sandbox failed; printed to the instance's log.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SetupError {
    /// A file-system step on a path.
    #[error("{what} {}: {source}", path.display())]
    Path {
        /// The step.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A system call.
    #[error("{what}: {source}")]
    Sys {
        /// The step.
        what: String,
        /// The errno.
        source: nix::errno::Errno,
    },
    /// Another I/O step.
    #[error("{what}: {source}")]
    Io {
        /// The step.
        what: String,
        /// Why.
        source: std::io::Error,
    },
    /// The start message is not what the agent sends.
    #[error("the start message is not valid JSON: {0}")]
    Message(#[from] serde_json::Error),
    /// The seccomp filter could not be installed.
    #[error("seccomp: {0}")]
    Seccomp(String),
    /// The program could not be run, and why in words.
    #[error("cannot run the app: {0}")]
    Exec(String),
}

impl SetupError {
    fn sys(what: impl Into<String>, source: nix::errno::Errno) -> Self {
        Self::Sys {
            what: what.into(),
            source,
        }
    }

    fn path(what: &'static str, path: &Path, source: std::io::Error) -> Self {
        Self::Path {
            what,
            path: path.to_owned(),
            source,
        }
    }
}

fn fail(what: &str, e: impl std::fmt::Display) -> i32 {
    eprintln!("warden-sandbox: {what}: {e}");
    SETUP_FAILED
}

/// Runs the helper; returns the exit code of the app (or of a failed setup).
///
/// The agent starts this with nothing run between its fork and this image's exec (see
/// [`crate::spawn::spawn_self_tied`]), so the helper's first steps are what such a step would
/// have done: it closes every descriptor past stdio, so that none the agent opened without
/// close-on-exec reaches init, which never execs; and it ties itself to the agent's life.
pub fn main(dir: &Path) -> i32 {
    close_past_stdio();
    if let Err(code) = tie_to_agent() {
        return code;
    }
    let plan_path = dir.join(PLAN_FILE);
    let plan: Plan = match std::fs::read(&plan_path)
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
        Ok(p) => p,
        Err(e) => return fail(&format!("cannot read {}", plan_path.display()), e),
    };
    let _ = std::fs::remove_file(&plan_path);
    if plan.stdin.is_some() {
        // An attached one-off process (`warden run`): the client's Ctrl-C goes to the
        // sandbox's whole process group and is the app's alone, which sees the default again
        // (`privileges::prepare_exec`); the helper, the child and init (which inherit this)
        // live on and report how the app ended.
        // SAFETY: ignoring a signal installs no handler.
        let _ = unsafe {
            nix::sys::signal::signal(Signal::SIGINT, nix::sys::signal::SigHandler::SigIgn)
        };
    }
    let privileged = nix::unistd::geteuid().is_root();
    let (uid, gid) = privileges::host_ids(dir, privileged);
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
                if let Err(code) = wire_from_outside(&plan, child, uid, gid, privileged) {
                    let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
                    let _ = waitpid(child, None);
                    return code;
                }
                let _ = std::fs::File::from(to_child_w).write_all(b"m");
            }
            exit_code(waitpid(child, None))
        }
    }
}

/// What the helper does to the namespaced child from outside: its id maps, its cgroups, and
/// in network mode `bridged` the veth pair into its network namespace.
fn wire_from_outside(
    plan: &Plan,
    child: nix::unistd::Pid,
    uid: u32,
    gid: u32,
    privileged: bool,
) -> Result<(), i32> {
    privileges::write_maps(child, uid, gid, privileged)
        .map_err(|e| fail("cannot map the sandbox's user ids", e))?;
    // The outer process joins before it forks init, so that everything inside the sandbox is
    // counted against the instance's limits.
    for procs in &plan.cgroup_procs {
        std::fs::write(procs, child.as_raw().to_string()).map_err(|e| {
            fail(
                &format!("cannot put the sandbox into {}", procs.display()),
                e,
            )
        })?;
    }
    if let Some(b) = &plan.bridged {
        // The child's network namespace exists now; init configures the inner end.
        crate::bridge::attach(b, child.as_raw().unsigned_abs()).map_err(|e| {
            fail(
                &format!("cannot wire the sandbox to bridge {}", b.bridge),
                e,
            )
        })?;
    }
    Ok(())
}

fn exit_code(status: nix::Result<WaitStatus>) -> i32 {
    match status {
        Ok(WaitStatus::Exited(_, code)) => code,
        Ok(WaitStatus::Signaled(_, sig, _)) => 128 + sig as i32,
        _ => SETUP_FAILED,
    }
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
    let helper = nix::unistd::getppid();
    if let Err(code) = die_with(helper) {
        return code;
    }
    let mut flags = CloneFlags::CLONE_NEWUSER
        | CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWNET
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWUTS;
    if plan.build {
        // Package managers fetch from their registries over the host's network.
        flags.remove(CloneFlags::CLONE_NEWNET);
    }
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
    let shown = match mounts::open_shown(plan, data) {
        Ok(s) => s,
        Err(e) => return fail("cannot open what the sandbox shows", e),
    };
    if let Err(e) = privileges::become_ns_root(privileged) {
        return fail("cannot become root of the user namespace", e);
    }
    // Asked for again: the kernel clears a parent-death signal when the effective uid changes,
    // as becoming root of the namespace does, and this process, and with it the whole sandbox,
    // would outlive the helper.
    if let Err(code) = die_with(helper) {
        return code;
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

/// Closes every descriptor above stderr. The helper is given stdin (the control socket),
/// stdout and stderr and nothing else; anything past them was left open by mistake.
fn close_past_stdio() {
    // SAFETY: close_range(2) takes plain integers and touches only the descriptor table; this
    // process is single-threaded and holds no descriptor of its own past stderr yet.
    unsafe {
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            0,
        );
    }
}

/// Asks for SIGKILL when the agent dies, as [`die_with`] does for the helper: the agent is the
/// peer of stdin, the control socket it made and handed over.
fn tie_to_agent() -> Result<(), i32> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    // SAFETY: fd 0 is this process's stdin, open for its whole life; it is only borrowed here.
    let stdin = unsafe { std::os::fd::BorrowedFd::borrow_raw(0) };
    let agent = getsockopt(&stdin, PeerCredentials).map_err(|e| {
        fail(
            "stdin is not the agent's control socket; sandbox-init is started by the warden agent",
            e,
        )
    })?;
    die_with(nix::unistd::Pid::from_raw(agent.pid()))
}

/// Asks for SIGKILL when the parent dies, and exits if `parent` is already gone (it died
/// before the request, which the kernel then never signals).
fn die_with(parent: nix::unistd::Pid) -> Result<(), i32> {
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)
        .map_err(|e| fail("cannot tie the sandbox to its helper", e))?;
    if nix::unistd::getppid() != parent {
        return Err(SETUP_FAILED);
    }
    Ok(())
}

/// Pid 1 of the sandbox.
fn init(plan: &Plan, shown: Vec<Shown>, listener: UnixListener) -> i32 {
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
    let networked = || if plan.build { Ok(()) } else { network(plan) };
    if let Err(e) = mounts::enter_root(&shown).and_then(|()| networked()) {
        return fail("cannot build the sandbox", e);
    }
    drop(shown);
    // Compiled and installed now, on init itself, so that a prepared slot leaves only the
    // app's own start for the request: the kernel's preparation of a filter took 0.3 ms of
    // each slot start (perf trace). The app's process inherits all of it across fork and
    // exec, as it would have had it from its own calls; init needs none of what they take
    // away (it forks, hands connections over and reaps), and keeps its capabilities in the
    // namespace, which only an exec would drop.
    let filters = match crate::seccomp::filters(plan.io_uring) {
        Ok(f) => f,
        Err(e) => return fail("cannot build the seccomp filter", e),
    };
    if let Err(e) = privileges::confine(&filters) {
        return fail("cannot confine the sandbox", e);
    }
    // The app's process is forked now, before the start message, and reads that message
    // itself: a fork of init took 0.3 ms of each slot start (perf), and init passing the
    // message on to it a further 0.3 ms (init's wake, its read, a pipe, the process's wake),
    // which a prepared slot has then done without. The pipe tells init when the process
    // execs or ends: its write end is the process's, closed on exec.
    let (exec_r, exec_w) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => return fail("pipe", e),
    };
    // SAFETY: single-threaded.
    let app = match unsafe { fork() } {
        Err(e) => return fail("fork", e),
        Ok(ForkResult::Child) => {
            drop((listener, exec_r));
            std::process::exit(app_process(plan, exec_w))
        }
        Ok(ForkResult::Parent { child }) => child,
    };
    drop(exec_w);
    // SAFETY: fd 0 is the control socket the agent gave sandbox-init as stdin; nothing else in
    // this process owns it.
    let control = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(0) });
    // The sandbox is prepared: everything from here on is the app's own start. An agent that
    // already sent its message and closed its end makes this fail; the message is still there.
    let _ = (&control).write_all(&[PREPARED]);
    if let Err(e) = app_process_goes(&exec_r) {
        return fail("cannot wait for the app's process", e);
    }
    // The app runs now, or its process ended (the agent let go of an unused slot, a bad
    // message, a kill from outside): `serve` reaps it first and ends the sandbox with it.
    // std duplicates with F_DUPFD_CLOEXEC; descriptor 0 closes when `control` drops here.
    let kept = control.try_clone().ok();
    drop(control);
    // /dev/null takes descriptor 0, so that no socket init opens later becomes a stdin.
    if let Err(e) = privileges::stdin_from_dev_null() {
        return fail("cannot give the sandbox a stdin", e);
    }
    let announce = kept
        .filter(|_| plan.announce_listening)
        .map(handover::Announce::new);
    handover::serve(listener, app, plan.port, announce)
}

/// The app's process, forked from init before the start message: gets ready to exec, reads
/// the start message (the rest of its environment) from the control socket, then execs the
/// app, which closes `_exec` (held until then) and so tells init. Exits 0 without a word when
/// the agent closes the socket without a message: the slot was let go of.
fn app_process(plan: &Plan, _exec: OwnedFd) -> i32 {
    // Descriptor 0 is the control socket: a copy closed on exec is read, and 0 becomes the
    // app's stdin, since the app must never hold the socket.
    let stdin = std::io::stdin();
    let control = match nix::fcntl::fcntl(&stdin, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(3)) {
        // SAFETY: the descriptor was just made, and nothing else owns it.
        Ok(fd) => std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) }),
        Err(e) => return fail("cannot keep the control socket", e),
    };
    let exec = match privileges::ExecReady::new(plan) {
        Ok(e) => e,
        Err(e) => return fail("cannot start the app", e),
    };
    warm(plan);
    let env = match read_go(control) {
        Ok(Some(go)) => go.env,
        Ok(None) => return 0,
        Err(e) => return fail("cannot read the start message", e),
    };
    let e = exec.exec(plan, env);
    eprintln!("warden-sandbox: cannot start {}: {e}", plan.argv[0]);
    127
}

/// Runs once, before the start message comes, the code that turns that message into the app's
/// environment. This process is a fork of init, which has run none of it: each page of that
/// code would otherwise be mapped at its first use, after the message, on the waiting
/// request's path (3-4 page faults, about 0.05 ms of a slot start here: docs/BENCHMARKS.md,
/// "The waiting request told first").
fn warm(plan: &Plan) {
    if let Ok(go) = serde_json::from_slice::<Go>(br#"{"env":{"WARDEN_LABEL":"warm"}}"#) {
        let _ = privileges::environment(plan, go.env);
    }
}

/// Reads the start message up to the agent's end of writing; `None` if the agent closed the
/// socket without one.
fn read_go(mut control: std::fs::File) -> Result<Option<Go>, SetupError> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match control.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // An agent that closed its end with init's "prepared" byte unread resets the
            // socket after its message arrived: the message is whole.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && !buf.is_empty() => break,
            Err(source) => {
                return Err(SetupError::Io {
                    what: "read the control socket".into(),
                    source,
                })
            }
        }
    }
    if buf.is_empty() {
        return Ok(None);
    }
    Ok(Some(serde_json::from_slice(&buf)?))
}

/// Waits until the app's process execs or ends: both close the pipe's write end, its one
/// holder, which polls the read end as hung up.
fn app_process_goes(exec: &OwnedFd) -> Result<(), SetupError> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    loop {
        let mut fds = [PollFd::new(exec.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::NONE) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(SetupError::sys("poll the app's process", e)),
            Ok(_) => return Ok(()),
        }
    }
}

/// The sandbox's host name and network: loopback, and in network mode `bridged` the inner end
/// of its veth pair.
fn network(plan: &Plan) -> Result<(), SetupError> {
    nix::unistd::sethostname(&plan.hostname).map_err(|e| SetupError::sys("sethostname", e))?;
    loopback_up().map_err(|source| SetupError::Io {
        what: "bring loopback up".into(),
        source,
    })?;
    if let Some(b) = &plan.bridged {
        crate::bridge::configure_inside(b).map_err(|source| SetupError::Io {
            what: format!("configure {}", crate::bridge::INSIDE_IF),
            source,
        })?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What the agent opened without close-on-exec, and so could hand the helper, is closed
    /// before anything else runs: init, which never execs, would keep it for the sandbox's life.
    #[test]
    fn the_helper_keeps_no_descriptor_past_stdio() {
        let dir = std::fs::File::open("/").unwrap();
        // A copy without close-on-exec, far above the lowest free descriptor.
        // SAFETY: F_DUPFD duplicates a descriptor this test owns; the copy is closed below.
        let fd = unsafe { libc::fcntl(dir.as_raw_fd(), libc::F_DUPFD, 100) };
        assert!(fd >= 100);
        // SAFETY: the kernel just returned this descriptor to this test, which owns it now.
        let _leaked = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: the child calls only async-signal-safe functions (close_range, fcntl, _exit)
        // before it exits, as a child of a multi-threaded process must.
        match unsafe { libc::fork() } {
            0 => {
                close_past_stdio();
                // SAFETY: as above.
                let open = |fd| unsafe { libc::fcntl(fd, libc::F_GETFD) } != -1;
                let ok = !open(fd) && open(0) && open(2);
                // SAFETY: as above.
                unsafe { libc::_exit(if ok { 0 } else { 1 }) }
            }
            -1 => panic!("fork: {}", std::io::Error::last_os_error()),
            pid => {
                let status = waitpid(nix::unistd::Pid::from_raw(pid), None).unwrap();
                assert_eq!(
                    status,
                    WaitStatus::Exited(nix::unistd::Pid::from_raw(pid), 0)
                );
            }
        }
    }
}
