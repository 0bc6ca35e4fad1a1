//! `/v1/store/backup`: a consistent snapshot of every durable record, for `warden store backup`.

use axum::extract::State;
use axum::Json;
use warden_store::backup::Backup;

use crate::error::ApiError;
use crate::Api;

/// The snapshot. It holds password hashes: it is for the admin alone, and the CLI writes it
/// with mode 0600.
pub async fn backup(State(api): State<Api>) -> Result<Json<Backup>, ApiError> {
    let b = warden_store::backup::snapshot(&*api.store).await?;
    tracing::info!(
        records = b.records.len(),
        revision = b.revision,
        "store backup taken"
    );
    Ok(Json(b))
}
