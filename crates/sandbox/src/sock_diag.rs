//! Asking the kernel about one TCP socket through `sock_diag` (netlink): its state, its uid and
//! whether it has a file yet. The agent asks whose listener takes a `process` instance's port
//! (`warden_agent`'s `peer_owner`); a sandbox's init asks whether the app listens yet, which
//! costs one netlink round trip instead of a connection refused by the app's port.
//!
//! The lookup is the kernel's own for a packet (`inet_diag_find_one_icsk`): the socket with
//! exactly these two ends, else the listener a connection to `own` would reach (its exact
//! address over a wildcard, and loopback's device index for a socket bound to `lo`). Its cost
//! does not grow with the namespace's sockets.

use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};

/// What `sock_diag` said of one socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Diag {
    /// Its TCP state, uid and inode (0: no file yet, a connection not yet accepted).
    Found(u8, u32, u32),
    /// No such socket, or no `inet_diag` to ask.
    Unknown,
}

/// The kernel's TCP_LISTEN.
pub const LISTEN: u8 = 10;
/// `SOCK_DIAG_BY_FAMILY` of `linux/sock_diag.h`.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `struct nlmsghdr`, `struct inet_diag_req_v2` and the offset of `idiag_uid` in `struct
/// inet_diag_msg` (`linux/inet_diag.h`).
const NLMSG_HDR: usize = 16;
const REQ_LEN: usize = 56;
const MSG_UID: usize = 64;

/// A netlink socket to ask `sock_diag` on, one question after the other.
pub fn socket() -> io::Result<OwnedFd> {
    use nix::sys::socket::{self, sockopt, AddressFamily, SockFlag, SockProtocol};
    let fd = socket::socket(
        AddressFamily::Netlink,
        socket::SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkSockDiag,
    )?;
    // The kernel answers while it takes the request; never wait long on a kernel that does
    // not.
    let wait = nix::sys::time::TimeVal::new(1, 0);
    socket::setsockopt(&fd, sockopt::ReceiveTimeout, &wait)?;
    Ok(fd)
}

/// Asks, on `fd`, for the TCP socket whose own address is `own` and whose remote is `remote`
/// (a listener of `own`, when no connection matches: a `remote` with port 0 asks for the
/// listener alone, since no connection comes from port 0).
pub fn ask(fd: &OwnedFd, remote: SocketAddr, own: SocketAddr) -> io::Result<Diag> {
    use nix::sys::socket::{self, MsgFlags};
    let (family, own_ip, remote_ip) = match (own.ip(), remote.ip()) {
        (IpAddr::V4(o), IpAddr::V4(r)) => (libc::AF_INET, o.to_ipv6_mapped(), r.to_ipv6_mapped()),
        (o, r) => (libc::AF_INET6, v6(o), v6(r)),
    };
    // Every state.
    let mut req = request(libc::NLM_F_REQUEST, family, u32::MAX);
    let r = &mut req[NLMSG_HDR..];
    // `struct inet_diag_sockid`: ports and addresses in network order.
    r[8..10].copy_from_slice(&own.port().to_be_bytes());
    r[10..12].copy_from_slice(&remote.port().to_be_bytes());
    let (own_ip, remote_ip) = match family {
        libc::AF_INET => (
            own_ip.octets()[12..].to_vec(),
            remote_ip.octets()[12..].to_vec(),
        ),
        _ => (own_ip.octets().to_vec(), remote_ip.octets().to_vec()),
    };
    r[12..12 + own_ip.len()].copy_from_slice(&own_ip);
    r[28..28 + remote_ip.len()].copy_from_slice(&remote_ip);
    // A socket bound to a device is found only by that device's index, and loopback's is 1
    // in every network namespace (`LOOPBACK_IFINDEX`); an unbound socket matches any.
    if own.ip().is_loopback()
        || v6(own.ip())
            .to_ipv4_mapped()
            .is_some_and(|v4| v4.is_loopback())
    {
        r[44..48].copy_from_slice(&1u32.to_ne_bytes());
    }
    let kernel = socket::NetlinkAddr::new(0, 0);
    socket::sendto(fd.as_raw_fd(), &req, &kernel, MsgFlags::empty())?;
    // The kernel answers within the `sendto`, so the answer is there now: never wait for one
    // (a sandbox's init serves its hand-overs from the same loop). One socket's answer is a
    // header, an `inet_diag_msg` and the few attributes always sent, about 150 bytes, and
    // only its first 88 are read. Small, since a sandbox's init asks on its own stack, which
    // stays as deep as it ever went for the sandbox's life.
    let mut buf = [0u8; 512];
    let n = socket::recv(fd.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT)?;
    read_answer(&buf[..n])
}

