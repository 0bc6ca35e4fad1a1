//! `/v1/login`, `/v1/logout`, `/v1/tokens`: an operator's sessions and personal API tokens.
//! A token is 32 random bytes, shown once; only its SHA-256 is stored, with its operator,
//! their generation, an expiry and a short public id.

use std::time::Duration;

use axum::extract::{FromRequest, Path, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use warden_api_types::{IssuedToken, Login, NewToken, TokenView};
use warden_core::audit::Event;
use warden_core::{keys, OperatorRecord, TokenKind, TokenRecord};
use warden_store::decode;

use crate::authz::{self, Principal};
use crate::error::{ApiError, ApiJson};
use crate::Api;

/// Longest an API token may last: a year.
const MAX_TOKEN_SECS: u64 = 365 * 24 * 3600;
/// What an API token lasts when its maker says nothing: 90 days.
const DEFAULT_TOKEN_SECS: u64 = 90 * 24 * 3600;

/// `POST /v1/login`: a session token for a local operator's name and password. Failures are
/// throttled per name and address and summed as audit refusals.
pub async fn login(State(api): State<Api>, req: Request) -> Response {
    let addr = authz::peer(&req).unwrap_or(std::net::IpAddr::from([0, 0, 0, 0]));
    let ApiJson(Login { name, password }) = match ApiJson::<Login>::from_request(req, &()).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let refused = |status: u16| {
        if api.audit.kept() {
            api.refusals.add(status, Some(addr), "/v1/login");
        }
    };
    // Like a sign-in at the gateway: none while `--audit required` cannot record it.
    if let Some(why) = api.audit.refusing() {
        return ApiError::new(StatusCode::SERVICE_UNAVAILABLE, why).into_response();
    }
    // A name no operator can have is refused before it is counted: the throttle's table keeps
    // names, and a megabyte of one per failure would fill memory.
    if let Err(e) = warden_core::validate_name("operator", &name) {
        refused(401);
        return ApiError::new(StatusCode::UNAUTHORIZED, e.to_string()).into_response();
    }
    // An IPv6 client holds a /64 at least: its addresses are counted as one.
    let addr = authz::throttle::network(addr);
    if let Err(wait) = api.throttle.check(&name, addr) {
        refused(429);
        let mut resp = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "too many failed logins; wait {} s and try again",
                wait.as_secs() + 1
            ),
        )
        .into_response();
        resp.headers_mut()
            .insert(header::RETRY_AFTER, (wait.as_secs() + 1).into());
        return resp;
    }
    let op =
        match warden_store::get_json::<OperatorRecord>(&*api.store, &keys::operator(&name)).await {
            Ok(op) => op.map(|(o, _)| o),
            Err(e) => return ApiError::from(e).into_response(),
        };
    // An unknown name is verified against a dummy hash: it takes as long as a real one.
    let hash = op.as_ref().and_then(|o| o.password_hash.clone());
    let cost = api.argon2;
    let ok = tokio::task::spawn_blocking(move || {
        warden_auth::verify_password(hash.as_deref(), &password, &cost)
    })
    .await
    .unwrap_or(false);
    let (Some(op), true) = (op, ok) else {
        api.throttle.fail(&name, addr);
        refused(401);
        return authz::unauthorized(
            "wrong operator name or password; an owner can reset it with `warden operators change NAME --password-stdin`",
        );
    };
    let label = format!("login from {addr}");
    match authz::issue(&api, &op, TokenKind::Session, label, api.session_ttl).await {
        Ok((token, record)) => {
            api.audit.record(Event::Change {
                actor: format!("operator:{}", op.name),
                method: "POST".into(),
                route: "/v1/login".into(),
                target: Some(op.name.clone()),
                outcome: "200".into(),
                before: None,
                after: None,
            });
            Json(issued(token, record)).into_response()
        }
        Err(e) => e.into_response(),
    }
}

pub(crate) fn issued(token: String, t: TokenRecord) -> IssuedToken {
    IssuedToken {
        id: t.id,
        token,
        operator: t.operator,
        expires_ms: t.expires_ms,
    }
}

