//! The scheduler: one agent node at a time decides how many instances of each app's label every
//! agent node keeps, and writes it as one record (`cluster/placement`); each agent then starts
//! and drains its own instances to match (the agent's `supervise::desired`).
//!
//! Why one elected scheduler rather than every agent claiming starts: placement is a decision
//! over the whole cluster (spread, load, drains, moves made before they break), and one writer
//! makes it once instead of every agent racing for it. Safety does not rest on the election:
//! the placement is written whole by compare-and-swap, so even two schedulers at once (a
//! partition, a slow hand-over) can never assign more than the desired count between them; at
//! worst they overwrite each other's choice of nodes. The record also carries the writer's
//! term, and a scheduler that sees a newer term stops writing.
//!
//! The election: `cluster/scheduler` is created under the node's lease by the first agent to
//! find it absent. It goes with the node's lease; but a lease lasts seconds, so an agent that
//! finds the holder's node port refusing connections (its process is gone) deletes the record
//! by compare-and-swap and takes over at once. The scheduler probes every agent node's port the
//! same way each round: a node whose port refuses is dead to it at once, well before its lease
//! ends, and its instances are placed elsewhere.
//!
//! Only a refusal counts: it comes from the node's own kernel, so the process is gone. A probe
//! that gets no answer proves nothing (the network between two nodes, or a node port whose
//! backlog a stranger filled); such a node stays as it is until its lease ends, so that no
//! partition and no flood of connections can make the scheduler evict a live node.

mod plan;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use warden_core::{
    keys, model::now_ms, AppHealth, AppSpec, DrainOrder, InstanceRecord, InstanceState, Lifetime,
    NodeRecord, Placement, SchedulerRecord,
};
use warden_store::{decode, CasOutcome, Store, StoreError};

use crate::node::Node;
pub use plan::Rules;
use plan::{NodeView, World};

/// How often the scheduler decides, and how often other agents check that it lives.
const ROUND: Duration = Duration::from_millis(250);
/// A node port that does not accept a connection within this is not answering.
const PROBE_TIMEOUT: Duration = Duration::from_millis(300);

/// The scheduler's thresholds as configured.
pub fn rules(start_margin: f64, shed_margin: f64) -> Rules {
    Rules {
        start_margin,
        shed_margin,
        move_timeout_ms: 30_000,
        move_pause_ms: 5_000,
        full: FULL,
    }
}

/// Load score from which a node has no room for another instance (its busiest resource,
/// memory, CPU or run queue per core, 85% used): below it, spreading a label's instances over
/// nodes wins over balancing load.
const FULL: f64 = 0.85;

/// One agent's part in scheduling: standing for election, and scheduling while elected.
pub struct Scheduler {
    store: Arc<dyn Store>,
    node: Arc<Node>,
    rules: Rules,
    stopping: watch::Receiver<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    Answers,
    Refuses,
    Silent,
}

// === impl Scheduler ===

impl Scheduler {
    /// The scheduler of the agent node `node`, with `rules`, until `stopping` turns true.
    pub fn new(
        store: Arc<dyn Store>,
        node: Arc<Node>,
        rules: Rules,
        stopping: watch::Receiver<bool>,
    ) -> Self {
        Self {
            store,
            node,
            rules,
            stopping,
        }
    }

