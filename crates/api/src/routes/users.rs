//! `/v1/users`: users who may sign in at the gateway. Passwords go in, only hashes are stored,
//! and neither ever comes back out.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use warden_core::{keys, validate_name, UserRecord};
use warden_store::{decode, CasOutcome};

use crate::error::{ApiError, ApiJson};
use crate::Api;

/// Body of `POST /v1/users`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewUser {
    /// Login name.
    pub name: String,
    /// Password in clear; hashed with Argon2id before it is stored.
    pub password: String,
    /// Clearance label in the lattice's text form.
    pub clearance: String,
    /// Groups.
    #[serde(default)]
    pub groups: Vec<String>,
}

/// A user as the API shows it: never the hash.
#[derive(Serialize)]
pub struct UserView {
    /// Login name.
    pub name: String,
    /// Canonical clearance label.
    pub clearance: String,
    /// Groups.
    pub groups: Vec<String>,
}

impl From<UserRecord> for UserView {
    fn from(u: UserRecord) -> Self {
        Self {
            name: u.name,
            clearance: u.clearance,
            groups: u.groups,
        }
    }
}

/// `GET /v1/users`
pub async fn list(State(api): State<Api>) -> Result<Json<Vec<UserView>>, ApiError> {
    let listing = api.store.list(keys::USERS).await?;
    let users = listing
        .entries
        .iter()
        .map(|e| decode::<UserRecord>(&e.key, &e.value).map(UserView::from))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Json(users))
}

/// `POST /v1/users`
pub async fn create(
    State(api): State<Api>,
    ApiJson(new): ApiJson<NewUser>,
) -> Result<(StatusCode, Json<UserView>), ApiError> {
    validate_name("user", &new.name).map_err(|e| ApiError::bad_request(e.to_string()))?;
    for g in &new.groups {
        validate_name("group", g).map_err(|e| ApiError::bad_request(e.to_string()))?;
    }
    let lattice = crate::routes::lattice::current(&api).await?;
    let clearance = lattice
        .canonical(&new.clearance)
        .map_err(|e| ApiError::bad_request(format!("clearance: {e}")))?;
    let password = new.password;
    let cost = api.argon2;
    let hash = tokio::task::spawn_blocking(move || warden_auth::hash_password(&password, &cost))
        .await
        .map_err(ApiError::internal)?
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let record = UserRecord {
        name: new.name,
        password_hash: hash,
        clearance,
        groups: new.groups,
    };
    let bytes = serde_json::to_vec(&record).map_err(ApiError::internal)?;
    match api
        .store
        .compare_and_swap(&keys::user(&record.name), None, Some(bytes), None)
        .await?
    {
        CasOutcome::Done(rev) => {
            api.applied(&keys::user(&record.name), rev).await;
            tracing::info!(user = %record.name, clearance = %record.clearance, "user created");
            Ok((StatusCode::CREATED, Json(record.into())))
        }
        CasOutcome::Conflict { .. } => Err(ApiError::conflict(format!(
            "user {:?} already exists; remove it first with `warden users rm {}`",
            record.name, record.name
        ))),
    }
}

/// `GET /v1/users/{name}`
pub async fn show(
    State(api): State<Api>,
    Path(name): Path<String>,
) -> Result<Json<UserView>, ApiError> {
    warden_store::get_json::<UserRecord>(&*api.store, &keys::user(&name))
        .await?
        .map(|(u, _)| Json(u.into()))
        .ok_or_else(|| no_user(&name))
}

/// `DELETE /v1/users/{name}`
pub async fn remove(
    State(api): State<Api>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    match api.store.delete(&keys::user(&name)).await? {
        Some(rev) => {
            api.applied(&keys::user(&name), rev).await;
            Ok(StatusCode::NO_CONTENT)
        }
        None => Err(no_user(&name)),
    }
}

fn no_user(name: &str) -> ApiError {
    ApiError::not_found(format!(
        "no user named {name:?}; `warden users list` shows the users"
    ))
}
