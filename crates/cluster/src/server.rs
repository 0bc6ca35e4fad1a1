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
use warden_core::audit::Audit;
use warden_core::builds::slug_files;
use warden_core::{keys, AppSpec, InstanceAdmin, InstanceError, Releases, Unavailable};
use warden_store::{get_json, Store};

use crate::pending::Pending;
use crate::releases::{serve_release, serve_release_log};
use crate::wire::{self, Reply, Request};
use crate::NodeTls;

/// Time a client gets to finish its handshake: no longer than a node waits for it itself, so
/// a stranger that never finishes goes as soon as it can.
const HANDSHAKE_TIMEOUT: Duration = crate::client::CONNECT_TIMEOUT;
/// Unfinished handshakes at once; beyond, the oldest is shed to make room (see `pending`):
/// new connections never wait for a stranger's to end.
const MAX_HANDSHAKES: usize = 1024;
/// Time an admitted node gets to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Admitted node port connections open at once; beyond, new ones are closed.
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
    /// Connections closed before their first byte: liveness probes.
    pub probes: AtomicU64,
    /// Unfinished handshakes closed to make room for newer ones (a flood of connections).
    pub shed: AtomicU64,
}

impl NodePortStats {
    /// The counters in Prometheus' text format.
    pub fn render(&self) -> String {
        let mut out = String::from(
            "# HELP warden_node_port_connections_total Node port connections by outcome: admitted (mutual TLS passed), refused (not a node of this cluster), joined (to an instance), probe (closed before a byte: a liveness probe), shed (handshake unfinished, closed to make room for newer ones).\n\
             # TYPE warden_node_port_connections_total counter\n",
        );
        for (outcome, n) in [
            ("admitted", &self.admitted),
            ("refused", &self.refused),
            ("joined", &self.joined),
            ("probe", &self.probes),
            ("shed", &self.shed),
        ] {
            out += &format!(
                "warden_node_port_connections_total{{outcome=\"{outcome}\"}} {}\n",
                n.load(Ordering::Relaxed)
            );
        }
        out
    }
}

/// How often a joined connection checks that its instance still serves its label, when no
/// byte passes: a relabel after taint closes it within this, so that no gateway reuses it.
const LABEL_CHECK: Duration = Duration::from_millis(100);

/// How long a draining instance's connection must carry nothing, its last request answered,
/// before it counts as idle and closes.
const DRAIN_IDLE: Duration = Duration::from_secs(1);

/// What a joined connection may still carry.
#[derive(PartialEq, Eq)]
enum Serves {
    /// Requests of its label.
    Yes,
    /// Nothing new: the instance is draining. Answers still in flight finish.
    Draining,
    /// Nothing at all: gone, or relabelled after taint.
    No,
}

fn serves(local: &dyn InstanceAdmin, id: &str, label: &str) -> Serves {
    match local.record(id) {
        Some(r) if r.label != label => Serves::No,
        Some(r) if r.state == warden_core::InstanceState::Draining => Serves::Draining,
        Some(_) => Serves::Yes,
        None => Serves::No,
    }
}

