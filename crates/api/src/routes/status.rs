//! `/v1/status`: a one-look summary of the platform.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::Json;
use serde::Serialize;
use warden_core::{
    keys, AppHealth, AppSpec, InstanceState, LabelHealth, Move, NodeRecord, Placement,
    SchedulerRecord, UserRecord,
};
use warden_store::get_json;

use crate::error::ApiError;
use crate::Api;

/// Per-app counts.
#[derive(Serialize)]
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
#[derive(Serialize)]
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
#[derive(Serialize)]
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

/// The summary.
#[derive(Serialize)]
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
}

/// A record that does not decode.
#[derive(Serialize)]
pub struct Damaged {
    /// Its key.
    pub key: String,
    /// What is wrong with it.
    pub reason: String,
}

/// `GET /v1/status`
pub async fn show(State(api): State<Api>) -> Result<Json<Status>, ApiError> {
    let apps = api.store.list(keys::APPS).await?;
    let nodes = api.store.list(keys::NODES).await?;
    let users = api.store.list(keys::USERS).await?;
    let instances = crate::routes::instances::all(&api).await?;
    let health = api.store.list(keys::HEALTH).await?;
    let placement = get_json::<Placement>(&*api.store, keys::PLACEMENT)
        .await
        .ok()
        .flatten()
        .map(|(p, _)| p)
        .unwrap_or_default();
    let scheduler = get_json::<SchedulerRecord>(&*api.store, keys::SCHEDULER)
        .await
        .ok()
        .flatten()
        .map(|(s, _)| s.node);
    let mut damaged: Vec<Damaged> = [&users, &apps, &health]
        .iter()
        .flat_map(|l| l.damaged.iter())
        .map(|(key, reason)| Damaged {
            key: key.clone(),
            reason: reason.clone(),
        })
        .collect();
    let mut check = |key: &str, r: Result<(), warden_store::StoreError>| {
        if let Err(e) = r {
            damaged.push(Damaged {
                key: key.to_owned(),
                reason: e.to_string(),
            });
        }
    };
    for e in &users.entries {
        check(
            &e.key,
            warden_store::decode::<UserRecord>(&e.key, &e.value).map(drop),
        );
    }
    for e in apps.entries.iter().filter(|e| e.key.ends_with("/spec")) {
        check(
            &e.key,
            warden_store::decode::<AppSpec>(&e.key, &e.value).map(drop),
        );
    }
    for e in &health.entries {
        check(
            &e.key,
            warden_store::decode::<AppHealth>(&e.key, &e.value).map(drop),
        );
    }
    let apps = apps
        .entries
        .iter()
        .filter(|e| e.key.ends_with("/spec"))
        .filter_map(|e| warden_store::decode::<AppSpec>(&e.key, &e.value).ok())
        .map(|spec| {
            let name = spec.name.as_str();
            let (mut by_label, mut spares) = (BTreeMap::new(), BTreeMap::new());
            for i in instances.iter().filter(|i| i.app == name) {
                let counts = if i.state == InstanceState::Spare {
                    &mut spares
                } else {
                    &mut by_label
                };
                *counts.entry(i.label.clone()).or_insert(0) += 1;
            }
            let mut crash_loops = Vec::new();
            let prefix = keys::health(name, "");
            for e in health.entries.iter().filter(|e| e.key.starts_with(&prefix)) {
                let node = &e.key[prefix.len()..];
                if let Ok(h) = warden_store::decode::<AppHealth>(&e.key, &e.value) {
                    for (label, health) in h.labels {
                        crash_loops.push(CrashReport {
                            label,
                            node: node.to_owned(),
                            health,
                        });
                    }
                }
            }
            let mut placed: BTreeMap<String, BTreeMap<String, u32>> = BTreeMap::new();
            for (node, apps) in &placement.nodes {
                for (label, n) in apps.get(name).into_iter().flatten() {
                    placed
                        .entry(label.clone())
                        .or_default()
                        .insert(node.clone(), *n);
                }
            }
            let mut ready = BTreeMap::new();
            for i in instances
                .iter()
                .filter(|i| i.app == name && i.kept && i.state == InstanceState::Ready)
            {
                *ready.entry(i.label.clone()).or_insert(0) += 1;
            }
            let generation = spec.generation();
            let outdated = instances
                .iter()
                .filter(|i| i.app == name && !i.generation.is_empty() && i.generation != generation)
                .count();
            AppStatus {
                outdated,
                name: name.to_owned(),
                instances: by_label,
                spares,
                desired: spec.desired.clone(),
                crash_loops,
                placed,
                ready,
                moving: placement
                    .moves
                    .iter()
                    .filter(|m| m.app == name)
                    .cloned()
                    .collect(),
            }
        })
        .collect();
    let by_node = nodes
        .entries
        .iter()
        .filter_map(|e| warden_store::decode::<NodeRecord>(&e.key, &e.value).ok())
        .map(|n| {
            let mut on: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
            for i in instances
                .iter()
                .filter(|i| i.node == n.id && i.state != InstanceState::Spare)
            {
                *on.entry(i.app.clone())
                    .or_default()
                    .entry(i.label.clone())
                    .or_insert(0) += 1;
            }
            NodeStatus {
                load: n.load.score(),
                name: n.id,
                roles: n.roles,
                advertise: n.advertise,
                instances: on,
                draining: n.draining,
            }
        })
        .collect();
    Ok(Json(Status {
        revision: users.revision,
        nodes: nodes.entries.len(),
        by_node,
        scheduler,
        users: users.entries.len(),
        apps,
        damaged,
    }))
}
