//! The node port: other nodes of the cluster, and nothing else, reach this node's instances
//! through it. A client must present a certificate of the cluster CA (mutual TLS); it then
//! sends one request. `connect` joins the stream to a running instance of this node, so the
//! instance itself keeps listening only inside the node; the other requests start, stop or
//! relabel instances through the local agent.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio_rustls::TlsAcceptor;
use warden_core::{InstanceError, Instances};

use crate::wire::{self, Reply, Request};
use crate::NodeTls;

/// Time a client gets to finish its handshake and send its request.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Node port connections open at once; beyond, new ones wait for the listener.
const MAX_CONNECTIONS: usize = 4096;

/// What the node port has seen, for metrics and tests.
#[derive(Debug, Default)]
pub struct NodePortStats {
    /// Connections that passed mutual TLS.
    pub admitted: AtomicU64,
    /// Connections refused: no certificate, a certificate of another CA, not TLS at all.
    pub refused: AtomicU64,
    /// `connect` requests joined to an instance.
    pub joined: AtomicU64,
}

impl NodePortStats {
    /// The counters in Prometheus' text format.
    pub fn render(&self) -> String {
        let mut out = String::from(
            "# HELP warden_node_port_connections_total Node port connections by outcome: admitted (mutual TLS passed), refused (not a node of this cluster), joined (to an instance).\n\
             # TYPE warden_node_port_connections_total counter\n",
        );
        for (outcome, n) in [
            ("admitted", &self.admitted),
            ("refused", &self.refused),
            ("joined", &self.joined),
        ] {
            out += &format!(
                "warden_node_port_connections_total{{outcome=\"{outcome}\"}} {}\n",
                n.load(Ordering::Relaxed)
            );
        }
        out
    }
}

/// Carries bytes between a joined node and the instance until either side closes, or until
/// the instance no longer serves `label`: a gateway's bytes reach it only while it does, so a
/// relabel after taint (made here by the agent) cuts every pooled connection of the old label
/// before its next request.
async fn relay(
    tls: tokio_rustls::server::TlsStream<TcpStream>,
    instance: warden_core::InstanceStream,
    local: &dyn Instances,
    id: &str,
    label: &str,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut from_node, mut to_node) = tokio::io::split(tls);
    let (mut from_app, mut to_app) = tokio::io::split(instance);
    let down = async {
        let _ = tokio::io::copy(&mut from_app, &mut to_node).await;
        let _ = to_node.shutdown().await;
    };
    let up = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from_node.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if local.record(id).is_none_or(|r| r.label != label) {
                tracing::info!(instance = %id, label, "cut a node's connection: the instance serves another label now");
                break;
            }
            if to_app.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = to_app.shutdown().await;
    };
    // Whichever side ends first ends the joined connection.
    tokio::select! {
        () = down => {}
        () = up => {}
    }
}

/// Serves the node port on `listener` until `stop` turns true.
pub async fn serve(
    listener: TcpListener,
    tls: NodeTls,
    local: Arc<dyn Instances>,
    stats: Arc<NodePortStats>,
    mut stop: watch::Receiver<bool>,
) {
    let acceptor = TlsAcceptor::from(tls.server);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "node port accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = async { let _ = stop.wait_for(|s| *s).await; } => return,
        };
        let (acceptor, local, stats) = (acceptor.clone(), local.clone(), stats.clone());
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = handle(tcp, acceptor, &*local, &stats).await {
                tracing::debug!(%peer, error = %e, "node port connection ended");
            }
        });
    }
}

async fn handle(
    tcp: TcpStream,
    acceptor: TlsAcceptor,
    local: &dyn Instances,
    stats: &NodePortStats,
) -> std::io::Result<()> {
    let _ = tcp.set_nodelay(true);
    let mut tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            stats.refused.fetch_add(1, Ordering::Relaxed);
            tracing::info!(error = %e, "node port refused a connection: not a node of this cluster");
            return Ok(());
        }
        Err(_) => {
            stats.refused.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
    };
    stats.admitted.fetch_add(1, Ordering::Relaxed);
    let request: Request = tokio::time::timeout(HANDSHAKE_TIMEOUT, wire::read(&mut tls))
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    let reply = match request {
        Request::Connect { id, label } => {
            let Some(record) = local.record(&id).filter(|r| r.label == label) else {
                // Gone, or relabelled after taint: it serves nobody of `label` any more.
                return wire::write(&mut tls, &Reply::Err(InstanceError::UnknownInstance(id)))
                    .await;
            };
            let instance = match local.connect(&record).await {
                Ok(s) => s,
                Err(e) => {
                    let refused = InstanceError::Unavailable(format!(
                        "instance {id} refused the connection: {e}"
                    ));
                    return wire::write(&mut tls, &Reply::Err(refused)).await;
                }
            };
            if let warden_core::InstanceStream::Tcp(s) = &instance {
                // Requests arrive in TLS records, often several per request: without this,
                // Nagle holds the last piece back until the app's delayed ACK (40 ms).
                let _ = s.set_nodelay(true);
            }
            wire::write(&mut tls, &Reply::Ok).await?;
            stats.joined.fetch_add(1, Ordering::Relaxed);
            // The instance counts as busy while another node holds a connection to it.
            let _busy = local.activity(&id).map(|a| a.begin());
            relay(tls, instance, local, &id, &label).await;
            return Ok(());
        }
        Request::Ensure { spec, label, owner } => match local.ensure(&spec, &label, &owner).await {
            Ok(r) => Reply::Record(Box::new(r)),
            Err(e) => Reply::Err(e),
        },
        Request::Retire { id } => {
            local.retire(&id);
            Reply::Ok
        }
        Request::Relabel { id, label } => {
            local.relabel(&id, &label);
            Reply::Ok
        }
        Request::Kill { id } => match local.kill(&id).await {
            Ok(()) => Reply::Ok,
            Err(e) => Reply::Err(e),
        },
        Request::Logs { id, lines } => match local.logs(&id, lines) {
            Ok(t) => Reply::Text(t),
            Err(e) => Reply::Err(e),
        },
    };
    wire::write(&mut tls, &reply).await
}