/// Carries bytes between a joined node and the instance until either side closes, or until
/// the instance no longer serves `label`: a gateway's bytes reach it only while it does, and a
/// relabel after taint (made here by the agent) closes every connection of the old label,
/// idle ones within [`LABEL_CHECK`] (the gateway's pool then drops them), busy ones before
/// the next byte of a request. A draining instance's connection closes once it is idle (its
/// last request answered and nothing carried for [`DRAIN_IDLE`]), so that the drain does not
/// wait for a gateway that keeps its pooled connection open.
async fn relay(
    tls: tokio_rustls::server::TlsStream<TcpStream>,
    instance: warden_core::InstanceStream,
    local: &dyn InstanceAdmin,
    id: &str,
    label: &str,
) {
    use std::sync::atomic::AtomicU64;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut from_node, mut to_node) = tokio::io::split(tls);
    let (mut from_app, mut to_app) = tokio::io::split(instance);
    // Bytes carried each way: a connection is idle when the last bytes went down.
    let (up_at, down_at) = (AtomicU64::new(0), AtomicU64::new(0));
    let tick = AtomicU64::new(0);
    let down = async {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from_app.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            down_at.store(tick.fetch_add(1, Ordering::Relaxed) + 1, Ordering::Relaxed);
            if to_node.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = to_node.shutdown().await;
    };
    let up = async {
        let mut buf = vec![0u8; 16 * 1024];
        let mut check = tokio::time::interval(LABEL_CHECK);
        // Bytes last seen at a check, and since when none passed.
        let (mut seen, mut quiet_since) = (0, tokio::time::Instant::now());
        loop {
            let read = tokio::select! {
                r = from_node.read(&mut buf) => r,
                _ = check.tick() => {
                    let now = tick.load(Ordering::Relaxed);
                    if now != seen {
                        (seen, quiet_since) = (now, tokio::time::Instant::now());
                    }
                    let answered = up_at.load(Ordering::Relaxed) <= down_at.load(Ordering::Relaxed);
                    match serves(local, id, label) {
                        Serves::Yes => continue,
                        Serves::Draining if !answered || quiet_since.elapsed() < DRAIN_IDLE => continue,
                        _ => break,
                    }
                }
            };
            let n = match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            // A new request on a draining instance's connection is let through only if the
            // gateway sent it before it knew; the gateway closes its pooled connections when
            // the record says `draining`, and this one closes at the next idle check.
            if serves(local, id, label) == Serves::No {
                break;
            }
            up_at.store(tick.fetch_add(1, Ordering::Relaxed) + 1, Ordering::Relaxed);
            if to_app.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        if serves(local, id, label) == Serves::No {
            tracing::info!(instance = %id, label, "closed a node's connection: the instance serves another label now");
        }
        let _ = to_app.shutdown().await;
    };
    // Whichever side ends first ends the joined connection.
    tokio::select! {
        () = down => {}
        () = up => {}
    }
}

/// Serves the node port on `listener` until `stop` turns true. App specs of start requests
/// are read from `store`, never taken from the asking node.
#[allow(clippy::too_many_arguments)]
pub async fn serve(
    listener: TcpListener,
    tls: NodeTls,
    local: Arc<dyn InstanceAdmin>,
    store: Arc<dyn Store>,
    stats: Arc<NodePortStats>,
    slugs: Option<std::path::PathBuf>,
    releases: Option<Arc<dyn Releases>>,
    audit: Arc<dyn Audit>,
    mut stop: watch::Receiver<bool>,
) {
    let slugs = Arc::new(slugs);
    let acceptor = TlsAcceptor::from(tls.server);
    // Unfinished handshakes are bounded by shedding the oldest, never by waiting: the accept
    // loop takes every connection at once, so a stranger's cannot hold a peer's back.
    let pending = Pending::new(MAX_HANDSHAKES);
    let admitted = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
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
        let (entry, shed) = pending.enter();
        stats.shed.fetch_add(shed as u64, Ordering::Relaxed);
        let (acceptor, local, store, stats, admitted, slugs, releases, audit) = (
            acceptor.clone(),
            local.clone(),
            store.clone(),
            stats.clone(),
            admitted.clone(),
            slugs.clone(),
            releases.clone(),
            audit.clone(),
        );
        tokio::spawn(async move {
            // Shed (`None`) or refused: the connection closes here.
            let Some(Some(tls)) = entry.run(handshake(tcp, acceptor, &stats)).await else {
                return;
            };
            let Ok(_permit) = admitted.try_acquire_owned() else {
                tracing::warn!(%peer, "node port full: {MAX_CONNECTIONS} connections open");
                return;
            };
            let ends = Ends {
                local: &*local,
                store: &*store,
                stats: &stats,
                slugs: slugs.as_deref(),
                releases: releases.as_ref(),
                audit: &*audit,
            };
            if let Err(e) = handle(tls, ends).await {
                tracing::debug!(%peer, error = %e, "node port connection ended");
            }
        });
    }
}

