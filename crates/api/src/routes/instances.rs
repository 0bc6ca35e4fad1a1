//! `/v1/instances`: list, start and kill app instances.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::Deserialize;
use std::sync::Arc;

use warden_core::{keys, AppSpec, InstanceError, InstanceRecord, Instances, Owner};
use warden_store::decode;

use crate::error::{ApiError, ApiJson};
use crate::Api;

/// Body of `POST /v1/instances`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartRequest {
    /// App to run.
    pub app: String,
    /// Clearance label the instance serves.
    pub label: String,
}

pub(crate) async fn all(api: &Api) -> Result<Vec<InstanceRecord>, ApiError> {
    let listing = api.store.list(keys::INSTANCES).await?;
    Ok(listing
        .entries
        .iter()
        .map(|e| decode::<InstanceRecord>(&e.key, &e.value))
        .collect::<Result<Vec<_>, _>>()?)
}

/// `GET /v1/instances`
pub async fn list(State(api): State<Api>) -> Result<Json<Vec<InstanceRecord>>, ApiError> {
    all(&api).await.map(Json)
}

/// The instances source of this process, or why there is none.
fn source(api: &Api) -> Result<&Arc<dyn Instances>, ApiError> {
    api.instances.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no agent runs in this process; start warden with the agent role (warden up --roles …,agent)",
        )
    })
}

/// `POST /v1/instances`: the ready instance for app and label, started if none runs.
pub async fn start(
    State(api): State<Api>,
    ApiJson(req): ApiJson<StartRequest>,
) -> Result<(StatusCode, Json<InstanceRecord>), ApiError> {
    let Some((spec, _)) =
        warden_store::get_json::<AppSpec>(&*api.store, &keys::app_spec(&req.app)).await?
    else {
        return Err(crate::routes::apps::no_app(&req.app));
    };
    let lattice = crate::routes::lattice::current(&api).await?;
    let label = lattice
        .canonical(&req.label)
        .map_err(|e| ApiError::bad_request(format!("label: {e}")))?;
    match source(&api)?.ensure(&spec, &label, &Owner::Shared).await {
        Ok(r) => Ok((StatusCode::CREATED, Json(r))),
        Err(InstanceError::UnknownApp(a)) => Err(crate::routes::apps::no_app(&a)),
        Err(e @ (InstanceError::StartFailed { .. } | InstanceError::StartTimeout { .. })) => {
            Err(ApiError::new(StatusCode::BAD_GATEWAY, e.to_string()))
        }
        Err(e) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            e.to_string(),
        )),
    }
}

/// `GET /v1/instances/{id}/logs?lines=N`: the last lines an instance of this node printed.
pub async fn logs(
    State(api): State<Api>,
    Path(id): Path<String>,
    axum::extract::Query(q): axum::extract::Query<LogsQuery>,
) -> Result<String, ApiError> {
    let lines = q.lines.unwrap_or(100).min(10_000);
    source(&api)?.logs(&id, lines).map_err(|_| {
        ApiError::not_found(format!(
            "no logs of instance {id:?} on this node; it never ran here or exited long ago"
        ))
    })
}

/// Query of `GET /v1/instances/{id}/logs`.
#[derive(Deserialize)]
pub struct LogsQuery {
    /// How many of the last lines to return (default 100, at most 10000).
    pub lines: Option<usize>,
}

/// `DELETE /v1/instances/{id}`
pub async fn kill(State(api): State<Api>, Path(id): Path<String>) -> Result<StatusCode, ApiError> {
    match source(&api)?.kill(&id).await {
        Ok(()) => Ok(StatusCode::NO_CONTENT),
        Err(InstanceError::UnknownInstance(_)) => Err(ApiError::not_found(format!(
            "no instance {id:?} runs on this node; `warden instances list` shows the running ones"
        ))),
        Err(e) => Err(ApiError::internal(e)),
    }
}
