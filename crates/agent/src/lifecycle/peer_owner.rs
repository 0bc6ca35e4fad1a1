//! Who listens on a `process` instance's port: the uid the kernel gives the listening socket
//! that takes loopback connections to it.
//!
//! A `process` instance is told a free loopback port and binds it itself, so between the
//! agent's choice and the app's `bind` (an interpreter's imports: hundreds of milliseconds)
//! any process on the host may bind the port first; an app that retries a taken port, as
//! gunicorn does, then starts beside it, and the agent's readiness connection would reach the
//! other listener. The kernel records which uid made a socket, so the agent asks it whose
//! listener takes the port's connections instead of trusting the port, at the start and for
//! every connection after (a port the app leaves is anyone's). The listener first: before Linux
//! 6.17 a connection still in the accept queue (gunicorn listens before its workers accept) is
//! shown as uid 0, having no file yet; and then, once a process has accepted the connection,
//! that process's uid, so that a listener closed after it took the connection cannot hide
//! behind the instance's new one.
//!
//! The question goes to `sock_diag` (netlink), which looks the listener up as a packet to the
//! port would be (the same choice between an exact and a wildcard address, and loopback's
//! device index, so a listener bound to `lo` is found too): its cost does not grow with the
//! node's connections. `/proc/net/tcp{,6}` lists every socket of the host (116 ms
//! for 20,000 here), so it is read only where `sock_diag` cannot answer (a kernel without
//! `inet_diag`, netlink refused), and the kernel's choice is made again from it.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};

use warden_sandbox::sock_diag::{ask, socket as diag_socket, Diag, LISTEN};

/// Whether `sock_diag` was seen to answer for TCP here.
static DIAG_ANSWERS: AtomicBool = AtomicBool::new(false);

/// Who the kernel says is at the other end of an open connection to a `process` instance's
/// port.
#[derive(Debug, Default, PartialEq, Eq)]
struct Owners {
    /// The uid of the listener a new connection to the port reaches now; `None` when nothing
    /// listens there any more.
    listener: Option<u32>,
    /// The uid of the process that accepted this connection, once one has: a listener that is
    /// the instance's now may not be the one that took it (another's, closed since). `None`
    /// while it waits in the accept queue, where the listener's uid is what counts.
    acceptor: Option<u32>,
}

/// [`Owners`] of the connection `local` → `peer`.
fn owners(local: SocketAddr, peer: SocketAddr) -> io::Result<Owners> {
    // Our own end exists while the connection is open: if it is not found, `sock_diag` does
    // not know TCP here (or netlink is refused us), and /proc must answer. Once it has
    // answered, it is not asked again.
    if !DIAG_ANSWERS.load(Ordering::Relaxed) {
        if !matches!(diag(peer, local), Ok(Diag::Found(..))) {
            return proc_owners(local, peer);
        }
        DIAG_ANSWERS.store(true, Ordering::Relaxed);
    }
    // No connection comes from port 0: the lookup falls through to the listeners, as the
    // kernel's own for a new connection does.
    let anyone = SocketAddr::new(local.ip(), 0);
    let Ok(fd) = diag_socket() else {
        return proc_owners(local, peer);
    };
    let listener = match ask(&fd, anyone, peer) {
        Ok(Diag::Found(LISTEN, uid, _)) => Some(uid),
        Ok(_) => None,
        Err(_) => return proc_owners(local, peer),
    };
    let acceptor = match ask(&fd, local, peer) {
        Ok(Diag::Found(_, uid, inode)) if inode != 0 => Some(uid),
        Ok(_) => None,
        Err(_) => return proc_owners(local, peer),
    };
    Ok(Owners { listener, acceptor })
}

/// What [`check`] found.
pub(crate) enum Check {
    /// The listener (and the acceptor, if any) is the instance's.
    Own,
    /// Nothing listens on the port any more, or the connection is gone: the next look tells.
    Gone,
    /// Another uid's process listens there, or accepted the connection; the reason, for the
    /// client (whose it was and on which port go to the log only).
    Foreign(String),
    /// The kernel could not be asked (out of descriptors, /proc unreadable): nothing is sent
    /// there, but nothing is known against the instance either.
    Unknown(String),
}

