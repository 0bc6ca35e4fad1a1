//! The readable pages a browser gets when a provider sign-in cannot go on.

use http::{header, HeaderValue, Response, StatusCode};

use crate::response::{full, Body};

/// `text` with HTML's special characters escaped.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A small HTML page: a title, a message and a way back to the sign-in page.
pub(crate) fn html(status: StatusCode, title: &str, message: &str) -> Response<Body> {
    let body = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{t}</title></head>\
         <body><h1>{t}</h1><p>{m}</p><p><a href=\"/login\">Sign in again</a></p></body></html>\n",
        t = escape(title),
        m = escape(message),
    );
    let mut resp = Response::new(full(bytes::Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
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
