//! Connecting to an instance, wherever its network lives.
//!
//! A `process` instance listens on a loopback port of the host: its address is `host:port`.
//! A sandboxed instance listens on loopback inside its own network namespace, which nothing on
//! the host can reach by address. Its init process listens on a Unix socket in the instance's
//! directory instead; for each connection it starts a TCP connection to the app inside the
//! namespace and hands the socket over with SCM_RIGHTS, without waiting for the handshake. The caller then holds an ordinary TCP
//! socket to the app, with no proxy hop, and no privileges are needed on either side.
#![allow(unsafe_code)]

use std::io::{self, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use tokio::io::Interest;
use tokio::net::{TcpStream, UnixStream};
use warden_core::InstanceAddr;

/// Reply byte of a successful hand-over; a failed one sends `b'e'` and the errno.
pub(crate) const HANDED: u8 = b'k';

/// Opens a TCP connection to the instance at `addr`.
pub async fn connect(addr: &InstanceAddr) -> io::Result<TcpStream> {
    let path = match addr {
        InstanceAddr::Tcp(a) => return TcpStream::connect(a).await,
        InstanceAddr::FdUnix { socket } => socket,
    };
    let unix = UnixStream::connect(path).await?;
    let fd = loop {
        unix.readable().await?;
        match unix.try_io(Interest::READABLE, || receive(unix.as_raw_fd())) {
            Ok(fd) => break fd,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    };
    let std = std::net::TcpStream::from(fd);
    std.set_nonblocking(true)?;
    // The socket may still be connecting (init does not wait): writable means the handshake
    // ended, and the socket's error says how. On loopback it nearly always has ended by now,
    // which the kernel says at once; tokio, new to the socket, would say so only after a turn
    // of its I/O driver.
    let ended = {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let mut fds = [PollFd::new(
            std::os::fd::AsFd::as_fd(&std),
            PollFlags::POLLOUT,
        )];
        matches!(poll(&mut fds, PollTimeout::ZERO), Ok(1))
    };
    let tcp = TcpStream::from_std(std)?;
    if !ended {
        tcp.writable().await?;
    }
    match tcp.take_error()? {
        Some(e) => Err(e),
        None => Ok(tcp),
    }
}

/// Reads one byte init writes on an instance's control socket, with the descriptor sent beside
/// it if any: init sends [`crate::LISTENING`] with the connection its probe made to the app
/// (see `init/handover.rs`). `None` once the socket ended.
pub async fn control_byte(control: &UnixStream) -> io::Result<Option<(u8, Option<OwnedFd>)>> {
    loop {
        control.readable().await?;
        let read = control.try_io(Interest::READABLE, || {
            let mut buf = [0u8; 1];
            let (n, fd) = receive_with_fd(control.as_raw_fd(), &mut buf)?;
            Ok((n == 1).then_some((buf[0], fd)))
        });
        match read {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            other => return other,
        }
    }
}

/// Reads and drops whatever init wrote on the control socket `fd` (non-blocking) and nobody
/// read: above all a probe's connection sent with [`crate::LISTENING`] after the agent saw the
/// app ready by itself, which, left in flight, would hold the app's accepted connection open
/// for as long as the socket lives.
pub fn drain_control(fd: RawFd) {
    let mut buf = [0u8; 64];
    while matches!(receive_with_fd(fd, &mut buf), Ok((n, _)) if n > 0) {}
}

/// Receives into `buf` and the first descriptor sent beside it (others are closed).
fn receive_with_fd(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    let mut iov = [IoSliceMut::new(buf)];
    let mut space = nix::cmsg_space!([RawFd; 1]);
    let msg = recvmsg::<()>(fd, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)
        .map_err(io::Error::from)?;
    let mut handed = None;
    for c in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for raw in fds {
                // SAFETY: the kernel just installed this descriptor in our table for us; nothing
                // else owns it.
                let owned = unsafe { OwnedFd::from_raw_fd(raw) };
                handed.get_or_insert(owned);
            }
        }
    }
    Ok((msg.bytes, handed))
}

/// Receives one reply: the socket, or the errno the init process met connecting.
fn receive(fd: RawFd) -> io::Result<OwnedFd> {
    let mut buf = [0u8; 2];
    let (n, handed) = receive_with_fd(fd, &mut buf)?;
    match (n, buf[0], handed) {
        (_, HANDED, Some(fd)) => Ok(fd),
        (2, b'e', _) => Err(io::Error::from_raw_os_error(i32::from(buf[1]))),
        (0, _, _) => Err(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            "the sandbox closed the connection socket without an answer",
        )),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "the sandbox sent a malformed connection hand-over",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What init does for each connection (`init/handover.rs::hand_over`): a non-blocking
    /// connect to `port`, its socket handed over on the next connection to `socket`.
    fn fake_init(path: &std::path::Path, port: u16) -> std::thread::JoinHandle<()> {
        use nix::sys::socket::{
            connect, sendmsg, socket, AddressFamily, ControlMessage, SockFlag, SockType, SockaddrIn,
        };
        let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
        std::thread::spawn(move || {
            let (conn, _) = listener.accept().unwrap();
            let tcp = socket(
                AddressFamily::Inet,
                SockType::Stream,
                SockFlag::SOCK_NONBLOCK,
                None,
            )
            .unwrap();
            let _ = connect(tcp.as_raw_fd(), &SockaddrIn::new(127, 0, 0, 1, port));
            let fds = [tcp.as_raw_fd()];
            let payload = [HANDED, 0];
            let iov = [std::io::IoSlice::new(&payload)];
            let cmsg = [ControlMessage::ScmRights(&fds)];
            sendmsg::<()>(conn.as_raw_fd(), &iov, &cmsg, MsgFlags::empty(), None).unwrap();
        })
    }

    /// A handed-over socket is returned once its handshake has ended, whether it had when it
    /// came (as on loopback nearly always) or not yet (the app's accept queue was full).
    #[tokio::test]
    async fn a_handed_over_connection_is_returned_connected() {
        let dir = tempfile::tempdir().unwrap();
        let app = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = app.local_addr().unwrap().port();
        let socket = dir.path().join("ready.sock");
        let init = fake_init(&socket, port);
        let tcp = connect(&InstanceAddr::fd_unix(socket)).await.unwrap();
        assert_eq!(tcp.peer_addr().unwrap().port(), port);
        init.join().unwrap();

        // Backlog 0 holds one connection not yet accepted; the next SYN is dropped, and the
        // kernel sends it again after a second.
        let full = nix::sys::socket::socket(
            nix::sys::socket::AddressFamily::Inet,
            nix::sys::socket::SockType::Stream,
            nix::sys::socket::SockFlag::empty(),
            None,
        )
        .unwrap();
        let any = nix::sys::socket::SockaddrIn::new(127, 0, 0, 1, 0);
        nix::sys::socket::bind(full.as_raw_fd(), &any).unwrap();
        nix::sys::socket::listen(&full, nix::sys::socket::Backlog::new(0).unwrap()).unwrap();
        let full = std::net::TcpListener::from(full);
        let port = full.local_addr().unwrap().port();
        let queued = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let socket = dir.path().join("full.sock");
        let init = fake_init(&socket, port);
        let accepting = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            let first = full.accept().unwrap();
            let second = full.accept().unwrap();
            (first, second, queued)
        });
        let tcp = connect(&InstanceAddr::fd_unix(socket)).await.unwrap();
        assert_eq!(
            tcp.peer_addr().unwrap().port(),
            port,
            "returned while its handshake was still under way"
        );
        init.join().unwrap();
        accepting.join().unwrap();
    }
}
