//! Session tokens: issued on login, presented as a cookie or a bearer token.
//!
//! A token is 256 random bits. Only its SHA-256 is stored (`sessions/<hash>`), under a lease
//! that ends with the session, so a copy of the store cannot be used to sign in and a logout or
//! expiry reaches every gateway through the watch.

use http::HeaderMap;
use sha2::{Digest, Sha256};

/// The first session token a request carries: the bearer token, else a session cookie.
pub(crate) fn token(headers: &HeaderMap) -> Option<String> {
    let authorization = headers
        .get(http::header::AUTHORIZATION)
        .map(http::HeaderValue::as_bytes);
    let cookies = headers
        .get_all(http::header::COOKIE)
        .iter()
        .map(http::HeaderValue::as_bytes);
    tokens(authorization, cookies)
        .into_iter()
        .next()
        .map(str::to_owned)
}

/// Every session token a request carries: the bearer token of `authorization`, then the value
/// of every session cookie in the `cookies` headers (the cookie's name in any case).
pub(crate) fn tokens<'a>(
    authorization: Option<&'a [u8]>,
    cookies: impl Iterator<Item = &'a [u8]>,
) -> Vec<&'a str> {
    let mut found = Vec::new();
    if let Some(t) = authorization.and_then(|v| v.strip_prefix(b"Bearer ")) {
        if let Ok(t) = std::str::from_utf8(t) {
            found.push(t.trim());
        }
    }
    for v in cookies.filter_map(|v| std::str::from_utf8(v).ok()) {
        found.extend(v.split(';').filter_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            is_session_cookie(name).then_some(value.trim())
        }));
    }
    found
}

/// Name of the gateway's session cookie.
pub(crate) const SESSION_COOKIE: &str = "warden_session";

/// Whether a cookie `name` is the gateway's session cookie, in any case: the gateway owns
/// every spelling of it.
pub(crate) fn is_session_cookie(name: &str) -> bool {
    name.trim().eq_ignore_ascii_case(SESSION_COOKIE)
}

/// The cookies of the API's dashboard (crates/api/src/ui: its session id, its CSRF cookie and
/// the cookie binding a single sign-on to its browser). A browser sends a host's cookies to
/// every port of it, so where the API and the gateway share a host name these reach the
/// gateway too; an app that could plant the binding cookie could have a person finish the
/// app author's own sign-in and act in the dashboard as them.
const DASHBOARD_COOKIES: [&str; 3] = ["warden_ui", "warden_ui_csrf", "warden_ui_oidc"];

/// Whether `name` (in any case) is a cookie warden owns: the session, the sign-in forms' CSRF
/// cookie, the cookie that binds a provider sign-in to its browser, and the dashboard's. No
/// app gets them with a request or may set them: an app's page holding the CSRF pair, or
/// planting its own, would leave the forms only their origin check; a planted binding cookie
/// would finish another's sign-in here; an app handed the dashboard's session id would hold
/// its operator's dashboard.
pub(crate) fn is_gateway_cookie(name: &str) -> bool {
    let name = name.trim();
    [
        SESSION_COOKIE,
        crate::endpoints::csrf::CSRF_COOKIE,
        crate::oidc::FLOW_COOKIE,
    ]
    .iter()
    .chain(DASHBOARD_COOKIES.iter())
    .any(|c| name.eq_ignore_ascii_case(c))
}

/// The stored name of a token: hex SHA-256.
pub(crate) fn token_hash(token: &str) -> String {
    warden_core::id::hex(&Sha256::digest(token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_come_from_bearer_or_cookie() {
        let mut h = HeaderMap::new();
        assert_eq!(token(&h), None);
        h.insert(
            http::header::COOKIE,
            "a=1; warden_session=tok; b=2".parse().expect("header"),
        );
        assert_eq!(token(&h).as_deref(), Some("tok"));
        let all = tokens(
            Some(b"Bearer one"),
            [&b"x=1; Warden_Session=two"[..], b"WARDEN_SESSION = three"].into_iter(),
        );
        assert_eq!(all, vec!["one", "two", "three"]);
        h.insert(
            http::header::AUTHORIZATION,
            "Bearer xyz".parse().expect("header"),
        );
        assert_eq!(token(&h).as_deref(), Some("xyz"));
        assert_eq!(token_hash("x").len(), 64);
    }
}
