//! Releases passed to another node of the cluster. A node that builds nothing passes a push, a
//! config change or a rollback to a node that does (through `Api::releases`, the cluster's node
//! port) and relays its answer: the 4xx it gives before anything runs, as it gave it, or the
//! release's progress line by line. The other end is `node_releases.rs`.

use std::path::PathBuf;

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use warden_api_types::{ConfigChange, PushQuery, ReleaseEvent, Rollback};
use warden_core::{
    keys, validate_name, AppSpec, ReleaseAsk, ReleaseError, ReleaseEvents, UploadReader,
};
use warden_store::get_json;

use crate::error::ApiError;
use crate::Api;

/// Passes the push whose upload is at `upload` (`digest` its SHA-256) to a node that builds.
pub(crate) async fn push(
    api: &Api,
    app: String,
    q: PushQuery,
    by: String,
    upload: PathBuf,
    digest: String,
) -> Result<Response, ApiError> {
    let file = tokio::fs::File::open(&upload)
        .await
        .map_err(|e| ApiError::internal(format!("cannot read the upload back: {e}")))?;
    let size = file.metadata().await.map_err(ApiError::internal)?.len();
    let ask = ReleaseAsk::Push {
        app,
        kind: q.kind,
        size,
        digest,
        by,
        from: q.from,
        groups: q.groups,
    };
    forward(api, ask, Some(Box::new(file)), None).await
}

/// Passes a config change to a node that builds, the one that delivered the running release
/// first (it has the slug).
pub(crate) async fn config(
    api: &Api,
    app: String,
    change: ConfigChange,
    by: String,
) -> Result<Response, ApiError> {
    validate_name("app", &app).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let prefer = node_of(api, &app, None).await?;
    let ask = ReleaseAsk::Config {
        app,
        set: change.set,
        unset: change.unset,
        by,
    };
    forward(api, ask, None, prefer).await
}

/// Passes a rollback to a node that builds, the one that delivered the release rolled back to
/// (or the running one) first.
pub(crate) async fn rollback(
    api: &Api,
    app: String,
    body: Rollback,
    by: String,
) -> Result<Response, ApiError> {
    validate_name("app", &app).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let prefer = node_of(api, &app, body.to).await?;
    let ask = ReleaseAsk::Rollback {
        app,
        to: body.to,
        expect: body.expect,
        by,
    };
    forward(api, ask, None, prefer).await
}

/// The node that delivered release `number` of `app` (the running one when `None`), if known.
async fn node_of(api: &Api, app: &str, number: Option<u64>) -> Result<Option<String>, ApiError> {
    let number = match number {
        Some(n) => n,
        None => {
            let spec = get_json::<AppSpec>(&*api.store, &keys::app_spec(app)).await?;
            match spec.and_then(|(s, _)| s.release) {
                Some(r) => r.number,
                None => return Ok(None),
            }
        }
    };
    let release =
        get_json::<warden_core::Release>(&*api.store, &keys::release(app, number)).await?;
    Ok(release.and_then(|(r, _)| r.node))
}

/// The log of `release`, from the node that delivered it (this node builds nothing).
pub(crate) async fn log(api: &Api, release: &warden_core::Release) -> Result<String, ApiError> {
    let Some(releases) = &api.releases else {
        return Ok(String::new());
    };
    releases
        .log(&release.app, release.number, release.node.clone())
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the release's log is kept by the node that delivered it, which did not give it ({e}); retry when it answers"),
            )
        })
}

async fn forward(
    api: &Api,
    ask: ReleaseAsk,
    upload: Option<UploadReader>,
    prefer: Option<String>,
) -> Result<Response, ApiError> {
    let Some(releases) = &api.releases else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "this node neither builds nor knows a node that does; run `warden up` with the agent role",
        ));
    };
    let events = releases
        .release(ask, upload, prefer)
        .await
        .map_err(refusal)?;
    Ok(relay(events))
}

/// How a release refused before anything ran is answered.
fn refusal(e: ReleaseError) -> ApiError {
    match e {
        ReleaseError::Refused { status, message } => ApiError::new(
            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
            message,
        ),
        other => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, other.to_string()),
    }
}

/// The building node's progress as this answer's body, ended by a `Lost` event if that node
/// broke off before the release's outcome.
fn relay(events: ReleaseEvents) -> Response {
    let stream = futures_util::stream::unfold(Some(events), |events| async move {
        let mut events = events?;
        let lost = match events.recv().await? {
            Ok(text) => return Some((Ok::<_, std::io::Error>(Bytes::from(text)), Some(events))),
            Err(e) => e.to_string(),
        };
        tracing::warn!(error = %lost, "a node delivering a release was lost");
        let mut text = serde_json::to_string(&ReleaseEvent::Lost { lost }).unwrap_or_default();
        text.push('\n');
        Some((Ok(Bytes::from(text)), None))
    });
    (
        [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response()
}
