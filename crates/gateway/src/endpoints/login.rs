//! `POST /login` and `POST /logout`: session tokens as an HttpOnly cookie and a bearer token.

use std::time::Duration;

use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Deserialize;
use warden_core::{keys, model::now_ms, SessionRecord};

use crate::auth::session::SESSION_COOKIE;
use crate::auth::{basic, session};
use crate::client::Client;
use crate::error::GatewayError;
use crate::response::{self as respond, Body};
use crate::state::State;

/// How long a session's record stays in the store after the session ended.
const SESSION_RECORD_GRACE: Duration = Duration::from_secs(60);

/// Largest login body read.
const MAX_LOGIN_BODY: usize = 8 * 1024;
/// Longest a login or logout waits for this gateway's view to apply it.
const SYNC_WAIT: Duration = Duration::from_secs(5);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoginBody {
    name: String,
    password: String,
}

/// The session cookie; `Secure` when the client came over TLS, so a browser never sends it back
/// over plain HTTP.
fn cookie(value: &str, max_age: u64, https: bool) -> header::HeaderValue {
    let secure = if https { "; Secure" } else { "" };
    let c = format!(
        "{SESSION_COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}"
    );
    header::HeaderValue::from_str(&c).unwrap_or(header::HeaderValue::from_static(""))
}

pub(crate) async fn login(
    state: &State,
    req: Request<Incoming>,
    client: &Client,
) -> Response<Body> {
    match try_login(state, req, client).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn try_login(
    state: &State,
    req: Request<Incoming>,
    client: &Client,
) -> Result<Response<Body>, GatewayError> {
    if req.method() != Method::POST {
        return Err(GatewayError::MethodNotAllowed(
            "use POST /login with Basic credentials or a JSON body {\"name\", \"password\"}",
        ));
    }
    let (name, password) = match basic::basic(req.headers()) {
        Some(b) => (b.user, b.password),
        None => {
            let body = Limited::new(req.into_body(), MAX_LOGIN_BODY)
                .collect()
                .await
                .map_err(|_| {
                    GatewayError::BadRequest(format!(
                        "login body must be JSON of at most {MAX_LOGIN_BODY} bytes"
                    ))
                })?
                .to_bytes();
            let b: LoginBody = serde_json::from_slice(&body).map_err(|e| {
                GatewayError::BadRequest(format!(
                    "login needs Basic credentials or a JSON body {{\"name\", \"password\"}}: {e}"
                ))
            })?;
            (b.name, b.password)
        }
    };
    let user = state
        .auth
        .password(
            &state.views,
            &name,
            password,
            client.ip,
            "form",
            &state.metrics,
        )
        .await?;
    let token = warden_core::id::secret_token();
    let key = keys::session(&session::token_hash(&token));
    let ttl = state.config.session_ttl;
    let unavailable = |e: warden_store::StoreError| GatewayError::NoSessions(e.to_string());
    // The record's own `expires_ms` ends the session, checked by every gateway on every
    // request; the lease only clears the record away a while later, so no session outlives its
    // time because a store's lease clock runs late, or lives on in a gateway's view.
    let lease = state
        .store
        .grant_lease(ttl + SESSION_RECORD_GRACE)
        .await
        .map_err(unavailable)?;
    let now = now_ms();
    let record = SessionRecord {
        user: user.record.name.clone(),
        generation: user.record.generation.clone(),
        created_ms: now,
        expires_ms: now + ttl.as_millis() as u64,
    };
    let rev = warden_store::put_json(&*state.store, &key, &record, Some(lease))
        .await
        .map_err(unavailable)?;
    let _ = tokio::time::timeout(SYNC_WAIT, state.views.caught_up(&key, rev)).await;
    tracing::info!(user = %record.user, "session started");
    let mut resp = respond::json(
        StatusCode::OK,
        &serde_json::json!({ "token": token, "user": record.user, "expires_in": ttl.as_secs() }),
    );
    resp.headers_mut().insert(
        header::SET_COOKIE,
        cookie(&token, ttl.as_secs(), client.https),
    );
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    Ok(resp)
}

pub(crate) async fn logout(state: &State, req: Request<Incoming>, https: bool) -> Response<Body> {
    if req.method() != Method::POST {
        return GatewayError::MethodNotAllowed(
            "use POST /logout with the session cookie or bearer token",
        )
        .into_response();
    }
    let Some(token) = session::token(req.headers()) else {
        return GatewayError::Unauthenticated.into_response();
    };
    let key = keys::session(&session::token_hash(&token));
    let entry = match state.store.get(&key).await {
        Ok(Some(e)) => e,
        Ok(None) => return GatewayError::Unauthenticated.into_response(),
        Err(e) => {
            return GatewayError::Unavailable {
                app: "logout".into(),
                reason: e.to_string(),
            }
            .into_response()
        }
    };
    // Deleting the key is what every gateway's watch sees; the lease then has nothing left.
    if let Ok(Some(rev)) = state.store.delete(&key).await {
        let _ = tokio::time::timeout(SYNC_WAIT, state.views.caught_up(&key, rev)).await;
    }
    if let Some(lease) = entry.lease {
        let _ = state.store.revoke_lease(lease).await;
    }
    let mut resp = respond::json(StatusCode::OK, &serde_json::json!({ "logged_out": true }));
    resp.headers_mut()
        .insert(header::SET_COOKIE, cookie("", 0, https));
    resp
}
