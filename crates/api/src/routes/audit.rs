//! `GET /v1/audit` (records of the audit logs, filtered: this node's, or on a cluster every
//! live node's) and `GET /v1/audit/verify` (whether each log is whole, and if not the first bad
//! spot).

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
        AuditError::Invalid(why) => ApiError::bad_request(why),
        e => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
    }
}

/// `GET /v1/audit?node=&user=&app=&label=&kind=&since=&until=&after=&limit=`: on a cluster,
/// every live node's records merged by time (`after` then needs `node`: sequence numbers are
/// per node).
pub async fn list(
    State(api): State<Api>,
    Query(q): Query<warden_core::audit::Query>,
) -> Result<Json<Vec<Record>>, ApiError> {
    api.audit.query(q).await.map(Json).map_err(api_error)
}

/// `GET /v1/audit/verify`: one result per node (on one node, its own); on a cluster a node
/// that cannot be checked (unreachable, or anchored but not live) is among them, not ok.
pub async fn verify(State(api): State<Api>) -> Result<Json<Vec<Verified>>, ApiError> {
    api.audit.verify_all().await.map(Json).map_err(api_error)
}
