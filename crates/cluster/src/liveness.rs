//! Pings every other agent node's port, so that this node knows within a second which ones
//! went silent (a frozen process, a stalled disk, a lost link) without waiting for their lease
//! to end, and says so in [`Peers`].
//!
//! Each ping rides one long-lived, mutually authenticated connection per node: a stranger can
//! neither answer for a node nor hold its answers back, and a flood of strangers' handshakes
//! on the node port (shed oldest first, `pending.rs`) does not touch a connection already
//! made. A node is silent when a ping (or the connection for it) has gone unanswered for
//! [`SILENT_AFTER`]. Silence only changes where this node sends requests; the node's record,
//! and so every other node's view, stays until its lease ends.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use warden_core::Peers;

use crate::client::PingLine;
use crate::{Directory, NodeClient};

/// Time between pings to a node.
const PING_EVERY: Duration = Duration::from_millis(200);
/// A node that has answered nothing for this long is silent. Well above a loaded node's
/// scheduling delay on a busy host; well below the second.
pub const SILENT_AFTER: Duration = Duration::from_millis(600);

/// Starts pinging the agent nodes of `nodes` other than `me` until `stop`; their state goes
/// to the returned [`Peers`].
pub fn watch_peers(
    me: String,
    client: NodeClient,
    nodes: Directory,
    stop: watch::Receiver<bool>,
) -> Arc<Peers> {
    let peers = Arc::new(Peers::default());
    tokio::spawn(run(me, client, nodes, peers.clone(), stop));
    peers
}

/// Keeps one pinger per live agent node, as the directory says.
async fn run(
    me: String,
    client: NodeClient,
    nodes: Directory,
    peers: Arc<Peers>,
    mut stop: watch::Receiver<bool>,
) {
    let mut pingers: HashMap<String, (String, JoinHandle<()>)> = HashMap::new();
    loop {
        let live: HashMap<String, String> = nodes
            .all()
            .into_iter()
            .filter(|n| n.id != me && n.runs_instances())
            .filter_map(|n| Some((n.id, n.advertise?)))
            .collect();
        let gone: Vec<String> = pingers
            .iter()
            .filter(|(node, (addr, _))| live.get(*node) != Some(addr))
            .map(|(node, _)| node.clone())
            .collect();
        for node in gone {
            if let Some((_, task)) = pingers.remove(&node) {
                // Ended before it is forgotten: a pinger caught mid-verdict must not mark the
                // node silent again after.
                task.abort();
                let _ = task.await;
            }
            peers.forget(&node);
        }
        for (node, addr) in live {
            pingers.entry(node.clone()).or_insert_with(|| {
                let task = tokio::spawn(ping(node, addr.clone(), client.clone(), peers.clone()));
                (addr, task)
            });
        }
        tokio::select! {
            () = tokio::time::sleep(PING_EVERY) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    for (_, (_, task)) in pingers {
        task.abort();
    }
}

/// Pings `node` at `addr` for as long as it is in the directory.
async fn ping(node: String, addr: String, client: NodeClient, peers: Arc<Peers>) {
    let mut line: Option<PingLine> = None;
    let mut last_heard = Instant::now();
    loop {
        let answered = tokio::time::timeout(SILENT_AFTER, once(&client, &addr, &mut line))
            .await
            .is_ok_and(|r| r.is_ok());
        if answered {
            last_heard = Instant::now();
            if peers.heard(&node, true) {
                tracing::info!(node, "node answers again; routing to it resumes");
            }
        } else {
            // A connection that missed an answer may deliver it late: never reuse it.
            line = None;
            if last_heard.elapsed() >= SILENT_AFTER && peers.heard(&node, false) {
                tracing::warn!(
                    node,
                    addr,
                    "node stopped answering its peers; routing around it until it answers again"
                );
            }
        }
        tokio::time::sleep(PING_EVERY).await;
    }
}

/// One ping, on the connection kept for it (made first if there is none).
async fn once(client: &NodeClient, addr: &str, line: &mut Option<PingLine>) -> std::io::Result<()> {
    let l = match line {
        Some(l) => l,
        None => line.insert(client.ping_line(addr).await?),
    };
    l.ping().await
}

/// The peers' state in Prometheus' text format.
pub fn render(peers: &Peers) -> String {
    let (now, ever) = peers.counts();
    format!(
        "# HELP warden_peers_silent Other nodes that answer none of this node's pings now (routed around).\n\
         # TYPE warden_peers_silent gauge\n\
         warden_peers_silent {now}\n\
         # HELP warden_peer_silences_total Times another node stopped answering this node's pings.\n\
         # TYPE warden_peer_silences_total counter\n\
         warden_peer_silences_total {ever}\n"
    )
}
