//! The operators' dashboard under `/ui/`: server-rendered pages of what the JSON API says, and
//! forms that call it.
//!
//! The dashboard has no access rule of its own. A signed-in browser holds a token in an
//! HttpOnly cookie (an operator's session from `POST /v1/login`, or the break-glass admin
//! token); every page and form calls the JSON API through the same router a client reaches,
//! with that token as its `Bearer`, so the same token check, role table, handlers, config
//! redaction and audit apply, and a refusal is the API's own. Forms are guarded against
//! cross-site requests by [`csrf`]; pages by the headers of [`pages::headers`].

mod actions;
mod audit;
mod audit_html;
mod csrf;
mod instances;
mod live;
mod metrics;
mod metrics_html;
mod nodes;
mod pages;
mod session;
mod sso;
mod text;
mod users;
mod users_html;

use std::net::SocketAddr;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Form, Router};
use serde::de::DeserializeOwned;
use tower_service::Service as _;
use warden_api_types::Status;
use warden_core::{AppSpec, InstanceRecord, Release};

use crate::Api;
pub(crate) use session::{refused, session, to_login, SessionId};

/// Largest answer of the JSON API a page reads.
const MAX_ANSWER: usize = 16 * 1024 * 1024;

/// What the dashboard's handlers share: the API's state and its JSON router.
#[derive(Clone)]
pub(crate) struct Ui {
    api: Api,
    json: Router,
    /// Open event streams per principal ([`live`]).
    streams: live::Streams,
    /// The metrics page's samples ([`metrics`]).
    samples: metrics::Samples,
}

/// The client's address, as the server recorded it.
type Peer = Option<Extension<ConnectInfo<SocketAddr>>>;

/// The dashboard's routes, which call `json` (the API's router) for everything they show or do.
pub(crate) fn router(api: Api, json: Router) -> Router {
    Router::new()
        .route("/ui", get(|| async { see_other("/ui/") }))
        .route("/ui/", get(overview))
        .route("/ui/login", get(session::login_page).post(session::login))
        .route("/ui/logout", post(session::logout))
        .route("/ui/login/oidc/{id}", get(sso::start))
        .route("/ui/login/oidc/{id}/callback", get(sso::callback))
        .route("/ui/apps/{name}", get(app))
        .route("/ui/apps/{name}/scale", post(scale))
        .route("/ui/users", get(users::page).post(users::create))
        .route("/ui/users/clearance", post(users::clearance))
        .route("/ui/users/password", post(users::password))
        .route("/ui/users/end-sessions", post(users::end_sessions))
        .route("/ui/audit", get(audit::search))
        .route("/ui/audit/events", get(audit::events))
        .route("/ui/metrics", get(metrics::show))
        .route("/ui/metrics/events", get(metrics::events))
        .route("/ui/apps/{name}/rollback", post(actions::rollback))
        .route("/ui/apps/{name}/restart", post(actions::restart))
        .route("/ui/apps/{name}/instances", get(instances::page))
        .route("/ui/nodes", get(nodes::page))
        .route("/ui/nodes/{name}/drain", post(nodes::drain))
        .route("/ui/nodes/{name}/undrain", post(nodes::undrain))
        .route("/ui/live.js", get(live::script))
        .route("/ui/events", get(live::events))
        .layer(axum::extract::DefaultBodyLimit::max(64 * 1024))
        .with_state(Ui {
            api,
            json,
            streams: live::Streams::default(),
            samples: metrics::Samples::default(),
        })
}

/// An answer of the JSON API.
struct Answer {
    status: StatusCode,
    body: Bytes,
}

impl Answer {
    /// `resp`, read whole (up to [`MAX_ANSWER`]).
    async fn read(resp: Response) -> Self {
        let status = resp.status();
        let body = axum::body::to_bytes(resp.into_body(), MAX_ANSWER)
            .await
            .unwrap_or_default();
        Self { status, body }
    }

    /// The body as `T`, or the API's error message.
    fn json<T: DeserializeOwned>(&self) -> Result<T, String> {
        if !self.status.is_success() {
            return Err(self.error());
        }
        serde_json::from_slice(&self.body).map_err(|e| format!("the API answered unreadably: {e}"))
    }

    /// What the API said went wrong.
    fn error(&self) -> String {
        serde_json::from_slice::<warden_api_types::ErrorBody>(&self.body)
            .map(|e| e.error)
            .unwrap_or_else(|_| format!("the API answered {}", self.status))
    }
}

// === impl Ui ===

impl Ui {
    /// The sign-in page's identity providers: `(id, label)` of those the dashboard offers.
    fn providers(&self) -> Vec<(String, String)> {
        self.api.idp.as_deref().map_or_else(Vec::new, |idp| {
            idp.providers
                .iter()
                .filter(|p| p.dashboard)
                .map(|p| (p.provider.config().id.clone(), p.label.clone()))
                .collect()
        })
    }

    /// Calls the JSON API as the browser in session `who` (none: anonymous), from `peer`,
    /// through its own router.
    async fn call(
        &self,
        who: &SessionId,
        peer: &Peer,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Answer {
        match self.send(who, peer, method, path, body).await {
            Ok(resp) => Answer::read(resp).await,
            Err(ans) => ans,
        }
    }

    /// [`Ui::call`], the answer unread: for a route that streams (a release's progress).
    async fn send(
        &self,
        who: &SessionId,
        peer: &Peer,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<Response, Answer> {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body));
        let mut req = match req {
            Ok(r) => r,
            Err(e) => {
                return Err(Answer {
                    status: StatusCode::BAD_REQUEST,
                    body: serde_json::json!({ "error": format!("not a valid request: {e}") })
                        .to_string()
                        .into(),
                })
            }
        };
        if let Some(Extension(c)) = peer {
            req.extensions_mut().insert(*c);
        }
        // The session's credential, by hash: the API's token check finds the principal by it.
        if let Some((hashed, _)) = session::credential(self, who).await {
            req.extensions_mut().insert(hashed);
        }
        match self.json.clone().call(req).await {
            Ok(r) => Ok(r),
            Err(never) => match never {},
        }
    }
}

