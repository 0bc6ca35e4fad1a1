//! One client socket, two handles, one descriptor: the connection's reader and writer, and a
//! handle kept by the connection's task to answer 408 after hyper gives up on a slow head
//! (hyper drops the connection it was given). A duplicated descriptor would do the same at the
//! cost of a second descriptor per connection, which halves how many connections fit under the
//! process's limit.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A client socket shared by reference count.
#[derive(Clone)]
pub(crate) struct SharedTcp(pub Arc<TcpStream>);

impl SharedTcp {
    /// Writes what the socket takes of `bytes` now, without waiting: a last word on a
    /// connection that is closing anyway.
    pub(crate) fn try_write_now(&self, bytes: &[u8]) {
        let _ = self.0.try_write(bytes);
    }
}

impl AsyncRead for SharedTcp {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            ready!(self.0.poll_read_ready(cx))?;
            // `try_read_buf` clears the readiness it finds stale, so the next poll waits again;
            // it reads into the unfilled part as it is, where `initialize_unfilled` would zero
            // the whole of it first (h2 hands over its 8 KiB spare capacity on every read).
            match self.0.try_read_buf(buf) {
                Ok(_) => return Poll::Ready(Ok(())),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for SharedTcp {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match self.0.try_write_vectored(bufs) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                r => return Poll::Ready(r),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = socket2::SockRef::from(&*self.0).shutdown(std::net::Shutdown::Write);
        Poll::Ready(match r {
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(()),
            r => r,
        })
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn both_handles_speak_on_one_descriptor() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::spawn(async move {
            let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
            c.write_all(b"ping").await.unwrap();
            let mut got = Vec::new();
            c.read_to_end(&mut got).await.unwrap();
            got
        });
        let (s, _) = listener.accept().await.unwrap();
        let mut io = SharedTcp(Arc::new(s));
        let spare = io.clone();
        let mut buf = [0u8; 4];
        io.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        io.write_all(b"pong,").await.unwrap();
        drop(io);
        // The kept handle still speaks after the other is gone, then closes.
        spare.try_write_now(b"last");
        drop(spare);
        assert_eq!(client.await.unwrap(), b"pong,last");
    }
}
