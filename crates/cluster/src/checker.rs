//! The checker (seed 003's G23): it probes every instance record through its node's port and
//! removes the records of instances that are gone, so that no gateway keeps routing to them.
//!
//! A record is removed only on a definite answer: its node is not live (no node record), or its
//! node's port says the instance is not there (or no longer serves its label, or refuses its
//! connection). A node that does not answer is left alone: its lease ends its records if it is
//! dead. Removal is a compare-and-swap on the record's revision, so several checkers never
//! fight, and a record rewritten since the probe (a restart, a relabel) is never removed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use warden_core::{keys, InstanceRecord, InstanceState};
use warden_store::{decode, CasOutcome, Store};

use crate::{Directory, NodeClient};

/// How often every record is probed.
pub const CHECK_EVERY: Duration = Duration::from_secs(2);
/// Longest a probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// What the checker found, for metrics and tests.
#[derive(Debug, Default)]
pub struct CheckerStats {
    /// Probes that reached the instance.
    pub alive: AtomicU64,
    /// Probes that found it gone.
    pub dead: AtomicU64,
    /// Probes whose node did not answer.
    pub unreachable: AtomicU64,
    /// Records removed.
    pub removed: AtomicU64,
}

impl CheckerStats {
    /// The counters in Prometheus' text format.
    pub fn render(&self) -> String {
        let mut out = String::from(
            "# HELP warden_checker_probes_total Instance records probed by the checker, by outcome.\n\
             # TYPE warden_checker_probes_total counter\n",
        );
        for (outcome, n) in [
            ("alive", &self.alive),
            ("dead", &self.dead),
            ("unreachable", &self.unreachable),
        ] {
            out += &format!(
                "warden_checker_probes_total{{outcome=\"{outcome}\"}} {}\n",
                n.load(Ordering::Relaxed)
            );
        }
        out += &format!(
            "# HELP warden_checker_removed_total Records of dead instances the checker removed.\n\
             # TYPE warden_checker_removed_total counter\nwarden_checker_removed_total {}\n",
            self.removed.load(Ordering::Relaxed)
        );
        out
    }
}

/// What one probe found.
#[derive(Debug, PartialEq, Eq)]
enum Probe {
    Alive,
    Dead,
    Unreachable,
}

/// The checker of one node.
pub struct Checker {
    store: Arc<dyn Store>,
    client: NodeClient,
    nodes: Directory,
    stats: Arc<CheckerStats>,
}

impl Checker {
    /// A checker probing through `client`'s node identity.
    pub fn new(
        store: Arc<dyn Store>,
        client: NodeClient,
        nodes: Directory,
        stats: Arc<CheckerStats>,
    ) -> Self {
        Self {
            store,
            client,
            nodes,
            stats,
        }
    }

    /// Probes every record each [`CHECK_EVERY`] until `stop` turns true.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        loop {
            if let Err(e) = self.round().await {
                tracing::warn!(error = %e, "a checker round failed");
            }
            tokio::select! {
                _ = tokio::time::sleep(CHECK_EVERY) => {}
                _ = async { let _ = stop.wait_for(|s| *s).await; } => return,
            }
        }
    }

    /// One pass over every instance record.
    pub async fn round(&self) -> Result<(), warden_store::StoreError> {
        let listing = self.store.list(keys::INSTANCES).await?;
        for e in &listing.entries {
            let Ok(r) = decode::<InstanceRecord>(&e.key, &e.value) else {
                continue;
            };
            // A start in progress is not listening yet; a spare waits to be handed out.
            if r.state != InstanceState::Ready {
                continue;
            }
            let outcome = self.probe(&r).await;
            let counter = match outcome {
                Probe::Alive => &self.stats.alive,
                Probe::Dead => &self.stats.dead,
                Probe::Unreachable => &self.stats.unreachable,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            if outcome == Probe::Dead {
                if let CasOutcome::Done(_) = self
                    .store
                    .compare_and_swap(&e.key, Some(e.mod_revision), None, None)
                    .await?
                {
                    self.stats.removed.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(instance = %r.id, app = %r.app, node = %r.node, "removed the record of a dead instance");
                }
            }
        }
        Ok(())
    }

    async fn probe(&self, r: &InstanceRecord) -> Probe {
        let Some(node) = self.nodes.get(&r.node) else {
            return Probe::Dead;
        };
        let Some(addr) = node.advertise else {
            // A node without a node port runs no instances of a cluster: nothing to ask.
            return Probe::Unreachable;
        };
        match tokio::time::timeout(PROBE_TIMEOUT, self.client.probe(&addr, &r.id, &r.label)).await {
            Ok(Ok(true)) => Probe::Alive,
            // The node answered: it has no such instance serving this label.
            Ok(Ok(false)) => Probe::Dead,
            _ => Probe::Unreachable,
        }
    }
}
