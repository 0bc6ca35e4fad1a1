//! The provider's signing keys: fetched once, fetched again when a token names a key not in
//! the set (rotation works without a restart), at most once per
//! `ProviderConfig::jwks_refetch` ([`crate::JWKS_REFETCH`] by default).

use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{Jwk, JwkSet, PublicKeyUse};
use jsonwebtoken::DecodingKey;

/// The cached key set.
#[derive(Default)]
pub(crate) struct JwksCache {
    pub set: Option<JwkSet>,
    pub fetched: Option<Instant>,
}

// === impl JwksCache ===

impl JwksCache {
    /// The key `kid` names (or, without a `kid`, the set's only signing key).
    pub(crate) fn find(&self, kid: Option<&str>) -> Option<Jwk> {
        let set = self.set.as_ref()?;
        let signing = set
            .keys
            .iter()
            .filter(|k| !matches!(k.common.public_key_use, Some(PublicKeyUse::Encryption)));
        match kid {
            Some(kid) => signing
                .into_iter()
                .find(|k| k.common.key_id.as_deref() == Some(kid))
                .cloned(),
            None => {
                let all: Vec<&Jwk> = signing.collect();
                (all.len() == 1).then(|| all[0].clone())
            }
        }
    }

    /// True when a refetch for an unknown key is allowed now.
    pub(crate) fn may_refetch(&self, now: Instant, every: Duration) -> bool {
        self.fetched.is_none_or(|t| now.duration_since(t) >= every)
    }
}

/// The decoding key of `jwk`.
pub(crate) fn decoding_key(jwk: &Jwk) -> Option<DecodingKey> {
    DecodingKey::from_jwk(jwk).ok()
}
