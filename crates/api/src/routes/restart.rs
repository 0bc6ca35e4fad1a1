//! `POST /v1/apps/{name}/restart`: fresh instances of the same release, with no new release.
//!
//! The restart is a count in the app's spec (`AppSpec::restarts`) that the generation of the
//! instances it names includes. Raising it makes them outdated, and every node's agent replaces
//! its own as it does for a changed spec (`crates/agent/src/supervise/rollout.rs` for instances
//! that requests start, `desired.rs` for kept ones): the new one ready first, the old one
//! handed over and drained, so no request fails. The store carries it to every node; the audit
//! layer records the request like every change.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use warden_api_types::{Restart, Restarted};
use warden_core::{keys, AppSpec, InstanceRecord, InstanceState};
use warden_store::{decode, CasOutcome};

use crate::error::{ApiError, ApiJson};
use crate::Api;

/// `POST /v1/apps/{name}/restart`
pub async fn restart(
    State(api): State<Api>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<Restart>,
) -> Result<(StatusCode, Json<Restarted>), ApiError> {
    // Instances carry the lattice's canonical label, and so must the count that names them.
    let label = match &body.label {
        Some(l) => {
            let lattice = crate::routes::lattice::current(&api).await?;
            Some(
                lattice
                    .canonical(l)
                    .map_err(|e| ApiError::bad_request(format!("label {l:?}: {e}")))?,
            )
        }
        None => None,
    };
    let key = keys::app_spec(&name);
    // Another writer may change the spec meanwhile: read, change, compare-and-swap, again.
    for _ in 0..8 {
        let Some((mut spec, rev)) = warden_store::get_json::<AppSpec>(&*api.store, &key).await?
        else {
            return Err(ApiError::no_app(&name));
        };
        let restart = spec.restarts.bump(label.as_deref());
        spec.validate()
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let bytes = serde_json::to_vec(&spec).map_err(ApiError::internal)?;
        if let CasOutcome::Done(rev) = api
            .store
            .compare_and_swap(&key, Some(rev), Some(bytes), None)
            .await?
        {
            api.applied(&key, rev).await;
            // Its process types carry the restart too, and are replaced the same way.
            if let Err(e) = crate::deliver::processes::sync(
                &api,
                &name,
                crate::deliver::processes::release_of(&spec),
                None,
            )
            .await
            {
                tracing::warn!(app = %name, error = %e, "restarting the app's process types failed");
            }
            let replacing = running(&api, &name, label.as_deref()).await?;
            tracing::info!(app = %name, label = ?label, restart, replacing, "app restarted");
            let answer = Restarted {
                app: name,
                label,
                restart,
                replacing,
                release: spec.release.map(|r| r.number),
            };
            return Ok((StatusCode::ACCEPTED, Json(answer)));
        }
    }
    Err(ApiError::conflict(format!(
        "app {name:?} kept changing while it was restarted; try again"
    )))
}

/// The app's instances (of `label`) that serve or are about to: the ones a restart replaces.
async fn running(api: &Api, app: &str, label: Option<&str>) -> Result<u32, ApiError> {
    let listing = api.store.list(&keys::app_instances(app)).await?;
    let n = listing
        .entries
        .iter()
        .filter_map(|e| decode::<InstanceRecord>(&e.key, &e.value).ok())
        .filter(|r| r.state != InstanceState::Draining)
        .filter(|r| label.is_none_or(|l| r.label == l))
        .count();
    Ok(u32::try_from(n).unwrap_or(u32::MAX))
}
