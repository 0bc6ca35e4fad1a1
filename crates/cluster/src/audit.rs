//! A cluster's audit logs read and verified together. Each node keeps its own log (under its
//! data dir, anchored at `audit/anchors/<node>`); [`ClusterAudit`] is the `Audit` an API uses on
//! a cluster: it records into this node's log, and reads and verifies every node's, this
//! node's locally and the others' over their node ports (`Request::Audit`, `AuditVerify`).
//!
//! Node joins and losses are recorded by every node that sees them ([`watch_nodes`]), in its
//! own log: a transition is in the log of each node that was up to see it, and a record says
//! both which node saw it (the record's `node`) and which node joined or was lost (the event's).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::sync::watch;
use warden_core::audit::{
    Audit, AuditError, AuditFuture, AuditStats, DurableFuture, Event, NodeEvent, Problem, Query,
    Record, Verified,
};
use warden_core::NodeRecord;
use warden_store::Store;

use crate::wire::{self, Reply, Request};
use crate::{Directory, NodeClient};

/// Records one query answers by default, and at most (a node port reply is bounded by it).
const DEFAULT_LIMIT: usize = 1000;
/// The most records one query answers.
pub const MAX_LIMIT: usize = 10_000;
/// Largest piece of records in one frame (a frame is at most 1 MiB of JSON).
const MAX_PIECE: usize = 256 << 10;
/// Time another node gets to answer a query.
const QUERY_TIMEOUT: Duration = Duration::from_secs(30);
/// Time another node gets to walk its log (it reads every segment).
const VERIFY_TIMEOUT: Duration = Duration::from_secs(300);
/// How often the live nodes are compared with the last view, for join and loss records.
const WATCH_EVERY: Duration = Duration::from_millis(500);
/// Where anchors are kept in the store, one key per node.
const ANCHORS: &str = "audit/anchors/";

/// This node's audit log, and every other node's through the node port.
pub struct ClusterAudit {
    me: String,
    local: Arc<dyn Audit>,
    client: NodeClient,
    nodes: Directory,
    store: Arc<dyn Store>,
}

// === impl ClusterAudit ===

impl ClusterAudit {
    /// Node `me`'s log `local`, and the logs of the live `nodes` reached with `client`; the
    /// anchors in `store` name the nodes that kept a log.
    pub fn new(
        me: String,
        local: Arc<dyn Audit>,
        client: NodeClient,
        nodes: Directory,
        store: Arc<dyn Store>,
    ) -> Self {
        Self {
            me,
            local,
            client,
            nodes,
            store,
        }
    }

    /// The node port of live node `id`, or why it has none.
    fn addr(&self, id: &str) -> Result<String, String> {
        match self.nodes.get(id) {
            None => Err("it is not live (no node record in the store)".into()),
            Some(NodeRecord {
                advertise: Some(a), ..
            }) => Ok(a),
            Some(_) => Err(
                "it advertises no node port (a node of an older warden): ask its own API, or upgrade it".into(),
            ),
        }
    }