async fn handshake(
    tcp: TcpStream,
    acceptor: TlsAcceptor,
    stats: &NodePortStats,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    let _ = tcp.set_nodelay(true);
    // One deadline for the first byte and the handshake together: a silent stranger stays no
    // longer than one that sends.
    let deadline = tokio::time::Instant::now() + HANDSHAKE_TIMEOUT;
    // A connection closed before its first byte is a liveness probe (the scheduler's): no
    // stranger to count or log.
    let mut first = [0u8; 1];
    match tokio::time::timeout_at(deadline, tcp.peek(&mut first)).await {
        Ok(Ok(0)) => {
            stats.probes.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        Ok(Ok(_)) => {}
        Ok(Err(_)) | Err(_) => {
            stats.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
    }
    match tokio::time::timeout_at(deadline, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => {
            stats.admitted.fetch_add(1, Ordering::Relaxed);
            Some(tls)
        }
        Ok(Err(e)) => {
            stats.refused.fetch_add(1, Ordering::Relaxed);
            tracing::info!(error = %e, "node port refused a connection: not a node of this cluster");
            None
        }
        Err(_) => {
            stats.refused.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// What a node port connection's requests reach on this node.
struct Ends<'a> {
    local: &'a dyn InstanceAdmin,
    store: &'a dyn Store,
    stats: &'a NodePortStats,
    slugs: Option<&'a std::path::Path>,
    releases: Option<&'a Arc<dyn Releases>>,
    audit: &'a dyn Audit,
}

async fn handle(
    mut tls: tokio_rustls::server::TlsStream<TcpStream>,
    ends: Ends<'_>,
) -> std::io::Result<()> {
    let Ends {
        local,
        store,
        stats,
        slugs,
        releases,
        audit,
    } = ends;
    // A peer's pings share one connection: each is answered, then the next request is read.
    let request = loop {
        let next: Request = tokio::time::timeout(REQUEST_TIMEOUT, wire::read(&mut tls))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        match next {
            // A peer that stops reading holds no permit for long.
            Request::Ping => {
                tokio::time::timeout(REQUEST_TIMEOUT, wire::write(&mut tls, &Reply::Ok))
                    .await
                    .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??
            }
            other => break other,
        }
    };
    let reply = match request {
        Request::Ping => Reply::Ok,
        Request::Connect { id, label } => {
            let Some(record) = local
                .record(&id)
                .filter(|r| r.label == label && r.state != warden_core::InstanceState::Draining)
            else {
                // Gone, relabelled after taint, or draining: it takes nothing new of `label`.
                return wire::write(&mut tls, &Reply::Err(InstanceError::UnknownInstance(id)))
                    .await;
            };
            let instance = match local.connect(&record).await {
                Ok(s) => s,
                Err(e) => {
                    let refused = InstanceError::unavailable(
                        Unavailable::Unreachable,
                        format!("instance {id} refused the connection: {e}"),
                    );
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
        Request::Ensure { spec, label, owner } => {
            // The app as the store says, not as the asking node says: a node may ask for a
            // start, never choose what runs.
            match get_json::<AppSpec>(store, &keys::app_spec(&spec.name)).await {
                Ok(Some((spec, _))) => match local.ensure(&spec, &label, &owner).await {
                    Ok(r) => Reply::Record(Box::new(r)),
                    Err(e) => Reply::Err(e),
                },
                Ok(None) => Reply::Err(InstanceError::UnknownApp(spec.name)),
                Err(e) => Reply::Err(InstanceError::unavailable(
                    Unavailable::Store,
                    format!(
                        "node cannot read app {}'s spec from the store: {e}",
                        spec.name
                    ),
                )),
            }
        }
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
        Request::Slug { id } => return send_slug(tls, slugs, &id).await,
        Request::Release { ask } => return serve_release(tls, releases, ask).await,
        Request::ReleaseLog { app, number } => {
            return serve_release_log(tls, releases, &app, number).await
        }
        Request::Audit { query } => return crate::audit::serve_query(tls, audit, query).await,
        Request::AuditVerify => crate::audit::serve_verify(audit).await,
    };
    wire::write(&mut tls, &reply).await
}

/// Sends the archive of slug `id` (complete on this node: its digest file is written last),
/// or says this node has none.
async fn send_slug(
    mut tls: tokio_rustls::server::TlsStream<TcpStream>,
    slugs: Option<&std::path::Path>,
    id: &str,
) -> std::io::Result<()> {
    let home = slugs
        .filter(|_| warden_core::model::is_slug_id(id))
        .map(|s| s.join(id));
    let file = match &home {
        Some(h) if h.join(slug_files::DIGEST).is_file() => {
            tokio::fs::File::open(h.join(slug_files::ARCHIVE))
                .await
                .ok()
        }
        _ => None,
    };
    let Some(mut file) = file else {
        let none = InstanceError::unavailable(
            Unavailable::NotHere,
            format!("slug {id} is not on this node"),
        );
        return wire::write(&mut tls, &Reply::Err(none)).await;
    };
    let size = file.metadata().await?.len();
    wire::write(&mut tls, &Reply::Blob { size }).await?;
    let sent = tokio::io::copy(&mut file, &mut tls).await?;
    tokio::io::AsyncWriteExt::shutdown(&mut tls).await?;
    tracing::info!(slug = %id, bytes = sent, "sent a slug to another node");
    Ok(())
}
