//! Cross-site request forgery on the gateway's forms (sign-in and sign-out): a signed
//! double-submit token, and the `Origin` a browser sends.
//!
//! A browser gets a random `warden_csrf` cookie (HttpOnly, SameSite=Strict, `Secure` on TLS)
//! and, in each form, a hidden field that is an HMAC-SHA256 of that cookie under the gateway's
//! CSRF key (the same on every gateway of a cluster). A form POST is taken only when its cookie
//! and field match, compared in constant time, and its `Origin`, when present, is this
//! gateway's. Another site can neither read the cookie nor compute the field; and a cookie
//! planted from a sibling host is useless without a field made for it, which only a page of
//! this gateway hands out (to whoever asks, hence the `Origin` check besides).
//!
//! JSON and Basic sign-ins (programs) are not checked: a browser sends neither across sites
//! without CORS, which the gateway never grants.

use http::{header, HeaderMap, HeaderValue};

/// The name of the CSRF cookie.
pub(crate) const CSRF_COOKIE: &str = "warden_csrf";

/// What the HMAC covers besides the cookie: this use, so the key signs nothing else alike.
const CONTEXT: &[u8] = b"warden csrf v1\0";

/// Why a form POST was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum CsrfError {
    /// The `Origin` names another site.
    #[error("the form was sent from another site ({0})")]
    OtherOrigin(String),
    /// No CSRF cookie came with the form.
    #[error("the form came without its cookie")]
    NoCookie,
    /// The field is missing or was not made for this cookie.
    #[error("the form's token does not match its cookie")]
    Mismatch,
}

/// The browser's CSRF cookie value, if it sent a well-formed one.
pub(crate) fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| name.trim() == CSRF_COOKIE)
        .map(|(_, value)| value.trim().to_owned())
        .filter(|v| (32..=128).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// The browser's CSRF cookie, or a new one with the `Set-Cookie` that gives it.
pub(crate) fn token(headers: &HeaderMap, https: bool) -> (String, Option<HeaderValue>) {
    if let Some(v) = cookie(headers) {
        return (v, None);
    }
    let v = warden_core::id::secret_token();
    let secure = if https { "; Secure" } else { "" };
    let set = format!("{CSRF_COOKIE}={v}; Path=/; HttpOnly; SameSite=Strict{secure}");
    (v.clone(), HeaderValue::from_str(&set).ok())
}

/// The form field for `cookie`: hex HMAC-SHA256 under `key`.
pub(crate) fn field(key: &[u8; 32], cookie: &str) -> String {
    warden_core::csrf::field(key, CONTEXT, cookie)
}

/// This gateway's origin as a browser writes it, from the request's `Host` (or, over HTTP/2,
/// its authority).
fn own_origin(headers: &HeaderMap, authority: Option<&str>, https: bool) -> Option<String> {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or(authority)?;
    let scheme = if https { "https" } else { "http" };
    Some(format!("{scheme}://{}", host.to_ascii_lowercase()))
}

/// Whether the request's `Origin`, if it sent one, is this gateway's (`authority`: the
/// request URI's, for HTTP/2).
pub(crate) fn check_origin(
    headers: &HeaderMap,
    authority: Option<&str>,
    https: bool,
) -> Result<(), CsrfError> {
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("").to_ascii_lowercase();
        if Some(&origin) != own_origin(headers, authority, https).as_ref() {
            return Err(CsrfError::OtherOrigin(origin));
        }
    }
    Ok(())
}

/// Whether a form POST with `headers` and the field `sent` may be taken: its origin
/// ([`check_origin`]), and a field made for its cookie under `key`.
pub(crate) fn check(
    key: &[u8; 32],
    headers: &HeaderMap,
    authority: Option<&str>,
    https: bool,
    sent: Option<&str>,
) -> Result<(), CsrfError> {
    check_origin(headers, authority, https)?;
    let c = cookie(headers).ok_or(CsrfError::NoCookie)?;
    match sent.is_some_and(|sent| warden_core::csrf::verify(key, CONTEXT, &c, sent)) {
        true => Ok(()),
        false => Err(CsrfError::Mismatch),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in pairs {
            h.append(
                http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn the_field_must_be_made_for_the_cookie_under_the_key() {
        let key = [7u8; 32];
        let (c, set) = token(&HeaderMap::new(), true);
        let set = set.unwrap();
        let set = set.to_str().unwrap();
        assert!(
            set.contains("HttpOnly")
                && set.contains("SameSite=Strict")
                && set.ends_with("; Secure")
        );
        let f = field(&key, &c);
        let cookie = format!("a=1; {CSRF_COOKIE}={c}");
        let h = headers(&[("cookie", &cookie), ("host", "gw:7700")]);
        assert_eq!(token(&h, false), (c.clone(), None));
        assert_eq!(check(&key, &h, None, false, Some(&f)), Ok(()));
        assert_eq!(
            check(&[8u8; 32], &h, None, false, Some(&f)),
            Err(CsrfError::Mismatch)
        );
        assert_eq!(check(&key, &h, None, false, None), Err(CsrfError::Mismatch));
        let other = field(&key, &"b".repeat(64));
        assert_eq!(
            check(&key, &h, None, false, Some(&other)),
            Err(CsrfError::Mismatch)
        );
        let none = headers(&[("host", "gw:7700")]);
        assert_eq!(
            check(&key, &none, None, false, Some(&f)),
            Err(CsrfError::NoCookie)
        );
        let same = headers(&[
            ("cookie", &cookie),
            ("host", "GW:7700"),
            ("origin", "http://gw:7700"),
        ]);
        assert_eq!(check(&key, &same, None, false, Some(&f)), Ok(()));
        for origin in ["https://gw:7700", "http://evil.example", "null"] {
            let h = headers(&[("cookie", &cookie), ("host", "gw:7700"), ("origin", origin)]);
            assert!(
                matches!(
                    check(&key, &h, None, false, Some(&f)),
                    Err(CsrfError::OtherOrigin(_))
                ),
                "{origin}"
            );
        }
    }
}
