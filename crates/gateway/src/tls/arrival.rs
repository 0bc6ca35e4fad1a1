//! When a connection's first bytes reached this machine, as the kernel stamped them.
//!
//! Under overload a ClientHello may sit for seconds in the listen backlog and the socket's
//! receive queue before the gateway reads it; by then its client may have given up. Counting a
//! handshake's queueing delay from the moment the gateway reads it would hide that wait, and the
//! gateway would spend a signature on a client that is gone while the live ones behind it time
//! out (the collapse seed 004 describes). `SO_TIMESTAMPNS` on the listener, inherited by every
//! accepted socket, makes the kernel stamp each arriving segment; the first read returns the
//! stamp of its first segment.

use std::io;
use std::io::IoSliceMut;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::BytesMut;
use nix::sys::socket::{
    recvmsg, setsockopt, sockopt, ControlMessageOwned, MsgFlags, SockaddrStorage,
};
use nix::sys::time::TimeSpec;
use tokio::io::Interest;
use tokio::net::{TcpListener, TcpStream};

/// Bytes taken by one read: a ClientHello is usually well under 2 KiB.
const READ: usize = 4096;

/// Asks the kernel to stamp the arrival of every segment on connections `listener` accepts.
pub(crate) fn stamp_arrivals(listener: &TcpListener) -> io::Result<()> {
    setsockopt(listener, sockopt::ReceiveTimestampns, &true).map_err(io::Error::from)
}

/// Reads what is there now, without waiting, appending it to `buf`. Returns the bytes read (0 at
/// end of stream) and when the first of them arrived, if the kernel stamped them.
/// `WouldBlock` when nothing has arrived yet, or when tokio has not yet seen the socket
/// readable.
pub(crate) fn try_read_stamped(
    stream: &TcpStream,
    buf: &mut BytesMut,
) -> io::Result<(usize, Option<Instant>)> {
    stream.try_io(Interest::READABLE, || read_stamped_now(stream, buf))
}

/// As [`try_read_stamped`], but asks the kernel even before tokio has seen the socket readable:
/// for a socket just accepted, whose first bytes are usually there already while tokio learns
/// of them only at its next poll. A `WouldBlock` here leaves tokio's readiness as it was, so a
/// later wait for readiness is still woken.
pub(crate) fn read_stamped_now(
    stream: &impl AsRawFd,
    buf: &mut BytesMut,
) -> io::Result<(usize, Option<Instant>)> {
    let mut chunk = [0u8; READ];
    let mut iov = [IoSliceMut::new(&mut chunk)];
    let mut cmsg = nix::cmsg_space!(TimeSpec);
    let msg = recvmsg::<SockaddrStorage>(
        stream.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_DONTWAIT,
    )
    .map_err(io::Error::from)?;
    let mut at = None;
    for c in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmTimestampns(ts) = c {
            at = Some(ts);
        }
    }
    let n = msg.bytes;
    buf.extend_from_slice(&chunk[..n]);
    Ok((n, at.map(arrived)))
}

/// Waits until bytes arrive, then reads them as [`try_read_stamped`] does.
pub(crate) async fn read_stamped(
    stream: &TcpStream,
    buf: &mut BytesMut,
) -> io::Result<(usize, Option<Instant>)> {
    loop {
        stream.readable().await?;
        match try_read_stamped(stream, buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            r => return r,
        }
    }
}

/// A kernel stamp (wall clock) on the monotonic clock; a stamp from the future (the wall clock
/// was set back) counts as now.
fn arrived(ts: TimeSpec) -> Instant {
    let at = UNIX_EPOCH + Duration::from(ts);
    let waited = SystemTime::now().duration_since(at).unwrap_or_default();
    let now = Instant::now();
    now.checked_sub(waited).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn accepted_connections_carry_the_arrival_of_their_first_bytes() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        stamp_arrivals(&listener).unwrap();
        // The kernel switches stamping on for the whole machine from a deferred work item when
        // the first socket asks for it, so the first segments after that may come unstamped.
        let mut on = false;
        for _ in 0..200 {
            let mut warm = TcpStream::connect(listener.local_addr().unwrap())
                .await
                .unwrap();
            warm.write_all(b"x").await.unwrap();
            let (server, _) = listener.accept().await.unwrap();
            let (_, at) = read_stamped(&server, &mut BytesMut::new()).await.unwrap();
            if at.is_some() {
                on = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(on, "the kernel never stamped a segment in 2 s");
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        client.write_all(b"hello").await.unwrap();
        // The bytes wait in the kernel, unread, as they do in a backlog under overload.
        tokio::time::sleep(Duration::from_millis(120)).await;
        let (server, _) = listener.accept().await.unwrap();
        let mut buf = BytesMut::new();
        let (n, arrived) = read_stamped(&server, &mut buf).await.unwrap();
        assert_eq!((n, &buf[..]), (5, &b"hello"[..]));
        let waited = arrived
            .expect("the kernel stamps the first bytes")
            .elapsed();
        assert!(waited >= Duration::from_millis(100), "{waited:?}");
        drop(client);
        let (n, _) = read_stamped(&server, &mut buf).await.unwrap();
        assert_eq!(n, 0);
    }
}
