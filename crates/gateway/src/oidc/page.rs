//! The readable pages a browser gets when a provider sign-in cannot go on.

use http::{Response, StatusCode};

use crate::response::Body;

/// A readable page in the gateway's own style and with its headers (CSP, framing, caching,
/// referrer): what went wrong, and a way back to the sign-in page.
pub(crate) fn html(status: StatusCode, title: &str, message: &str) -> Response<Body> {
    let page =
        crate::endpoints::pages::error(status, &format!("{title}. {message}"), Some("/login"));
    crate::endpoints::pages::respond(status, page)
}

/// No provider of that id.
pub(crate) fn not_found(id: &str) -> Response<Body> {
    html(
        StatusCode::NOT_FOUND,
        "No such identity provider",
        &format!("This gateway has no identity provider {id:?}. Sign in with a password or pick another provider."),
    )
}

/// The provider did not answer.
pub(crate) fn provider_down(label: &str, err: &warden_oidc::OidcError) -> Response<Body> {
    tracing::warn!(provider = %label, error = %err, "identity provider unavailable");
    html(
        StatusCode::BAD_GATEWAY,
        "Identity provider unavailable",
        &format!(
            "The identity provider {label} did not answer; sign in with a password or try again."
        ),
    )
}
