//! `/v1/users`: users who may sign in at the gateway. Passwords go in, only hashes are stored,
//! and neither ever comes back out.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
pub use warden_api_types::{NewUser, SessionView, UserChange, UserView};
use warden_core::{keys, validate_name, SessionRecord, UserRecord};
use warden_store::{decode, CasOutcome};

use crate::error::{ApiError, ApiJson};
use crate::Api;

/// `GET /v1/users`
pub async fn list(State(api): State<Api>) -> Result<Json<Vec<UserView>>, ApiError> {
    let listing = api.store.list(keys::USERS).await?;
    let users = listing
        .entries
        .iter()
        .filter_map(|e| crate::routes::readable(decode::<UserRecord>(&e.key, &e.value)))
        .map(UserView::from)
        .collect();
    Ok(Json(users))
}

/// `POST /v1/users`
pub async fn create(
    State(api): State<Api>,
    ApiJson(new): ApiJson<NewUser>,
) -> Result<(StatusCode, Json<UserView>), ApiError> {
    validate_name("user", &new.name).map_err(|e| ApiError::bad_request(e.to_string()))?;
    check_groups(&new.groups)?;
    let clearance = canonical_clearance(&api, &new.clearance).await?;
    let record = UserRecord {
        name: new.name,
        password_hash: hash(&api, new.password).await?,
        clearance,
        groups: new.groups,
        generation: warden_core::id::short_id(),
        provider: None,
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

/// `PATCH /v1/users/{name}`: a new password, clearance or groups. The account gets a new
/// generation, so every session of it ends at every gateway, and the old password's cached
/// verifications stop working at once (they are bound to the old hash).
pub async fn change(
    State(api): State<Api>,
    Path(name): Path<String>,
    ApiJson(change): ApiJson<UserChange>,
) -> Result<Json<UserView>, ApiError> {
    if change.password.is_none() && change.clearance.is_none() && change.groups.is_none() {
        return Err(ApiError::bad_request(
            "say what changes: password, clearance or groups",
        ));
    }
    let key = keys::user(&name);
    let (mut record, rev) = warden_store::get_json::<UserRecord>(&*api.store, &key)
        .await?
        .ok_or_else(|| no_user(&name))?;
    if let Some(groups) = change.groups {
        check_groups(&groups)?;
        record.groups = groups;
    }
    if let Some(clearance) = change.clearance {
        record.clearance = canonical_clearance(&api, &clearance).await?;
    }
    if let Some(password) = change.password {
        // A provider user signs in only through its provider: a password would be a second
        // way in that the provider's removal of the person does not close.
        if let Some(p) = &record.provider {
            return Err(ApiError::bad_request(format!(
                "user {name:?} signs in through identity provider {:?} and cannot have a password; create a local user instead",
                p.id
            )));
        }
        record.password_hash = hash(&api, password).await?;
    }
    record.generation = warden_core::id::short_id();
    let bytes = serde_json::to_vec(&record).map_err(ApiError::internal)?;
    match api
        .store
        .compare_and_swap(&key, Some(rev), Some(bytes), None)
        .await?
    {
        CasOutcome::Done(rev) => {
            api.applied(&key, rev).await;
            end_sessions(&api, &name).await?;
            tracing::info!(user = %name, clearance = %record.clearance, "user changed; sessions ended");
            Ok(Json(record.into()))
        }
        CasOutcome::Conflict { .. } => Err(ApiError::conflict(format!(
            "user {name:?} changed meanwhile; try again"
        ))),
    }
}

/// `DELETE /v1/users/{name}`: the user and every session of theirs.
pub async fn remove(
    State(api): State<Api>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    match api.store.delete(&keys::user(&name)).await? {
        Some(rev) => {
            api.applied(&keys::user(&name), rev).await;
            end_sessions(&api, &name).await?;
            tracing::info!(user = %name, "user removed; sessions ended");
            Ok(StatusCode::NO_CONTENT)
        }
        None => Err(no_user(&name)),
    }
}

/// `GET /v1/sessions`: every app user's session at the gateways, oldest first; never a token
/// (their records are keyed by its hash, which is not shown either).
pub async fn sessions(State(api): State<Api>) -> Result<Json<Vec<SessionView>>, ApiError> {
    let listing = api.store.list(keys::SESSIONS).await?;
    let now = warden_core::model::now_ms();
    let mut out: Vec<SessionView> = listing
        .entries
        .iter()
        .filter_map(|e| crate::routes::readable(decode::<SessionRecord>(&e.key, &e.value)))
        .filter(|s| s.expires_ms > now)
        .map(|s| SessionView {
            user: s.user,
            created_ms: s.created_ms,
            expires_ms: s.expires_ms,
            provider: s.provider.map(|p| p.id),
        })
        .collect();
    out.sort_by(|a, b| (a.created_ms, &a.user).cmp(&(b.created_ms, &b.user)));
    Ok(Json(out))
}

/// `DELETE /v1/users/{name}/sessions`: ends every session of the user at every gateway. The
/// account gets a new generation, as a change does (so a gateway's cached session or password
/// verification ends too), and the session records go.
pub async fn end(State(api): State<Api>, Path(name): Path<String>) -> Result<StatusCode, ApiError> {
    let key = keys::user(&name);
    let (mut record, rev) = warden_store::get_json::<UserRecord>(&*api.store, &key)
        .await?
        .ok_or_else(|| no_user(&name))?;
    record.generation = warden_core::id::short_id();
    let bytes = serde_json::to_vec(&record).map_err(ApiError::internal)?;
    match api
        .store
        .compare_and_swap(&key, Some(rev), Some(bytes), None)
        .await?
    {
        CasOutcome::Done(rev) => {
            api.applied(&key, rev).await;
            end_sessions(&api, &name).await?;
            tracing::info!(user = %name, "sessions ended");
            Ok(StatusCode::NO_CONTENT)
        }
        CasOutcome::Conflict { .. } => Err(ApiError::conflict(format!(
            "user {name:?} changed meanwhile; try again"
        ))),
    }
}

/// Deletes every session record of `user` and waits until the local gateway has applied it.
/// Gateways refuse those sessions already (the account's generation changed or it is gone);
/// this keeps them from lingering in the store until their lease ends.
async fn end_sessions(api: &Api, user: &str) -> Result<(), ApiError> {
    let listing = api.store.list(keys::SESSIONS).await?;
    for e in listing.entries {
        let Ok(s) = decode::<SessionRecord>(&e.key, &e.value) else {
            continue;
        };
        if s.user != user {
            continue;
        }
        if let Some(rev) = api.store.delete(&e.key).await? {
            api.applied(&e.key, rev).await;
        }
        if let Some(lease) = e.lease {
            let _ = api.store.revoke_lease(lease).await;
        }
    }
    Ok(())
}

fn check_groups(groups: &[String]) -> Result<(), ApiError> {
    for g in groups {
        validate_name("group", g).map_err(|e| ApiError::bad_request(e.to_string()))?;
    }
    Ok(())
}

async fn canonical_clearance(api: &Api, clearance: &str) -> Result<String, ApiError> {
    let lattice = crate::routes::lattice::current(api).await?;
    lattice
        .canonical(clearance)
        .map_err(|e| ApiError::bad_request(format!("clearance: {e}")))
}

/// The Argon2id hash of a new password, made off the executor.
pub(crate) async fn hash(api: &Api, password: String) -> Result<String, ApiError> {
    let cost = api.argon2;
    tokio::task::spawn_blocking(move || warden_auth::hash_password(&password, &cost))
        .await
        .map_err(ApiError::internal)?
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

fn no_user(name: &str) -> ApiError {
    ApiError::not_found(format!(
        "no user named {name:?}; `warden users list` shows the users"
    ))
}
