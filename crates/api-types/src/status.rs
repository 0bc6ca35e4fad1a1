//! Bodies of `GET /v1/status` (a one-look summary of the platform) and what a client reads of
//! `GET /v1/store/backup`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use warden_core::{LabelHealth, Move};

/// The summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Status {
    /// Store revision when the summary was taken.
    pub revision: u64,
    /// Live nodes.
    pub nodes: usize,
    /// Each live node with its instances.
    pub by_node: Vec<NodeStatus>,
    /// The agent node that places kept instances now.
    pub scheduler: Option<String>,
    /// Registered users.
    pub users: usize,
    /// Apps with their instance counts.
    pub apps: Vec<AppStatus>,
    /// Records that do not decode (skipped everywhere else): restore them from a backup, or
    /// delete the app or user and create it again.
    pub damaged: Vec<Damaged>,
    /// Where apps' data lives, as this node's API sees it (no password): a private PostgreSQL
    /// under the data dir, the server `--data` names, or `None` (apps cannot have data).
    #[serde(default)]
    pub data: Option<String>,
    /// This node's audit log: `ok`, `none` (not kept here), or why it is not writing.
    #[serde(default)]
    pub audit: Option<String>,
}

/// Per-app counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AppStatus {
    /// App name.
    pub name: String,
    /// Running instances that serve requests, by label.
    pub instances: BTreeMap<String, usize>,
    /// Spare instances of the warm pool, by label.
    pub spares: BTreeMap<String, usize>,
    /// Desired instances, by label.
    pub desired: BTreeMap<String, u32>,
    /// Labels whose kept instances crashed, per node.
    pub crash_loops: Vec<CrashReport>,
    /// Kept instances the scheduler placed, by label, then node.
    pub placed: BTreeMap<String, BTreeMap<String, u32>>,
    /// Ready kept instances, by label: what `desired` is met by.
    pub ready: BTreeMap<String, usize>,
    /// Instances moving between nodes (drain, shedding load, spreading).
    pub moving: Vec<Move>,
    /// Instances started from an older spec, being replaced.
    pub outdated: usize,
}

/// Restart state of one label on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CrashReport {
    /// Label.
    pub label: String,
    /// Node.
    pub node: String,
    /// The restart state.
    #[serde(flatten)]
    pub health: LabelHealth,
}

/// One live node and what runs on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct NodeStatus {
    /// Node name.
    pub name: String,
    /// Roles it runs.
    pub roles: Vec<String>,
    /// Its node port, if it serves one.
    pub advertise: Option<String>,
    /// Its load score (the largest of its load fractions).
    pub load: f64,
    /// Instances that serve requests on it, by app, then label.
    pub instances: BTreeMap<String, BTreeMap<String, usize>>,
    /// Drained: nothing new is placed on it.
    pub draining: bool,
}

/// A record that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Damaged {
    /// Its key.
    pub key: String,
    /// What is wrong with it.
    pub reason: String,
}

/// What a client reads of `GET /v1/store/backup` to say what it saved. The whole body is the
/// store's sealed backup (`warden_store::backup::Backup`), kept as it came; this crate does not
/// depend on the store, so it names only the fields a client reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct BackupHead {
    /// The store revision the snapshot was taken at.
    pub revision: u64,
    /// The records, in key order.
    pub records: Vec<BackupRecord>,
}

/// One record of a backup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct BackupRecord {
    /// The key.
    pub key: String,
    /// The value, base64.
    pub value: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crash_report_reads_back_what_it_writes() {
        let c = CrashReport {
            label: "public".into(),
            node: "n1".into(),
            health: LabelHealth::default(),
        };
        let text = serde_json::to_string(&c).expect("serializes");
        let back: CrashReport = serde_json::from_str(&text).expect("reads back");
        assert_eq!(back, c);
    }
}
