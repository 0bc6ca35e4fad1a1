//! `/v1/nodes`: nodes whose agents are alive (their records live under the agents' leases),
//! and their drain orders.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
pub use warden_api_types::DrainQuery;
use warden_core::{keys, model::now_ms, DrainOrder, NodeRecord};
use warden_store::{decode, put_json};

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

/// `POST /v1/nodes/{name}/drain`: nothing new is placed on the node and its instances move to
/// other nodes, each stopping once its replacement is ready. The order stays (across restarts
/// of the node) until `DELETE`. A node that is not running is drained only with `?ahead=true`.
pub async fn drain(
    State(api): State<Api>,
    Path(name): Path<String>,
    Query(q): Query<DrainQuery>,
) -> Result<(StatusCode, Json<DrainOrder>), ApiError> {
    warden_core::name::validate_name("node", &name)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    // A misspelt name would drain nothing and say it did.
    if !q.ahead && api.store.get(&keys::node(&name)).await?.is_none() {
        return Err(ApiError::not_found(format!(
            "no live node named {name:?} (`warden nodes list` shows them); to drain a node that is not running yet, ask with ?ahead=true (`warden nodes drain --ahead`)"
        )));
    }
    let order = DrainOrder {
        since_ms: now_ms(),
        reason: "operator".into(),
    };
    let key = keys::drain(&name);
    let rev = put_json(&*api.store, &key, &order, None).await?;
    api.applied(&key, rev).await;
    tracing::info!(node = %name, "node drained");
    Ok((StatusCode::ACCEPTED, Json(order)))
}

/// `DELETE /v1/nodes/{name}/drain`: the node takes instances again.
pub async fn undrain(
    State(api): State<Api>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    warden_core::name::validate_name("node", &name)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    match api.store.delete(&keys::drain(&name)).await? {
        Some(_) => {
            tracing::info!(node = %name, "node undrained");
            Ok(StatusCode::NO_CONTENT)
        }
        None => Err(ApiError::not_found(format!("node {name:?} is not drained"))),
    }
}
