//! `/whoami`: who is signed in, at which clearance, in which groups; a page with a sign-out
//! button for a browser, JSON for a program. Without a session, a browser is sent to sign in.

use http::{header, Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use super::{csrf, pages};
use crate::client::Client;
use crate::error::GatewayError;
use crate::response::{self, Ask, Body};
use crate::state::State;

/// The page's own path: where a browser returns after signing in.
const PATH: &str = "/whoami";

/// `GET /whoami`.
pub(crate) async fn whoami(
    state: &State,
    req: Request<Incoming>,
    client: &Client,
) -> Response<Body> {
    let accept = req.headers().get(header::ACCEPT).map(|v| v.as_bytes());
    let ask = Ask::new(accept, req.method().as_str().as_bytes(), Some(PATH));
    if !matches!(*req.method(), Method::GET | Method::HEAD) {
        return GatewayError::MethodNotAllowed("use GET /whoami").respond(&ask);
    }
    let user = match state
        .auth
        .authenticate(&state.views, req.headers(), client.ip, &state.metrics)
        .await
    {
        Ok(u) => u,
        Err(e) => return e.respond(&ask),
    };
    let r = &user.record;
    if !ask.html {
        let mut resp = response::json(
            StatusCode::OK,
            &serde_json::json!({ "user": r.name, "clearance": r.clearance, "groups": r.groups }),
        );
        resp.headers_mut().insert(
            header::CACHE_CONTROL,
            header::HeaderValue::from_static("no-store"),
        );
        return resp;
    }
    let (token, set) = csrf::token(req.headers(), client.https);
    let html = pages::whoami(&pages::WhoAmI {
        user: &r.name,
        clearance: r.clearance.as_str(),
        groups: &r.groups,
        csrf: &csrf::field(&state.config.csrf_key, &token),
    });
    let mut resp = pages::respond(StatusCode::OK, html);
    if let Some(set) = set {
        resp.headers_mut().insert(header::SET_COOKIE, set);
    }
    resp
}
