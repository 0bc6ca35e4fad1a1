//! Signing in and out of the dashboard, and the session a signed-in browser holds: the
//! `warden_ui` cookie, the CSRF check of every form, and what ends a session.
//!
//! The cookie holds a random session id, never a token of the API. The session's record
//! (`ui-sessions/<SHA-256 of the id>`) holds the SHA-256 of the credential it signed in with:
//! an operator's session token, minted by `POST /v1/login` at sign-in and then forgotten, or
//! the break-glass admin token. Each call the dashboard makes for the browser carries that hash
//! as a request extension ([`crate::authz::Hashed`]), and the API's one token check finds the
//! principal by it. So a revoked, expired or logged-out token, an operator removed or changed,
//! or an admin token turned off ends the dashboard's session too, and the admin token never
//! sits in a cookie. Why a minted token rather than a record naming the operator and their
//! generation: `warden tokens list` then shows a dashboard session, `warden tokens revoke`
//! ends it, and there is no second way of checking a principal.

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::Response;
use axum::{Extension, Form};
use subtle::ConstantTimeEq;
use warden_api_types::IssuedToken;
use warden_core::{keys, TokenRecord};

use super::{csrf, page, pages, see_other, Peer, Plain, Ui};
use crate::authz::{token_hash, Hashed};
use crate::error::ApiError;

/// The cookie that holds the signed-in browser's session id.
const SESSION_COOKIE: &str = "warden_ui";

/// A browser's session id, as its cookie holds it (empty: none).
#[derive(Debug, Clone, Default)]
pub(crate) struct SessionId(String);

/// A dashboard session's record: who, by the hash of their credential, and until when.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    /// The credential's kind: `token` (an operator's session token) or `admin`.
    kind: String,
    /// The credential's SHA-256 (hex).
    hash: String,
    /// Who signed in, as the audit names them (`operator:<name>`, `admin token`): what event
    /// streams are counted by.
    actor: String,
    /// When the session ends, in ms since the epoch.
    expires_ms: u64,
}

/// The credential and actor of the session `id` names, unless it has none or it ended.
pub(crate) async fn credential(ui: &Ui, id: &SessionId) -> Option<(Hashed, String)> {
    if id.0.is_empty() {
        return None;
    }
    let key = keys::ui_session(&token_hash(&id.0));
    let (r, _) = warden_store::get_json::<Record>(&*ui.api.store, &key)
        .await
        .ok()??;
    if warden_core::model::now_ms() >= r.expires_ms {
        return None;
    }
    let hashed = match r.kind.as_str() {
        "admin" => Hashed::Admin(r.hash),
        _ => Hashed::Token(r.hash),
    };
    Some((hashed, r.actor))
}

/// Whether the dashboard is reached over TLS (a proxy the operator names with `--ui-origin
/// https://…`), for its cookies' `Secure`. The API's own listener is plain HTTP.
pub(super) fn https(ui: &Ui) -> bool {
    ui.api
        .ui_origin
        .as_deref()
        .is_some_and(|o| o.starts_with("https://"))
}

/// Back to the sign-in page, forgetting the session cookie.
pub(crate) fn to_login() -> Response {
    let mut resp = see_other("/ui/login");
    resp.headers_mut()
        .insert(header::SET_COOKIE, session_cookie(None, false));
    resp
}

/// The `Set-Cookie` of the session: `id`, or its removal.
pub(super) fn session_cookie(id: Option<&str>, https: bool) -> HeaderValue {
    let secure = if https { "; Secure" } else { "" };
    let value = match id {
        Some(t) => format!("{SESSION_COOKIE}={t}; Path=/ui; HttpOnly; SameSite=Strict{secure}"),
        None => {
            format!("{SESSION_COOKIE}=; Path=/ui; Max-Age=0; HttpOnly; SameSite=Strict{secure}")
        }
    };
    HeaderValue::from_str(&value).unwrap_or(HeaderValue::from_static("warden_ui=; Max-Age=0"))
}

/// The signed-in browser's session id, its CSRF field (bound to that session) and the CSRF
/// cookie to set if it had none; `None`: no session cookie (answer [`to_login`]). Whether the
/// session still stands is asked of the store by each call made with it.
pub(crate) fn session(
    ui: &Ui,
    headers: &HeaderMap,
) -> Option<(SessionId, String, Option<HeaderValue>)> {
    let id = csrf::cookie(headers, SESSION_COOKIE)?;
    let (c, set) = csrf::token(headers, https(ui));
    let field = csrf::field(&ui.api.ui_key, &c, &id);
    Some((SessionId(id), field, set))
}

/// The CSRF check of a signed-in form POST: `Some(refusal)`, a page saying why, when it fails.
/// The field must have been made for this browser's session: one from before sign-in, or of
/// another session, is refused.
pub(crate) fn refused(ui: &Ui, headers: &HeaderMap, sent: Option<&str>) -> Option<Response> {
    let id = csrf::cookie(headers, SESSION_COOKIE).unwrap_or_default();
    refused_for(ui, headers, sent, &id)
}

/// The CSRF check of a form POST bound to session `id` (empty: before sign-in).
fn refused_for(ui: &Ui, headers: &HeaderMap, sent: Option<&str>, id: &str) -> Option<Response> {
    let origin = ui.api.ui_origin.as_deref();
    csrf::check(&ui.api.ui_key, headers, origin, sent, id)
        .err()
        .map(|e| pages::respond(StatusCode::FORBIDDEN, pages::error(None, &e.to_string())))
}

