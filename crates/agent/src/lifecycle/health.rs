//! The readiness check of apps that name a health path: one `GET` on a fresh connection, judged
//! by the status line alone.
//!
//! Only the status line is read, so an app's health page may be any size and any body; the
//! connection is closed after it.

use std::io;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest status line accepted; a real one is about 20 bytes.
const MAX_STATUS_LINE: usize = 1024;

/// Sends `GET path` on `conn` and returns the status code of the answer.
pub(crate) async fn check(mut conn: TcpStream, path: &str) -> io::Result<u16> {
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: warden-agent\r\nConnection: close\r\n\r\n"
    );
    conn.write_all(request.as_bytes()).await?;
    let mut line = Vec::with_capacity(64);
    let mut buf = [0u8; 256];
    loop {
        let n = conn.read(&mut buf).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed before a status line",
            ));
        }
        line.extend_from_slice(&buf[..n]);
        if let Some(end) = line.windows(2).position(|w| w == b"\r\n") {
            return status(&line[..end]);
        }
        if line.len() > MAX_STATUS_LINE {
            return Err(invalid("status line too long"));
        }
    }
}

/// The code of `HTTP/1.x NNN reason`.
fn status(line: &[u8]) -> io::Result<u16> {
    let line = std::str::from_utf8(line).map_err(|_| invalid("status line is not text"))?;
    let mut parts = line.splitn(3, ' ');
    let version = parts.next().unwrap_or_default();
    let code = parts.next().unwrap_or_default();
    if !version.starts_with("HTTP/1.") || code.len() != 3 {
        return Err(invalid("malformed status line"));
    }
    code.parse().map_err(|_| invalid("malformed status code"))
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::net::TcpListener;

    /// Serves one connection with `answer` and returns the request it read.
    async fn ask(answer: &'static [u8]) -> (io::Result<u16>, String) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut req = vec![0u8; 1024];
            let n = s.read(&mut req).await.unwrap();
            s.write_all(answer).await.unwrap();
            String::from_utf8_lossy(&req[..n]).into_owned()
        });
        let conn = TcpStream::connect(addr).await.unwrap();
        let got = check(conn, "/healthz?deep=1").await;
        (got, server.await.unwrap())
    }

    #[tokio::test]
    async fn reads_the_status_code_and_sends_the_path() {
        let (got, req) =
            ask(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n").await;
        assert_eq!(got.unwrap(), 503);
        assert!(req.starts_with("GET /healthz?deep=1 HTTP/1.1\r\n"), "{req}");
        let (got, _) = ask(b"HTTP/1.0 200 OK\r\n\r\nbody").await;
        assert_eq!(got.unwrap(), 200);
    }

    #[tokio::test]
    async fn rejects_answers_that_are_not_http() {
        for answer in [&b"SSH-2.0-OpenSSH\r\n"[..], b"HTTP/1.1 2000 OK\r\n", b""] {
            let (got, _) = ask(answer).await;
            assert!(got.is_err(), "{:?}", String::from_utf8_lossy(answer));
        }
    }
}
