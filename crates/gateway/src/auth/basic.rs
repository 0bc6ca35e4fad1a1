//! HTTP Basic credentials.

use base64::Engine;
use http::HeaderMap;

/// Credentials from a request. The password is dropped as soon as it is verified.
pub(crate) struct Basic {
    pub user: String,
    pub password: String,
}

/// Longest Authorization header value considered; longer ones are refused without decoding.
const MAX_AUTH_LEN: usize = 4096;

/// Parses `Authorization: Basic base64(user:password)`; `None` when absent or malformed.
pub(crate) fn basic(headers: &HeaderMap) -> Option<Basic> {
    parse(headers.get(http::header::AUTHORIZATION)?.as_bytes())
}

/// Parses an Authorization value `Basic base64(user:password)`.
pub(crate) fn parse(value: &[u8]) -> Option<Basic> {
    if value.len() > MAX_AUTH_LEN {
        return None;
    }
    let (scheme, rest) = std::str::from_utf8(value).ok()?.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(rest.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some(Basic {
        user: user.to_owned(),
        password: password.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_basic_and_refuses_junk() {
        let mut h = HeaderMap::new();
        assert!(basic(&h).is_none());
        h.insert(
            http::header::AUTHORIZATION,
            "Basic YWxpY2U6cDpw".parse().expect("header"),
        );
        let b = basic(&h).expect("parses");
        assert_eq!((b.user.as_str(), b.password.as_str()), ("alice", "p:p"));
        for junk in ["Bearer abc", "Basic !!!", "Basic YWxpY2U=", "Basic"] {
            h.insert(http::header::AUTHORIZATION, junk.parse().expect("header"));
            assert!(basic(&h).is_none(), "{junk}");
        }
    }
}
