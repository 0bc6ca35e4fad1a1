//! Apps awaiting their first release (issue 38): a config change saved in the app's spec
//! (the app made if it did not exist) instead of refused, and the app a first push makes at
//! once, so that a first push that fails leaves an app to fix or remove.

use axum::response::{IntoResponse, Response};
use warden_core::keys;
use warden_core::model::validate_env_var;
use warden_store::decode;

use warden_api_types::ConfigChange;

use crate::error::ApiError;
use crate::Api;

/// A config change of an app that runs no release yet (or does not exist: it is made, awaiting
/// its first push) is saved in its spec, which that push releases with; no release is made.
/// `None`: the app runs a release, and the change is a release of its own.
pub(super) async fn config_before_release(
    api: &Api,
    name: &str,
    change: &ConfigChange,
) -> Result<Option<Response>, ApiError> {
    for (k, v) in &change.set {
        validate_env_var(k, v).map_err(|e| ApiError::bad_request(e.to_string()))?;
    }
    let key = keys::app_spec(name);
    // Compare-and-swap, so a push that makes the app or its release meanwhile is not undone.
    for _ in 0..8 {
        let entry = api.store.get(&key).await?;
        let (mut spec, expected) = match &entry {
            Some(e) => (
                decode::<warden_core::AppSpec>(&e.key, &e.value)?,
                Some(e.mod_revision),
            ),
            None => (warden_core::AppSpec::new(name, Vec::new()), None),
        };
        if !spec.awaits_release() {
            return Ok(None);
        }
        for k in &change.unset {
            spec.env.remove(k);
        }
        spec.env.extend(change.set.clone());
        if expected.is_none() {
            // A new app: a process type left by an earlier app of the name goes first.
            crate::deliver::processes::remove_all(api, name).await?;
        }
        let bytes = serde_json::to_vec(&spec).map_err(ApiError::internal)?;
        let done = api
            .store
            .compare_and_swap(&key, expected, Some(bytes), None);
        if let warden_store::CasOutcome::Done(rev) = done.await? {
            api.applied(&key, rev).await;
            let who = match expected {
                None => format!("made app {name}, which"),
                Some(_) => format!("app {name}"),
            };
            let saved = format!(
                "{who} has no release yet: its config ({}) is kept for its first push (`warden push {name} DIR`)",
                spec.env.keys().cloned().collect::<Vec<_>>().join(", ")
            );
            tracing::info!(app = %name, "config saved before the first release");
            let line = serde_json::to_string(&warden_api_types::ReleaseEvent::Saved { saved })
                .map_err(ApiError::internal)?;
            return Ok(Some(
                (
                    [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
                    format!("{line}\n"),
                )
                    .into_response(),
            ));
        }
    }
    Err(ApiError::conflict(format!(
        "app {name:?} kept changing while its config was saved; try again"
    )))
}

/// Makes the app a first push is for, awaiting its release: from here on it exists, so a
/// first push that fails leaves an app whose failed release is listed, whose config can be set
/// and which can be removed (its database with it), rather than releases of no app.
pub(super) async fn made_by_push(
    api: &Api,
    name: &str,
    data: bool,
    groups: Option<Vec<String>>,
) -> Result<(), ApiError> {
    let mut spec = warden_core::AppSpec::new(name, Vec::new());
    spec.data = data;
    spec.groups = groups.unwrap_or_default();
    let key = keys::app_spec(name);
    let bytes = serde_json::to_vec(&spec).map_err(ApiError::internal)?;
    // The caller found no app of the name: a process type left by an earlier one goes first.
    crate::deliver::processes::remove_all(api, name).await?;
    // Made meanwhile (by `apps create`, a config change, another push): that one stays.
    if let warden_store::CasOutcome::Done(rev) = api
        .store
        .compare_and_swap(&key, None, Some(bytes), None)
        .await?
    {
        api.applied(&key, rev).await;
    }
    Ok(())
}
