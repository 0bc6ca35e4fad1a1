//! Draining this node: a drain order (`drains/<node>`, from `warden nodes drain` or from the
//! node itself when it gets SIGTERM) makes the node say so in its record, so that nothing new is
//! placed here; the scheduler moves the kept instances away (each stops once its replacement is
//! ready elsewhere), and once none is assigned here the rest drain too.

use std::time::Duration;

use warden_core::{keys, model::now_ms, DrainOrder, NodeRecord, Placement};
use warden_store::decode;

use super::Supervisor;
use crate::sync::lock;

/// How long a stopping node waits for its instances to move away before it stops them anyway.
pub(crate) const STOP_DRAIN_MAX: Duration = Duration::from_secs(30);

// === impl Supervisor (drain) ===

impl Supervisor {
    /// Reads this node's drain order, publishes a change, and once no kept instance is placed
    /// here any more, drains what is left.
    pub(super) async fn follow_drain_order(&self) {
        let order = match self.store.get(&keys::drain(self.node.id())).await {
            Ok(e) => e.is_some_and(|e| decode::<DrainOrder>(&e.key, &e.value).is_ok()),
            Err(_) => return,
        };
        if self.node.set_draining(order) {
            tracing::info!(node = %self.node.id(), draining = order, "drain order changed");
            if let Err(e) = self.node.publish(self.life.count()).await {
                tracing::warn!(error = %e, "publishing the node's drain state failed");
            }
        }
        if !order {
            return;
        }
        let nothing_placed = lock(&self.placement)
            .as_ref()
            .is_none_or(|p: &Placement| p.nodes.get(self.node.id()).is_none_or(|a| a.is_empty()));
        if nothing_placed {
            for id in self.life.undrained() {
                self.life.drain_soon(id);
            }
        }
    }
}

/// Before a stopping agent stops its instances: if another agent node can take them, gives
/// this node a drain order (under its lease, so it goes with the node) and waits, at most
/// [`STOP_DRAIN_MAX`], until its instances have moved away.
pub(crate) async fn drain_before_stop(
    store: &dyn warden_store::Store,
    node: &warden_cluster::node::Node,
    life: &crate::lifecycle::Lifecycle,
) {
    if life.count() == 0 {
        return;
    }
    let others = match store.list(keys::NODES).await {
        Ok(l) => l
            .entries
            .iter()
            .filter_map(|e| decode::<NodeRecord>(&e.key, &e.value).ok())
            .any(|n| n.id != node.id() && n.runs_instances() && !n.draining),
        Err(_) => false,
    };
    if !others {
        return;
    }
    let order = DrainOrder {
        since_ms: now_ms(),
        reason: "stopping".into(),
    };
    // Only if the operator gave none: theirs stays across this stop (it has no lease), where
    // this one goes with the node.
    let bytes = serde_json::to_vec(&order).expect("a drain order serialises");
    match store
        .compare_and_swap(
            &keys::drain(node.id()),
            None,
            Some(bytes),
            Some(node.lease()),
        )
        .await
    {
        Ok(_) => {}
        Err(_) => return,
    }
    tracing::info!(node = %node.id(), "stopping: moving instances to other nodes first");
    let deadline = tokio::time::Instant::now() + STOP_DRAIN_MAX;
    while life.count() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