    /// One node's records for `q`.
    async fn query_node(&self, id: &str, q: Query) -> Result<Vec<Record>, AuditError> {
        if id == self.me {
            return self.local.query(q).await;
        }
        let unreachable =
            |why: String| AuditError::Read(format!("node {id}'s log cannot be read: {why}"));
        let addr = self.addr(id).map_err(unreachable)?;
        let limit = q.limit.unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT);
        let exchange = async {
            let mut s = self.client.open(&addr).await?;
            wire::write(&mut s, &Request::Audit { query: q }).await?;
            let mut out = Vec::new();
            loop {
                match wire::read::<Reply>(&mut s).await? {
                    Reply::Text(piece) => {
                        for line in piece.lines().filter(|l| !l.is_empty()) {
                            let r: Record = serde_json::from_str(line)
                                .map_err(|e| std::io::Error::other(format!("a bad record: {e}")))?;
                            out.push(r);
                        }
                        if out.len() > limit {
                            return Err(std::io::Error::other("it sent more records than asked"));
                        }
                    }
                    Reply::Ok => return Ok(Ok(out)),
                    Reply::Refused { message, .. } => return Ok(Err(message)),
                    other => return Err(std::io::Error::other(format!("it sent {other:?}"))),
                }
            }
        };
        match tokio::time::timeout(QUERY_TIMEOUT, exchange).await {
            Err(_) => Err(unreachable("no answer".into())),
            Ok(Err(e)) => Err(unreachable(e.to_string())),
            Ok(Ok(Err(refused))) => Err(AuditError::Read(format!("node {id}: {refused}"))),
            Ok(Ok(Ok(records))) => Ok(records),
        }
    }

    /// Every live node's records for `q`, merged by time; the newest `limit`, then for each
    /// live node whose log could not be read a notice saying so (none skipped silently).
    async fn query_all(&self, q: Query) -> Result<Vec<Record>, AuditError> {
        if q.after.is_some() {
            // Sequence numbers are per node: a cursor means nothing across nodes.
            return Err(AuditError::Invalid(
                "on a cluster, `after` needs `node` (sequence numbers are per node's log); ask node by node, e.g. ?node=<name>&after=<seq>".into(),
            ));
        }
        let limit = q.limit.unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT);
        let ids = self.live_ids();
        let asks = ids.iter().map(|id| self.query_node(id, q.clone()));
        let (mut all, mut unread) = (Vec::new(), Vec::new());
        for (id, answer) in ids.iter().zip(futures_util::future::join_all(asks).await) {
            match answer {
                Ok(records) => all.extend(records),
                // This node's own log unreadable is the answer's failure.
                Err(e) if *id == self.me => return Err(e),
                Err(e) => unread.push(unread_notice(id, &self.me, &e)),
            }
        }
        all.sort_by(|a, b| (a.at_ms, &a.node, a.seq).cmp(&(b.at_ms, &b.node, b.seq)));
        let skip = all.len().saturating_sub(limit);
        all.drain(..skip);
        // Last, whatever the filter: the answer says which logs it lacks, never silently.
        all.extend(unread);
        Ok(all)
    }

    /// The live nodes, this one among them.
    fn live_ids(&self) -> BTreeSet<String> {
        let mut ids: BTreeSet<String> = self.nodes.all().into_iter().map(|n| n.id).collect();
        ids.insert(self.me.clone());
        ids
    }

    /// One node's log checked, or why it could not be: never an error, a `Verified` not ok.
    async fn verify_node(&self, id: &str) -> Verified {
        if id == self.me {
            return self
                .local
                .verify()
                .await
                .unwrap_or_else(|e| not_checked(id, "unreadable", e.to_string()));
        }
        let addr = match self.addr(id) {
            Ok(a) => a,
            Err(why) => return not_checked(id, "unreachable", format!("node {id}: {why}")),
        };
        let exchange = async {
            let mut s = self.client.open(&addr).await?;
            wire::write(&mut s, &Request::AuditVerify).await?;
            wire::read::<Reply>(&mut s).await
        };
        let unreachable = |why: String| {
            not_checked(
                id,
                "unreachable",
                format!("node {id} could not be reached at {addr}: {why}; check it is up, or verify its log on its machine"),
            )
        };
        match tokio::time::timeout(VERIFY_TIMEOUT, exchange).await {
            Err(_) => unreachable("no answer".into()),
            Ok(Err(e)) => unreachable(e.to_string()),
            Ok(Ok(Reply::Verified(v))) => *v,
            Ok(Ok(Reply::Refused { message, .. })) => not_checked(id, "unreadable", message),
            Ok(Ok(other)) => unreachable(format!("it sent {other:?}")),
        }
    }

    /// Every node's log: the live ones checked, and each node with an anchor in the store that
    /// is not live reported as not checked.
    async fn verify_every(&self) -> Result<Vec<Verified>, AuditError> {
        let live = self.live_ids();
        let listing =
            self.store.list(ANCHORS).await.map_err(|e| {
                AuditError::Read(format!("cannot list the anchors in the store: {e}"))
            })?;
        let mut out =
            futures_util::future::join_all(live.iter().map(|id| self.verify_node(id))).await;
        for e in &listing.entries {
            let Some(id) = e.key.strip_prefix(ANCHORS) else {
                continue;
            };
            if live.contains(id) {
                continue;
            }
            let anchor_seq = serde_json::from_slice::<serde_json::Value>(&e.value)
                .ok()
                .and_then(|v| v["seq"].as_u64());
            let mut v = not_checked(
                id,
                "not live",
                format!(
                    "node {id} kept an audit log (anchored in the store at seq {}) but is not live now, so it cannot be reached: its log stays on its machine under <its data dir>/audit; start it again and verify (`warden audit verify --stopped` reads only a single node's data dir today)", anchor_seq.map_or("?".into(), |s| s.to_string())
                ),
            );
            v.anchor_seq = anchor_seq;
            out.push(v);
        }
        out.sort_by(|a, b| a.node.cmp(&b.node));
        Ok(out)
    }
}

