//! `/v1/status`: a one-look summary of the platform.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::Json;
use serde::Serialize;
use warden_core::keys;

use crate::error::ApiError;
use crate::Api;

/// Per-app counts.
#[derive(Serialize)]
pub struct AppStatus {
    /// App name.
    pub name: String,
    /// Running instances, by label.
    pub instances: BTreeMap<String, usize>,
}

/// The summary.
#[derive(Serialize)]
pub struct Status {
    /// Store revision when the summary was taken.
    pub revision: u64,
    /// Live nodes.
    pub nodes: usize,
    /// Registered users.
    pub users: usize,
    /// Apps with their instance counts.
    pub apps: Vec<AppStatus>,
}

/// `GET /v1/status`
pub async fn show(State(api): State<Api>) -> Result<Json<Status>, ApiError> {
    let apps = api.store.list(keys::APPS).await?;
    let nodes = api.store.list(keys::NODES).await?;
    let users = api.store.list(keys::USERS).await?;
    let instances = crate::routes::instances::all(&api).await?;
    let apps = apps
        .entries
        .iter()
        .filter_map(|e| {
            e.key
                .strip_prefix("apps/")
                .and_then(|k| k.strip_suffix("/spec"))
        })
        .map(|name| {
            let mut by_label = BTreeMap::new();
            for i in instances.iter().filter(|i| i.app == name) {
                *by_label.entry(i.label.clone()).or_insert(0) += 1;
            }
            AppStatus {
                name: name.to_owned(),
                instances: by_label,
            }
        })
        .collect();
    Ok(Json(Status {
        revision: users.revision,
        nodes: nodes.entries.len(),
        users: users.entries.len(),
        apps,
    }))
}
