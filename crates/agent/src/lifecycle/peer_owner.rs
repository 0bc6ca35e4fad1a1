//! Who took a connection to a `process` instance's port: the uid the kernel gives the socket
//! that accepted it.
//!
//! A `process` instance is told a free loopback port and binds it itself, so between the
//! agent's choice and the app's `bind` (an interpreter's imports: hundreds of milliseconds)
//! any process on the host may bind the port first; an app that retries a taken port, as
//! gunicorn does, then starts beside it, and the agent's readiness connection would reach the
//! other listener. The kernel records which uid made a listening socket and gives its
//! accepted connections the same uid, so the agent asks it who is at the other end of the
//! very connection it opened, instead of trusting the port.
//!
//! The question goes to `sock_diag` (netlink), which looks the one socket up by its four
//! addresses, as a packet would be: its cost does not grow with the node's connections.
//! `/proc/net/tcp{,6}` says the same but lists every socket of the host (116 ms for 20,000
//! here), so it is read only where `sock_diag` cannot answer (a kernel without `inet_diag`).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;

/// The uid of the socket at the far end of the loopback connection `local` → `peer`; `None`
/// when the kernel has no live socket there to say (the far end closed it already, or its
/// handshake is not done), so that another look must tell.
pub(crate) fn uid(local: SocketAddr, peer: SocketAddr) -> io::Result<Option<u32>> {
    // Our own end exists while the connection is open: if it is not found, `sock_diag` does
    // not know TCP here (or netlink is refused us), and /proc must answer.
    if !matches!(diag(peer, local), Ok(Diag::Found(..))) {
        return proc_uid(local, peer);
    }
    match diag(local, peer) {
        Ok(Diag::Found(state, uid)) if !matches!(state, TIME_WAIT | SYN_RECV) => Ok(Some(uid)),
        Ok(_) => Ok(None),
        Err(_) => proc_uid(local, peer),
    }
}

/// What `sock_diag` said of one socket.
enum Diag {
    /// Its TCP state and uid.
    Found(u8, u32),
    /// No such socket, or no `inet_diag` to ask.
    Unknown,
}

/// The kernel's TCP states whose uid is no owner's: a TIME_WAIT socket's and a request
/// socket's (its handshake not done) are printed as 0.
const TIME_WAIT: u8 = 6;
const SYN_RECV: u8 = 3;
/// `SOCK_DIAG_BY_FAMILY` of `linux/sock_diag.h`.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `struct nlmsghdr`, `struct inet_diag_req_v2` and the offset of `idiag_uid` in `struct
/// inet_diag_msg` (`linux/inet_diag.h`).
const NLMSG_HDR: usize = 16;
const REQ_LEN: usize = 56;
const MSG_UID: usize = 64;

/// Asks `sock_diag` for the TCP socket whose own address is `own` and whose remote is
/// `remote` (a listener of `own`, when no connection matches).
fn diag(remote: SocketAddr, own: SocketAddr) -> io::Result<Diag> {
    use nix::sys::socket::{self, sockopt, AddressFamily, MsgFlags, SockFlag, SockProtocol};
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
    let mut req = [0u8; NLMSG_HDR + REQ_LEN];
    req[0..4].copy_from_slice(&((NLMSG_HDR + REQ_LEN) as u32).to_ne_bytes());
    req[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req[6..8].copy_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    let (family, own_ip, remote_ip) = match (own.ip(), remote.ip()) {
        (IpAddr::V4(o), IpAddr::V4(r)) => (libc::AF_INET, o.to_ipv6_mapped(), r.to_ipv6_mapped()),
        (o, r) => (libc::AF_INET6, v6(o), v6(r)),
    };
    let r = &mut req[NLMSG_HDR..];
    r[0] = family as u8;
    r[1] = libc::IPPROTO_TCP as u8;
    r[4..8].copy_from_slice(&u32::MAX.to_ne_bytes()); // every state
                                                      // `struct inet_diag_sockid`: ports and addresses in network order, no cookie.
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
    r[48..56].copy_from_slice(&[0xff; 8]);
    let kernel = socket::NetlinkAddr::new(0, 0);
    socket::sendto(fd.as_raw_fd(), &req, &kernel, MsgFlags::empty())?;
    let mut buf = [0u8; 8192];
    let n = socket::recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty())?;
    read_answer(&buf[..n])
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
    Ok(Diag::Found(body[1], uid))
}

fn v6(ip: IpAddr) -> Ipv6Addr {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        IpAddr::V6(v6) => v6,
    }
}

/// [`uid`] from `/proc/net/tcp` and `/proc/net/tcp6`, which list every socket of the host.
fn proc_uid(local: SocketAddr, peer: SocketAddr) -> io::Result<Option<u32>> {
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = match std::fs::read_to_string(table) {
            Ok(t) => t,
            // A kernel without IPv6 has no tcp6 table.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        if let Some(uid) = find(&text, local, peer) {
            return Ok(Some(uid));
        }
    }
    Ok(None)
}

