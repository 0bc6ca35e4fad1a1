//! The gateway's own answers: `/healthz`, `/readyz`, `/login` and `/logout` ([`login`], with
//! the sign-in page from [`pages`], forms checked by [`csrf`], `next` by [`next`]), `/whoami`
//! ([`whoami`]), the redirect that adds a trailing slash to an app's root, and apps' static
//! files ([`statics`]).

pub(crate) mod csrf;
pub(crate) mod login;
pub mod next;
pub mod pages;
pub mod statics;
pub(crate) mod whoami;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::client::Client;
use crate::error::GatewayError;
use crate::response::{self, Ask, Body};
use crate::state::State;

/// Answers a request that no app route matched.
pub(crate) async fn answer(
    state: &State,
    req: Request<Incoming>,
    client: &Client,
) -> Response<Body> {
    match req.uri().path() {
        "/healthz" => response::json(StatusCode::OK, &serde_json::json!({ "status": "ok" })),
        // Ready while the store can record sessions; apps are served either way.
        "/readyz" => match state.store.ready() {
            Ok(()) => response::json(StatusCode::OK, &serde_json::json!({ "status": "ready" })),
            Err(e) => response::json(
                StatusCode::SERVICE_UNAVAILABLE,
                &serde_json::json!({ "status": "not ready", "error": e.to_string() }),
            ),
        },
        // A sign-in the log could not record is refused like a request to an app.
        "/login" => match state.audit_gate(accept(&req)) {
            Ok(()) => login::login(state, req, client).await,
            Err(e) => e.respond(&Ask::new(
                accept(&req),
                req.method().as_str().as_bytes(),
                None,
            )),
        },
        "/logout" => login::logout(state, req, client).await,
        "/whoami" => whoami::whoami(state, req, client).await,
        path if path.starts_with("/login/oidc/") => {
            match crate::oidc::answer(state, req, client).await {
                Some(r) => r,
                None => GatewayError::NotFound("no such sign-in path".into()).into_response(),
            }
        }
        path => GatewayError::NotFound(format!(
            "nothing is served at {path}; apps are under /apps/<name>/ or at their host names"
        ))
        .respond(&Ask::new(
            accept(&req),
            req.method().as_str().as_bytes(),
            None,
        )),
    }
}

/// The request's `Accept`.
fn accept(req: &Request<Incoming>) -> Option<&[u8]> {
    req.headers()
        .get(http::header::ACCEPT)
        .map(|v| v.as_bytes())
}

/// A permanent redirect to `location`.
pub(crate) fn redirect(location: &str) -> Response<Body> {
    let mut resp = Response::new(response::full(bytes::Bytes::new()));
    *resp.status_mut() = StatusCode::PERMANENT_REDIRECT;
    if let Ok(v) = http::HeaderValue::from_str(location) {
        resp.headers_mut().insert(http::header::LOCATION, v);
    }
    resp
}
