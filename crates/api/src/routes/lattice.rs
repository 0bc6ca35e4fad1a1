//! `/v1/lattice`: the clearance lattice users and instances are labelled in.

use axum::extract::State;
use axum::Json;
use warden_auth::Lattice;
use warden_core::{keys, UserRecord};
use warden_store::decode;

use crate::error::{ApiError, ApiJson};
use crate::Api;

/// The stored lattice, or a 409 saying how to define one.
pub(crate) async fn current(api: &Api) -> Result<Lattice, ApiError> {
    warden_store::get_json::<Lattice>(&*api.store, keys::LATTICE)
        .await?
        .map(|(l, _)| l)
        .ok_or_else(|| {
            ApiError::conflict(
                "no clearance lattice is defined yet; define it first with `warden lattice set --levels ...` (PUT /v1/lattice)",
            )
        })
}

/// `GET /v1/lattice`
pub async fn show(State(api): State<Api>) -> Result<Json<Lattice>, ApiError> {
    current(&api).await.map(Json).map_err(|_| {
        ApiError::not_found("no clearance lattice is defined yet; define it with `warden lattice set --levels ...` (PUT /v1/lattice)")
    })
}

/// `PUT /v1/lattice`: refused while users hold clearances the new lattice cannot express.
pub async fn replace(
    State(api): State<Api>,
    ApiJson(lattice): ApiJson<Lattice>,
) -> Result<Json<Lattice>, ApiError> {
    lattice
        .validate()
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let users = api.store.list(keys::USERS).await?;
    let mut stranded = Vec::new();
    for e in &users.entries {
        let u: UserRecord = decode(&e.key, &e.value)?;
        if lattice.canonical(&u.clearance).ok().as_deref() != Some(u.clearance.as_str()) {
            stranded.push(u.name);
        }
    }
    if !stranded.is_empty() {
        return Err(ApiError::conflict(format!(
            "the new lattice cannot express the clearance of users {}; change or remove them first",
            stranded.join(", ")
        )));
    }
    warden_store::put_json(&*api.store, keys::LATTICE, &lattice, None).await?;
    Ok(Json(lattice))
}
