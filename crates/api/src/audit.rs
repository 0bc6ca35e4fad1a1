//! The API's audit records: every mutating request (not GET or HEAD) is recorded as a `change`,
//! made durable BEFORE the handler acts, then again with the status it ended with. Only requests
//! that passed the admin token get here (this layer runs inside `require_admin`). The body is
//! recorded as its SHA-256, never as itself: it may hold passwords or config values.

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use warden_core::audit::Event;

use crate::error::ApiError;
use crate::Api;

/// Who a change through the API is recorded as: the admin token, the only API credential.
pub const ACTOR: &str = "admin token";

/// Largest body digested before the handler runs; bigger ones are refused by the handlers'
/// own limit anyway (pushes, which stream, are digested by nothing: their release records the
/// upload's digest).
const MAX_DIGESTED: usize = 1024 * 1024;

/// The path parameter of `path` where `template` has one (`{name}`, `{id}`): the first.
fn target(template: &str, path: &str) -> Option<String> {
    template
        .split('/')
        .zip(path.split('/'))
        .find(|(t, _)| t.starts_with('{'))
        .map(|(_, p)| p.to_owned())
}

/// The `name` of a JSON object body.
fn named(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Named {
        name: String,
    }
    serde_json::from_slice::<Named>(body).ok().map(|n| n.name)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Records a mutating request before and after its handler.
pub(crate) async fn record_change(State(api): State<Api>, req: Request, next: Next) -> Response {
    if matches!(*req.method(), Method::GET | Method::HEAD) {
        return next.run(req).await;
    }
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_owned())
        .unwrap_or_else(|| req.uri().path().to_owned());
    let method = req.method().to_string();
    let mut target = target(&route, req.uri().path());
    let streamed = route == "/v1/apps/{name}/releases";
    let (req, after) = if streamed {
        (req, None)
    } else {
        let (parts, body) = req.into_parts();
        let Ok(bytes) = axum::body::to_bytes(body, MAX_DIGESTED).await else {
            return ApiError::new(
                axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                "the request body is over 1 MiB or was cut off; send a smaller body",
            )
            .into_response();
        };
        let digest = (!bytes.is_empty()).then(|| hex(&Sha256::digest(&bytes)));
        // A create names its target in the body (`{"name": …}`): a name is no secret.
        target = target.or_else(|| named(&bytes));
        (Request::from_parts(parts, Body::from(bytes)), digest)
    };
    let change = |outcome: String| Event::Change {
        actor: ACTOR.into(),
        method: method.clone(),
        route: route.clone(),
        target: target.clone(),
        outcome,
        before: None,
        after: after.clone(),
    };
    // Serve with an alarm when the log cannot write (the default; `/readyz` and `warden status`
    // say so): a refusal mode for those who must is not built yet.
    if let Err(e) = api.audit.record_durable(change("pending".into())).await {
        warden_core::log_limited!(error, error = %e, "an API change goes ahead unrecorded");
    }
    let resp = next.run(req).await;
    api.audit.record(change(resp.status().as_u16().to_string()));
    resp
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_target_is_the_paths_first_parameter() {
        assert_eq!(
            super::target("/v1/apps/{name}/scale", "/v1/apps/web/scale").as_deref(),
            Some("web")
        );
        assert_eq!(super::target("/v1/apps", "/v1/apps"), None);
    }
}