/// Said in a merged answer for live node `id` whose log `me` could not read: a `gap` record
/// of `id` with seq 0 (no record of a log has it) and no hash, so no reader takes it for one of
/// the log's own.
fn unread_notice(id: &str, me: &str, e: &AuditError) -> Record {
    Record {
        seq: 0,
        at_ms: warden_core::model::now_ms(),
        node: id.to_owned(),
        event: Event::Gap {
            why: format!("not in this answer (read through node {me}): {e}"),
            lost: None,
        },
        prev: String::new(),
        hash: String::new(),
    }
}

/// A node's log that could not be checked, and why.
fn not_checked(node: &str, what: &str, detail: String) -> Verified {
    Verified {
        node: node.to_owned(),
        ok: false,
        records: 0,
        head_seq: 0,
        anchor_seq: None,
        problem: Some(Problem {
            file: String::new(),
            line: 0,
            seq: None,
            what: what.to_owned(),
            detail,
        }),
    }
}

impl Audit for ClusterAudit {
    fn record(&self, e: Event) {
        self.local.record(e);
    }
    fn record_durable(&self, e: Event) -> DurableFuture {
        self.local.record_durable(e)
    }
    fn kept(&self) -> bool {
        self.local.kept()
    }
    fn health(&self) -> Result<(), String> {
        self.local.health()
    }
    fn required(&self) -> bool {
        self.local.required()
    }
    fn refusing(&self) -> Option<String> {
        self.local.refusing()
    }
    fn digest(&self, body: &[u8]) -> String {
        self.local.digest(body)
    }
    fn stats(&self) -> AuditStats {
        self.local.stats()
    }
    fn query(&self, q: Query) -> AuditFuture<'_, Vec<Record>> {
        Box::pin(async move {
            match q.node.clone() {
                Some(id) => self.query_node(&id, q).await,
                None => self.query_all(q).await,
            }
        })
    }
    fn verify(&self) -> AuditFuture<'_, Verified> {
        self.local.verify()
    }
    fn verify_all(&self) -> AuditFuture<'_, Vec<Verified>> {
        Box::pin(self.verify_every())
    }
}

/// Answers `Request::Audit`: this node's records for `q` as JSON lines in `Text` pieces, then
/// `Ok`; at most [`MAX_LIMIT`] of them.
pub(crate) async fn serve_query(
    mut tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    audit: &dyn Audit,
    mut q: Query,
) -> std::io::Result<()> {
    q.limit = Some(q.limit.unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT));
    let records = match audit.query(q).await {
        Ok(r) => r,
        Err(e) => {
            let refused = Reply::Refused {
                status: 503,
                message: e.to_string(),
            };
            return wire::write(&mut tls, &refused).await;
        }
    };
    let mut piece = String::new();
    for r in &records {
        piece += &serde_json::to_string(r).map_err(std::io::Error::other)?;
        piece.push('\n');
        if piece.len() >= MAX_PIECE {
            wire::write(&mut tls, &Reply::Text(std::mem::take(&mut piece))).await?;
        }
    }
    if !piece.is_empty() {
        wire::write(&mut tls, &Reply::Text(piece)).await?;
    }
    wire::write(&mut tls, &Reply::Ok).await?;
    tls.shutdown().await
}

/// Answers `Request::AuditVerify`: this node's log checked.
pub(crate) async fn serve_verify(audit: &dyn Audit) -> Reply {
    match audit.verify().await {
        Ok(v) => Reply::Verified(Box::new(v)),
        Err(e) => Reply::Refused {
            status: 503,
            message: e.to_string(),
        },
    }
}

/// Records in `audit` (node `me`'s log) every other node that joins the live nodes or leaves
/// them (its lease ended or it stopped), once per transition as this node sees it, until
/// `stop`. The nodes live when it starts are its baseline: a restart records no joins.
pub async fn watch_nodes(
    me: String,
    nodes: Directory,
    audit: Arc<dyn Audit>,
    mut stop: watch::Receiver<bool>,
) {
    let ids = |nodes: &Directory| -> BTreeSet<String> {
        nodes
            .all()
            .into_iter()
            .map(|n| n.id)
            .filter(|id| *id != me)
            .collect()
    };
    let mut seen = ids(&nodes);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(WATCH_EVERY) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let now = ids(&nodes);
        let joined = now.difference(&seen).map(|id| (id, NodeEvent::Joined));
        let lost = seen.difference(&now).map(|id| (id, NodeEvent::Lost));
        for (id, event) in joined.chain(lost) {
            tracing::info!(node = %id, ?event, "a node joined or was lost");
            audit.record(Event::Node {
                event,
                node: Some(id.clone()),
            });
        }
        seen = now;
    }
}
