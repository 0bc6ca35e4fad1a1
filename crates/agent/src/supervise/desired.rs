//! Desired counts kept across nodes (seed 003 §3.3.2): every tick compares each app's desired
//! count per label with the shared instances the store lists on all nodes. A missing instance
//! is started by the node whose load is lowest (nodes above the mean by a margin start none);
//! a surplus kept instance is stopped by the node running most of them.

use std::collections::BTreeMap;

use warden_core::keys;
use warden_core::{AppSpec, InstanceRecord, InstanceState, Lifetime, NodeRecord, Owner};
use warden_store::decode;

use super::Supervisor;
use crate::lifecycle::Purpose;
use crate::restarts::LabelKey;
use crate::AgentError;

/// A node whose load score is above the cluster mean by more than this starts no instances.
const LOAD_MARGIN: f64 = 0.1;

// === impl Supervisor (desired counts) ===

impl Supervisor {
    pub(super) async fn keep_desired(&self, apps: &[AppSpec]) -> Result<(), AgentError> {
        let store = &*self.store;
        let apps: Vec<&AppSpec> = apps
            .iter()
            .filter(|a| !a.desired.is_empty() && a.lifetime == Lifetime::Shared)
            .collect();
        if apps.is_empty() {
            return Ok(());
        }
        let instances: Vec<InstanceRecord> = list_readable(store, keys::INSTANCES).await?;
        let mut nodes: Vec<NodeRecord> = list_readable(store, keys::NODES).await?;
        nodes.retain(NodeRecord::runs_instances);
        let me = self.node.id();
        let local: Vec<InstanceRecord> = self.life.instances();
        for spec in &apps {
            for (label, &want) in &spec.desired {
                let key = (spec.name.clone(), label.clone());
                let serving = |r: &&InstanceRecord| {
                    r.app == spec.name
                        && r.label == *label
                        && r.lifetime == Lifetime::Shared
                        && r.owner.is_none()
                        && r.state != InstanceState::Spare
                };
                let remote: Vec<&InstanceRecord> = instances
                    .iter()
                    .filter(serving)
                    .filter(|r| r.node != me)
                    .collect();
                let mine: Vec<&InstanceRecord> = local.iter().filter(serving).collect();
                let have = remote.len() + mine.len() + self.restarts.pending(&key) as usize;
                let want = want as usize;
                if have < want {
                    if self.restarts.may_start(&key) && placement_target(&nodes, me) {
                        self.start_kept(spec, key);
                    }
                } else if have > want {
                    let kept: Vec<&&InstanceRecord> = mine.iter().filter(|r| r.kept).collect();
                    if let Some(victim) = kept.iter().max_by_key(|r| r.started_at_ms) {
                        if shedding_node(&instances, spec, label, me) {
                            tracing::info!(app = %spec.name, %label, instance = %victim.id, "more instances than desired; stopping one");
                            self.life.kill_soon(victim.id.clone());
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn start_kept(&self, spec: &AppSpec, key: LabelKey) {
        self.restarts.add_pending(&key, 1);
        let (life, restarts, spec) = (self.life.clone(), self.restarts.clone(), spec.clone());
        tokio::spawn(async move {
            let (app, label) = (&key.0, &key.1);
            let result = life
                .start(&spec, label, &Owner::Shared, Purpose::Kept)
                .await;
            restarts.add_pending(&key, -1);
            match &result {
                Ok(r) => {
                    restarts.started(app, label, "");
                    life.serve_if_free(r);
                }
                // The monitor already counted an instance that exited.
                Err(AgentError::Exited { .. }) => {}
                Err(e) => restarts.crashed(app, label, "", &e.to_string(), ""),
            }
        });
    }
}

/// The records under `prefix` that decode as `T`. Others are skipped: one unreadable record
/// must not stop the healing of every app. (`apps/<app>/...` also holds non-spec keys, which
/// simply do not decode as a spec.)
async fn list_readable<T: serde::de::DeserializeOwned>(
    store: &dyn warden_store::Store,
    prefix: &str,
) -> Result<Vec<T>, AgentError> {
    Ok(store
        .list(prefix)
        .await?
        .entries
        .iter()
        .filter_map(|e| decode::<T>(&e.key, &e.value).ok())
        .collect())
}

/// True when `me` should start the next missing instance: among nodes not loaded above the
/// mean by more than the margin, the one with fewest instances (then lowest id).
fn placement_target(nodes: &[NodeRecord], me: &str) -> bool {
    if nodes.is_empty() {
        return true;
    }
    let mean = nodes.iter().map(|n| n.load.score()).sum::<f64>() / nodes.len() as f64;
    let best = nodes
        .iter()
        .filter(|n| n.load.score() <= mean + LOAD_MARGIN)
        .min_by(|a, b| {
            (a.load.instances, &a.id)
                .partial_cmp(&(b.load.instances, &b.id))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
    best.is_none_or(|n| n.id == me)
}

/// True when `me` should stop a surplus kept instance of (app, label): the node with most
/// kept instances of it (then highest id).
fn shedding_node(instances: &[InstanceRecord], spec: &AppSpec, label: &str, me: &str) -> bool {
    let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
    for r in instances
        .iter()
        .filter(|r| r.app == spec.name && r.label == label && r.kept)
    {
        *per_node.entry(r.node.as_str()).or_default() += 1;
    }
    per_node
        .iter()
        .max_by_key(|(id, n)| (**n, *id))
        .is_none_or(|(id, _)| *id == me)
}

#[cfg(test)]
mod tests {
    use super::*;
    use warden_core::HostLoad;

    fn node(id: &str, score: f64, instances: u32) -> NodeRecord {
        NodeRecord {
            id: id.into(),
            hostname: String::new(),
            pid: 1,
            started_at_ms: 0,
            load: HostLoad {
                memory_used: score,
                instances,
                ..HostLoad::default()
            },
            limits: String::new(),
            roles: vec!["agent".into()],
            advertise: None,
            drivers: Vec::new(),
        }
    }

    #[test]
    fn the_least_busy_node_below_the_mean_starts() {
        let nodes = [node("a", 0.2, 3), node("b", 0.2, 1), node("c", 0.9, 0)];
        // c has no instances but is far above the mean load, so b starts.
        assert!(placement_target(&nodes, "b"));
        assert!(!placement_target(&nodes, "a"));
        assert!(!placement_target(&nodes, "c"));
        assert!(placement_target(&[], "x"));
    }
}
