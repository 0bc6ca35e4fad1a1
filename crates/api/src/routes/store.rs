//! `/v1/store/backup`: a consistent snapshot of every durable record, for `warden store backup`.

use axum::extract::State;
use axum::Json;
use warden_store::backup::Backup;

use crate::error::ApiError;
use crate::Api;

/// The snapshot, sealed under this warden's backup key. It holds password hashes: it is for the
/// admin alone, and the CLI writes it with mode 0600.
pub async fn backup(State(api): State<Api>) -> Result<Json<Backup>, ApiError> {
    let key = api.backup_key().ok_or_else(|| {
        ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "this warden has no backup key to seal a backup with; back up through a warden started by `warden up`",
        )
    })?;
    let b = warden_store::backup::snapshot(&*api.store, key.as_bytes()).await?;
    tracing::info!(
        records = b.records.len(),
        revision = b.revision,
        "store backup taken"
    );
    Ok(Json(b))
}