/// `GET /ui/login`
pub(super) async fn login_page(State(ui): State<Ui>, headers: HeaderMap) -> Response {
    let (c, set) = csrf::token(&headers, https(&ui));
    let html = pages::login(&csrf::field(&ui.api.ui_key, &c, ""), None, &ui.providers());
    page(StatusCode::OK, html, set)
}

/// The sign-in form: an operator's name and password, or the admin token.
#[derive(serde::Deserialize)]
pub(super) struct LoginForm {
    csrf: Option<String>,
    name: Option<String>,
    password: Option<String>,
    token: Option<String>,
}

/// `POST /ui/login`: an operator's name and password go to `POST /v1/login` (its checks, its
/// throttle, its audit), whose token is kept by hash only; the admin token is compared in
/// constant time. Either starts a session whose id alone goes into the cookie.
pub(super) async fn login(
    State(ui): State<Ui>,
    peer: Peer,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    if let Some(resp) = refused_for(&ui, &headers, f.csrf.as_deref(), "") {
        return resp;
    }
    let again = |status: StatusCode, msg: &str| {
        let (c, set) = csrf::token(&headers, https(&ui));
        let field = csrf::field(&ui.api.ui_key, &c, "");
        page(
            status,
            pages::login(&field, Some(msg), &ui.providers()),
            set,
        )
    };
    let record = match f.token.filter(|t| !t.is_empty()) {
        Some(t) => {
            let ok = ui
                .api
                .admin_token()
                .is_some_and(|a| bool::from(t.as_bytes().ct_eq(a.as_bytes())));
            if !ok {
                if ui.api.audit.kept() {
                    let from = peer.as_ref().map(|Extension(c)| c.0.ip());
                    ui.api.refusals.add(401, from, "/ui/login");
                }
                return again(
                    StatusCode::UNAUTHORIZED,
                    "that is not the break-glass admin token (DATA_DIR/admin-token), or the token is off; sign in as an operator",
                );
            }
            Record {
                kind: "admin".into(),
                hash: token_hash(&t),
                actor: crate::authz::ACTOR.into(),
                expires_ms: expires(ui.api.session_ttl),
            }
        }
        None => {
            let body = serde_json::json!({
                "name": f.name.unwrap_or_default(),
                "password": f.password.unwrap_or_default(),
            });
            let ans = ui
                .call(
                    &SessionId::default(),
                    &peer,
                    Method::POST,
                    "/v1/login",
                    Some(body),
                )
                .await;
            match ans.json::<IssuedToken>() {
                Ok(issued) => Record {
                    kind: "token".into(),
                    hash: token_hash(&issued.token),
                    actor: format!("operator:{}", issued.operator),
                    expires_ms: issued.expires_ms,
                },
                Err(msg) => return again(ans.status, &msg),
            }
        }
    };
    match start(&ui, &record).await {
        Ok(id) => {
            let mut resp = see_other("/ui/");
            resp.headers_mut()
                .insert(header::SET_COOKIE, session_cookie(Some(&id), https(&ui)));
            resp
        }
        Err(e) => again(e.status(), e.message()),
    }
}

/// Starts a session for an operator's session token minted by another sign-in (single
/// sign-on through an identity provider): kept by hash only, like a password sign-in's.
pub(super) async fn start_for_token(
    ui: &Ui,
    token: &TokenRecord,
    secret: &str,
) -> Result<String, ApiError> {
    let record = Record {
        kind: "token".into(),
        hash: token_hash(secret),
        actor: format!("operator:{}", token.operator),
        expires_ms: token.expires_ms,
    };
    start(ui, &record).await
}

/// Now plus `ttl`, in ms since the epoch.
fn expires(ttl: std::time::Duration) -> u64 {
    warden_core::model::now_ms().saturating_add(ttl.as_millis() as u64)
}

/// Stores `record` under a new session id, which it returns; ended sessions' records are
/// swept first (they carry no lease, so each sign-in would otherwise leave one for good).
async fn start(ui: &Ui, record: &Record) -> Result<String, ApiError> {
    let now = warden_core::model::now_ms();
    let listing = ui.api.store.list(keys::UI_SESSIONS).await?;
    for e in listing.entries {
        let ended =
            serde_json::from_slice::<Record>(&e.value).map_or(true, |r| now >= r.expires_ms);
        if ended {
            ui.api.store.delete(&e.key).await?;
        }
    }
    let id = warden_core::id::secret_token();
    let bytes = serde_json::to_vec(record).map_err(ApiError::internal)?;
    ui.api
        .store
        .put(&keys::ui_session(&token_hash(&id)), bytes, None)
        .await?;
    Ok(id)
}

/// `POST /ui/logout`: ends the operator's token through `POST /v1/logout` (the admin token has
/// none to end), then the session's record, and forgets the cookie.
pub(super) async fn logout(
    State(ui): State<Ui>,
    peer: Peer,
    headers: HeaderMap,
    Form(f): Form<Plain>,
) -> Response {
    if let Some(resp) = refused(&ui, &headers, f.csrf.as_deref()) {
        return resp;
    }
    if let Some(id) = csrf::cookie(&headers, SESSION_COOKIE) {
        let id = SessionId(id);
        let ans = ui.call(&id, &peer, Method::POST, "/v1/logout", None).await;
        tracing::debug!(status = %ans.status, "dashboard sign-out");
        let key = keys::ui_session(&token_hash(&id.0));
        if let Err(e) = ui.api.store.delete(&key).await {
            tracing::warn!(error = %e, "a dashboard session's record was not deleted at sign-out");
        }
    }
    to_login()
}
