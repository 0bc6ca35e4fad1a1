//! How git authenticates to the API (`git push`, issue 38): git's two routes, HTTP Basic whose
//! password is the token (taken on those routes alone), and refusals as git shows them (plain
//! text; a 401 with the Basic challenge, so that git asks for credentials). The routes
//! themselves are `routes/git.rs`; this sits here so that authorizing imports no route.

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// The route git asks for the refs it may update.
pub(crate) const REFS: &str = "/v1/apps/{name}/git/info/refs";
/// The route git sends a push to.
pub(crate) const RECEIVE: &str = "/v1/apps/{name}/git/git-receive-pack";

/// Whether `route` (a template) is one of git's.
pub(crate) fn is_git(route: &str) -> bool {
    route == REFS || route == RECEIVE
}

/// The password of HTTP Basic credentials: the token git was given. The user name is ignored.
pub(crate) fn basic_password(headers: &HeaderMap) -> Option<String> {
    use base64::Engine as _;
    let encoded = headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    text.split_once(':').map(|(_, p)| p.to_owned())
}

/// A refusal of the API (JSON) as git shows it: the message as plain text, and for a 401 the
/// Basic challenge, so that git asks for the user name and token.
pub(crate) async fn for_git(resp: Response) -> Response {
    let status = resp.status();
    let (mut parts, body) = resp.into_parts();
    let bytes = axum::body::to_bytes(body, 64 * 1024)
        .await
        .unwrap_or_default();
    let message = serde_json::from_slice::<warden_api_types::ErrorBody>(&bytes)
        .map(|e| e.error)
        .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
    let mut text = text(status, message);
    if status == StatusCode::UNAUTHORIZED {
        text.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"warden\""),
        );
    }
    parts.headers.remove(header::CONTENT_TYPE);
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.remove(header::WWW_AUTHENTICATE);
    for (k, v) in text.headers() {
        parts.headers.insert(k.clone(), v.clone());
    }
    Response::from_parts(parts, text.into_body())
}

/// `message` as a plain-text answer, which git prints as `remote:` lines.
pub(crate) fn text(status: StatusCode, message: impl Into<String>) -> Response {
    let mut body = message.into();
    body.push('\n');
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}
