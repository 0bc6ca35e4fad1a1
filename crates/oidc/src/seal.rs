//! Sealing what must rest in the store (an in-flight sign-in's PKCE verifier and nonce, a
//! session's refresh token): ChaCha20-Poly1305 under a key of its own, with what the secret
//! belongs to as associated data, so a sealed value moved to another record does not open.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use rand::RngCore;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};

use crate::Secret;

/// Seals and opens secrets at rest.
pub struct Sealer {
    key: LessSafeKey,
}

/// A sealed value that does not open.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// The key is not 32 bytes.
    #[error("the sealing key must be 32 bytes")]
    KeyLength,
    /// Wrong key, wrong record, or altered.
    #[error(
        "a sealed value does not open (another key, another record, or altered); sign in again"
    )]
    Open,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(<key>)")
    }
}

// === impl Sealer ===

impl Sealer {
    /// A sealer under `key` (32 bytes).
    pub fn new(key: &[u8]) -> Result<Self, SealError> {
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, key).map_err(|_| SealError::KeyLength)?;
        Ok(Self {
            key: LessSafeKey::new(unbound),
        })
    }

    /// Seals `secret` for `context` (what it belongs to): base64url of nonce ‖ ciphertext ‖ tag.
    pub fn seal(&self, context: &str, secret: &Secret) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        rand::rngs::OsRng.fill_bytes(&mut nonce);
        let mut data = secret.expose().as_bytes().to_vec();
        // ChaCha20-Poly1305 seals any length; the only failure is a message past 2^38 bytes.
        if self
            .key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(context.as_bytes()),
                &mut data,
            )
            .is_err()
        {
            return String::new();
        }
        let mut out = nonce.to_vec();
        out.extend(data);
        URL_SAFE_NO_PAD.encode(out)
    }

    /// Opens what [`Sealer::seal`] made for the same `context`.
    pub fn open(&self, context: &str, sealed: &str) -> Result<Secret, SealError> {
        let raw = URL_SAFE_NO_PAD
            .decode(sealed)
            .map_err(|_| SealError::Open)?;
        if raw.len() < NONCE_LEN {
            return Err(SealError::Open);
        }
        let (nonce, data) = raw.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| SealError::Open)?;
        let mut data = data.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(context.as_bytes()), &mut data)
            .map_err(|_| SealError::Open)?;
        String::from_utf8(plain.to_vec())
            .map(Secret::new)
            .map_err(|_| SealError::Open)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_context_bound() {
        let s = Sealer::new(&[7u8; 32]).unwrap();
        let sealed = s.seal("flow:abc", &Secret::new("verifier"));
        assert!(!sealed.contains("verifier"));
        assert_eq!(s.open("flow:abc", &sealed).unwrap().expose(), "verifier");
        assert!(s.open("flow:abd", &sealed).is_err());
        assert!(Sealer::new(&[8u8; 32])
            .unwrap()
            .open("flow:abc", &sealed)
            .is_err());
        assert!(s.open("flow:abc", "AAAA").is_err());
        assert!(Sealer::new(&[1u8; 16]).is_err());
    }
}
