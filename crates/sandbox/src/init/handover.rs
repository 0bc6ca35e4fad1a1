//! Init's loop once the app runs: hand out connections to the app to the gateway (see
//! [`crate::connect`]), reap children, and exit with the app.

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;

use super::{exit_code, fail};

/// How long into the app's start every probe connects rather than asking `sock_diag` first
/// (see [`Announce`]).
const CONNECT_FIRST: Duration = Duration::from_millis(20);

/// How long init looks for the app to accept before it stops looking; the agent polls through
/// init only from then on (every 50 ms), and sees an app slower than that.
pub const ANNOUNCE_FOR: Duration = Duration::from_secs(30);

/// Telling the agent when the app accepts connections: probes of the app's port, every 100 µs
/// for the app's first 20 ms, then every 250 µs until a second, every millisecond until 10 s
/// and every 10 ms after ([`interval`]), so a start is seen soon after its `listen` instead of
/// at the agent's next poll through this process. In the first 20 ms ([`CONNECT_FIRST`]) every
/// probe is a non-blocking connect on the sandbox's own loopback: an app that listens this
/// soon is one a request waits for, and the connect that sees it comes at once, in a namespace
/// its refused predecessors kept warm (the first connect in a new namespace costs about 35 µs
/// more). After that, a probe first asks `sock_diag` whether a listener takes the port: one
/// netlink round trip, about half the CPU of a connect the port refuses (SYN, reset, close),
/// and connects once one does. The connection is sent with the word, left open: the agent
/// gives it to the request that waits for the start. Where the kernel cannot answer for TCP
/// (no `inet_diag`, netlink refused), every probe connects, every millisecond after the first
/// 20 ms and every 10 ms after a second; so do the probes of a listener that takes no
/// connection (its backlog full).
pub(super) struct Announce {
    control: std::fs::File,
    began: Instant,
    next: Instant,
    /// A `sock_diag` socket; `None` where netlink does not answer (connects alone tell then).
    diag: Option<OwnedFd>,
}

impl Announce {
    pub(super) fn new(control: std::fs::File) -> Self {
        // The probes' timer is a `ppoll` timeout, which the kernel may extend by the thread's
        // timer slack (50 µs by default): half as much again as the probes' interval.
        let _ = nix::sys::prctl::set_timerslack(1_000);
        let now = Instant::now();
        Self {
            control,
            began: now,
            next: now,
            // Where the kernel has no `inet_diag` for TCP, it says "no such socket" to every
            // question: a "nothing listens" would never end, and no word would come.
            diag: crate::sock_diag::socket()
                .ok()
                .filter(crate::sock_diag::answers_for_tcp),
        }
    }

    /// Whether `sock_diag` says that nothing listens on `port` yet, so a probe at `age` need
    /// not connect; never asked in the first phase, where every probe connects.
    fn nothing_listens(&mut self, port: u16, age: Duration) -> bool {
        if age < CONNECT_FIRST {
            return false;
        }
        match self
            .diag
            .as_ref()
            .map(|fd| crate::sock_diag::listens(fd, port))
        {
            Some(Ok(listens)) => !listens,
            // Netlink failing (out of memory, refused): connects tell from now on.
            Some(Err(_)) => {
                self.diag = None;
                false
            }
            None => false,
        }
    }

    /// How long until the next probe is due.
    fn wait(&self) -> Duration {
        self.next.saturating_duration_since(Instant::now())
    }

