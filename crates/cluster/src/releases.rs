//! Releases over the node port: a node that builds nothing (an API-only node) passes a push, a
//! config change or a rollback to an agent node ([`ReleaseForwarder`]), which makes it as it
//! would its own (`serve_release`, through its [`Releases`]) and answers with the release's
//! progress on the same stream. So the release's controller runs where the build runs, and
//! that node resumes it after a crash.
//!
//! The exchange: `Request::Release` (for a push, its `size` bytes follow), then `Refused`, or
//! `Stream` followed by the progress as `Text` frames and a final `Ok`. A stream that ends
//! before its `Ok` lost its node.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use warden_core::{
    NodeRecord, Peers, ReleaseAsk, ReleaseError, ReleaseEvents, Releases, UploadReader,
};

use crate::wire::{self, Reply, Request};
use crate::{Directory, NodeClient};

/// Time an upload may take to cross between two nodes.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(600);
/// Time a node gets to take a release once its upload arrived (it unpacks and detects it).
const TAKE_TIMEOUT: Duration = Duration::from_secs(120);
/// Largest piece of progress in one frame (a frame is at most 1 MiB of JSON).
const MAX_PIECE: usize = 256 << 10;
/// How often a release's stream checks that its node is still live.
const LIVE_CHECK: Duration = Duration::from_secs(1);

/// Passes releases to the agent nodes of the cluster: the live one least loaded (not silent to
/// this node's pings, not drained), or the one preferred if it is live.
pub struct ReleaseForwarder {
    me: String,
    client: NodeClient,
    nodes: Directory,
    peers: Arc<Peers>,
}

// === impl ReleaseForwarder ===

impl ReleaseForwarder {
    /// Releases of node `me` (which builds nothing) made on other nodes.
    pub fn new(me: String, client: NodeClient, nodes: Directory, peers: Arc<Peers>) -> Self {
        Self {
            me,
            client,
            nodes,
            peers,
        }
    }

    /// Nodes that may build, the preferred one first, then least loaded first.
    fn candidates(&self, prefer: Option<&str>) -> Vec<NodeRecord> {
        let mut nodes: Vec<NodeRecord> = self
            .nodes
            .all()
            .into_iter()
            .filter(|n| n.runs_instances() && n.advertise.is_some() && n.id != self.me)
            .filter(|n| !self.peers.silent(&n.id))
            .collect();
        // A drained node takes nothing new, unless every node is drained.
        if nodes.iter().any(|n| !n.draining) {
            nodes.retain(|n| !n.draining);
        }
        nodes.sort_by(|a, b| {
            (Some(a.id.as_str()) != prefer)
                .cmp(&(Some(b.id.as_str()) != prefer))
                .then(a.load.score().total_cmp(&b.load.score()))
                .then(a.id.cmp(&b.id))
        });
        nodes
    }
}

#[async_trait]
impl Releases for ReleaseForwarder {
    async fn release(
        &self,
        ask: ReleaseAsk,
        mut upload: Option<UploadReader>,
        prefer: Option<String>,
    ) -> Result<ReleaseEvents, ReleaseError> {
        let candidates = self.candidates(prefer.as_deref());
        if candidates.is_empty() {
            return Err(ReleaseError::NoNode);
        }
        let mut tried = Vec::new();
        for node in candidates {
            let Some(addr) = node.advertise.as_deref() else {
                continue;
            };
            // Only a node that could not be reached is passed over: the upload is untouched.
            let stream = match self.client.open(addr).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::info!(node = %node.id, error = %e, "a node did not take a release; asking the next");
                    tried.push(format!("{}: {e}", node.id));
                    continue;
                }
            };
            let asked = Asked {
                node: node.id,
                nodes: self.nodes.clone(),
            };
            return ask_node(stream, asked, &ask, upload.take()).await;
        }
        Err(ReleaseError::Unreachable(tried.join("; ")))
    }

    async fn log(
        &self,
        app: &str,
        number: u64,
        node: Option<String>,
    ) -> Result<String, ReleaseError> {
        let Some(node) = node else {
            return Ok(String::new());
        };
        let unreachable = |reason: String| ReleaseError::Unreachable(format!("{node}: {reason}"));
        let addr = self
            .nodes
            .get(&node)
            .and_then(|n| n.advertise)
            .ok_or_else(|| unreachable("not live, or it serves no node port".into()))?;
        let exchange = async {
            let mut s = self.client.open(&addr).await?;
            let request = Request::ReleaseLog {
                app: app.to_owned(),
                number,
            };
            wire::write(&mut s, &request).await?;
            let mut text = String::new();
            loop {
                match wire::read::<Reply>(&mut s).await? {
                    Reply::Text(piece) => text.push_str(&piece),
                    Reply::Ok => return Ok(text),
                    other => return Err(std::io::Error::other(format!("it sent {other:?}"))),
                }
            }
        };
        tokio::time::timeout(TAKE_TIMEOUT, exchange)
            .await
            .map_err(|_| unreachable("no answer".into()))?
            .map_err(|e| unreachable(e.to_string()))
    }
}

