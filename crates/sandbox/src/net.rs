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
    let tcp = TcpStream::from_std(std)?;
    // The socket may still be connecting (init does not wait): writable means the handshake
    // ended, and the socket's error says how.
    tcp.writable().await?;
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