/// In one table's text, the uid of the socket whose own address is `peer` and whose remote is
/// `local`: the far end of our connection (a v4-mapped IPv6 address is its IPv4 one).
fn find(text: &str, local: SocketAddr, peer: SocketAddr) -> Option<u32> {
    text.lines().skip(1).find_map(|line| {
        let mut f = line.split_whitespace();
        let _slot = f.next()?;
        let own = address(f.next()?)?;
        let remote = address(f.next()?)?;
        let state = u8::from_str_radix(f.next()?, 16).ok()?;
        let uid = f.nth(3)?.parse().ok()?;
        (own == peer && remote == local && !matches!(state, TIME_WAIT | SYN_RECV)).then_some(uid)
    })
}

/// `0100007F:1F90` (tcp) or 32 hex digits and a port (tcp6): the kernel prints each 32-bit word
/// of the address as it lies in memory, and the port in host order.
fn address(text: &str) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| {
        ip.get(i * 8..i * 8 + 8)
            .and_then(|w| u32::from_str_radix(w, 16).ok())
            .map(u32::to_ne_bytes)
    };
    let ip = match ip.len() {
        8 => IpAddr::V4(Ipv4Addr::from(word(0)?)),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            let v6 = Ipv6Addr::from(bytes);
            v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn the_far_end_of_a_loopback_connection_is_found_with_its_uid() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut conn = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        conn.write_all(b"x").unwrap();
        let (local, peer) = (conn.local_addr().unwrap(), conn.peer_addr().unwrap());
        let me = nix::unistd::geteuid().as_raw();
        assert_eq!(uid(local, peer).unwrap(), Some(me));
        assert_eq!(proc_uid(local, peer).unwrap(), Some(me));
        // Our own end is not taken for the far one.
        assert_eq!(uid(peer, local).unwrap(), Some(me));
        let elsewhere = SocketAddr::from(([127, 0, 0, 1], 1));
        assert_eq!(uid(local, elsewhere).unwrap(), None);
        assert_eq!(proc_uid(local, elsewhere).unwrap(), None);
    }

    #[test]
    fn sock_diag_answers_here_for_both_ends_and_says_when_there_is_none() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let conn = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let _accepted = listener.accept().unwrap();
        let (local, peer) = (conn.local_addr().unwrap(), conn.peer_addr().unwrap());
        let me = nix::unistd::geteuid().as_raw();
        for (remote, own) in [(local, peer), (peer, local)] {
            match diag(remote, own).unwrap() {
                Diag::Found(state, uid) => assert_eq!((state, uid), (1, me)), // ESTABLISHED
                Diag::Unknown => panic!("sock_diag did not find {own} -> {remote}"),
            }
        }
        let nobody = SocketAddr::from(([127, 0, 0, 1], 1));
        assert!(matches!(diag(local, nobody).unwrap(), Diag::Unknown));
        // With no connection of that remote, the listener that would take it answers.
        match diag(nobody, peer).unwrap() {
            Diag::Found(state, uid) => assert_eq!((state, uid), (10, me)), // LISTEN
            Diag::Unknown => panic!("no listener found"),
        }
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
    fn a_dual_stack_listener_is_found_by_its_v4_mapped_address() {
        let Ok(listener) = std::net::TcpListener::bind("[::]:0") else {
            return; // no IPv6 here
        };
        let port = listener.local_addr().unwrap().port();
        let conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let me = nix::unistd::geteuid().as_raw();
        let found = uid(conn.local_addr().unwrap(), conn.peer_addr().unwrap()).unwrap();
        assert_eq!(found, Some(me));
    }

    #[test]
    fn the_kernels_lines_are_read_as_it_prints_them() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
            0: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000 300001        0 12345 1 0 20 4 30 10 -1\n   \
            1: 0100007F:1F90 0100007F:D432 06 00000000:00000000 03:00001234 00000000     0        0 0 3 0\n";
        let local = |p| SocketAddr::from(([127, 0, 0, 1], p));
        assert_eq!(find(tcp, local(0xD431), local(0x1F90)), Some(300001));
        // TIME_WAIT's uid is the kernel's 0, not an owner's.
        assert_eq!(find(tcp, local(0xD432), local(0x1F90)), None);
        let tcp6 = "  sl  local_address                         remote_address                        st\n   \
            0: 0000000000000000FFFF00000100007F:1F90 0000000000000000FFFF00000100007F:D433 01 00000000:00000000 00:00000000 00000000    65534        0 1 1\n";
        assert_eq!(find(tcp6, local(0xD433), local(0x1F90)), Some(65534));
    }
}
