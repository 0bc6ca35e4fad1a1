//! Who took a connection to a `process` instance's port: the uid the kernel gives the socket
//! that accepted it, read from `/proc/net/tcp` and `/proc/net/tcp6`.
//!
//! A `process` instance is told a free loopback port and binds it itself, so between the
//! agent's choice and the app's `bind` (an interpreter's imports: hundreds of milliseconds)
//! any process on the host may bind the port first; an app that retries a taken port, as
//! gunicorn does, then starts beside it, and the agent's readiness connection would reach the
//! other listener. The kernel records which uid made a listening socket and gives its
//! accepted connections the same uid, so the agent asks it who is at the other end of the
//! very connection it opened, instead of trusting the port.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// `/proc/net/tcp`'s state of a socket in TIME_WAIT, whose uid the kernel prints as 0.
const TIME_WAIT: u8 = 0x06;

/// The uid of the socket at the far end of the loopback connection `local` → `peer`; `None`
/// when the kernel lists no live socket there (the far end already closed it).
pub(crate) fn uid(local: SocketAddr, peer: SocketAddr) -> io::Result<Option<u32>> {
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
        (own == peer && remote == local && state != TIME_WAIT).then_some(uid)
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
        // Our own end is not taken for the far one.
        assert_eq!(uid(peer, local).unwrap(), Some(me));
        let elsewhere = SocketAddr::from(([127, 0, 0, 1], 1));
        assert_eq!(uid(local, elsewhere).unwrap(), None);
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
