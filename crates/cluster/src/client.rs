//! The client side of other nodes' ports.

use std::os::fd::AsRawFd;
use std::time::Duration;

use nix::sys::socket::{recv, MsgFlags};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use warden_core::builds::SlugTransferError;
use warden_core::{InstanceError, RemoteStream, Unavailable};

use crate::certs::server_name;
use crate::wire::{self, Reply, Request};
use crate::NodeTls;

/// Time to reach a node and finish the handshake (nodes are near: a dead one should cost a
/// request little). The node port gives a client no longer for its handshake.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Time a node gets to answer a request: a start waits for the instance to be ready.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);
/// Time a slug transfer may take.
const SLUG_TIMEOUT: Duration = Duration::from_secs(600);
/// Time a node gets to answer a connect.
const JOIN_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection to another node's port.
pub(crate) type NodeStream = TlsStream<TcpStream>;

/// Opens connections to other nodes' ports as this node.
#[derive(Clone)]
pub struct NodeClient {
    connector: TlsConnector,
}

/// A stream to an instance through its node's port.
struct Joined(TlsStream<TcpStream>);

impl tokio::io::AsyncRead for Joined {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Joined {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    /// Passed through, so a request head written in pieces (`write_signed`) leaves as one TLS
    /// record in one segment: without it tokio wrote each piece on its own, three records and
    /// three sends a request, each woken for and decrypted on the other node (issue 39).
    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

impl RemoteStream for Joined {
    /// Reusable while nothing waits on the socket: any byte there (a close, an alert, an
    /// answer nobody asked for) or its end means the connection must not carry a request.
    fn reusable(&self) -> bool {
        let mut probe = [0u8; 1];
        let fd = self.0.get_ref().0.as_raw_fd();
        matches!(
            recv(fd, &mut probe, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT),
            Err(nix::errno::Errno::EAGAIN)
        )
    }
}

/// One connection carrying this node's pings to another node's port.
pub(crate) struct PingLine(TlsStream<TcpStream>);

impl PingLine {
    /// One ping and its answer.
    pub(crate) async fn ping(&mut self) -> std::io::Result<()> {
        wire::write(&mut self.0, &Request::Ping).await?;
        match wire::read::<Reply>(&mut self.0).await? {
            Reply::Ok => Ok(()),
            other => Err(std::io::Error::other(format!(
                "a node answered a ping with {other:?}"
            ))),
        }
    }
}

impl NodeClient {
    /// A connection for pings to the node at `addr`.
    pub(crate) async fn ping_line(&self, addr: &str) -> std::io::Result<PingLine> {
        self.open(addr).await.map(PingLine)
    }

    /// A client presenting this node's certificate.
    pub fn new(tls: &NodeTls) -> Self {
        Self {
            connector: TlsConnector::from(tls.client.clone()),
        }
    }

    pub(crate) async fn open(&self, addr: &str) -> std::io::Result<NodeStream> {
        let name = server_name(addr)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let open = async {
            let tcp = TcpStream::connect(addr).await?;
            let _ = tcp.set_nodelay(true);
            self.connector.connect(name, tcp).await
        };
        tokio::time::timeout(CONNECT_TIMEOUT, open)
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))?
    }