/// Whether `sock_diag` answers for TCP on `fd` at all. A kernel without `inet_diag` (or
/// without its TCP part) says `ENOENT` to every question, as it does of a socket that does
/// not exist, so a "no" from [`listens`] means nothing there. A dump of the listeners ends
/// with `NLMSG_DONE` where the kernel can answer, and with that error where it cannot.
pub fn answers_for_tcp(fd: &OwnedFd) -> bool {
    use nix::sys::socket::{self, MsgFlags};
    let req = request(
        libc::NLM_F_REQUEST | libc::NLM_F_DUMP,
        libc::AF_INET,
        1 << LISTEN,
    );
    let kernel = socket::NetlinkAddr::new(0, 0);
    if socket::sendto(fd.as_raw_fd(), &req, &kernel, MsgFlags::empty()).is_err() {
        return false;
    }
    // A dump comes in datagrams, each of whole messages, read as the reader asks; a
    // namespace's listeners fit in a few. Bounded: a sandbox's app may open many.
    let mut buf = [0u8; 4096];
    for _ in 0..64 {
        let Ok(n) = socket::recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()) else {
            return false;
        };
        match dump_end(&buf[..n]) {
            Some(answers) => return answers,
            None if n == 0 => return false,
            None => {}
        }
    }
    false
}

/// In one datagram of a dump, whether it ended and how: `Some(true)` at `NLMSG_DONE` with no
/// error, `Some(false)` at an error, `None` if the dump goes on.
fn dump_end(mut buf: &[u8]) -> Option<bool> {
    while buf.len() >= NLMSG_HDR {
        let len = u32::from_ne_bytes(buf[0..4].try_into().ok()?) as usize;
        let kind = i32::from(u16::from_ne_bytes(buf[4..6].try_into().ok()?));
        let error = buf
            .get(NLMSG_HDR..NLMSG_HDR + 4)
            .and_then(|w| w.try_into().ok())
            .map_or(0, i32::from_ne_bytes);
        match kind {
            libc::NLMSG_DONE => return Some(error == 0),
            libc::NLMSG_ERROR => return Some(false),
            _ => {}
        }
        // Messages are padded to 4 bytes.
        let step = (len.max(NLMSG_HDR) + 3) & !3;
        buf = buf.get(step..)?;
    }
    None
}

