//! `/v1/oidc/providers`: identity providers added through the API (issue 36), owner only (the
//! table in `authz`). Stored at `oidc/providers/<id>` with the client secret sealed; every
//! gateway follows that prefix, so a change reaches all of them without a restart. The config
//! file's providers are listed (`source: config`) but change only in the file.
//!
//! Checking a provider (the config file's rules, then its discovery) and sealing its secret
//! are the binary's, through [`OidcCheck`]: one function for the file's tables and these.

use std::future::Future;
use std::pin::Pin;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
pub use warden_api_types::{NewOidcProvider, OidcProviderChange, OidcProviderView};
use warden_core::{keys, OidcProviderRecord};
use warden_store::{decode, CasOutcome};

use crate::error::{ApiError, ApiJson};
use crate::Api;

/// A provider to check: its fields, and its client secret either in clear (new) or as already
/// sealed (a change that keeps it).
pub enum Secret {
    /// Given in the body.
    Clear(String),
    /// Kept from the stored record.
    Sealed(String),
}

/// What the binary does for these routes.
pub trait OidcCheck: Send + Sync {
    /// The config file's providers, as listed.
    fn config_providers(&self) -> Vec<OidcProviderView>;
    /// Checks `record` as the config file's tables are checked and tries its discovery; seals
    /// a clear secret into it. `Err`: what failed, said for the operator (a 422).
    fn check(
        &self,
        record: OidcProviderRecord,
        secret: Secret,
    ) -> Pin<Box<dyn Future<Output = Result<OidcProviderRecord, String>> + Send + '_>>;
}

fn checker(api: &Api) -> Result<&dyn OidcCheck, ApiError> {
    api.oidc.as_deref().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "this node runs no gateway, which keeps the providers' sealing key; call the API of a node that runs one",
        )
    })
}

/// 409 for a provider of the config file.
fn from_file(id: &str) -> ApiError {
    ApiError::conflict(format!(
        "identity provider {id:?} comes from the config file; edit its [[oidc]] table there and restart"
    ))
}

/// The key of provider `id`, or 404 for an id no provider can have (the path is the caller's).
fn key_of(id: &str) -> Result<String, ApiError> {
    warden_core::validate_name("oidc provider id", id).map_err(|_| no_provider(id))?;
    Ok(keys::oidc_provider(id))
}

fn no_provider(id: &str) -> ApiError {
    ApiError::not_found(format!(
        "no identity provider {id:?} was added through the API; `warden oidc list` shows them"
    ))
}

async fn stored(api: &Api) -> Result<Vec<OidcProviderRecord>, ApiError> {
    let listing = api.store.list(keys::OIDC_PROVIDERS).await?;
    Ok(listing
        .entries
        .iter()
        .filter_map(|e| crate::routes::readable(decode::<OidcProviderRecord>(&e.key, &e.value)))
        .collect())
}

/// `GET /v1/oidc/providers`: the config file's, then the API's.
pub async fn list(State(api): State<Api>) -> Result<Json<Vec<OidcProviderView>>, ApiError> {
    let mut all = checker(&api)?.config_providers();
    all.extend(stored(&api).await?.into_iter().map(OidcProviderView::from));
    Ok(Json(all))
}

/// `GET /v1/oidc/providers/{id}`
pub async fn show(
    State(api): State<Api>,
    Path(id): Path<String>,
) -> Result<Json<OidcProviderView>, ApiError> {
    if let Some(v) = checker(&api)?
        .config_providers()
        .into_iter()
        .find(|v| v.id == id)
    {
        return Ok(Json(v));
    }
    warden_store::get_json::<OidcProviderRecord>(&*api.store, &key_of(&id)?)
        .await?
        .map(|(r, _)| Json(r.into()))
        .ok_or_else(|| no_provider(&id))
}