/// Whether `conn`, just opened to an instance's port, reached a process of `uid`, the
/// instance's.
pub(crate) fn check(conn: &tokio::net::TcpStream, uid: u32) -> Check {
    // An unaccepted connection the app reset (its listener closed) has no peer any more.
    let Ok((local, peer)) = conn.local_addr().and_then(|l| Ok((l, conn.peer_addr()?))) else {
        return Check::Gone;
    };
    let port = peer.port();
    match owners(local, peer) {
        Ok(o) => match [o.acceptor, o.listener]
            .into_iter()
            .flatten()
            .find(|&u| u != uid)
        {
            Some(other) => {
                tracing::warn!(
                    port,
                    other_uid = other,
                    instance_uid = uid,
                    "another user's process listens on an instance's port; nothing is sent there"
                );
                Check::Foreign("another user's process listens on its port".into())
            }
            None if o.listener.is_none() => Check::Gone,
            None => Check::Own,
        },
        Err(e) => {
            tracing::warn!(port, error = %e, "cannot tell whose process listens on an instance's port; nothing is sent there");
            Check::Unknown("warden cannot tell whose process listens on its port".into())
        }
    }
}

/// Asks `sock_diag` for the TCP socket whose own address is `own` and whose remote is
/// `remote` (a listener of `own`, when no connection matches).
fn diag(remote: SocketAddr, own: SocketAddr) -> io::Result<Diag> {
    ask(&diag_socket()?, remote, own)
}

/// [`owners`] from `/proc/net/tcp` and `/proc/net/tcp6`, which list every socket of the host.
fn proc_owners(local: SocketAddr, peer: SocketAddr) -> io::Result<Owners> {
    let mut best: Option<(u8, u32)> = None;
    let mut acceptor = None;
    for (table, v4) in [("/proc/net/tcp", true), ("/proc/net/tcp6", false)] {
        let text = match std::fs::read_to_string(table) {
            Ok(t) => t,
            // A kernel without IPv6 has no tcp6 table; without the tcp one, nothing is known.
            Err(e) if e.kind() == io::ErrorKind::NotFound && !v4 => continue,
            Err(e) => return Err(e),
        };
        for (score, uid) in listeners(&text, peer, v4) {
            if best.is_none_or(|(s, _)| score > s) {
                best = Some((score, uid));
            }
        }
        acceptor = acceptor.or_else(|| proc_acceptor(&text, local, peer));
    }
    Ok(Owners {
        listener: best.map(|(_, uid)| uid),
        acceptor,
    })
}

/// In one table's text, the uid of the socket that accepted `local` → `peer` (its own address
/// `peer`, its remote `local`), if it has a file (inode): accepted, and not a TIME_WAIT one.
fn proc_acceptor(text: &str, local: SocketAddr, peer: SocketAddr) -> Option<u32> {
    text.lines().skip(1).find_map(|line| {
        let mut f = line.split_whitespace();
        let _slot = f.next()?;
        let own = address(f.next()?)?;
        let remote = address(f.next()?)?;
        let uid: u32 = f.nth(4)?.parse().ok()?;
        let inode: u64 = f.nth(1)?.parse().ok()?;
        (own == peer && remote == local && inode != 0).then_some(uid)
    })
}

