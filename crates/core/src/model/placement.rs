//! What the scheduler decides and the agents carry out: how many instances of each app's label
//! each agent node keeps ([`Placement`], at `cluster/placement`), who schedules
//! ([`SchedulerRecord`], at `cluster/scheduler`) and which nodes are drained ([`DrainOrder`], at
//! `drains/<node>`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Per node, per app, per label: how many kept instances that node runs.
pub type Assignments = BTreeMap<String, BTreeMap<String, BTreeMap<String, u32>>>;

/// The cluster's placement of kept instances. One record, written whole by compare-and-swap,
/// so that no two writers can ever assign more than an app's desired count between them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Placement {
    /// The election revision of the scheduler that wrote it; a scheduler seeing a higher term
    /// than its own has been replaced and stops.
    pub term: u64,
    /// Node that wrote it.
    pub scheduler: String,
    /// Node → app → label → count.
    pub nodes: Assignments,
    /// Instances on their way from one node to another: `to` already counts the new one,
    /// `from` still counts the old one until the new one is ready (make before break).
    #[serde(default)]
    pub moves: Vec<Move>,
    /// When a shedding or spreading move last ended, ms since the Unix epoch: the next waits a
    /// while so that load figures catch up.
    #[serde(default)]
    pub last_move_ms: u64,
    /// When a move last timed out (its new instance never became ready): drains wait a while
    /// before trying again.
    #[serde(default)]
    pub last_timeout_ms: u64,
}

/// One instance moving between nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Move {
    /// App.
    pub app: String,
    /// Label.
    pub label: String,
    /// Node giving the instance up once its replacement is ready.
    pub from: String,
    /// Node starting the replacement.
    pub to: String,
    /// Why it moves.
    pub why: MoveReason,
    /// When the move began, ms since the Unix epoch.
    pub since_ms: u64,
}

/// Why an instance moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum MoveReason {
    /// Its node is drained.
    Drain,
    /// Its node is loaded above the cluster mean by more than the shedding margin.
    Shed,
    /// The label's instances are spread unevenly (a node came back).
    Spread,
}

impl Placement {
    /// How many instances of (app, label) `node` keeps.
    pub fn count(&self, node: &str, app: &str, label: &str) -> u32 {
        self.nodes
            .get(node)
            .and_then(|a| a.get(app))
            .and_then(|l| l.get(label))
            .copied()
            .unwrap_or(0)
    }

    /// Sets how many instances of (app, label) `node` keeps, pruning empty maps.
    pub fn set(&mut self, node: &str, app: &str, label: &str, n: u32) {
        if n == 0 {
            if let Some(apps) = self.nodes.get_mut(node) {
                if let Some(labels) = apps.get_mut(app) {
                    labels.remove(label);
                    if labels.is_empty() {
                        apps.remove(app);
                    }
                }
                if apps.is_empty() {
                    self.nodes.remove(node);
                }
            }
            return;
        }
        self.nodes
            .entry(node.to_owned())
            .or_default()
            .entry(app.to_owned())
            .or_default()
            .insert(label.to_owned(), n);
    }
}

/// Which agent node runs the scheduler. Stored under that node's lease, so that it goes with
/// the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct SchedulerRecord {
    /// Node.
    pub node: String,
    /// Since when, ms since the Unix epoch.
    pub since_ms: u64,
}

/// A node's drain order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct DrainOrder {
    /// When it was given, ms since the Unix epoch.
    pub since_ms: u64,
    /// `operator` (`warden nodes drain`) or `stopping` (the node got SIGTERM).
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_set_to_zero_leave_no_empty_maps() {
        let mut p = Placement::default();
        p.set("n1", "demo", "PUBLIC", 2);
        assert_eq!(p.count("n1", "demo", "PUBLIC"), 2);
        p.set("n1", "demo", "PUBLIC", 0);
        assert_eq!(p.count("n1", "demo", "PUBLIC"), 0);
        assert!(p.nodes.is_empty());
    }
}