    /// Sends `request` to the node at `addr` and returns its reply.
    pub(crate) async fn call(&self, addr: &str, request: &Request) -> Result<Reply, InstanceError> {
        let unreachable = |e: std::io::Error| {
            InstanceError::unavailable(
                Unavailable::Unreachable,
                format!("node port {addr} did not answer: {e}"),
            )
        };
        let exchange = async {
            let mut s = self.open(addr).await?;
            wire::write(&mut s, request).await?;
            wire::read(&mut s).await
        };
        tokio::time::timeout(ANSWER_TIMEOUT, exchange)
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))
            .and_then(|r| r)
            .map_err(unreachable)
    }

    /// Copies slug `id`'s archive from the node at `addr` into `into`, at most `max` bytes.
    pub async fn fetch_slug(
        &self,
        addr: &str,
        id: &str,
        into: &std::path::Path,
        max: u64,
    ) -> Result<(), SlugTransferError> {
        use SlugTransferError::Unreachable;
        let exchange = async {
            let mut s = self.open(addr).await.map_err(Unreachable)?;
            let request = Request::Slug { id: id.to_owned() };
            wire::write(&mut s, &request).await.map_err(Unreachable)?;
            let size = match wire::read(&mut s).await.map_err(Unreachable)? {
                Reply::Blob { size } if size <= max => size,
                Reply::Blob { size } => return Err(SlugTransferError::TooLarge { size, max }),
                Reply::Err(e) => return Err(SlugTransferError::Refused(e)),
                other => return Err(SlugTransferError::Unexpected(format!("{other:?}"))),
            };
            let write = |source| SlugTransferError::Write {
                path: into.to_owned(),
                source,
            };
            let mut file = tokio::fs::File::create(into).await.map_err(write)?;
            let copied = copy_exactly(&mut s, &mut file, into, size).await?;
            if copied != size {
                return Err(SlugTransferError::Short { copied, size });
            }
            tokio::io::AsyncWriteExt::flush(&mut file)
                .await
                .map_err(write)
        };
        tokio::time::timeout(SLUG_TIMEOUT, exchange)
            .await
            .map_err(|_| SlugTransferError::TimedOut(SLUG_TIMEOUT.as_secs()))?
    }

    /// Asks the node at `addr` for a ready instance of `spec`'s app (the node reads the spec
    /// from the store by name) for `label` and `owner`.
    pub async fn ensure(
        &self,
        addr: &str,
        spec: &warden_core::AppSpec,
        label: &str,
        owner: &warden_core::Owner,
    ) -> Result<warden_core::InstanceRecord, InstanceError> {
        let request = Request::Ensure {
            spec: Box::new(spec.clone()),
            label: label.to_owned(),
            owner: owner.clone(),
        };
        match self.call(addr, &request).await? {
            Reply::Record(r) => Ok(*r),
            Reply::Err(e) => Err(e),
            other => Err(InstanceError::unavailable(
                Unavailable::Unreachable,
                format!("node port {addr} answered a start with {other:?}"),
            )),
        }
    }

    /// A stream joined to instance `id`, serving `label`, on the node at `addr`. A refusal (the
    /// instance is gone, serves another label now, or closed its port) is `ConnectionRefused`,
    /// as a local connection's would be.
    pub async fn join(
        &self,
        addr: &str,
        id: &str,
        label: &str,
    ) -> std::io::Result<Box<dyn RemoteStream>> {
        match self.ask_join(addr, id, label).await? {
            Ok(s) => Ok(s),
            // The node's answer stays the source: a caller may ask what it was.
            Err(e) => Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionRefused,
                e,
            )),
        }
    }

    /// Whether the node at `addr` has instance `id` serving `label`: `Ok(true)` joined,
    /// `Ok(false)` the node answered that it has not; `Err` the node did not answer.
    pub async fn probe(&self, addr: &str, id: &str, label: &str) -> std::io::Result<bool> {
        Ok(self.ask_join(addr, id, label).await?.is_ok())
    }

    /// The outer error: the node did not answer; the inner one: it answered no.
    async fn ask_join(
        &self,
        addr: &str,
        id: &str,
        label: &str,
    ) -> std::io::Result<Result<Box<dyn RemoteStream>, InstanceError>> {
        let mut s = self.open(addr).await?;
        let request = Request::Connect {
            id: id.to_owned(),
            label: label.to_owned(),
        };
        wire::write(&mut s, &request).await?;
        let reply = tokio::time::timeout(JOIN_TIMEOUT, wire::read::<Reply>(&mut s))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        match reply {
            Reply::Ok => Ok(Ok(Box::new(Joined(s)))),
            Reply::Err(e) => Ok(Err(e)),
            other => Err(std::io::Error::other(format!(
                "node port {addr} answered connect with {other:?}"
            ))),
        }
    }
}

/// Copies up to `size` bytes from `from` to `to` (the file at `path`); how many came before
/// `from` ended. A failed
/// read is the node's (`Unreachable`), a failed write this node's (`Write`): the caller
/// reports them differently.
async fn copy_exactly(
    from: &mut (impl tokio::io::AsyncRead + Unpin),
    to: &mut tokio::fs::File,
    path: &std::path::Path,
    size: u64,
) -> Result<u64, SlugTransferError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 << 10];
    let mut copied = 0u64;
    while copied < size {
        let want = usize::try_from(size - copied).map_or(buf.len(), |left| left.min(buf.len()));
        let n = from
            .read(&mut buf[..want])
            .await
            .map_err(SlugTransferError::Unreachable)?;
        if n == 0 {
            break;
        }
        to.write_all(&buf[..n])
            .await
            .map_err(|source| SlugTransferError::Write {
                path: path.to_owned(),
                source,
            })?;
        copied += n as u64;
    }
    Ok(copied)
}
