//! `/login` and `/logout`: the sign-in page and its form for browsers, Basic or JSON for
//! programs; session tokens as an HttpOnly cookie and a bearer token.
//!
//! A browser signs in with the form (`application/x-www-form-urlencoded`: name, password,
//! csrf, next), checked for cross-site forgery ([`csrf`]), and is sent on to `next` (only a
//! path of this gateway, [`next::safe_next`]). A program POSTs Basic credentials or JSON and
//! gets the token back as today. Every password goes through the same
//! [`crate::auth::Authenticator::password`], so the form is throttled like every sign-in.

use std::collections::HashMap;
use std::time::Duration;

use http::{header, request::Parts, HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Deserialize;
use warden_core::{keys, model::now_ms, SessionRecord};

use super::{csrf, next, pages};
use crate::auth::session::SESSION_COOKIE;
use crate::auth::{basic, session};
use crate::client::Client;
use crate::error::GatewayError;
use crate::response::{self as respond, Ask, Body};
use crate::state::State;

/// How long a session's record stays in the store after the session ended.
const SESSION_RECORD_GRACE: Duration = Duration::from_secs(60);

/// Largest login body read.
const MAX_LOGIN_BODY: usize = 8 * 1024;
/// Longest a login or logout waits for this gateway's view to apply it.
const SYNC_WAIT: Duration = Duration::from_secs(5);

/// A browser's form, answered with pages.
const FORM_ASK: Ask<'static> = Ask {
    html: true,
    navigation: false,
    target: None,
};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoginBody {
    name: String,
    password: String,
}

/// The session cookie; `Secure` when the client came over TLS, so a browser never sends it back
/// over plain HTTP. `SameSite=Lax`: an identity provider's redirect back is a cross-site
/// top-level GET, which `Strict` would strip; cross-site POSTs still go without it.
/// Every sign-in method sets it through here (the provider sign-in too).
pub(crate) fn cookie(value: &str, max_age: u64, https: bool) -> header::HeaderValue {
    let secure = if https { "; Secure" } else { "" };
    let c = format!(
        "{SESSION_COOKIE}={value}; Path=/; HttpOnly; SameSite=Lax; Max-Age={max_age}{secure}"
    );
    header::HeaderValue::from_str(&c).unwrap_or(header::HeaderValue::from_static(""))
}

/// Whether a request's body is a browser's form.
fn is_form(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| {
            t.trim()
                .eq_ignore_ascii_case("application/x-www-form-urlencoded")
        })
}

/// The fields of a form body (or a query string): the first value of each name.
pub(crate) fn form_fields(body: &[u8]) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for pair in body.split(|b| *b == b'&').filter(|p| !p.is_empty()) {
        let (name, value) = match pair.iter().position(|b| *b == b'=') {
            Some(i) => (&pair[..i], &pair[i + 1..]),
            None => (pair, &b""[..]),
        };
        let decode = |s: &[u8]| {
            let plus: Vec<u8> = s
                .iter()
                .map(|b| if *b == b'+' { b' ' } else { *b })
                .collect();
            percent_encoding::percent_decode(&plus)
                .decode_utf8_lossy()
                .into_owned()
        };
        out.entry(decode(name)).or_insert_with(|| decode(value));
    }
    out
}

/// Reads a small body whole.
async fn read_body(body: Incoming) -> Result<bytes::Bytes, GatewayError> {
    Ok(Limited::new(body, MAX_LOGIN_BODY)
        .collect()
        .await
        .map_err(|_| {
            GatewayError::BadRequest(format!(
                "a sign-in body must be at most {MAX_LOGIN_BODY} bytes"
            ))
        })?
        .to_bytes())
}

/// `/login`: the page (GET, HEAD), the form or a program's sign-in (POST).
pub(crate) async fn login(
    state: &State,
    req: Request<Incoming>,
    client: &Client,
) -> Response<Body> {
    match *req.method() {
        Method::GET | Method::HEAD => {
            let q = form_fields(req.uri().query().unwrap_or("").as_bytes());
            let next = next::next_or_default(q.get("next").map(String::as_str));
            sign_in_page(state, req.headers(), client, &next, None)
        }
        Method::POST if is_form(req.headers()) => form_login(state, req, client).await,
        Method::POST => match try_login(state, req, client).await {
            Ok(r) => r,
            Err(e) => e.into_response(),
        },
        _ => GatewayError::MethodNotAllowed(
            "use GET /login for the sign-in page, or POST /login with Basic credentials or a JSON body {\"name\", \"password\"}",
        )
        .into_response(),
    }
}

