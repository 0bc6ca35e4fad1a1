//! The floor of the gateway benchmark: a relay that does no HTTP work at all, to show what any
//! proxy could reach on this machine in the same run.
//!
//! On two shared cores the kernel's loopback path, the upstream and wrk take most of the CPU, so
//! a proxy's throughput has a ceiling no proxy design can pass. This relay measures it: a byte
//! relay with the cheapest structure we know in Rust (one current-thread runtime per core on
//! `SO_REUSEPORT` listeners, one read and one write per message, no parsing, no allocation per
//! request). It refuses a request without forwarding it when the bytes of one read hold a
//! configured needle (a wrong password, a non-admin's cookie), with a canned response, so the
//! refusal workloads have a floor too (and closes after it when the read asks to, as the
//! benchmark's probes do). It relies on wrk's behaviour, one request per read and no
//! pipelining, which is why it is a measuring stick here and nothing more.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use memchr::memmem::Finder;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A canned response and the needle that selects it.
struct Refusal {
    needle: Finder<'static>,
    response: Vec<u8>,
}

struct Config {
    upstream: std::net::SocketAddr,
    refusals: Vec<Refusal>,
    /// The benchmark's probes ask to close; wrk never does.
    close: Finder<'static>,
}

impl Config {
    fn new(upstream: u16, refusals: Vec<Refusal>) -> Config {
        Config {
            upstream: ([127, 0, 0, 1], upstream).into(),
            refusals,
            close: Finder::new(b"connection: close").into_owned(),
        }
    }

    /// The canned answer to `read`, and whether to close after it.
    fn refusal(&self, read: &[u8]) -> Option<(&[u8], bool)> {
        self.refusals
            .iter()
            .find(|r| r.needle.find(read).is_some())
            .map(|r| (r.response.as_slice(), self.close.find(read).is_some()))
    }
}

/// Reads `STATUS NEEDLE` lines: a read that holds NEEDLE is answered with STATUS.
fn refusals(file: &Path) -> anyhow::Result<Vec<Refusal>> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("reading the refusals in {}", file.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (status, needle) = l
                .split_once(' ')
                .context("a refusal line is `STATUS NEEDLE`")?;
            let status: u16 = status.parse().context("a refusal's status is a number")?;
            Ok(Refusal {
                needle: Finder::new(needle.as_bytes()).into_owned(),
                response: format!("HTTP/1.1 {status} Refused\r\ncontent-length: 0\r\n\r\n")
                    .into_bytes(),
            })
        })
        .collect()
}

/// Serves `listen` until killed, relaying to `upstream` on one thread per core.
pub(crate) fn run(listen: u16, upstream: u16, refusals_file: Option<&Path>) -> anyhow::Result<()> {
    let refusals = match refusals_file {
        Some(f) => refusals(f)?,
        None => Vec::new(),
    };
    let config = Arc::new(Config::new(upstream, refusals));
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let threads: Vec<_> = (0..cores)
        .map(|_| {
            let config = config.clone();
            std::thread::spawn(move || -> anyhow::Result<()> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_io()
                    .build()?;
                rt.block_on(accept(listen, config))
            })
        })
        .collect();
    for t in threads {
        t.join()
            .map_err(|_| anyhow::anyhow!("a relay thread panicked"))??;
    }
    Ok(())
}

async fn accept(port: u16, config: Arc<Config>) -> anyhow::Result<()> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseport(true)?;
    socket
        .bind(([127, 0, 0, 1], port).into())
        .with_context(|| format!("binding 127.0.0.1:{port}"))?;
    let listener = socket.listen(4096)?;
    loop {
        let (client, _) = listener.accept().await?;
        tokio::spawn(relay(client, config.clone()));
    }
}

/// What one turn of a relay read.
enum Event {
    Client(std::io::Result<usize>),
    Upstream(std::io::Result<usize>),
}

/// Copies bytes both ways until either side closes; the upstream connection is opened on the
/// first read that is not refused.
async fn relay(mut client: TcpStream, config: Arc<Config>) {
    let _ = client.set_nodelay(true);
    let mut upstream: Option<TcpStream> = None;
    let mut from_client = vec![0u8; 16 * 1024];
    let mut from_upstream = vec![0u8; 16 * 1024];
    loop {
        let event = match upstream.as_mut() {
            None => Event::Client(client.read(&mut from_client).await),
            Some(up) => tokio::select! {
                r = client.read(&mut from_client) => Event::Client(r),
                r = up.read(&mut from_upstream) => Event::Upstream(r),
            },
        };
        let sent = match event {
            Event::Upstream(Ok(n)) if n > 0 => client.write_all(&from_upstream[..n]).await,
            Event::Upstream(_) | Event::Client(Ok(0) | Err(_)) => return,
            Event::Client(Ok(n)) => {
                let read = &from_client[..n];
                if let Some((canned, close)) = config.refusal(read) {
                    if close {
                        let _ = client.write_all(canned).await;
                        return;
                    }
                    client.write_all(canned).await
                } else {
                    if upstream.is_none() {
                        let Ok(up) = TcpStream::connect(config.upstream).await else {
                            return;
                        };
                        let _ = up.set_nodelay(true);
                        upstream = Some(up);
                    }
                    match upstream.as_mut() {
                        Some(up) => up.write_all(read).await,
                        None => return,
                    }
                }
            }
        };
        if sent.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_chosen_by_needle() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("refusals");
        std::fs::write(&f, "401 Basic YWxpY2U6bm8=\n403 warden_session=user\n").unwrap();
        let config = Config::new(1, refusals(&f).unwrap());
        let req = |h: &str| format!("GET / HTTP/1.1\r\nHost: x\r\n{h}\r\n\r\n");
        assert_eq!(
            config.refusal(req("Authorization: Basic YWxpY2U6bm8=").as_bytes()),
            Some((
                &b"HTTP/1.1 401 Refused\r\ncontent-length: 0\r\n\r\n"[..],
                false
            ))
        );
        assert!(config
            .refusal(req("Cookie: warden_session=user\r\nconnection: close").as_bytes())
            .is_some_and(|(r, close)| r.starts_with(b"HTTP/1.1 403") && close));
        assert_eq!(
            config.refusal(req("Authorization: Basic YWxpY2U6eWVz").as_bytes()),
            None
        );
        std::fs::write(&f, "four-oh-one needle\n").unwrap();
        assert!(refusals(&f).is_err());
    }
}
