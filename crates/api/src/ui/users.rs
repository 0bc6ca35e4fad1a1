//! `/ui/users`: app users (clearance, groups, provider, sessions at the gateways) and the forms
//! that create one, change a clearance, reset a password and end a user's sessions. Each form
//! calls the users API's own route (`POST /v1/users`, `PATCH /v1/users/{name}`, `DELETE
//! /v1/users/{name}/sessions`) as the signed-in browser, so its validation, its role row
//! (owner only), its audit and its errors are the API's. A password goes from the form to the
//! API's body and nowhere else: never into a page, a log line or an error.

use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::Response;
use axum::Form;
use warden_api_types::{SessionView, UserView};

use super::{pages, refusal, see_other, session, to_login, users_html, Peer, Ui};

/// `GET /ui/users`: `GET /v1/users` and `GET /v1/sessions`, shown.
pub(super) async fn page(State(ui): State<Ui>, peer: Peer, headers: HeaderMap) -> Response {
    let (who, csrf, set) = match session(&ui, &headers) {
        Some(s) => s,
        None => return to_login(),
    };
    let ans = ui.call(&who, &peer, Method::GET, "/v1/users", None).await;
    let users = match ans.json::<Vec<UserView>>() {
        Ok(u) => u,
        Err(msg) => return refusal(&ans, &csrf, msg),
    };
    let ans = ui
        .call(&who, &peer, Method::GET, "/v1/sessions", None)
        .await;
    let sessions = match ans.json::<Vec<SessionView>>() {
        Ok(s) => s,
        Err(msg) => return refusal(&ans, &csrf, msg),
    };
    let html = users_html::page(&users, &sessions, &csrf);
    super::page(StatusCode::OK, html, set)
}

/// The create form. Groups: names separated by commas or spaces.
#[derive(serde::Deserialize)]
pub(super) struct NewUserForm {
    csrf: Option<String>,
    name: String,
    password: String,
    clearance: String,
    #[serde(default)]
    groups: String,
}

/// `POST /ui/users`: `POST /v1/users`.
pub(super) async fn create(
    State(ui): State<Ui>,
    peer: Peer,
    headers: HeaderMap,
    Form(f): Form<NewUserForm>,
) -> Response {
    let groups: Vec<&str> = f
        .groups
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|g| !g.is_empty())
        .collect();
    let body = serde_json::json!({
        "name": f.name.trim(),
        "password": f.password,
        "clearance": f.clearance.trim(),
        "groups": groups,
    });
    act(
        &ui,
        &peer,
        &headers,
        f.csrf.as_deref(),
        Method::POST,
        "/v1/users".into(),
        Some(body),
    )
    .await
}

/// The clearance form.
#[derive(serde::Deserialize)]
pub(super) struct ClearanceForm {
    csrf: Option<String>,
    name: String,
    clearance: String,
}

/// `POST /ui/users/clearance`: `PATCH /v1/users/{name}` with the clearance.
pub(super) async fn clearance(
    State(ui): State<Ui>,
    peer: Peer,
    headers: HeaderMap,
    Form(f): Form<ClearanceForm>,
) -> Response {
    let body = serde_json::json!({ "clearance": f.clearance.trim() });
    let path = format!("/v1/users/{}", segment(f.name.trim()));
    act(
        &ui,
        &peer,
        &headers,
        f.csrf.as_deref(),
        Method::PATCH,
        path,
        Some(body),
    )
    .await
}

/// The password form.
#[derive(serde::Deserialize)]
pub(super) struct PasswordForm {
    csrf: Option<String>,
    name: String,
    password: String,
}

/// `POST /ui/users/password`: `PATCH /v1/users/{name}` with the new password.
pub(super) async fn password(
    State(ui): State<Ui>,
    peer: Peer,
    headers: HeaderMap,
    Form(f): Form<PasswordForm>,
) -> Response {
    let body = serde_json::json!({ "password": f.password });
    let path = format!("/v1/users/{}", segment(f.name.trim()));
    act(
        &ui,
        &peer,
        &headers,
        f.csrf.as_deref(),
        Method::PATCH,
        path,
        Some(body),
    )
    .await
}

/// The end-sessions form.
#[derive(serde::Deserialize)]
pub(super) struct EndForm {
    csrf: Option<String>,
    name: String,
}

/// `POST /ui/users/end-sessions`: `DELETE /v1/users/{name}/sessions`.
pub(super) async fn end_sessions(
    State(ui): State<Ui>,
    peer: Peer,
    headers: HeaderMap,
    Form(f): Form<EndForm>,
) -> Response {
    let path = format!("/v1/users/{}/sessions", segment(f.name.trim()));
    act(
        &ui,
        &peer,
        &headers,
        f.csrf.as_deref(),
        Method::DELETE,
        path,
        None,
    )
    .await
}

/// A name as one path segment: percent-encoded but for what a name may hold, so a name from
/// a form reaches the API's route whole and nothing else (the API refuses what no user can be
/// named).
fn segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A form's call: its CSRF check, then the API's route as the browser; back to the users page
/// on success, the API's refusal shown otherwise.
async fn act(
    ui: &Ui,
    peer: &Peer,
    headers: &HeaderMap,
    sent: Option<&str>,
    method: Method,
    path: String,
    body: Option<serde_json::Value>,
) -> Response {
    if let Some(resp) = super::refused(ui, headers, sent) {
        return resp;
    }
    let (who, csrf, _) = match session(ui, headers) {
        Some(s) => s,
        None => return to_login(),
    };
    let ans = ui.call(&who, peer, method, &path, body).await;
    if ans.status.is_success() {
        let mut resp = see_other("/ui/users");
        for (n, v) in pages::headers() {
            resp.headers_mut().insert(n, v);
        }
        return resp;
    }
    let msg = ans.error();
    refusal(&ans, &csrf, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_one_path_segment_whatever_it_holds() {
        assert_eq!(segment("ann_1-b"), "ann_1-b");
        assert_eq!(segment("../x?y#z"), "%2E%2E%2Fx%3Fy%23z");
        assert_eq!(segment("<b>"), "%3Cb%3E");
    }
}