/// `POST /v1/oidc/providers`
pub async fn create(
    State(api): State<Api>,
    ApiJson(new): ApiJson<NewOidcProvider>,
) -> Result<(StatusCode, Json<OidcProviderView>), ApiError> {
    let check = checker(&api)?;
    if check.config_providers().iter().any(|v| v.id == new.id) {
        return Err(from_file(&new.id));
    }
    let record = OidcProviderRecord {
        label: new.label.unwrap_or_else(|| new.id.clone()),
        id: new.id,
        issuer: new.issuer,
        client_id: new.client_id,
        client_secret_sealed: String::new(),
        scopes: new
            .scopes
            .unwrap_or_else(|| vec!["profile".into(), "groups".into()]),
        redirect_url: new.redirect_url,
        username_claim: new
            .username_claim
            .unwrap_or_else(|| "preferred_username".into()),
        ca_file: new.ca_file,
        rules: new.rules,
    };
    let record = check
        .check(record, Secret::Clear(new.client_secret))
        .await
        .map_err(|m| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, m))?;
    let key = keys::oidc_provider(&record.id);
    let bytes = serde_json::to_vec(&record).map_err(ApiError::internal)?;
    match api
        .store
        .compare_and_swap(&key, None, Some(bytes), None)
        .await?
    {
        CasOutcome::Done(rev) => {
            api.applied(&key, rev).await;
            tracing::info!(provider = %record.id, "identity provider added");
            Ok((StatusCode::CREATED, Json(record.into())))
        }
        CasOutcome::Conflict { .. } => Err(ApiError::conflict(format!(
            "identity provider {:?} exists; change it with `warden oidc change {}`",
            record.id, record.id
        ))),
    }
}

/// `PATCH /v1/oidc/providers/{id}`: checked again as a whole (discovery too).
pub async fn change(
    State(api): State<Api>,
    Path(id): Path<String>,
    ApiJson(c): ApiJson<OidcProviderChange>,
) -> Result<Json<OidcProviderView>, ApiError> {
    let check = checker(&api)?;
    if check.config_providers().iter().any(|v| v.id == id) {
        return Err(from_file(&id));
    }
    if c == OidcProviderChange::default() {
        return Err(ApiError::bad_request(
            "say what changes: label, issuer, client_id, client_secret, scopes, redirect_url, username_claim, ca_file or rules",
        ));
    }
    let key = key_of(&id)?;
    let Some((old, rev)) = warden_store::get_json::<OidcProviderRecord>(&*api.store, &key).await?
    else {
        return Err(no_provider(&id));
    };
    // The client secret goes to the token endpoint the issuer's discovery names (trusted by
    // `ca_file`): kept across a change of either, it would go to a provider of the caller's
    // choosing, which would read it.
    let elsewhere = c.issuer.as_ref().is_some_and(|i| *i != old.issuer)
        || c.ca_file
            .as_ref()
            .is_some_and(|f| Some(f) != old.ca_file.as_ref());
    let secret = match c.client_secret {
        Some(s) => Secret::Clear(s),
        None if elsewhere => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                format!(
                    "a new issuer or ca_file for {id:?} needs its client secret given again (client_secret, or `warden oidc change {id} --secret-file`): warden does not send the secret it holds to another provider"
                ),
            ))
        }
        None => Secret::Sealed(old.client_secret_sealed.clone()),
    };
    let record = OidcProviderRecord {
        label: c.label.unwrap_or(old.label),
        issuer: c.issuer.unwrap_or(old.issuer),
        client_id: c.client_id.unwrap_or(old.client_id),
        scopes: c.scopes.unwrap_or(old.scopes),
        redirect_url: c.redirect_url.unwrap_or(old.redirect_url),
        username_claim: c.username_claim.unwrap_or(old.username_claim),
        ca_file: c.ca_file.or(old.ca_file),
        rules: c.rules.unwrap_or(old.rules),
        ..old
    };
    let record = check
        .check(record, secret)
        .await
        .map_err(|m| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, m))?;
    let bytes = serde_json::to_vec(&record).map_err(ApiError::internal)?;
    match api
        .store
        .compare_and_swap(&key, Some(rev), Some(bytes), None)
        .await?
    {
        CasOutcome::Done(rev) => {
            api.applied(&key, rev).await;
            Ok(Json(record.into()))
        }
        CasOutcome::Conflict { .. } => Err(ApiError::conflict(format!(
            "identity provider {id:?} changed meanwhile; read it again and retry"
        ))),
    }
}

/// `DELETE /v1/oidc/providers/{id}`: its button goes, its sign-ins in flight fail, its
/// people's sessions end at their next refresh.
pub async fn remove(
    State(api): State<Api>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    if checker(&api)?.config_providers().iter().any(|v| v.id == id) {
        return Err(from_file(&id));
    }
    let key = key_of(&id)?;
    match api.store.delete(&key).await? {
        Some(rev) => {
            api.applied(&key, rev).await;
            tracing::info!(provider = %id, "identity provider removed");
            Ok(StatusCode::NO_CONTENT)
        }
        None => Err(no_provider(&id)),
    }
}