/// The node a release was asked of, and the live nodes: one whose record is gone (its lease
/// ended: dead, frozen or cut off) is lost even while its connection stays open.
struct Asked {
    node: String,
    nodes: Directory,
}

/// Sends the release (and its upload) on `stream` to the node `asked`, and relays its answer.
async fn ask_node(
    mut s: crate::client::NodeStream,
    asked: Asked,
    ask: &ReleaseAsk,
    upload: Option<UploadReader>,
) -> Result<ReleaseEvents, ReleaseError> {
    let Asked { node, nodes } = asked;
    let app = ask.app().to_owned();
    let unreachable = |reason: String| ReleaseError::Unreachable(format!("{node}: {reason}"));
    let send = async {
        wire::write(&mut s, &Request::Release { ask: ask.clone() }).await?;
        if let (ReleaseAsk::Push { size, .. }, Some(upload)) = (ask, upload) {
            let sent = tokio::io::copy(&mut upload.take(*size), &mut s).await?;
            if sent != *size {
                return Err(std::io::Error::other(format!(
                    "the upload was {sent} bytes, not {size}"
                )));
            }
            s.flush().await?;
        }
        Ok::<_, std::io::Error>(())
    };
    tokio::time::timeout(UPLOAD_TIMEOUT, send)
        .await
        .map_err(|_| unreachable("the upload timed out".into()))?
        .map_err(|e| unreachable(e.to_string()))?;
    let reply = tokio::time::timeout(TAKE_TIMEOUT, wire::read::<Reply>(&mut s))
        .await
        .map_err(|_| unreachable("no answer".into()))?
        .map_err(|e| unreachable(e.to_string()))?;
    match reply {
        Reply::Stream => {}
        Reply::Refused { status, message } => {
            return Err(ReleaseError::Refused { status, message })
        }
        other => return Err(unreachable(format!("it answered {other:?}"))),
    }
    tracing::info!(node, app = ask.app(), "a node took a release");
    let (tx, rx) = mpsc::channel(64);
    // The progress goes on while the client listens; the delivery on the node goes on anyway.
    tokio::spawn(async move {
        loop {
            let item = match next(&mut s, &node, &nodes).await {
                Ok(Reply::Text(piece)) => Ok(piece),
                Ok(Reply::Ok) => return,
                Ok(other) => Err(format!("it sent {other:?}")),
                Err(e) => Err(e.to_string()),
            };
            let stop = item.is_err();
            let item = item.map_err(|reason| ReleaseError::Lost {
                node: node.clone(),
                app: app.clone(),
                reason,
            });
            if tx.send(item).await.is_err() || stop {
                return;
            }
        }
    });
    Ok(rx)
}

/// Why a building node's progress stopped before its outcome.
#[derive(Debug, thiserror::Error)]
enum Broken {
    /// The connection to it broke.
    #[error("{0}")]
    Io(std::io::Error),
    /// Its node record is gone.
    #[error("its lease ended: it is dead, frozen or cut off")]
    LeaseEnded,
}

