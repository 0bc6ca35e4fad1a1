//! Cross-site request forgery on the dashboard's forms: a signed double-submit token and the
//! `Origin` a browser sends, as the gateway's sign-in forms do (crates/gateway/src/endpoints/
//! csrf.rs, whose reasoning holds here; roles share no code, so the rule is written twice and
//! a test of each guards it).
//!
//! A browser gets a random `warden_ui_csrf` cookie (HttpOnly, SameSite=Strict, Path=/ui) and,
//! in each form, a hidden field that is an HMAC-SHA256 of that cookie under the dashboard's
//! key. A POST is taken only when cookie and field match (constant time) and its `Origin`, when
//! present, is this API's own.

use axum::http::{header, HeaderMap, HeaderValue};

/// The name of the dashboard's CSRF cookie.
pub(crate) const CSRF_COOKIE: &str = "warden_ui_csrf";

/// What the HMAC covers besides the cookie: this use, so the key signs nothing else alike.
const CONTEXT: &[u8] = b"warden ui csrf v1\0";

/// Why a form POST was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum CsrfError {
    /// The `Origin` names another site.
    #[error("the form was sent from another site ({0}); use the dashboard's own page")]
    OtherOrigin(String),
    /// No CSRF cookie came with the form.
    #[error("the form came without its cookie; reload the page and send it again")]
    NoCookie,
    /// The field is missing or was not made for this cookie.
    #[error("the form's token does not match its cookie; reload the page and send it again")]
    Mismatch,
}

/// The value of cookie `name`, if the browser sent a well-formed one (a token: 32 to 128
/// letters and digits).
pub(crate) fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(n, _)| n.trim() == name)
        .map(|(_, value)| value.trim().to_owned())
        .filter(|v| (32..=128).contains(&v.len()) && v.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// The browser's CSRF cookie, or a new one with the `Set-Cookie` that gives it.
pub(crate) fn token(headers: &HeaderMap, https: bool) -> (String, Option<HeaderValue>) {
    if let Some(v) = cookie(headers, CSRF_COOKIE) {
        return (v, None);
    }
    let v = warden_core::id::secret_token();
    let secure = if https { "; Secure" } else { "" };
    let set = format!("{CSRF_COOKIE}={v}; Path=/ui; HttpOnly; SameSite=Strict{secure}");
    (v.clone(), HeaderValue::from_str(&set).ok())
}

/// The form field for `cookie` and the browser's session `session` (empty before sign-in): hex
/// HMAC-SHA256 under `key`. Bound to the session, so a cookie and field a page planted or
/// read before sign-in are worth nothing after it.
pub(crate) fn field(key: &[u8; 32], cookie: &str, session: &str) -> String {
    warden_core::csrf::field(key, CONTEXT, &bound(cookie, session))
}

/// What the HMAC covers: the cookie (letters and digits) and the session, apart.
fn bound(cookie: &str, session: &str) -> String {
    format!("{cookie}\0{session}")
}

/// Whether a form POST with `headers` and the field `sent`, from a browser in session
/// `session`, may be taken. Its `Origin`, when present, must be `public` (the origin a TLS
/// proxy in front of the API serves the dashboard at, as the operator named it) or else this
/// API's own over plain HTTP.
pub(crate) fn check(
    key: &[u8; 32],
    headers: &HeaderMap,
    public: Option<&str>,
    sent: Option<&str>,
    session: &str,
) -> Result<(), CsrfError> {
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("").to_ascii_lowercase();
        let own = match public {
            Some(p) => Some(p.trim_end_matches('/').to_ascii_lowercase()),
            None => headers
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(|h| format!("http://{}", h.to_ascii_lowercase())),
        };
        if Some(&origin) != own.as_ref() {
            return Err(CsrfError::OtherOrigin(origin));
        }
    }
    let c = cookie(headers, CSRF_COOKIE).ok_or(CsrfError::NoCookie)?;
    let ok =
        sent.is_some_and(|sent| warden_core::csrf::verify(key, CONTEXT, &bound(&c, session), sent));
    match ok {
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
                axum::http::HeaderName::from_bytes(n.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn the_field_must_be_made_for_the_cookie_under_the_key_from_this_origin() {
        let key = [7u8; 32];
        let (c, set) = token(&HeaderMap::new(), false);
        let set = set.unwrap();
        let set = set.to_str().unwrap();
        assert!(set.contains("HttpOnly; SameSite=Strict") && set.contains("Path=/ui"));
        let f = field(&key, &c, "s1");
        let cookie = format!("a=1; {CSRF_COOKIE}={c}");
        let h = headers(&[("cookie", &cookie), ("host", "api:7701")]);
        assert_eq!(check(&key, &h, None, Some(&f), "s1"), Ok(()));
        assert_eq!(
            check(&[8u8; 32], &h, None, Some(&f), "s1"),
            Err(CsrfError::Mismatch)
        );
        assert_eq!(check(&key, &h, None, None, "s1"), Err(CsrfError::Mismatch));
        let none = headers(&[("host", "api:7701")]);
        assert_eq!(
            check(&key, &none, None, Some(&f), "s1"),
            Err(CsrfError::NoCookie)
        );
        for origin in ["https://api:7701", "http://evil.example", "null"] {
            let h = headers(&[
                ("cookie", &cookie),
                ("host", "api:7701"),
                ("origin", origin),
            ]);
            assert!(
                matches!(
                    check(&key, &h, None, Some(&f), "s1"),
                    Err(CsrfError::OtherOrigin(_))
                ),
                "{origin}"
            );
        }
        let same = headers(&[
            ("cookie", &cookie),
            ("host", "api:7701"),
            ("origin", "http://api:7701"),
        ]);
        assert_eq!(check(&key, &same, None, Some(&f), "s1"), Ok(()));
        // Made for another session, or for none (before sign-in): refused.
        for other in ["s2", ""] {
            assert_eq!(
                check(&key, &same, None, Some(&f), other),
                Err(CsrfError::Mismatch)
            );
        }
        // Behind a TLS proxy the operator named: its origin, and only it.
        let proxied = headers(&[
            ("cookie", &cookie),
            ("host", "api:7701"),
            ("origin", "https://dash.example"),
        ]);
        let public = Some("https://dash.example");
        assert_eq!(check(&key, &proxied, public, Some(&f), "s1"), Ok(()));
        assert!(matches!(
            check(&key, &same, public, Some(&f), "s1"),
            Err(CsrfError::OtherOrigin(_))
        ));
    }
}