/// The sign-in page, with a message and the status it goes with (a wrong password, a
/// throttle) when it is shown again.
fn sign_in_page(
    state: &State,
    headers: &HeaderMap,
    client: &Client,
    next: &str,
    refused: Option<&GatewayError>,
) -> Response<Body> {
    let (token, set) = csrf::token(headers, client.https);
    let field = csrf::field(&state.config.csrf_key, &token);
    let message = refused.map(|e| match e {
        GatewayError::Unauthenticated => "Wrong name or password.".to_owned(),
        e => sentence(&e.to_string()),
    });
    // The providers now: those added through the API come and go while the gateway runs.
    let buttons: Vec<crate::config::SignInButton> = match &state.config.oidc {
        Some(o) => o
            .buttons()
            .into_iter()
            .map(|(id, label)| crate::config::SignInButton { id, label })
            .collect(),
        None => state.config.providers.clone(),
    };
    let html = pages::sign_in(&pages::SignIn {
        next,
        csrf: &field,
        message: message.as_deref(),
        providers: &buttons,
        passwords: state.auth.passwords(),
    });
    let status = refused.map_or(StatusCode::OK, GatewayError::status);
    let mut resp = pages::respond(status, html);
    if let Some(set) = set {
        resp.headers_mut().insert(header::SET_COOKIE, set);
    }
    if let Some(e) = refused {
        let extra = match e {
            GatewayError::Unauthenticated => Some(respond::form_challenge()),
            e => e.extra_header(),
        };
        if let Some((name, value)) = extra {
            resp.headers_mut().insert(name, value);
        }
    }
    resp
}

/// `text` as a sentence: a capital first, a full stop last.
fn sentence(text: &str) -> String {
    let mut chars = text.chars();
    let mut out: String = match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    };
    out.push('.');
    out
}

/// Refuses a POST that a page of another site sent (its `Origin` is not this gateway's).
fn foreign_origin(parts: &Parts, https: bool) -> Option<GatewayError> {
    parts.headers.get(header::ORIGIN)?;
    let authority = parts.uri.authority().map(|a| a.as_str());
    match csrf::check_origin(&parts.headers, authority, https) {
        Ok(()) => None,
        Err(e) => Some(GatewayError::Csrf(e.to_string())),
    }
}

/// Checks a form's CSRF token and origin.
fn checked_form(
    parts: &Parts,
    key: &[u8; 32],
    https: bool,
    form: &HashMap<String, String>,
) -> Result<(), GatewayError> {
    let authority = parts.uri.authority().map(|a| a.as_str());
    let sent = form.get("csrf").map(String::as_str);
    csrf::check(key, &parts.headers, authority, https, sent)
        .map_err(|e| GatewayError::Csrf(e.to_string()))
}

/// A browser's sign-in form: on success the session cookie and `303` to `next`; on a wrong
/// password or a throttle the page again, with its status.
async fn form_login(state: &State, req: Request<Incoming>, client: &Client) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let form = match read_body(body).await {
        Ok(b) => form_fields(&b),
        Err(e) => return e.respond(&FORM_ASK),
    };
    let next = next::next_or_default(form.get("next").map(String::as_str));
    // Nothing a form could change while passwords are off: say so before anything else.
    if !state.auth.passwords() {
        let off = GatewayError::PasswordsOff;
        return sign_in_page(state, &parts.headers, client, &next, Some(&off));
    }
    if let Err(e) = checked_form(&parts, &state.config.csrf_key, client.https, &form) {
        return e.respond(&FORM_ASK);
    }
    let name = form.get("name").cloned().unwrap_or_default();
    let password = form.get("password").cloned().unwrap_or_default();
    let signed_in = state
        .auth
        .password(
            &state.views,
            &name,
            password,
            client.ip,
            "form",
            &state.metrics,
        )
        .await;
    let user = match signed_in {
        Ok(u) => u,
        Err(e) => return sign_in_page(state, &parts.headers, client, &next, Some(&e)),
    };
    let (token, record) = match start_session(state, &user.record).await {
        Ok(s) => s,
        Err(e) => return e.respond(&FORM_ASK),
    };
    let mut resp = see_other(&next);
    resp.headers_mut().insert(
        header::SET_COOKIE,
        cookie(&token, state.config.session_ttl.as_secs(), client.https),
    );
    tracing::info!(user = %record.user, "session started from the sign-in form");
    resp
}

/// `303 See Other` to `location` (a path this gateway chose or checked).
pub(crate) fn see_other(location: &str) -> Response<Body> {
    let mut resp = pages::respond(StatusCode::SEE_OTHER, String::new());
    if let Ok(v) = header::HeaderValue::from_str(location) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    resp
}

