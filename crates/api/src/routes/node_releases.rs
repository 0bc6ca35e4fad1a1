//! Releases made here for another node of the cluster ([`NodeReleases`]): an agent node makes a
//! release passed to it as it would one of its own, with itself as the delivering node. The
//! asking end is `forward.rs`.

use async_trait::async_trait;
use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::Response;
use futures_util::StreamExt;
use tokio::sync::mpsc;
use warden_api_types::{ConfigChange, Rollback};
use warden_core::{validate_name, ReleaseAsk, ReleaseError, ReleaseEvents, Releases, UploadReader};

use super::releases::{self as local, Pushed};
use crate::error::ApiError;
use crate::Api;

/// Events queued between the body of a release made here and the node that asked for it.
const QUEUE: usize = 64;

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
            groups,
        } => {
            validate_name("app", &app).map_err(|e| ApiError::bad_request(e.to_string()))?;
            let kind = local::kind(kind.as_deref())?;
            let groups = local::groups(groups.as_deref())?;
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
                groups,
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
        ReleaseAsk::Rollback {
            app,
            to,
            expect,
            by,
        } => {
            validate_name("app", &app).map_err(|e| ApiError::bad_request(e.to_string()))?;
            local::rollback_with(api, builds, app, Rollback { to, expect }, by).await
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
