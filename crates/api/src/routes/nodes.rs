//! `/v1/nodes`: nodes whose agents are alive (their records live under the agents' leases).

use axum::extract::State;
use axum::Json;
use warden_core::{keys, NodeRecord};
use warden_store::decode;

use crate::error::ApiError;
use crate::Api;

/// `GET /v1/nodes`
pub async fn list(State(api): State<Api>) -> Result<Json<Vec<NodeRecord>>, ApiError> {
    let listing = api.store.list(keys::NODES).await?;
    let nodes = listing
        .entries
        .iter()
        .map(|e| decode::<NodeRecord>(&e.key, &e.value))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Json(nodes))
}
