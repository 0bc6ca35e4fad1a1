//! The app page's releases and their actions: each release with its status, who made it and
//! when; a rollback to each earlier release that served (`POST /v1/apps/{name}/rollback`) and
//! a restart of the serving one (`POST /v1/apps/{name}/restart`: fresh instances of the same
//! release, no new release, as `warden apps restart APP`); and the newest release's build
//! output, read through `GET /v1/apps/{name}/releases/{number}/log` and kept current by the
//! page's event stream (see [`super::live`]).
//!
//! Both actions take two POSTs, each with its CSRF field: the first answers a page that asks
//! to confirm (no script needed), the second, carrying `confirm=yes`, acts.

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Form;
use warden_core::Release;

use super::pages::{self, escape_html, Build};
use super::{text, Peer, SessionId, Ui};

/// The newest release's output, through the API (`None`: no release, or the API would not
/// say).
pub(super) async fn build_output(
    ui: &Ui,
    token: &SessionId,
    peer: &Peer,
    name: &str,
    releases: &[Release],
) -> Option<Build> {
    let r = releases.iter().max_by_key(|r| r.number)?;
    // One byte past what is shown, so `tail` knows whether anything was cut.
    let path = format!(
        "/v1/apps/{name}/releases/{}/log?tail={}",
        r.number,
        text::TAIL + 1
    );
    let ans = ui.call(token, peer, Method::GET, &path, None).await;
    if !ans.status.is_success() {
        return None;
    }
    let all = String::from_utf8_lossy(&ans.body);
    let (end, cut) = text::tail(&all);
    Some(Build {
        number: r.number,
        status: r.status,
        text: text::plain(end),
        cut,
    })
}

/// The rollback and restart forms.
#[derive(serde::Deserialize)]
pub(super) struct ActionForm {
    csrf: Option<String>,
    to: String,
    /// The release serving when the page was shown (absent from hand-made posts).
    from: Option<String>,
    confirm: Option<String>,
}

/// Which action a form asks for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Action {
    Rollback,
    Restart,
}

/// `POST /ui/apps/{name}/rollback`: `POST /v1/apps/{name}/rollback` with `to`, once confirmed.
pub(super) async fn rollback(
    State(ui): State<Ui>,
    peer: Peer,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(f): Form<ActionForm>,
) -> Response {
    act(ui, peer, headers, name, f, Action::Rollback).await
}

/// `POST /ui/apps/{name}/restart`: `POST /v1/apps/{name}/restart` of every label, once
/// confirmed (`to`, the release serving when the page was shown, only says what restarts).
pub(super) async fn restart(
    State(ui): State<Ui>,
    peer: Peer,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(f): Form<ActionForm>,
) -> Response {
    act(ui, peer, headers, name, f, Action::Restart).await
}

async fn act(
    ui: Ui,
    peer: Peer,
    headers: HeaderMap,
    name: String,
    f: ActionForm,
    action: Action,
) -> Response {
    if let Some(resp) = super::refused(&ui, &headers, f.csrf.as_deref()) {
        return resp;
    }
    let Some((token, csrf, _)) = super::session(&ui, &headers) else {
        return super::to_login();
    };
    if warden_core::validate_name("app", &name).is_err() {
        let page = pages::error(Some(&csrf), "no such app");
        return pages::respond(StatusCode::NOT_FOUND, page);
    }
    let Ok(to) = f.to.trim().parse::<u64>() else {
        let msg = format!("{:?} is not a release number", f.to);
        return pages::respond(StatusCode::BAD_REQUEST, pages::error(Some(&csrf), &msg));
    };
    let from = match f.from.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => match s.parse::<u64>() {
            Ok(n) => Some(n),
            Err(_) => {
                let msg = format!("{s:?} is not a release number");
                return pages::respond(StatusCode::BAD_REQUEST, pages::error(Some(&csrf), &msg));
            }
        },
    };
    if f.confirm.as_deref() != Some("yes") {
        return pages::respond(StatusCode::OK, confirm(&name, to, from, action, &csrf));
    }
    let (path, body) = match action {
        // `expect`: the API refuses (409) if another release serves than the one the page
        // showed, so a confirm page left open does not roll back from a release never seen.
        Action::Rollback => (
            format!("/v1/apps/{name}/rollback"),
            serde_json::json!({ "to": to, "expect": from }),
        ),
        Action::Restart => (format!("/v1/apps/{name}/restart"), serde_json::json!({})),
    };
    // The release goes on whether or not its progress is read: the page shows it.
    let ans = match ui
        .send(&token, &peer, Method::POST, &path, Some(body))
        .await
    {
        Ok(resp) if resp.status().is_success() => {
            let mut resp = (
                StatusCode::SEE_OTHER,
                [(header::LOCATION, format!("/ui/apps/{name}"))],
            )
                .into_response();
            for (n, v) in pages::headers() {
                resp.headers_mut().insert(n, v);
            }
            return resp;
        }
        Ok(resp) => super::Answer::read(resp).await,
        Err(ans) => ans,
    };
    if ans.status == StatusCode::UNAUTHORIZED {
        return super::to_login();
    }
    let msg = ans.error();
    with_message(&ui, &token, &peer, &name, &csrf, ans.status, &msg).await
}

/// The app page saying `msg`, answered with `status`; or a page with only the message.
async fn with_message(
    ui: &Ui,
    token: &SessionId,
    peer: &Peer,
    name: &str,
    csrf: &str,
    status: StatusCode,
    msg: &str,
) -> Response {
    match super::app_page(ui, token, peer, name).await {
        Ok(p) => pages::respond(status, pages::app(&p, csrf, Some(msg))),
        Err(_) => pages::respond(status, pages::error(Some(csrf), msg)),
    }
}

/// The page that asks to confirm an action.
fn confirm(name: &str, to: u64, from: Option<u64>, action: Action, csrf: &str) -> String {
    let n = escape_html(name);
    let now = from.map_or(String::new(), |f| format!(" It now serves release {f}."));
    let from_field = from.map_or(String::new(), |f| {
        format!("<input type=\"hidden\" name=\"from\" value=\"{f}\">")
    });
    let (title, what, path, label) = match action {
        Action::Rollback => (
            format!("Roll back {name}"),
            format!("Roll app {n} back to release {to}?{now} A new release runs release {to}'s build and config; each instance is replaced once its replacement is ready."),
            "rollback",
            format!("Roll back to {to}"),
        ),
        Action::Restart => (
            format!("Restart {name}"),
            format!("Restart app {n}? Its instances are replaced by fresh ones of release {to}, each once its replacement is ready; no release is made."),
            "restart",
            "Restart".to_owned(),
        ),
    };
    let main = format!(
        "<h1>{}</h1>\n<p>{what}</p>\
         <form method=\"post\" action=\"/ui/apps/{n}/{path}\" id=\"confirm\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <input type=\"hidden\" name=\"to\" value=\"{to}\">{from_field}\
         <input type=\"hidden\" name=\"confirm\" value=\"yes\">\
         <button type=\"submit\">{label}</button> <a href=\"/ui/apps/{n}\">Cancel</a></form>",
        escape_html(&title),
        csrf = escape_html(csrf),
    );
    pages::document(&title, Some(csrf), &main)
}
