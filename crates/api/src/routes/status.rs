//! `/v1/status`: a one-look summary of the platform.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::Json;
pub use warden_api_types::{AppStatus, CrashReport, Damaged, NodeStatus, Status};
use warden_core::{
    keys, AppHealth, AppSpec, InstanceState, NodeRecord, Placement, SchedulerRecord, UserRecord,
};
use warden_store::get_json;

use crate::error::ApiError;
use crate::Api;

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
        // A process type is its app's, shown under it (`GET /v1/apps/{name}/ps`).
        .filter(|spec| spec.process.is_none())
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
            for e in &health.entries {
                // The app's own and its process types' (`health/APP~TYPE/NODE`), the latter
                // labelled `TYPE:LABEL` as `apps scale` names them.
                let Some((of, node)) = e
                    .key
                    .strip_prefix("health/")
                    .and_then(|k| k.split_once('/'))
                else {
                    continue;
                };
                let kind = match warden_core::split_process_app(of) {
                    Some((parent, kind)) if parent == name => Some(kind),
                    None if of == name => None,
                    _ => continue,
                };
                if let Ok(h) = warden_store::decode::<AppHealth>(&e.key, &e.value) {
                    for (label, health) in h.labels {
                        crash_loops.push(CrashReport {
                            label: match kind {
                                Some(k) => format!("{k}:{label}"),
                                None => label,
                            },
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
            // One digest per label, not per instance.
            let mut generations: BTreeMap<&str, String> = BTreeMap::new();
            let outdated = instances
                .iter()
                .filter(|i| i.app == name && !i.generation.is_empty())
                .filter(|i| {
                    let current = generations
                        .entry(i.label.as_str())
                        .or_insert_with(|| spec.generation(&i.label));
                    i.generation != *current
                })
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
        data: api.data.as_ref().map(|d| d.describe()),
        audit: Some(match (api.audit.kept(), api.audit.health()) {
            (false, _) => "none (this node keeps no audit log)".into(),
            (true, Ok(())) => "ok".into(),
            (true, Err(why)) => why,
        }),
    }))
}
