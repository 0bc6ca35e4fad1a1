//! Token endpoint answers and ID token checks (OIDC Core 3.1.3.7 and 12.2).

use std::collections::HashSet;
use std::fmt;

use jsonwebtoken::{Algorithm, Validation};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::{OidcError, Secret};

/// Signature algorithms accepted: asymmetric only. Never `none`, never HS* (a client secret
/// is no key a provider signs ID tokens with for us).
pub(crate) const ALLOWED: &[Algorithm] = &[
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// Clock skew allowed between warden and the provider.
pub(crate) const LEEWAY_SECS: u64 = 60;
/// An ID token issued longer ago than this is not a fresh sign-in.
const MAX_AGE_SECS: u64 = 24 * 3600;

/// The token endpoint's answer (RFC 6749 5.1), as read.
#[derive(Deserialize)]
pub(crate) struct TokenAnswer {
    pub id_token: Option<String>,
    pub refresh_token: Option<String>,
    pub expires_in: Option<u64>,
}

/// An OAuth error answer (RFC 6749 5.2).
#[derive(Deserialize)]
pub(crate) struct ErrorAnswer {
    pub error: String,
}

/// A validated ID token's claims.
#[derive(Clone)]
pub struct IdClaims {
    /// The subject: the person's stable id at the provider.
    pub sub: String,
    /// Expiry, seconds since the Unix epoch.
    pub exp: u64,
    /// Every claim, for the mapping rules and the username.
    pub all: Map<String, Value>,
}

impl fmt::Debug for IdClaims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Claims are not secrets, but a person's attributes: only the subject in logs.
        f.debug_struct("IdClaims")
            .field("sub", &self.sub)
            .field("exp", &self.exp)
            .finish_non_exhaustive()
    }
}

/// What a code exchange or a refresh gave.
#[derive(Debug)]
pub struct Tokens {
    /// The ID token's validated claims.
    pub claims: IdClaims,
    /// The refresh token, when the provider gave one.
    pub refresh_token: Option<Secret>,
    /// When what the provider allowed ends (the ID token's expiry, or the access token's if
    /// sooner), milliseconds since the Unix epoch: without a refresh token the session ends
    /// there; with one it is refreshed there.
    pub expires_ms: u64,
}

/// What a token must say besides its signature.
pub(crate) struct Expect<'a> {
    pub issuer: &'a str,
    pub client_id: &'a str,
    /// The nonce the flow sent (`None` on refresh: OIDC Core 12.2).
    pub nonce: Option<&'a str>,
    /// The subject of the session being refreshed: a refresh must not change who it is.
    pub sub: Option<&'a str>,
    pub now_secs: u64,
}

/// The validation jsonwebtoken does for `alg`: signature, `iss`, `aud`, `exp`.
pub(crate) fn validation(alg: Algorithm, e: &Expect<'_>) -> Validation {
    let mut v = Validation::new(alg);
    v.algorithms = vec![alg];
    v.leeway = LEEWAY_SECS;
    v.set_issuer(&[e.issuer]);
    v.set_audience(&[e.client_id]);
    v.required_spec_claims = HashSet::from(["exp", "iss", "aud", "sub"].map(String::from));
    v.validate_exp = true;
    v.validate_nbf = true;
    v
}

/// The checks jsonwebtoken does not make: `azp`, `iat`, `nonce`, `sub` on refresh.
pub(crate) fn check_claims(all: Map<String, Value>, e: &Expect<'_>) -> Result<IdClaims, OidcError> {
    let bad = |m: &str| Err(OidcError::Token(m.to_owned()));
    let audiences: Vec<&str> = match all.get("aud") {
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        _ => return bad("it has no audience"),
    };
    let azp = all.get("azp").and_then(Value::as_str);
    if audiences.len() > 1 && azp.is_none() {
        return bad("it has several audiences and no azp");
    }
    if azp.is_some_and(|a| a != e.client_id) {
        return bad("its azp is another client");
    }
    let Some(iat) = all.get("iat").and_then(Value::as_u64) else {
        return bad("it has no iat");
    };
    if iat > e.now_secs + LEEWAY_SECS {
        return bad("it was issued in the future (check the clocks)");
    }
    if iat + MAX_AGE_SECS < e.now_secs {
        return bad("it was issued over a day ago");
    }
    if let Some(want) = e.nonce {
        if all.get("nonce").and_then(Value::as_str) != Some(want) {
            return bad("its nonce is not the one this sign-in sent");
        }
    }
    let Some(sub) = all.get("sub").and_then(Value::as_str).map(str::to_owned) else {
        return bad("it has no sub");
    };
    if e.sub.is_some_and(|s| s != sub) {
        return bad("a refresh returned another subject");
    }
    let exp = all.get("exp").and_then(Value::as_u64).unwrap_or(0);
    Ok(IdClaims { sub, exp, all })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const NOW: u64 = 1_800_000_000;

    fn expect<'a>(nonce: Option<&'a str>, sub: Option<&'a str>) -> Expect<'a> {
        Expect {
            issuer: "https://idp",
            client_id: "warden",
            nonce,
            sub,
            now_secs: NOW,
        }
    }

    fn claims(extra: Value) -> Map<String, Value> {
        let mut m =
            json!({ "sub": "u1", "aud": "warden", "iat": NOW, "exp": NOW + 60, "nonce": "n1" })
                .as_object()
                .unwrap()
                .clone();
        m.extend(extra.as_object().unwrap().clone());
        m
    }

    #[test]
    fn a_good_token_passes() {
        let c = check_claims(claims(json!({})), &expect(Some("n1"), None)).unwrap();
        assert_eq!(c.sub, "u1");
        assert!(
            !format!("{c:?}").contains("n1"),
            "Debug shows only sub and exp"
        );
    }

    #[test]
    fn nonce_azp_iat_and_subject_are_checked() {
        let bad = |extra: Value, e: Expect<'_>| check_claims(claims(extra), &e).is_err();
        assert!(bad(json!({ "nonce": "other" }), expect(Some("n1"), None)));
        assert!(
            bad(json!({ "aud": ["warden", "x"] }), expect(None, None)),
            "several audiences need azp"
        );
        assert!(bad(
            json!({ "aud": ["warden", "x"], "azp": "x" }),
            expect(None, None)
        ));
        assert!(!bad(
            json!({ "aud": ["warden", "x"], "azp": "warden" }),
            expect(None, None)
        ));
        assert!(
            bad(json!({ "iat": NOW + 3600 }), expect(None, None)),
            "issued in the future"
        );
        assert!(
            bad(json!({ "iat": NOW - 2 * 86400 }), expect(None, None)),
            "too old"
        );
        assert!(
            bad(json!({ "sub": "u2" }), expect(None, Some("u1"))),
            "refresh changed subject"
        );
        // On refresh no nonce is required (OIDC Core 12.2).
        assert!(!bad(json!({ "nonce": null }), expect(None, Some("u1"))));
    }

    #[test]
    fn only_asymmetric_algorithms_are_allowed() {
        for a in [Algorithm::HS256, Algorithm::HS384, Algorithm::HS512] {
            assert!(!ALLOWED.contains(&a));
        }
    }
}
