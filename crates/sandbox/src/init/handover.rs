//! Init's loop once the app runs: hand out connections to the app to the gateway (see
//! [`crate::connect`]), reap children, and exit with the app.

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;

use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;

use super::{exit_code, fail};

/// Serves hand-overs until the app exits; returns the app's exit code.
pub(super) fn serve(listener: UnixListener, app: Pid, port: u16) -> i32 {
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
