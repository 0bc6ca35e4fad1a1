//! `/v1/apps/{name}/data`: what an app's database holds; and the declassifier mark
//! (`declassify_to` in an app's spec), which the apps routes hand to the data plane.
//!
//! Marking an app a declassifier is an admin's act: the API's only credential is the admin
//! token (`require_admin` answers 401 to anyone else before a handler runs), so whoever reaches
//! these handlers is the operator. A user's session token or password is not an API credential.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use warden_api_types::AppData;
use warden_core::{keys, AppSpec};
use warden_store::CasOutcome;

use crate::error::ApiError;
use crate::Api;

/// Held while a spec's `declassify_to` is stored and handed to the data plane, so that two
/// changes at once cannot leave the database with one mark and the spec with the other.
static MARKING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `GET /v1/apps/{name}/data`: size, tables, rows per label and declassified writes.
pub async fn show(
    State(api): State<Api>,
    Path(name): Path<String>,
) -> Result<Json<AppData>, ApiError> {
    let Some((spec, _)) =
        warden_store::get_json::<AppSpec>(&*api.store, &keys::app_spec(&name)).await?
    else {
        return Err(ApiError::no_app(&name));
    };
    if !spec.data {
        return Err(ApiError::conflict(format!(
            "app {name:?} has no data (it was not created with --data), so it has no database to show"
        )));
    }
    let data = plane(&api)?;
    data.show(&name).await.map(Json).map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "cannot read app {name:?}'s database: {e}; check that the data server is up \
                 (`warden status` says where data lives) and ask again"
            ),
        )
    })
}

fn plane(api: &Api) -> Result<&dyn warden_core::data::DataPlane, ApiError> {
    api.data.as_deref().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "this warden has no data server (`warden status` says why); start it with its \
             PostgreSQL, or with --data postgres://ADMIN@HOST/DB",
        )
    })
}

/// Checks `spec.declassify_to` and writes it in the lattice's canonical form: only an app with
/// data can declassify (its database is where the mark and the record of writes live).
pub(crate) async fn check_mark(api: &Api, spec: &mut AppSpec) -> Result<(), ApiError> {
    let Some(label) = &spec.declassify_to else {
        return Ok(());
    };
    if !spec.data {
        return Err(ApiError::bad_request(
            "declassify_to lets an app's instances write rows below their label, so only an app \
             with data (a database of its own, `--data` at create) can have it",
        ));
    }
    let lattice = crate::routes::lattice::current(api).await?;
    let canonical = lattice
        .canonical(label)
        .map_err(|e| ApiError::bad_request(format!("declassify_to {label:?}: {e}")))?;
    spec.declassify_to = Some(canonical);
    Ok(())
}

/// Serializes changes of the mark; see [`MARKING`].
pub(crate) async fn lock() -> tokio::sync::MutexGuard<'static, ()> {
    MARKING.lock().await
}

/// Hands `spec`'s mark to the app's database, after the spec was stored at `rev`. If the data
/// plane fails, the store write is undone (`before`: the spec it replaced, `None` for a new
/// app), so the spec never says other than the database does.
pub(crate) async fn apply_mark(
    api: &Api,
    spec: &AppSpec,
    rev: u64,
    before: Option<&AppSpec>,
) -> Result<(), ApiError> {
    let data = plane(api)?;
    let Err(e) = data
        .declassifier(&spec.name, spec.declassify_to.as_deref())
        .await
    else {
        return Ok(());
    };
    let key = keys::app_spec(&spec.name);
    let undo = match before {
        Some(b) => Some(serde_json::to_vec(b).map_err(ApiError::internal)?),
        None => None,
    };
    match api
        .store
        .compare_and_swap(&key, Some(rev), undo, None)
        .await
    {
        Ok(CasOutcome::Done(rev)) => api.applied(&key, rev).await,
        Ok(CasOutcome::Conflict { .. }) => tracing::error!(
            app = %spec.name,
            "the app's spec changed before a failed declassifier mark could be undone in it; set the mark again"
        ),
        Err(e) => tracing::error!(
            app = %spec.name, error = %e,
            "undoing the spec of a failed declassifier mark failed; set the mark again"
        ),
    }
    Err(ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        format!(
            "cannot set app {:?}'s declassifier mark in its database: {e}; nothing was changed: \
             check that the data server is up (`warden status`) and try again",
            spec.name
        ),
    ))
}