    /// Stands for election and schedules while elected, until the agent stops.
    pub async fn run(self: Arc<Self>) {
        let mut stopping = self.stopping.clone();
        let mut elected: Option<u64> = None;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(ROUND) => {}
                _ = stopping.wait_for(|s| *s) => break,
            }
            match self.elect().await {
                Ok(Some(term)) => {
                    if elected != Some(term) {
                        tracing::info!(node = %self.node.id(), term, "this node schedules now");
                        elected = Some(term);
                    }
                    if let Err(e) = self.round(term).await {
                        tracing::warn!(error = %e, "a scheduling round failed");
                    }
                }
                Ok(None) => elected = None,
                Err(e) => tracing::debug!(error = %e, "standing for scheduler failed this round"),
            }
        }
        if let Some(term) = elected {
            // Hand over at once rather than when the lease ends.
            let _ = self
                .store
                .compare_and_swap(keys::SCHEDULER, Some(term), None, None)
                .await;
        }
    }

    /// The term (election revision) if this node is the scheduler now, taking the role when it
    /// is free or its holder is dead.
    async fn elect(&self) -> Result<Option<u64>, StoreError> {
        let me = self.node.id();
        let lease = self.node.lease();
        match self.store.get(keys::SCHEDULER).await? {
            None => {
                let record = SchedulerRecord {
                    node: me.to_owned(),
                    since_ms: now_ms(),
                };
                let bytes = serde_json::to_vec(&record).expect("a scheduler record serialises");
                match self
                    .store
                    .compare_and_swap(keys::SCHEDULER, None, Some(bytes), Some(lease))
                    .await?
                {
                    CasOutcome::Done(rev) => Ok(Some(rev)),
                    CasOutcome::Conflict { .. } => Ok(None),
                }
            }
            Some(e) => {
                let holder = decode::<SchedulerRecord>(&e.key, &e.value).ok();
                match holder {
                    Some(h) if h.node == me && e.lease == Some(lease) => Ok(Some(e.mod_revision)),
                    Some(h) if h.node != me && self.holder_lives(&h.node).await? => Ok(None),
                    // Dead, unreadable, or this node's from before it lost its lease.
                    _ => {
                        tracing::info!(holder = ?holder.map(|h| h.node), "the scheduler is gone; standing for it");
                        self.store
                            .compare_and_swap(keys::SCHEDULER, Some(e.mod_revision), None, None)
                            .await?;
                        Ok(None)
                    }
                }
            }
        }
    }

    async fn holder_lives(&self, node: &str) -> Result<bool, StoreError> {
        let Some(e) = self.store.get(&keys::node(node)).await? else {
            return Ok(false);
        };
        let Ok(record) = decode::<NodeRecord>(&e.key, &e.value) else {
            return Ok(true);
        };
        Ok(match &record.advertise {
            Some(addr) => probe(addr).await != Probe::Refuses,
            None => true,
        })
    }

    /// One scheduling round: look, plan, write the placement if it changed.
    async fn round(&self, term: u64) -> Result<(), StoreError> {
        let store = &*self.store;
        let current = store.get(keys::PLACEMENT).await?;
        let (placement, revision) = match &current {
            Some(e) => match decode::<Placement>(&e.key, &e.value) {
                Ok(p) => (p, Some(e.mod_revision)),
                Err(err) => {
                    // Rebuilding it from nothing would drain every node: leave it for an
                    // operator (or a scheduler of the version that wrote it).
                    tracing::warn!(error = %err, "the placement does not read; not scheduling");
                    return Ok(());
                }
            },
            None => (Placement::default(), None),
        };
        if placement.term > term {
            tracing::info!(
                term,
                newer = placement.term,
                "a newer scheduler wrote the placement; standing down"
            );
            return Ok(());
        }
        let world = self.look().await?;
        let mut next = plan::plan(&placement, &world);
        next.term = term;
        next.scheduler = self.node.id().to_owned();
        if next == placement {
            return Ok(());
        }
        for m in next.moves.iter().filter(|m| !placement.moves.contains(m)) {
            tracing::info!(app = %m.app, label = %m.label, from = %m.from, to = %m.to, why = ?m.why, "moving an instance");
        }
        let bytes = serde_json::to_vec(&next).expect("a placement serialises");
        match store
            .compare_and_swap(keys::PLACEMENT, revision, Some(bytes), None)
            .await?
        {
            CasOutcome::Done(_) => Ok(()),
            // Someone else wrote it meanwhile; the next round starts from theirs.
            CasOutcome::Conflict { .. } => Ok(()),
        }
    }

    /// What the scheduler sees now.
    async fn look(&self) -> Result<World, StoreError> {
        let store = &*self.store;
        let nodes: Vec<NodeRecord> = readable(store, keys::NODES).await?;
        let nodes: Vec<NodeRecord> = nodes.into_iter().filter(|n| n.runs_instances()).collect();
        let drains: BTreeSet<String> = store
            .list(keys::DRAINS)
            .await?
            .entries
            .iter()
            .filter(|e| decode::<DrainOrder>(&e.key, &e.value).is_ok())
            .filter_map(|e| keys::node_of_drain(&e.key).map(str::to_owned))
            .collect();
        let me = self.node.id();
        let probes = futures_util::future::join_all(nodes.iter().map(|n| async move {
            match (&n.advertise, n.id == me) {
                (Some(addr), false) => probe(addr).await,
                _ => Probe::Answers,
            }
        }))
        .await;
        let views = nodes
            .iter()
            .zip(probes)
            .map(|(n, p)| NodeView {
                id: n.id.clone(),
                alive: p != Probe::Refuses,
                draining: n.draining || drains.contains(&n.id),
                score: n.load.score(),
            })
            .collect();
        let apps: Vec<AppSpec> = readable(store, keys::APPS).await?;
        let desired = apps
            .iter()
            .filter(|a| a.lifetime == Lifetime::Shared)
            .flat_map(|a| {
                a.desired
                    .iter()
                    .filter(|(_, n)| **n > 0)
                    .map(|(l, n)| ((a.name.clone(), l.clone()), *n))
            })
            .collect();
        let mut ready = BTreeMap::new();
        for r in readable::<InstanceRecord>(store, keys::INSTANCES).await? {
            if r.kept && r.state == InstanceState::Ready && r.user.is_none() {
                *ready.entry((r.node, r.app, r.label)).or_insert(0) += 1;
            }
        }
        let mut crash_looping = BTreeSet::new();
        for e in store.list(keys::HEALTH).await?.entries {
            let Ok(h) = decode::<AppHealth>(&e.key, &e.value) else {
                continue;
            };
            let mut parts = e.key.split('/').skip(1);
            let (Some(app), Some(node)) = (parts.next(), parts.next()) else {
                continue;
            };
            for label in h
                .labels
                .iter()
                .filter(|(_, lh)| lh.crash_loop)
                .map(|(l, _)| l)
            {
                crash_looping.insert((node.to_owned(), app.to_owned(), label.clone()));
            }
        }
        Ok(World {
            desired,
            nodes: views,
            ready,
            crash_looping,
            now_ms: now_ms(),
            rules: self.rules,
        })
    }
}

/// Whether a node port accepts a TCP connection. The connection is closed before a byte is
/// sent; the node port takes that for a probe.
async fn probe(addr: &str) -> Probe {
    match tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(addr)).await {
        Ok(Ok(_)) => Probe::Answers,
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => Probe::Refuses,
        Ok(Err(_)) | Err(_) => Probe::Silent,
    }
}

/// The records under `prefix` that decode as `T`; others are skipped, so one unreadable record
/// does not stop scheduling.
pub async fn readable<T: serde::de::DeserializeOwned>(
    store: &dyn Store,
    prefix: &str,
) -> Result<Vec<T>, StoreError> {
    Ok(store
        .list(prefix)
        .await?
        .entries
        .iter()
        .filter_map(|e| decode::<T>(&e.key, &e.value).ok())
        .collect())
}