/// A program's sign-in: Basic credentials, or a JSON body.
async fn try_login(
    state: &State,
    req: Request<Incoming>,
    client: &Client,
) -> Result<Response<Body>, GatewayError> {
    let (parts, body) = req.into_parts();
    if let Some(e) = foreign_origin(&parts, client.https) {
        return Err(e);
    }
    let (name, password) = match basic::basic(&parts.headers) {
        Some(b) => (b.user, b.password),
        None => {
            // A page of another site can POST text/plain that reads as JSON, or a body with no
            // type at all (a `no-cors` fetch of a Blob); a program that sends JSON says so.
            let json = parts.headers.get(header::CONTENT_TYPE).is_some_and(|t| {
                let t = t.as_bytes();
                t.len() >= 16 && t[..16].eq_ignore_ascii_case(b"application/json")
            });
            if !json {
                return Err(GatewayError::BadRequest(
                    "login needs Basic credentials, a JSON body {\"name\", \"password\"} (content-type application/json) or the sign-in form".into(),
                ));
            }
            let body = read_body(body).await?;
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
    let (token, record) = start_session(state, &user.record).await?;
    let ttl = state.config.session_ttl;
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

/// Records a new session for `user` and waits (briefly) until this gateway's view has it;
/// the token and the record. Every sign-in method starts its session here.
pub(crate) async fn start_session(
    state: &State,
    user: &warden_core::UserRecord,
) -> Result<(String, SessionRecord), GatewayError> {
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
        user: user.name.clone(),
        generation: user.generation.clone(),
        created_ms: now,
        expires_ms: now + ttl.as_millis() as u64,
        provider: None,
    };
    let rev = warden_store::put_json(&*state.store, &key, &record, Some(lease))
        .await
        .map_err(unavailable)?;
    let _ = tokio::time::timeout(SYNC_WAIT, state.views.caught_up(&key, rev)).await;
    Ok((token, record))
}

/// Ends the session of `token` on every gateway (its record deleted, which every watch sees);
/// `false` when there was none.
async fn end_session(state: &State, token: &str) -> Result<bool, GatewayError> {
    let key = keys::session(&session::token_hash(token));
    let entry = match state.store.get(&key).await {
        Ok(Some(e)) => e,
        Ok(None) => return Ok(false),
        Err(e) => {
            return Err(GatewayError::Unavailable {
                app: "logout".into(),
                reason: e.to_string(),
            })
        }
    };
    // Deleting the key is what every gateway's watch sees; the lease then has nothing left.
    if let Ok(Some(rev)) = state.store.delete(&key).await {
        let _ = tokio::time::timeout(SYNC_WAIT, state.views.caught_up(&key, rev)).await;
    }
    if let Some(lease) = entry.lease {
        let _ = state.store.revoke_lease(lease).await;
    }
    Ok(true)
}

/// `POST /logout`: from the signed-in page's form, the session ended, the cookie cleared and
/// `303` to the sign-in page; from a program, JSON as before.
pub(crate) async fn logout(
    state: &State,
    req: Request<Incoming>,
    client: &Client,
) -> Response<Body> {
    let https = client.https;
    if req.method() != Method::POST {
        return GatewayError::MethodNotAllowed(
            "use POST /logout with the session cookie or bearer token",
        )
        .into_response();
    }
    if is_form(req.headers()) {
        let (parts, body) = req.into_parts();
        let form = match read_body(body).await {
            Ok(b) => form_fields(&b),
            Err(e) => return e.respond(&FORM_ASK),
        };
        if let Err(e) = checked_form(&parts, &state.config.csrf_key, https, &form) {
            return e.respond(&FORM_ASK);
        }
        // Signed out already (an expired session, a second click): the same page follows.
        if let Some(token) = session::token(&parts.headers) {
            if let Err(e) = end_session(state, &token).await {
                return e.respond(&FORM_ASK);
            }
        }
        let mut resp = see_other("/login");
        resp.headers_mut()
            .insert(header::SET_COOKIE, cookie("", 0, https));
        return resp;
    }
    let (parts, _) = req.into_parts();
    if let Some(e) = foreign_origin(&parts, https) {
        return e.into_response();
    }
    let Some(token) = session::token(&parts.headers) else {
        return GatewayError::Unauthenticated.into_response();
    };
    match end_session(state, &token).await {
        Ok(true) => {}
        Ok(false) => return GatewayError::Unauthenticated.into_response(),
        Err(e) => return e.into_response(),
    }
    let mut resp = respond::json(StatusCode::OK, &serde_json::json!({ "logged_out": true }));
    resp.headers_mut()
        .insert(header::SET_COOKIE, cookie("", 0, https));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_fields_decode_like_a_browser_encodes() {
        let f = form_fields(b"name=al+ice&password=p%26w%3D1&next=%2Fapps%2Fdemo%2F&name=x&flag");
        assert_eq!(f["name"], "al ice");
        assert_eq!(f["password"], "p&w=1");
        assert_eq!(f["next"], "/apps/demo/");
        assert_eq!(f["flag"], "");
    }
}
