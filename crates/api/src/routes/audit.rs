//! `GET /v1/audit` (records of this node's audit log, filtered) and `GET /v1/audit/verify`
//! (whether the log is whole, and if not the first bad spot).

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use warden_core::audit::{AuditError, Record, Verified};

use crate::error::ApiError;
use crate::Api;

fn api_error(e: AuditError) -> ApiError {
    match e {
        AuditError::NotKept => ApiError::not_found(
            "this node keeps no audit log; ask the API of a node that runs `warden up`",
        ),
        e => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// `GET /v1/audit?user=&app=&label=&kind=&since=&until=&after=&limit=`
pub async fn list(
    State(api): State<Api>,
    Query(q): Query<warden_core::audit::Query>,
) -> Result<Json<Vec<Record>>, ApiError> {
    api.audit.query(q).await.map(Json).map_err(api_error)
}

/// `GET /v1/audit/verify`
pub async fn verify(State(api): State<Api>) -> Result<Json<Verified>, ApiError> {
    api.audit.verify().await.map(Json).map_err(api_error)
}
