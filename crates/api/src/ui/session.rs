//! Signing in and out of the dashboard, and the session a signed-in browser holds: the
//! `warden_ui` cookie, the CSRF check of every form, and what ends a session.

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::Response;
use axum::{Extension, Form};
use subtle::ConstantTimeEq;
use warden_api_types::IssuedToken;

use super::{csrf, page, pages, see_other, Peer, Plain, Ui};

/// The cookie that holds the signed-in browser's token.
const SESSION_COOKIE: &str = "warden_ui";

/// Whether the dashboard is served over TLS, for its cookies' `Secure`: the API's listener is
/// plain HTTP on loopback or a private network today; when it takes TLS this follows it.
pub(super) const HTTPS: bool = false;

/// Back to the sign-in page, forgetting the session cookie.
pub(crate) fn to_login() -> Response {
    let mut resp = see_other("/ui/login");
    resp.headers_mut()
        .insert(header::SET_COOKIE, session_cookie(None));
    resp
}

/// The `Set-Cookie` of the session: `token`, or its removal.
fn session_cookie(token: Option<&str>) -> HeaderValue {
    let secure = if HTTPS { "; Secure" } else { "" };
    let value = match token {
        Some(t) => format!("{SESSION_COOKIE}={t}; Path=/ui; HttpOnly; SameSite=Strict{secure}"),
        None => {
            format!("{SESSION_COOKIE}=; Path=/ui; Max-Age=0; HttpOnly; SameSite=Strict{secure}")
        }
    };
    HeaderValue::from_str(&value).unwrap_or(HeaderValue::from_static("warden_ui=; Max-Age=0"))
}

/// The signed-in browser's token, its CSRF field and the CSRF cookie to set if it had none;
/// `None`: not signed in (answer [`to_login`]).
pub(crate) fn session(
    ui: &Ui,
    headers: &HeaderMap,
) -> Option<(String, String, Option<HeaderValue>)> {
    let token = csrf::cookie(headers, SESSION_COOKIE)?;
    let (c, set) = csrf::token(headers, HTTPS);
    Some((token, csrf::field(&ui.api.ui_key, &c), set))
}

/// The CSRF check of a form POST: `Some(refusal)`, a page saying why, when it fails.
pub(crate) fn refused(ui: &Ui, headers: &HeaderMap, sent: Option<&str>) -> Option<Response> {
    csrf::check(&ui.api.ui_key, headers, HTTPS, sent)
        .err()
        .map(|e| pages::respond(StatusCode::FORBIDDEN, pages::error(None, &e.to_string())))
}

/// `GET /ui/login`
pub(super) async fn login_page(State(ui): State<Ui>, headers: HeaderMap) -> Response {
    let (c, set) = csrf::token(&headers, HTTPS);
    let html = pages::login(&csrf::field(&ui.api.ui_key, &c), None);
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
/// throttle, its audit); the admin token is compared in constant time. Either token becomes
/// the session cookie.
pub(super) async fn login(
    State(ui): State<Ui>,
    peer: Peer,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    if let Some(resp) = refused(&ui, &headers, f.csrf.as_deref()) {
        return resp;
    }
    let again = |status: StatusCode, msg: &str| {
        let (c, set) = csrf::token(&headers, HTTPS);
        page(
            status,
            pages::login(&csrf::field(&ui.api.ui_key, &c), Some(msg)),
            set,
        )
    };
    let token = match f.token.filter(|t| !t.is_empty()) {
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
            t
        }
        None => {
            let body = serde_json::json!({
                "name": f.name.unwrap_or_default(),
                "password": f.password.unwrap_or_default(),
            });
            let ans = ui
                .call("", &peer, Method::POST, "/v1/login", Some(body))
                .await;
            match ans.json::<IssuedToken>() {
                Ok(issued) => issued.token,
                Err(msg) => return again(ans.status, &msg),
            }
        }
    };
    let mut resp = see_other("/ui/");
    resp.headers_mut()
        .insert(header::SET_COOKIE, session_cookie(Some(&token)));
    resp
}

/// `POST /ui/logout`: ends the session through `POST /v1/logout` (the admin token has none to
/// end) and forgets the cookie.
pub(super) async fn logout(
    State(ui): State<Ui>,
    peer: Peer,
    headers: HeaderMap,
    Form(f): Form<Plain>,
) -> Response {
    if let Some(resp) = refused(&ui, &headers, f.csrf.as_deref()) {
        return resp;
    }
    if let Some(token) = csrf::cookie(&headers, SESSION_COOKIE) {
        let ans = ui
            .call(&token, &peer, Method::POST, "/v1/logout", None)
            .await;
        tracing::debug!(status = %ans.status, "dashboard sign-out");
    }
    to_login()
}
