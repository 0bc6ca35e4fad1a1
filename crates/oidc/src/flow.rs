//! The start of an authorization code flow: `state`, `nonce`, a PKCE verifier and its S256
//! challenge, and the URL the browser is sent to.

use std::fmt;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use rand::RngCore;
use sha2::{Digest, Sha256};

use crate::Secret;

/// What RFC 3986 leaves unreserved stays as it is in a query value; everything else is encoded.
pub(crate) const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// 32 random bytes from the OS, base64url: 256 bits, unguessable.
pub(crate) fn random_token() -> String {
    let mut b = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut b);
    URL_SAFE_NO_PAD.encode(b)
}

/// A PKCE pair (RFC 7636): the verifier stays with warden (sealed in the store), the challenge
/// goes to the provider.
pub struct Pkce {
    /// The verifier, sent only with the code to the token endpoint.
    pub verifier: Secret,
    /// `BASE64URL(SHA256(verifier))`.
    pub challenge: String,
}

// === impl Pkce ===

impl Pkce {
    /// A new random pair.
    pub fn new() -> Self {
        Self::from_verifier(Secret::new(random_token()))
    }

    /// The pair of a given verifier.
    pub fn from_verifier(verifier: Secret) -> Self {
        let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.expose().as_bytes()));
        Self {
            verifier,
            challenge,
        }
    }
}

impl Default for Pkce {
    fn default() -> Self {
        Self::new()
    }
}

/// A sign-in begun: where to send the browser, and what to keep until it comes back.
pub struct AuthStart {
    /// The provider's authorization URL with every parameter (no token in it).
    pub url: String,
    /// `state`: the callback's key to the in-flight record.
    pub state: Secret,
    /// `nonce`: must come back inside the ID token.
    pub nonce: Secret,
    /// The PKCE verifier.
    pub verifier: Secret,
}

impl fmt::Debug for AuthStart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthStart")
            .field("state", &self.state)
            .field("nonce", &self.nonce)
            .field("verifier", &self.verifier)
            .finish_non_exhaustive()
    }
}

/// The authorization URL (OIDC Core 3.1.2.1) for `params` appended to `endpoint`.
pub(crate) fn authorization_url(endpoint: &str, params: &[(&str, &str)]) -> String {
    let mut url = endpoint.to_owned();
    let mut sep = if endpoint.contains('?') { '&' } else { '?' };
    for (k, v) in params {
        url.push(sep);
        url.push_str(k);
        url.push('=');
        url.extend(utf8_percent_encode(v, QUERY_VALUE));
        sep = '&';
    }
    url
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkce_s256_challenge() {
        // BASE64URL(SHA256(verifier)), as computed independently (python hashlib).
        let p = Pkce::from_verifier(Secret::new("dBjftJeZ4CVP-mJ92K9ZWvSCTSsdGNkGu4g6zJbPt-cM"));
        assert_eq!(p.challenge, "8FTMbMM7OiLGZDZNN-rZp9jMzYHQtZYBySMpB4XLOGs");
    }

    #[test]
    fn url_encodes_values() {
        let u = authorization_url(
            "https://idp/auth",
            &[
                ("redirect_uri", "https://gw/cb?x=1"),
                ("scope", "openid groups"),
            ],
        );
        assert_eq!(
            u,
            "https://idp/auth?redirect_uri=https%3A%2F%2Fgw%2Fcb%3Fx%3D1&scope=openid%20groups"
        );
        assert!(authorization_url("https://idp/auth?a=b", &[("c", "d")]).ends_with("?a=b&c=d"));
    }

    #[test]
    fn tokens_are_random_and_long() {
        let a = random_token();
        assert_ne!(a, random_token());
        assert_eq!(a.len(), 43);
    }
}
