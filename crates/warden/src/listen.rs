//! A socket option of the TLS listener that the gateway cannot set itself: it forbids unsafe
//! code, and neither nix nor socket2 wraps `TCP_DEFER_ACCEPT` (std's `set_deferaccept` is
//! not stable yet).
//!
//! With it the kernel hands a connection to `accept` only once its first bytes (a TLS client
//! speaks first: the ClientHello) have arrived. Without it, the gateway accepted most
//! connections a few microseconds before their hello, so admission could not decide in the
//! accept loop: each connection it went on to refuse first cost a task, a timer and a wake-up,
//! twice what a refusal costs at the floor (docs/BENCHMARKS.md). A client that connects and
//! sends nothing waits in the kernel's queue of half-open connections, taking no descriptor
//! and no connection slot, and is handed over after about seven seconds of silence (the
//! kernel's SYN-ACK retransmissions at 1, 3 and 7 s), when the gateway's own timeouts start.
#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, BorrowedFd};

use nix::libc;

/// Seconds the kernel holds a connection that has sent nothing before handing it over anyway
/// (it rounds up to its SYN-ACK retransmissions: three, the last at 7 s). A TLS client speaks
/// first, at once; only a broken or hostile client stays silent this long.
const DEFER_SECS: libc::c_int = 5;

/// Sets `TCP_DEFER_ACCEPT` on a listening socket.
pub fn defer_accept(listener: BorrowedFd<'_>) -> std::io::Result<()> {
    let secs = DEFER_SECS;
    // SAFETY: the descriptor is borrowed and so open for the call; the option value points to
    // a live c_int and the length passed is its size, which is what the kernel reads for
    // TCP_DEFER_ACCEPT.
    let r = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            std::ptr::from_ref(&secs).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    #[test]
    fn a_connection_is_handed_over_with_its_first_bytes() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        defer_accept(listener.as_fd()).unwrap();
        listener.set_nonblocking(true).unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        // Connected from the client's side, but not yet acceptable: nothing was sent.
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert_eq!(
            listener.accept().map(|_| ()).unwrap_err().kind(),
            std::io::ErrorKind::WouldBlock
        );
        client.write_all(b"hello").unwrap();
        listener.set_nonblocking(false).unwrap();
        let (mut server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 5];
        // The bytes came with the connection: readable at once, without waiting.
        server.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hello");
    }
}
