//! The floor of refusing a TLS handshake: `warden-bench tls-refuser`, a server that refuses
//! every connection with the least work a TLS server can do for it (accept, one read of the
//! ClientHello, the alert, close: four system calls, no runtime, one thread). What it costs
//! per refusal on its core is what any server pays in the kernel and the system calls,
//! measured under the same emulated clients as the servers (`--servers refuse-all`).

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;

use anyhow::Context;
use nix::sys::socket::{recv, send, MsgFlags};

/// The same fatal `internal_error` alert warden's admission control sends.
const ALERT: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x50];

pub(crate) fn run(listen: u16) -> anyhow::Result<()> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(SocketAddr::from((Ipv4Addr::LOCALHOST, listen)))?;
    // The backlog the servers ask for (the kernel caps it at net.core.somaxconn). tokio's
    // socket builder sets it; tokio wants a reactor only while the listener is its own.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    let listener = rt
        .block_on(async { socket.listen(65535) })
        .context("listening")?
        .into_std()?;
    drop(rt);
    listener.set_nonblocking(false)?;
    let mut hello = [0u8; 4096];
    loop {
        let Ok((s, _)) = listener.accept() else {
            // Out of descriptors, say: back off rather than spin on the servers' core.
            std::thread::sleep(std::time::Duration::from_millis(1));
            continue;
        };
        // The hello is usually there by the time the connection is accepted; if not, the
        // refusal goes out without it (never waiting: the floor must not block on a client).
        let dont_wait = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL;
        let _ = recv(s.as_raw_fd(), &mut hello, dont_wait);
        let _ = send(s.as_raw_fd(), &ALERT, dont_wait);
    }
}
