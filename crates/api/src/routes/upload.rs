//! Receiving a pushed archive: the upload limit clients ask for, the body written to a
//! private file under the data directory (bounded, hashed) and removed unless a release keeps it.

use axum::body::Body;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use warden_api_types::UploadLimits;

use crate::error::ApiError;
use crate::Api;

/// `GET /v1/limits`: what this API takes, so that a client can refuse an upload before
/// sending it (an HTTP client that is still sending rarely reads an early 413).
pub async fn limits(State(api): State<Api>) -> Json<UploadLimits> {
    Json(UploadLimits {
        max_upload_bytes: api.max_upload,
    })
}

pub(crate) fn too_large(max: u64) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!(
            "the upload is larger than this API takes ({max} bytes); leave out what the app does not need (.wardenignore), or raise warden up --max-upload-mb"
        ),
    )
}

/// An upload on disk, removed when dropped (on every path out of a push before its release
/// is recorded: a client that went away and a stopping server included) unless kept.
pub(crate) struct Upload {
    pub(crate) path: std::path::PathBuf,
    kept: bool,
}

impl Upload {
    /// Its file name under `uploads/`.
    pub(super) fn name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// Leaves the file for the release that names it.
    pub(super) fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Upload {
    fn drop(&mut self) {
        if !self.kept {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Writes the request body to a private file under the data directory, at most
/// `api.max_upload` bytes, and returns it with its SHA-256.
pub(crate) async fn receive(api: &Api, body: Body) -> Result<(Upload, String), ApiError> {
    use futures_util::StreamExt;
    use sha2::Digest;
    use tokio::io::AsyncWriteExt;
    let dir = api
        .data_dir
        .as_ref()
        .ok_or_else(|| ApiError::internal("this API has no data directory for uploads"))?
        .join("uploads");
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(|e| ApiError::internal(format!("cannot create {}: {e}", dir.display())))?;
    let path = dir.join(format!("{}.tar.gz", warden_core::id::short_id()));
    let mut file = tokio::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(&path)
        .await
        .map_err(|e| ApiError::internal(format!("cannot create {}: {e}", path.display())))?;
    let upload = Upload { path, kept: false };
    let mut hash = sha2::Sha256::new();
    let mut size = 0u64;
    let mut stream = body.into_data_stream();
    let result = async {
        while let Some(chunk) = stream.next().await {
            let chunk =
                chunk.map_err(|e| ApiError::bad_request(format!("the upload broke off: {e}")))?;
            size += chunk.len() as u64;
            if size > api.max_upload {
                return Err(too_large(api.max_upload));
            }
            hash.update(&chunk);
            file.write_all(&chunk).await.map_err(|e| {
                ApiError::new(
                    StatusCode::INSUFFICIENT_STORAGE,
                    format!("cannot store the upload: {e}; free space under the data directory"),
                )
            })?;
        }
        file.flush().await.map_err(ApiError::internal)?;
        if size == 0 {
            return Err(ApiError::bad_request(
                "the upload is empty; send a gzip'd tar of the app's source",
            ));
        }
        Ok(())
    }
    .await;
    result?;
    let digest = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok((upload, digest))
}
