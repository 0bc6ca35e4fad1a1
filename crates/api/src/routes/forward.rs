//! Releases across the cluster. A node that builds nothing passes a push, a config change or a
//! rollback to a node that does (through `Api::releases`, the cluster's node port) and relays
//! its answer: the 4xx it gives before anything runs, as it gave it, or the release's progress
//! line by line. [`NodeReleases`] is the other end: an agent node making a release passed to
//! it as it would one of its own, with itself as the delivering node.

use std::path::PathBuf;

use async_trait::async_trait;
use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use warden_api_types::{ConfigChange, PushQuery, ReleaseEvent, Rollback};
use warden_core::{
    keys, validate_name, AppSpec, ReleaseAsk, ReleaseError, ReleaseEvents, Releases, UploadReader,
};
use warden_store::get_json;

use super::releases::{self as local, Pushed};
use crate::error::ApiError;
use crate::Api;

/// Events queued between the body of a release made here and the node that asked for it.
const QUEUE: usize = 64;

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

/// This node's releases, made for another node of the cluster: the same checks, record and
/// delivery as a release asked of this node's own API, this node named as the one delivering.
pub struct NodeReleases(Api);

impl NodeReleases {
    /// Releases made with `api`'s store, builds and data directory.
    pub fn new(api: Api) -> Self {
        Self(api)
    }
}

#[async_trait]
impl Releases for NodeReleases {
    async fn release(
        &self,
        ask: ReleaseAsk,
        upload: Option<UploadReader>,
        _prefer: Option<String>,
    ) -> Result<ReleaseEvents, ReleaseError> {
        let made = make(self.0.clone(), ask, upload).await;
        match made {
            Ok(response) => Ok(events_of(response)),
            Err(e) => Err(ReleaseError::Refused {
                status: e.status().as_u16(),
                message: e.message().to_owned(),
            }),
        }
    }

    /// This node's log of the release (`node` is this node).
    async fn log(
        &self,
        app: &str,
        number: u64,
        _node: Option<String>,
    ) -> Result<String, ReleaseError> {
        if validate_name("app", app).is_err() {
            return Ok(String::new());
        }
        let path = crate::deliver::log_path(&self.0, app, number);
        Ok(match path {
            Some(p) => tokio::fs::read_to_string(p).await.unwrap_or_default(),
            None => String::new(),
        })
    }
}

async fn make(
    api: Api,
    ask: ReleaseAsk,
    upload: Option<UploadReader>,
) -> Result<Response, ApiError> {
    let Some(builds) = api.builds.clone() else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "this node builds nothing; ask an agent node",
        ));
    };
    match ask {
        ReleaseAsk::Push {
            app,
            kind,
            size,
            digest,
            by,
            from,
        } => {
            validate_name("app", &app).map_err(|e| ApiError::bad_request(e.to_string()))?;
            let kind = local::kind(kind.as_deref())?;
            if size > api.max_upload {
                return Err(local::too_large(api.max_upload));
            }
            let Some(upload) = upload else {
                return Err(ApiError::bad_request("a push came without its upload"));
            };
            let (upload, got) = local::receive(&api, body_of(upload)).await?;
            if got != digest {
                return Err(ApiError::bad_request(
                    "the upload changed on its way between the cluster's nodes; push again",
                ));
            }
            let from = local::note(from.as_deref().unwrap_or("an upload"));
            let pushed = Pushed {
                name: app,
                kind,
                upload,
                digest,
                from,
                by: local::note(&by),
            };
            local::push_received(api, builds, pushed).await
        }
        ReleaseAsk::Config {
            app,
            set,
            unset,
            by,
        } => {
            validate_name("app", &app).map_err(|e| ApiError::bad_request(e.to_string()))?;
            local::config_with(api, builds, app, ConfigChange { set, unset }, by).await
        }
        ReleaseAsk::Rollback { app, to, by } => {
            validate_name("app", &app).map_err(|e| ApiError::bad_request(e.to_string()))?;
            local::rollback_with(api, builds, app, Rollback { to }, by).await
        }
    }
}

/// An upload's bytes as a request body.
fn body_of(upload: UploadReader) -> Body {
    use tokio::io::AsyncReadExt;
    let chunks = futures_util::stream::unfold(Some(upload), |upload| async move {
        let mut upload = upload?;
        let mut buf = vec![0u8; 64 << 10];
        match upload.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Bytes::from(buf)), Some(upload)))
            }
            Err(e) => Some((Err(e), None)),
        }
    });
    Body::from_stream(chunks)
}

/// A release's answer, as progress for the node that asked for it.
fn events_of(response: Response) -> ReleaseEvents {
    let (tx, rx) = mpsc::channel(QUEUE);
    let mut body = response.into_body().into_data_stream();
    tokio::spawn(async move {
        while let Some(chunk) = body.next().await {
            let Ok(chunk) = chunk else { break };
            let text = String::from_utf8_lossy(&chunk).into_owned();
            if tx.send(Ok(text)).await.is_err() {
                break;
            }
        }
    });
    rx
}