/// A `SOCK_DIAG_BY_FAMILY` request for TCP sockets of `family` in `states` (a bit per TCP
/// state): the `nlmsghdr` and an `inet_diag_req_v2` whose socket id is empty but for its cookie
/// ("none"), for the caller to fill.
fn request(flags: libc::c_int, family: libc::c_int, states: u32) -> [u8; NLMSG_HDR + REQ_LEN] {
    let mut req = [0u8; NLMSG_HDR + REQ_LEN];
    req[0..4].copy_from_slice(&((NLMSG_HDR + REQ_LEN) as u32).to_ne_bytes());
    req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req[6..8].copy_from_slice(&(flags as u16).to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    let r = &mut req[NLMSG_HDR..];
    r[0] = family as u8;
    r[1] = libc::IPPROTO_TCP as u8;
    r[4..8].copy_from_slice(&states.to_ne_bytes());
    r[48..56].copy_from_slice(&[0xff; 8]);
    req
}

/// One answer of `sock_diag`: a socket's `inet_diag_msg`, or an error (`ENOENT`: none).
fn read_answer(buf: &[u8]) -> io::Result<Diag> {
    let short = || io::Error::new(io::ErrorKind::InvalidData, "a short sock_diag answer");
    let word = |at: usize| -> io::Result<[u8; 4]> {
        buf.get(at..at + 4)
            .and_then(|w| w.try_into().ok())
            .ok_or_else(short)
    };
    let [k0, k1, ..] = word(4)?;
    let kind = u16::from_ne_bytes([k0, k1]);
    let body = buf.get(NLMSG_HDR..).ok_or_else(short)?;
    if kind == libc::NLMSG_ERROR as u16 {
        let errno = -i32::from_ne_bytes(word(NLMSG_HDR)?);
        return match errno {
            libc::ENOENT => Ok(Diag::Unknown),
            e => Err(io::Error::from_raw_os_error(e)),
        };
    }
    if kind != SOCK_DIAG_BY_FAMILY {
        return Err(short());
    }
    let uid = u32::from_ne_bytes(word(NLMSG_HDR + MSG_UID)?);
    let inode = u32::from_ne_bytes(word(NLMSG_HDR + MSG_UID + 4)?);
    Ok(Diag::Found(body[1], uid, inode))
}

/// Whether a TCP listener on this network namespace's loopback takes connections to `port`
/// now (`Ok(false)`: nothing listens there yet), asked on `fd`.
pub fn listens(fd: &OwnedFd, port: u16) -> io::Result<bool> {
    let own = SocketAddr::from(([127, 0, 0, 1], port));
    let anyone = SocketAddr::from(([127, 0, 0, 1], 0));
    Ok(matches!(ask(fd, anyone, own)?, Diag::Found(LISTEN, ..)))
}

fn v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listens_is_true_only_while_a_listener_takes_the_port() {
        use nix::sys::socket::{self, AddressFamily, Backlog, SockFlag, SockType, SockaddrIn};
        let fd = super::socket().expect("a sock_diag socket");
        assert!(answers_for_tcp(&fd), "sock_diag answers for TCP here");
        // Bound and not listening yet: what a starting app has first.
        let sock = socket::socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        socket::bind(sock.as_raw_fd(), &SockaddrIn::new(127, 0, 0, 1, 0)).unwrap();
        let port = socket::getsockname::<SockaddrIn>(sock.as_raw_fd())
            .unwrap()
            .port();
        assert!(!listens(&fd, port).unwrap(), "bound, not listening");
        socket::listen(&sock, Backlog::new(8).unwrap()).unwrap();
        assert!(listens(&fd, port).unwrap(), "listening");
        drop(sock);
        assert!(!listens(&fd, port).unwrap(), "closed");
    }

    #[test]
    fn an_answer_of_the_wrong_shape_is_an_error_not_an_owner() {
        let mut error = vec![0u8; NLMSG_HDR + 4];
        error[4..6].copy_from_slice(&(libc::NLMSG_ERROR as u16).to_ne_bytes());
        error[NLMSG_HDR..].copy_from_slice(&(-libc::ENOENT).to_ne_bytes());
        assert!(matches!(read_answer(&error), Ok(Diag::Unknown)));
        error[NLMSG_HDR..].copy_from_slice(&(-libc::EPERM).to_ne_bytes());
        assert!(read_answer(&error).is_err());
        // A message cut before its uid.
        let mut short = vec![0u8; NLMSG_HDR + MSG_UID];
        short[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        assert!(read_answer(&short).is_err());
        assert!(read_answer(&[0u8; 3]).is_err());
    }

    #[test]
    fn a_dump_ends_where_the_kernel_says_done_and_not_at_an_error() {
        let message = |kind: i32, error: i32| {
            let mut m = vec![0u8; NLMSG_HDR + 4];
            m[0..4].copy_from_slice(&((NLMSG_HDR + 4) as u32).to_ne_bytes());
            m[4..6].copy_from_slice(&(kind as u16).to_ne_bytes());
            m[NLMSG_HDR..].copy_from_slice(&error.to_ne_bytes());
            m
        };
        assert_eq!(dump_end(&message(libc::NLMSG_DONE, 0)), Some(true));
        // What a kernel without `inet_diag`'s TCP part ends a dump with.
        assert_eq!(
            dump_end(&message(libc::NLMSG_DONE, -libc::ENOENT)),
            Some(false)
        );
        assert_eq!(
            dump_end(&message(libc::NLMSG_ERROR, -libc::ENOENT)),
            Some(false)
        );
        // A listener's message first, then the end, in one datagram.
        let mut both = message(i32::from(SOCK_DIAG_BY_FAMILY), 0);
        both.extend(message(libc::NLMSG_DONE, 0));
        assert_eq!(dump_end(&both), Some(true));
        assert_eq!(dump_end(&message(i32::from(SOCK_DIAG_BY_FAMILY), 0)), None);
        assert_eq!(dump_end(&[0u8; 3]), None);
    }
}