/// The node's next frame, or why there is none: the connection broke, or the node's record is
/// gone (a build may print nothing for minutes, so silence alone proves nothing).
async fn next(
    s: &mut crate::client::NodeStream,
    node: &str,
    nodes: &Directory,
) -> Result<Reply, Broken> {
    let read = wire::read::<Reply>(s);
    tokio::pin!(read);
    let mut check = tokio::time::interval(LIVE_CHECK);
    loop {
        tokio::select! {
            r = &mut read => return r.map_err(Broken::Io),
            _ = check.tick() => {
                if nodes.get(node).is_none() {
                    return Err(Broken::LeaseEnded);
                }
            }
        }
    }
}

/// Makes the release asked on `tls` with this node's `releases`, and answers with its progress
/// until it ends. A push's bytes (`size` of them, as the asking node declared) are read
/// whatever happens, so that a refusal reaches the asking node whole.
pub(crate) async fn serve_release(
    tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    releases: Option<&Arc<dyn Releases>>,
    ask: ReleaseAsk,
) -> std::io::Result<()> {
    let (mut from_node, mut to_node) = tokio::io::split(tls);
    let size = match &ask {
        ReleaseAsk::Push { size, .. } => Some(*size),
        _ => None,
    };
    // The upload's bytes go through a pipe, so that what the release leaves unread is drained.
    let (upload, drained) = match size {
        Some(size) => {
            let (mut into, out) = tokio::io::duplex(64 << 10);
            let drain = tokio::spawn(async move {
                let mut buf = vec![0u8; 64 << 10];
                let (mut left, mut piping) = (size, true);
                let copy = async {
                    while left > 0 {
                        let want = usize::try_from(left).map_or(buf.len(), |l| l.min(buf.len()));
                        let n = from_node.read(&mut buf[..want]).await?;
                        if n == 0 {
                            break;
                        }
                        left -= n as u64;
                        piping = piping && into.write_all(&buf[..n]).await.is_ok();
                    }
                    Ok::<_, std::io::Error>(())
                };
                let _ = tokio::time::timeout(UPLOAD_TIMEOUT, copy).await;
            });
            (Some(Box::new(out) as UploadReader), Some(drain))
        }
        None => (None, None),
    };
    let taken = match releases {
        Some(r) => r.release(ask, upload, None).await,
        None => Err(ReleaseError::Refused {
            status: 503,
            message: "this node does not make releases; ask another agent node".into(),
        }),
    };
    let mut events = match taken {
        Ok(events) => events,
        Err(e) => {
            if let Some(d) = drained {
                let _ = d.await;
            }
            let status = match &e {
                ReleaseError::Refused { status, .. } => *status,
                _ => 503,
            };
            let message = e.to_string();
            wire::write(&mut to_node, &Reply::Refused { status, message }).await?;
            return to_node.shutdown().await;
        }
    };
    wire::write(&mut to_node, &Reply::Stream).await?;
    while let Some(item) = events.recv().await {
        let Ok(text) = item else { break };
        for piece in pieces(&text) {
            wire::write(&mut to_node, &Reply::Text(piece.to_owned())).await?;
        }
    }
    wire::write(&mut to_node, &Reply::Ok).await?;
    to_node.shutdown().await
}

/// Sends the log of release `number` of `app` that this node keeps (nothing if it has none).
pub(crate) async fn serve_release_log(
    mut tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    releases: Option<&Arc<dyn Releases>>,
    app: &str,
    number: u64,
) -> std::io::Result<()> {
    let text = match releases {
        Some(r) => r.log(app, number, None).await.unwrap_or_default(),
        None => String::new(),
    };
    for piece in pieces(&text) {
        wire::write(&mut tls, &Reply::Text(piece.to_owned())).await?;
    }
    wire::write(&mut tls, &Reply::Ok).await?;
    tls.shutdown().await
}

/// `text` in pieces of at most [`MAX_PIECE`] bytes, cut at character boundaries.
fn pieces(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut cut = rest.len().min(MAX_PIECE);
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let (piece, tail) = rest.split_at(cut);
        rest = tail;
        Some(piece)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_bounded_and_whole_characters() {
        let text = "é".repeat(MAX_PIECE);
        let parts: Vec<&str> = pieces(&text).collect();
        assert!(parts.len() > 1);
        assert!(parts.iter().all(|p| p.len() <= MAX_PIECE));
        assert_eq!(parts.concat(), text);
    }
}
