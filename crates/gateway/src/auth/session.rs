//! Session tokens: issued on login, presented as a cookie or a bearer token.
//!
//! A token is 256 random bits. Only its SHA-256 is stored (`sessions/<hash>`), under a lease
//! that ends with the session, so a copy of the store cannot be used to sign in and a logout or
//! expiry reaches every gateway through the watch.

use http::HeaderMap;
use sha2::{Digest, Sha256};

/// Name of the session cookie.
pub const COOKIE: &str = "warden_session";

/// The session token a request carries: `Authorization: Bearer` first, then the cookie.
pub(crate) fn token(headers: &HeaderMap) -> Option<String> {
    token_from(
        headers
            .get(http::header::AUTHORIZATION)
            .map(http::HeaderValue::as_bytes),
        headers
            .get_all(http::header::COOKIE)
            .iter()
            .map(http::HeaderValue::as_bytes),
    )
}

/// [`token`] from the raw values of the Authorization header and of every Cookie header.
pub(crate) fn token_from<'a>(
    authorization: Option<&[u8]>,
    cookies: impl Iterator<Item = &'a [u8]>,
) -> Option<String> {
    if let Some(t) = authorization.and_then(|v| v.strip_prefix(b"Bearer ")) {
        return std::str::from_utf8(t).ok().map(|t| t.trim().to_owned());
    }
    for v in cookies.filter_map(|v| std::str::from_utf8(v).ok()) {
        if let Some(value) = cookie_value(v) {
            return Some(value.to_owned());
        }
    }
    None
}

/// The session cookie's value in one Cookie header.
fn cookie_value(header: &str) -> Option<&str> {
    header.split(';').find_map(|pair| {
        let (name, value) = pair.trim().split_once('=')?;
        (name == COOKIE).then_some(value)
    })
}

/// The pairs of one Cookie header other than the session cookie.
pub(crate) fn other_cookies(header: &str) -> impl Iterator<Item = &str> {
    header
        .split(';')
        .map(str::trim)
        .filter(|p| !p.is_empty() && p.split_once('=').is_none_or(|(n, _)| n != COOKIE))
}

/// Removes the session cookie from `Cookie` headers, keeping the app's own cookies.
pub(crate) fn strip_cookie(headers: &mut HeaderMap) {
    let kept: Vec<String> = headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(other_cookies)
        .map(str::to_owned)
        .collect();
    headers.remove(http::header::COOKIE);
    if !kept.is_empty() {
        if let Ok(v) = http::HeaderValue::from_str(&kept.join("; ")) {
            headers.insert(http::header::COOKIE, v);
        }
    }
}

/// The stored name of a token: hex SHA-256.
pub(crate) fn token_hash(token: &str) -> String {
    warden_core::id::hex(&Sha256::digest(token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_come_from_bearer_or_cookie_and_the_cookie_is_stripped() {
        let mut h = HeaderMap::new();
        assert_eq!(token(&h), None);
        h.insert(
            http::header::COOKIE,
            "a=1; warden_session=tok; b=2".parse().expect("header"),
        );
        assert_eq!(token(&h).as_deref(), Some("tok"));
        strip_cookie(&mut h);
        assert_eq!(
            h.get(http::header::COOKIE).and_then(|v| v.to_str().ok()),
            Some("a=1; b=2")
        );
        h.insert(
            http::header::AUTHORIZATION,
            "Bearer xyz".parse().expect("header"),
        );
        assert_eq!(token(&h).as_deref(), Some("xyz"));
        assert_eq!(token_hash("x").len(), 64);
    }
}