    /// Probes the port if a probe is due. True once there is nothing more to do: the agent was
    /// told, or [`ANNOUNCE_FOR`] passed. With `pass` the probe's connection goes with the
    /// word; without (a connection was handed over already, so the agent's own poll may have
    /// seen the app ready and will not read the word) it is closed, so that no connection the
    /// app accepted waits unread on the control socket, taking an app's only worker.
    fn probe(&mut self, port: u16, pass: bool) -> bool {
        use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
        let now = Instant::now();
        if now < self.next {
            return false;
        }
        let age = now - self.began;
        if age >= ANNOUNCE_FOR {
            return true;
        }
        let listens = !self.nothing_listens(port, age);
        if let Some(conn) = listens.then(|| accepting(port)).flatten() {
            // The probe's connection goes with the word: the agent may hand it to the request
            // that waits for this start, which then needs no hand-over of its own (see
            // `ready.rs::Listening`). An agent that went away makes this fail; nothing is left
            // to tell then.
            let fds = [conn.as_raw_fd()];
            let iov = [std::io::IoSlice::new(&[crate::LISTENING])];
            let cmsg = [ControlMessage::ScmRights(&fds)];
            let cmsg: &[ControlMessage] = if pass { &cmsg } else { &[] };
            let _ = sendmsg::<()>(
                self.control.as_raw_fd(),
                &iov,
                cmsg,
                MsgFlags::MSG_NOSIGNAL,
                None,
            );
            return true;
        }
        // A listener that took no connection (its backlog full: loopback drops the SYN) makes
        // every probe a connect, so the probes come as connects alone do, not four times as
        // often as that.
        self.next = now + interval(age, self.diag.is_some() && !listens);
        false
    }
}

/// The interval between probes at `age`, asking `sock_diag` first (`diag`) or connecting
/// alone. A `sock_diag` probe costs about 2.4 µs of CPU and a refused connect 4.9 (on the
/// machine of docs/BENCHMARKS.md): one every 250 µs until a second is about 1% of a core while
/// an app starts (connects every millisecond: 0.5%), one every millisecond until 10 s 0.24%.
fn interval(age: Duration, diag: bool) -> Duration {
    let ms = Duration::from_millis;
    match (age, diag) {
        (a, _) if a < ms(20) => Duration::from_micros(100),
        (a, true) if a < ms(1_000) => Duration::from_micros(250),
        (a, true) if a < ms(10_000) => ms(1),
        (a, false) if a < ms(1_000) => ms(1),
        _ => ms(10),
    }
}

/// A connection to the app on `port` if it accepts connections now. A connect still in
/// progress (which loopback hardly ever leaves) counts as not yet: the next probe asks again.
fn accepting(port: u16) -> Option<OwnedFd> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use nix::sys::socket::{getsockopt, sockopt::SocketError};
    let fd = connect_nonblocking(port).ok()?;
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLOUT)];
    let connected = matches!(poll(&mut fds, PollTimeout::ZERO), Ok(1))
        && matches!(getsockopt(&fd, SocketError), Ok(0));
    connected.then_some(fd)
}

/// Serves hand-overs until the app exits, telling the agent on the way when the app accepts
/// (`announce`); returns the app's exit code.
pub(super) fn serve(
    listener: UnixListener,
    app: Pid,
    port: u16,
    mut announce: Option<Announce>,
) -> i32 {
    use nix::poll::{ppoll, PollFd, PollFlags};
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
    // Whether a connection to the app was handed over: then the probe's is not passed on.
    let mut handed = false;
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
        if announce.as_mut().is_some_and(|a| a.probe(port, !handed)) {
            announce = None;
        }
        let mut fds = [
            PollFd::new(listener.as_fd(), PollFlags::POLLIN),
            PollFd::new(sfd.as_fd(), PollFlags::POLLIN),
        ];
        let timeout = announce
            .as_ref()
            .map(|a| nix::sys::time::TimeSpec::from_duration(a.wait()));
        if let Err(e) = ppoll(&mut fds, timeout, None) {
            if e != nix::errno::Errno::EINTR {
                return fail("poll", e);
            }
        }
        while sfd.read_signal().ok().flatten().is_some() {}
        while let Ok((conn, _)) = listener.accept() {
            handed |= hand_over(&conn, port);
        }
    }
}