/// In one table's text, the listeners that could take a connection to `addr`, each with its
/// uid and the kernel's preference (`compute_score`): its exact address over a wildcard, an
/// IPv4 socket over a dual-stack one.
fn listeners(text: &str, addr: SocketAddr, v4: bool) -> Vec<(u8, u32)> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let _slot = f.next()?;
            let own = address(f.next()?)?;
            let _remote = f.next()?;
            let state = u8::from_str_radix(f.next()?, 16).ok()?;
            let uid = f.nth(3)?.parse().ok()?;
            if state != LISTEN || own.port() != addr.port() {
                return None;
            }
            let exact = own.ip() == addr.ip();
            if !exact && !own.ip().is_unspecified() {
                return None;
            }
            Some((u8::from(exact) * 4 + u8::from(v4), uid))
        })
        .collect()
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

    #[test]
    fn the_listener_of_a_loopback_connection_is_found_with_its_uid() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        // Never accepted: still in the accept queue, as gunicorn's are while it starts.
        let conn = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (local, peer) = (conn.local_addr().unwrap(), conn.peer_addr().unwrap());
        let me = nix::unistd::geteuid().as_raw();
        assert_eq!(owners(local, peer).unwrap().listener, Some(me));
        assert_eq!(proc_owners(local, peer).unwrap().listener, Some(me));
        drop(listener);
        assert_eq!(owners(local, peer).unwrap().listener, None);
        assert_eq!(proc_owners(local, peer).unwrap().listener, None);
    }

    /// As root: a listener made by another uid is that uid's, though root connects to it.
    #[test]
    fn another_uids_listener_that_never_accepts_is_that_uids() {
        use std::io::BufRead;
        use std::os::unix::process::CommandExt;
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        // Plain, and bound to the loopback device (any user may, since Linux 5.7), which a
        // lookup without the device's index does not find.
        for bind_to_lo in [
            "",
            "s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b'lo')\n",
        ] {
            let script = format!("import socket\ns = socket.socket()\n{bind_to_lo}s.bind(('127.0.0.1', 0))\ns.listen(8)\nprint(s.getsockname()[1], flush=True)\ninput()\n");
            let mut other = std::process::Command::new("python3")
                .args(["-c", &script])
                .uid(65534)
                .gid(65534)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let mut line = String::new();
            std::io::BufReader::new(other.stdout.take().unwrap())
                .read_line(&mut line)
                .unwrap();
            let port: u16 = line.trim().parse().unwrap();
            let conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            let (local, peer) = (conn.local_addr().unwrap(), conn.peer_addr().unwrap());
            let found = (owners(local, peer), proc_owners(local, peer));
            let _ = other.kill();
            let _ = other.wait();
            assert_eq!(
                (found.0.unwrap().listener, found.1.unwrap().listener),
                (Some(65534), Some(65534)),
                "{bind_to_lo}"
            );
        }
    }

    /// As root: another uid's listener that accepted our connection and closed, the port then
    /// listened on by the instance's uid, is still not the instance: the acceptor says.
    #[tokio::test]
    async fn a_connection_another_uid_accepted_is_not_the_instances_though_its_listener_now_is() {
        use std::io::BufRead;
        use std::os::unix::process::CommandExt;
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let script = "import socket, time\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\ns.bind(('127.0.0.1', 0))\ns.listen(8)\nprint(s.getsockname()[1], flush=True)\nc, _ = s.accept()\ns.close()\nprint('accepted', flush=True)\ntime.sleep(60)\n";
        let mut other = std::process::Command::new("python3")
            .args(["-c", script])
            .uid(65534)
            .gid(65534)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(other.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let port: u16 = line.trim().parse().unwrap();
        let conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        line.clear();
        out.read_line(&mut line).unwrap();
        assert_eq!(line.trim(), "accepted");
        let me = nix::unistd::geteuid().as_raw();
        let mine = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        let (local, peer) = (conn.local_addr().unwrap(), conn.peer_addr().unwrap());
        conn.set_nonblocking(true).unwrap();
        let conn = tokio::net::TcpStream::from_std(conn).unwrap();
        let said = (
            owners(local, peer).unwrap(),
            proc_owners(local, peer).unwrap(),
        );
        let checked = check(&conn, me);
        let _ = other.kill();
        let _ = other.wait();
        drop(mine);
        // Both ways of asking find the port's listener the instance's now, and the acceptor not.
        let want = Owners {
            listener: Some(me),
            acceptor: Some(65534),
        };
        assert_eq!((&said.0, &said.1), (&want, &want));
        assert!(matches!(checked, Check::Foreign(_)));
    }

    #[test]
    fn sock_diag_answers_here_for_both_ends_and_says_when_there_is_none() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let conn = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let _accepted = listener.accept().unwrap();
        let (local, peer) = (conn.local_addr().unwrap(), conn.peer_addr().unwrap());
        if !matches!(diag(peer, local), Ok(Diag::Found(..))) {
            eprintln!("no sock_diag for TCP here (a kernel without inet_diag): /proc answers");
            return;
        }
        let me = nix::unistd::geteuid().as_raw();
        for (remote, own) in [(local, peer), (peer, local)] {
            match diag(remote, own).unwrap() {
                // ESTABLISHED, with a file: accepted.
                Diag::Found(state, uid, inode) => {
                    assert_eq!((state, uid), (1, me));
                    assert_ne!(inode, 0);
                }
                Diag::Unknown => panic!("sock_diag did not find {own} -> {remote}"),
            }
        }
        let nobody = SocketAddr::from(([127, 0, 0, 1], 1));
        assert!(matches!(diag(local, nobody).unwrap(), Diag::Unknown));
        // With no connection of that remote, the listener that would take it answers.
        match diag(nobody, peer).unwrap() {
            Diag::Found(state, uid, _) => assert_eq!((state, uid), (LISTEN, me)),
            Diag::Unknown => panic!("no listener found"),
        }
    }

    #[test]
    fn a_dual_stack_listener_is_found_for_its_ipv4_loopback() {
        let Ok(listener) = std::net::TcpListener::bind("[::]:0") else {
            return; // no IPv6 here
        };
        let port = listener.local_addr().unwrap().port();
        let conn = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let me = nix::unistd::geteuid().as_raw();
        let (local, peer) = (conn.local_addr().unwrap(), conn.peer_addr().unwrap());
        assert_eq!(owners(local, peer).unwrap().listener, Some(me));
        assert_eq!(proc_owners(local, peer).unwrap().listener, Some(me));
    }

    #[test]
    fn the_kernels_lines_are_read_as_it_prints_them_and_chosen_as_it_chooses() {
        let head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n";
        let line = |addr: &str, st: &str, uid: u32| {
            format!("   0: {addr} 00000000:0000 {st} 00000000:00000000 00:00000000 00000000 {uid:>6}        0 1 1\n")
        };
        let at = SocketAddr::from(([127, 0, 0, 1], 0x1F90));
        // A wildcard listener of one uid and an exact one of another: the exact one takes it.
        let tcp = format!(
            "{head}{}{}{}",
            line("00000000:1F90", "0A", 300001),
            line("0100007F:1F90", "0A", 65534),
            line("0100007F:1F90", "01", 7),
        );
        let best = |v: Vec<(u8, u32)>| v.into_iter().max().map(|(_, uid)| uid);
        // The accepted end of 127.0.0.1:54321 -> :8080 (its inode nonzero), and one not yet.
        let ends = format!(
            "{head}   0: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000 300001        0 12345 1\n   \
             1: 0100007F:1F90 0100007F:D432 01 00000000:00000000 00:00000000 00000000     0        0 0 1\n"
        );
        let from = |p| SocketAddr::from(([127, 0, 0, 1], p));
        assert_eq!(proc_acceptor(&ends, from(0xD431), at), Some(300001));
        assert_eq!(proc_acceptor(&ends, from(0xD432), at), None);
        assert_eq!(best(listeners(&tcp, at, true)), Some(65534));
        // Another port, another address, or no LISTEN: nothing.
        let other = format!(
            "{head}{}{}",
            line("0100007F:1F91", "0A", 1),
            line("0200007F:1F90", "0A", 2)
        );
        assert_eq!(best(listeners(&other, at, true)), None);
        // An IPv4 wildcard is taken over a dual-stack one; a v4-mapped exact one over both.
        let v6_any = line("00000000000000000000000000000000:1F90", "0A", 3);
        let v6_mapped = line("0000000000000000FFFF00000100007F:1F90", "0A", 4);
        let v4_any = listeners(
            &format!("{head}{}", line("00000000:1F90", "0A", 5)),
            at,
            true,
        );
        let v6 = listeners(&format!("{head}{v6_any}"), at, false);
        assert_eq!(best([v4_any.clone(), v6].concat()), Some(5));
        let mapped = listeners(&format!("{head}{v6_mapped}"), at, false);
        assert_eq!(best([v4_any, mapped].concat()), Some(4));
    }
}

/// The figure in docs/BENCHMARKS.md ("Who listens on a `process` instance's port"): run with
/// `cargo test --release -p warden-agent --lib peer_owner::timing -- --ignored --nocapture`.
#[cfg(test)]
mod timing {
    #[tokio::test]
    #[ignore = "a measurement, not a check: run it by name"]
    async fn cost_of_one_check() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let conn = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let _accepted = listener.accept().unwrap();
        conn.set_nonblocking(true).unwrap();
        let conn = tokio::net::TcpStream::from_std(conn).unwrap();
        let me = nix::unistd::geteuid().as_raw();
        for round in 0..3 {
            let began = std::time::Instant::now();
            for _ in 0..10_000 {
                assert!(matches!(super::check(&conn, me), super::Check::Own));
            }
            eprintln!("round {round}: {:?} per check", began.elapsed() / 10_000);
        }
    }
}
