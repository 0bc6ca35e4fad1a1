//! Session tokens: issued on login, presented as a cookie or a bearer token.
//!
//! A token is 256 random bits. Only its SHA-256 is stored (`sessions/<hash>`), under a lease
//! that ends with the session, so a copy of the store cannot be used to sign in and a logout or
//! expiry reaches every gateway through the watch.

use http::HeaderMap;
use sha2::{Digest, Sha256};

use crate::hygiene::SESSION_COOKIE;

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
        (name == SESSION_COOKIE).then_some(value)
    })
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
        h.insert(
            http::header::AUTHORIZATION,
            "Bearer xyz".parse().expect("header"),
        );
        assert_eq!(token(&h).as_deref(), Some("xyz"));
        assert_eq!(token_hash("x").len(), 64);
    }
}