/// Starts a connection to the app inside and sends the socket to the caller, or the errno.
///
/// The connect does not block: on loopback it usually completes at once, but with the app's
/// accept queue full the kernel retries the handshake for seconds, and init, which serves every
/// hand-over of the sandbox in turn, must not wait for it. The caller waits for the socket to
/// become writable and reads its error, as for any non-blocking connect. True if the connect
/// did not fail at once (the app may have accepted it).
fn hand_over(conn: &std::os::unix::net::UnixStream, port: u16) -> bool {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let _ = conn.set_nonblocking(false);
    match connect_nonblocking(port) {
        Ok(tcp) => {
            let fds = [tcp.as_raw_fd()];
            let payload = [crate::net::HANDED, 0];
            let iov = [std::io::IoSlice::new(&payload)];
            let cmsg = [ControlMessage::ScmRights(&fds)];
            let _ = sendmsg::<()>(conn.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None);
            true
        }
        Err(errno) => {
            let payload = [b'e', u8::try_from(errno as i32).unwrap_or(u8::MAX)];
            let _ = (&*conn).write_all(&payload);
            false
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
    fn probes_come_often_while_an_app_starts_and_more_often_where_sock_diag_answers() {
        let (us, ms) = (Duration::from_micros, Duration::from_millis);
        for diag in [true, false] {
            assert_eq!(interval(ms(0), diag), us(100));
            assert_eq!(interval(ms(19), diag), us(100));
            assert_eq!(interval(ms(30_000), diag), ms(10));
        }
        // An interpreter's start, and a long one.
        assert_eq!(interval(ms(300), true), us(250));
        assert_eq!(interval(ms(300), false), ms(1));
        assert_eq!(interval(ms(3_000), true), ms(1));
        assert_eq!(interval(ms(3_000), false), ms(10));
        assert_eq!(interval(ms(10_000), true), ms(10));
    }

    /// A TCP socket bound to a free port of 127.0.0.1, not listening, and that port.
    fn bound_tcp() -> (OwnedFd, u16) {
        let fd = nix::sys::socket::socket(
            nix::sys::socket::AddressFamily::Inet,
            nix::sys::socket::SockType::Stream,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        let any = nix::sys::socket::SockaddrIn::new(127, 0, 0, 1, 0);
        nix::sys::socket::bind(fd.as_raw_fd(), &any).unwrap();
        let bound: nix::sys::socket::SockaddrIn =
            nix::sys::socket::getsockname(fd.as_raw_fd()).unwrap();
        (fd, bound.port())
    }

    #[test]
    fn a_listener_that_takes_no_connection_is_probed_as_seldom_as_connects_alone_are() {
        // Backlog 0 holds one connection not yet accepted; the next connect's SYN is dropped,
        // and it stays in progress: `sock_diag` says "listens", and the connect does not
        // complete.
        let (fd, port) = bound_tcp();
        nix::sys::socket::listen(&fd, nix::sys::socket::Backlog::new(0).unwrap()).unwrap();
        let _queued = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (control, _agent) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut announce = Announce::new(std::fs::File::from(OwnedFd::from(control)));
        assert!(announce.diag.is_some(), "sock_diag answers here");
        // Three seconds into the app's start: a `sock_diag` probe would come every millisecond.
        announce.began = Instant::now() - Duration::from_secs(3);
        let before = Instant::now();
        assert!(!announce.probe(port, true), "no word: nothing was accepted");
        assert!(
            announce.next >= before + Duration::from_millis(10),
            "the next probe comes in {:?}: a connect every millisecond",
            announce.next - before
        );
    }

    /// In the app's first 20 ms a probe connects without asking `sock_diag`; after, it asks
    /// first, and connects only once something listens.
    #[test]
    fn sock_diag_is_asked_only_after_the_first_phase() {
        // A port nothing listens on: bound, never listening.
        let (_fd, port) = bound_tcp();
        let (control, _agent) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut announce = Announce::new(std::fs::File::from(OwnedFd::from(control)));
        assert!(announce.diag.is_some(), "sock_diag answers here");
        let ms = Duration::from_millis;
        assert!(!announce.nothing_listens(port, ms(0)), "a connect decides");
        assert!(!announce.nothing_listens(port, ms(19)), "a connect decides");
        assert!(announce.nothing_listens(port, ms(20)), "sock_diag says so");
        assert!(
            announce.nothing_listens(port, ms(3_000)),
            "sock_diag says so"
        );
    }
}
