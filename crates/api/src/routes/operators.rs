//! `/v1/operators`: the people who change warden through the API, with their roles. Owner
//! only (the table in `authz`). Passwords go in, only hashes are stored, neither comes out.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
pub use warden_api_types::{NewOperator, OperatorChange, OperatorView};
use warden_core::{keys, validate_name, OperatorRecord, OperatorSource, Role, TokenRecord};
use warden_store::{decode, CasOutcome};

use crate::error::{ApiError, ApiJson};
use crate::Api;

/// `GET /v1/operators`
pub async fn list(State(api): State<Api>) -> Result<Json<Vec<OperatorView>>, ApiError> {
    let listing = api.store.list(keys::OPERATORS).await?;
    Ok(Json(
        listing
            .entries
            .iter()
            .filter_map(|e| crate::routes::readable(decode::<OperatorRecord>(&e.key, &e.value)))
            .map(OperatorView::from)
            .collect(),
    ))
}

/// `POST /v1/operators`
pub async fn create(
    State(api): State<Api>,
    ApiJson(new): ApiJson<NewOperator>,
) -> Result<(StatusCode, Json<OperatorView>), ApiError> {
    validate_name("operator", &new.name).map_err(|e| ApiError::bad_request(e.to_string()))?;
    check_roles(&new.roles)?;
    let record = OperatorRecord {
        name: new.name,
        password_hash: Some(crate::routes::users::hash(&api, new.password).await?),
        roles: new.roles,
        generation: warden_core::id::short_id(),
        source: OperatorSource::Local,
    };
    let key = keys::operator(&record.name);
    let bytes = serde_json::to_vec(&record).map_err(ApiError::internal)?;
    match api
        .store
        .compare_and_swap(&key, None, Some(bytes), None)
        .await?
    {
        CasOutcome::Done(_) => {
            tracing::info!(operator = %record.name, "operator created");
            Ok((StatusCode::CREATED, Json(record.into())))
        }
        CasOutcome::Conflict { .. } => Err(ApiError::conflict(format!(
            "operator {:?} already exists; change it with `warden operators change {}`",
            record.name, record.name
        ))),
    }
}

/// `GET /v1/operators/{name}`
pub async fn show(
    State(api): State<Api>,
    Path(name): Path<String>,
) -> Result<Json<OperatorView>, ApiError> {
    warden_store::get_json::<OperatorRecord>(&*api.store, &keys::operator(&name))
        .await?
        .map(|(o, _)| Json(o.into()))
        .ok_or_else(|| no_operator(&name))
}

/// `PATCH /v1/operators/{name}`: a new password or roles. The operator gets a new generation,
/// so every token of theirs stops working at once.
pub async fn change(
    State(api): State<Api>,
    Path(name): Path<String>,
    ApiJson(change): ApiJson<OperatorChange>,
) -> Result<Json<OperatorView>, ApiError> {
    if change == OperatorChange::default() {
        return Err(ApiError::bad_request("say what changes: password or roles"));
    }
    let key = keys::operator(&name);
    let (mut record, rev) = warden_store::get_json::<OperatorRecord>(&*api.store, &key)
        .await?
        .ok_or_else(|| no_operator(&name))?;
    if let Some(roles) = change.roles {
        check_roles(&roles)?;
        if !roles.contains(&Role::Owner) {
            keep_an_owner(&api, &name).await?;
        }
        record.roles = roles;
    }
    if let (Some(_), OperatorSource::Provider { id, .. }) = (&change.password, &record.source) {
        return Err(ApiError::bad_request(format!(
            "operator {name:?} signs in through the identity provider {id:?} (`warden login --provider {id}`) and has no password here"
        )));
    }
    if let Some(password) = change.password {
        record.password_hash = Some(crate::routes::users::hash(&api, password).await?);
    }
    record.generation = warden_core::id::short_id();
    let bytes = serde_json::to_vec(&record).map_err(ApiError::internal)?;
    match api
        .store
        .compare_and_swap(&key, Some(rev), Some(bytes), None)
        .await?
    {
        CasOutcome::Done(_) => {
            end_tokens(&api, &name).await?;
            tracing::info!(operator = %name, "operator changed; their tokens ended");
            Ok(Json(record.into()))
        }
        CasOutcome::Conflict { .. } => Err(ApiError::conflict(format!(
            "operator {name:?} changed meanwhile; try again"
        ))),
    }
}

/// `DELETE /v1/operators/{name}`: the operator and every token of theirs.
pub async fn remove(
    State(api): State<Api>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    keep_an_owner(&api, &name).await?;
    match api.store.delete(&keys::operator(&name)).await? {
        Some(_) => {
            end_tokens(&api, &name).await?;
            tracing::info!(operator = %name, "operator removed; their tokens ended");
            Ok(StatusCode::NO_CONTENT)
        }
        None => Err(no_operator(&name)),
    }
}

/// Deletes every token record of `operator`. They are refused already (stale generation or
/// no operator); this keeps them from lingering in the store and in `GET /v1/tokens`.
pub(crate) async fn end_tokens(api: &Api, operator: &str) -> Result<(), ApiError> {
    let listing = api.store.list(keys::API_TOKENS).await?;
    for e in listing.entries {
        match decode::<TokenRecord>(&e.key, &e.value) {
            Ok(t) if t.operator == operator => {
                api.store.delete(&e.key).await?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// With the admin token off, refuses to take the owner role from `name` (removed or changed)
/// when no other operator has it: nobody could change warden any more.
pub(crate) async fn keep_an_owner(api: &Api, name: &str) -> Result<(), ApiError> {
    if api.admin_token().is_some() {
        return Ok(());
    }
    let listing = api.store.list(keys::OPERATORS).await?;
    let other = listing.entries.iter().any(|e| {
        decode::<OperatorRecord>(&e.key, &e.value)
            .is_ok_and(|o| o.name != name && o.roles.contains(&Role::Owner))
    });
    if other {
        return Ok(());
    }
    Err(ApiError::conflict(format!(
        "with the admin token off, {name:?} may be the last owner: make another owner first (`warden operators add NAME --role owner`)"
    )))
}

fn check_roles(roles: &[Role]) -> Result<(), ApiError> {
    if roles.is_empty() {
        return Err(ApiError::bad_request(
            "give at least one role: owner, deployer (with apps) or viewer",
        ));
    }
    for r in roles {
        if let Role::Deployer { apps } = r {
            if apps.is_empty() {
                return Err(ApiError::bad_request(
                    "a deployer role names the apps it deploys: {\"role\": \"deployer\", \"apps\": [\"web\"]}",
                ));
            }
            for a in apps {
                validate_name("app", a).map_err(|e| ApiError::bad_request(e.to_string()))?;
            }
        }
    }
    Ok(())
}

fn no_operator(name: &str) -> ApiError {
    ApiError::not_found(format!(
        "no operator named {name:?}; `warden operators list` shows the operators"
    ))
}