/// `POST /v1/logout`: ends the token presented.
pub(crate) async fn logout(
    State(api): State<Api>,
    Extension(who): Extension<Principal>,
) -> Result<StatusCode, ApiError> {
    let Principal::Operator { token_hash, .. } = who else {
        return Err(ApiError::bad_request(
            "the break-glass admin token has no session to end; turn it off with `warden up --admin-token off`",
        ));
    };
    api.store.delete(&keys::api_token(&token_hash)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /v1/tokens`: a personal API token for automation, shown once.
pub(crate) async fn create(
    State(api): State<Api>,
    Extension(who): Extension<Principal>,
    ApiJson(new): ApiJson<NewToken>,
) -> Result<(StatusCode, Json<IssuedToken>), ApiError> {
    let Principal::Operator {
        name, generation, ..
    } = &who
    else {
        return Err(ApiError::bad_request(
            "the break-glass admin token acts as no operator: `warden login` as one to make their tokens",
        ));
    };
    let secs = new.expires_in.unwrap_or(DEFAULT_TOKEN_SECS);
    if !(1..=MAX_TOKEN_SECS).contains(&secs) {
        return Err(ApiError::bad_request(format!(
            "expires_in must be 1 to {MAX_TOKEN_SECS} seconds (a year)"
        )));
    }
    if new.label.len() > 200 {
        return Err(ApiError::bad_request("a label is at most 200 bytes"));
    }
    let op = warden_store::get_json::<OperatorRecord>(&*api.store, &keys::operator(name))
        .await?
        .map(|(o, _)| o)
        .ok_or_else(|| ApiError::not_found("this operator was removed meanwhile"))?;
    // A provider operator's access lasts as long as their sign-in there: a token outliving
    // it would outlive their removal from the group, which warden learns only at a sign-in.
    if let Some(id) = op.source.provider() {
        return Err(ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            format!(
                "operator {name:?} signs in through the identity provider {id:?}, and such an operator makes no API tokens: their access lasts only as long as their sign-in. For automation an owner adds a local operator (`warden operators add NAME --role ...`)"
            ),
        ));
    }
    // The token presented was for the operator as they were; if their password or roles
    // changed since, it must mint nothing that outlives the change.
    if &op.generation != generation {
        return Err(ApiError::new(
            axum::http::StatusCode::UNAUTHORIZED,
            "this token was issued before the operator's password or roles changed; `warden login` again",
        ));
    }
    let (token, record) = authz::issue(
        &api,
        &op,
        TokenKind::Api,
        new.label,
        Duration::from_secs(secs),
    )
    .await?;
    Ok((StatusCode::CREATED, Json(issued(token, record))))
}

/// Every token record and its key, of `who` (an owner: of everyone).
async fn visible(api: &Api, who: &Principal) -> Result<Vec<(String, TokenRecord)>, ApiError> {
    let listing = api.store.list(keys::API_TOKENS).await?;
    Ok(listing
        .entries
        .iter()
        .filter_map(|e| {
            crate::routes::readable(decode::<TokenRecord>(&e.key, &e.value))
                .map(|t| (e.key.clone(), t))
        })
        .filter(|(_, t)| match who {
            Principal::Operator { name, .. } if !who.owner() => &t.operator == name,
            _ => true,
        })
        .collect())
}

/// `GET /v1/tokens`: the caller's tokens (an owner's: everyone's), never the tokens themselves.
pub(crate) async fn list(
    State(api): State<Api>,
    Extension(who): Extension<Principal>,
) -> Result<Json<Vec<TokenView>>, ApiError> {
    let mut tokens: Vec<TokenView> = visible(&api, &who)
        .await?
        .into_iter()
        .map(|(_, t)| t.into())
        .collect();
    tokens.sort_by_key(|t| t.created_ms);
    Ok(Json(tokens))
}

/// `DELETE /v1/tokens/{id}`: revokes one of the caller's tokens (an owner: anyone's).
pub(crate) async fn revoke(
    State(api): State<Api>,
    Extension(who): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let found = visible(&api, &who)
        .await?
        .into_iter()
        .find(|(_, t)| t.id == id);
    let Some((key, _)) = found else {
        return Err(ApiError::not_found(format!(
            "no token of yours with id {id:?}; `warden tokens list` shows them"
        )));
    };
    api.store.delete(&key).await?;
    Ok(StatusCode::NO_CONTENT)
}