/// A 303 to `to`.
fn see_other(to: &'static str) -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, to)]).into_response()
}

/// A page, with the CSRF cookie if the browser had none.
fn page(status: StatusCode, html: String, set_csrf: Option<HeaderValue>) -> Response {
    let mut resp = pages::respond(status, html);
    if let Some(c) = set_csrf {
        resp.headers_mut().append(header::SET_COOKIE, c);
    }
    resp
}

/// A form that carries only its CSRF field.
#[derive(serde::Deserialize)]
pub(crate) struct Plain {
    csrf: Option<String>,
}

/// An API refusal as a page: 401 signs in again, anything else says what the API said.
fn refusal(ans: &Answer, csrf: &str, msg: String) -> Response {
    if ans.status == StatusCode::UNAUTHORIZED {
        return to_login();
    }
    let status = if ans.status.is_success() {
        StatusCode::BAD_GATEWAY
    } else {
        ans.status
    };
    pages::respond(status, pages::error(Some(csrf), &msg))
}

/// `GET /ui/`: `GET /v1/status`, shown.
async fn overview(State(ui): State<Ui>, peer: Peer, headers: HeaderMap) -> Response {
    let (token, csrf, set) = match session(&ui, &headers) {
        Some(s) => s,
        None => return to_login(),
    };
    let ans = ui
        .call(&token, &peer, Method::GET, "/v1/status", None)
        .await;
    match ans.json::<Status>() {
        Ok(status) => page(StatusCode::OK, pages::overview(&status, &csrf), set),
        Err(msg) => refusal(&ans, &csrf, msg),
    }
}

/// `GET /ui/apps/{name}`: the app, its part of the status, its instances and releases.
async fn app(
    State(ui): State<Ui>,
    peer: Peer,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Response {
    let (token, csrf, set) = match session(&ui, &headers) {
        Some(s) => s,
        None => return to_login(),
    };
    match app_page(&ui, &token, &peer, &name).await {
        Ok(p) => page(StatusCode::OK, pages::app(&p, &csrf, None), set),
        Err((ans, msg)) => refusal(&ans, &csrf, msg),
    }
}

/// Reads what the app page shows, each part through the JSON API.
async fn app_page(
    ui: &Ui,
    token: &SessionId,
    peer: &Peer,
    name: &str,
) -> Result<pages::AppPage, (Answer, String)> {
    if let Err(e) = warden_core::validate_name("app", name) {
        let ans = Answer {
            status: StatusCode::NOT_FOUND,
            body: Bytes::new(),
        };
        return Err((ans, e.to_string()));
    }
    let spec: AppSpec = read(ui, token, peer, &format!("/v1/apps/{name}")).await?;
    let releases: Vec<Release> =
        read(ui, token, peer, &format!("/v1/apps/{name}/releases")).await?;
    let status: Status = read(ui, token, peer, "/v1/status").await?;
    let instances: Vec<InstanceRecord> = read(ui, token, peer, "/v1/instances").await?;
    let build = actions::build_output(ui, token, peer, name, &releases).await;
    Ok(pages::AppPage {
        status: status.apps.into_iter().find(|a| a.name == name),
        instances: instances.into_iter().filter(|i| i.app == name).collect(),
        releases,
        spec,
        build,
    })
}

/// `GET path` of the JSON API as `T`, or its answer and what it said went wrong.
async fn read<T: DeserializeOwned>(
    ui: &Ui,
    who: &SessionId,
    peer: &Peer,
    path: &str,
) -> Result<T, (Answer, String)> {
    let ans = ui.call(who, peer, Method::GET, path, None).await;
    match ans.json::<T>() {
        Ok(v) => Ok(v),
        Err(msg) => Err((ans, msg)),
    }
}

/// The scale form.
#[derive(serde::Deserialize)]
struct ScaleForm {
    csrf: Option<String>,
    label: String,
    count: String,
}

/// `POST /ui/apps/{name}/scale`: `POST /v1/apps/{name}/scale` with the one label's count.
async fn scale(
    State(ui): State<Ui>,
    peer: Peer,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(f): Form<ScaleForm>,
) -> Response {
    if let Some(resp) = refused(&ui, &headers, f.csrf.as_deref()) {
        return resp;
    }
    let (token, csrf, _) = match session(&ui, &headers) {
        Some(s) => s,
        None => return to_login(),
    };
    let Ok(count) = f.count.trim().parse::<u32>() else {
        let msg = format!(
            "{:?} is not a count of instances: give a whole number, 0 or more",
            f.count
        );
        return pages::respond(StatusCode::BAD_REQUEST, pages::error(Some(&csrf), &msg));
    };
    if warden_core::validate_name("app", &name).is_err() {
        return pages::respond(
            StatusCode::NOT_FOUND,
            pages::error(Some(&csrf), "no such app"),
        );
    }
    let body = serde_json::json!({ "desired": { f.label.clone(): count } });
    let path = format!("/v1/apps/{name}/scale");
    let ans = ui
        .call(&token, &peer, Method::POST, &path, Some(body))
        .await;
    if ans.status.is_success() {
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
    let msg = ans.error();
    refusal(&ans, &csrf, msg)
}
