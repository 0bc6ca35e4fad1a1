//! How an app knows a request came from the gateway: every instance gets a secret of its own
//! (`WARDEN_INSTANCE_SECRET`), and the gateway adds to every request a MAC of the identity it
//! vouches for under that secret:
//!
//! ```text
//! X-Warden-Signature: v1=<hex HMAC-SHA256(secret, "v1\n" + X-Warden-User + "\n" + X-Warden-Label)>
//! ```
//!
//! The key is the secret's text as given in the environment. A process that reaches the
//! instance's port without the gateway (another app on the node's loopback) cannot make one; the
//! secret is the instance's alone, so a signature seen by one instance is worth nothing at
//! another. The node's identity key derives every instance's secret, so the agent that starts an
//! instance and the gateway that forwards to it agree without a word in the store.

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Version tag of the signature scheme, in the header and in the signed text.
pub const VERSION: &str = "v1";
/// Length of a signature header's value: `v1=` and 64 hex digits.
pub const SIGNATURE_LEN: usize = 3 + 64;
/// The request header that carries the signature.
pub const SIGNATURE_HEADER: &str = "x-warden-signature";
/// The environment variable that carries an instance's secret.
pub const SECRET_ENV: &str = "WARDEN_INSTANCE_SECRET";

/// The node's identity key: 256 random bits, kept in the data dir's `identity-key` (mode 0600).
/// Never printed: its `Debug` says only that it is there.
#[derive(Clone)]
pub struct IdentityKey(HmacSha256);

/// Signs identities for one instance.
#[derive(Clone)]
pub struct Signer(HmacSha256);

/// Why a key file's text is no key.
#[derive(Debug, thiserror::Error)]
#[error("the identity key must be 64 hex digits (256 bits); found {0} characters that are not")]
pub struct KeyError(usize);

// === impl IdentityKey ===

impl IdentityKey {
    /// The key from its file's text (64 hex digits, surrounding whitespace ignored).
    pub fn from_hex(text: &str) -> Result<Self, KeyError> {
        let t = text.trim();
        let bytes = decode_hex(t)
            .filter(|b| b.len() == 32)
            .ok_or(KeyError(t.len()))?;
        Ok(Self::from_bytes(&bytes))
    }

    fn from_bytes(key: &[u8]) -> Self {
        // HMAC takes keys of any length.
        Self(HmacSha256::new_from_slice(key).unwrap_or_else(|_| unreachable!()))
    }

    /// The secret of instance `id`, as the instance's environment carries it: 64 hex digits.
    pub fn instance_secret(&self, id: &str) -> String {
        let mut mac = self.0.clone();
        mac.update(b"warden instance secret v1\n");
        mac.update(id.as_bytes());
        crate::id::hex(&mac.finalize().into_bytes())
    }

    /// The signer of requests to instance `id`.
    pub fn signer(&self, id: &str) -> Signer {
        Signer::for_secret(&self.instance_secret(id))
    }
}

impl std::fmt::Debug for IdentityKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdentityKey(..)")
    }
}

// === impl Signer ===

impl Signer {
    /// The signer whose key is an instance's secret as its environment carries it.
    pub fn for_secret(secret: &str) -> Self {
        Self(HmacSha256::new_from_slice(secret.as_bytes()).unwrap_or_else(|_| unreachable!()))
    }

    /// The header value vouching for `user` at `label`: `v1=` and 64 hex digits.
    pub fn sign(&self, user: &str, label: &str) -> [u8; SIGNATURE_LEN] {
        let mut mac = self.0.clone();
        mac.update(b"v1\n");
        mac.update(user.as_bytes());
        mac.update(b"\n");
        mac.update(label.as_bytes());
        let digest = mac.finalize().into_bytes();
        let mut out = [0u8; SIGNATURE_LEN];
        out[..3].copy_from_slice(b"v1=");
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        for (i, b) in digest.iter().enumerate() {
            out[3 + 2 * i] = DIGITS[usize::from(b >> 4)];
            out[4 + 2 * i] = DIGITS[usize::from(b & 0xf)];
        }
        out
    }

    /// Whether `value` is the signature of `user` at `label`, compared in constant time.
    pub fn verify(&self, user: &str, label: &str, value: &[u8]) -> bool {
        let Some(hex) = value.strip_prefix(b"v1=") else {
            return false;
        };
        let Some(tag) = std::str::from_utf8(hex).ok().and_then(decode_hex) else {
            return false;
        };
        let mut mac = self.0.clone();
        mac.update(b"v1\n");
        mac.update(user.as_bytes());
        mac.update(b"\n");
        mac.update(label.as_bytes());
        mac.verify_slice(&tag).is_ok()
    }
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer(..)")
    }
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn a_signature_verifies_only_for_its_identity_and_its_instance() {
        let key = IdentityKey::from_hex(KEY).unwrap();
        let a = key.signer("inst-a");
        let sig = a.sign("alice", "SECRET");
        assert!(a.verify("alice", "SECRET", &sig));
        assert!(!a.verify("alice", "TOP SECRET", &sig));
        assert!(!a.verify("carol", "SECRET", &sig));
        assert!(!key.signer("inst-b").verify("alice", "SECRET", &sig));
        // The instance verifies with the secret its environment carries.
        let from_env = Signer::for_secret(&key.instance_secret("inst-a"));
        assert!(from_env.verify("alice", "SECRET", &sig));
        assert_eq!(from_env.sign("alice", "SECRET"), sig);
    }

    #[test]
    fn matches_hmac_sha256_as_any_language_computes_it() {
        // The secret and signature recomputed with Python's hmac module:
        // hmac.new(secret.encode(), b"v1\nalice\nSECRET", "sha256").hexdigest()
        let s = Signer::for_secret("s3cret");
        assert_eq!(
            std::str::from_utf8(&s.sign("alice", "SECRET")).unwrap(),
            "v1=c6a99e3c64f51372d16f3af6a04fb37848c8209de1d860c06c5cbcdf116db1ed"
        );
    }

    #[test]
    fn bad_key_files_are_refused() {
        assert!(IdentityKey::from_hex("abc").is_err());
        assert!(IdentityKey::from_hex(&"zz".repeat(32)).is_err());
        assert!(IdentityKey::from_hex(&KEY[..62]).is_err());
        assert!(IdentityKey::from_hex(&format!(" {KEY}\n")).is_ok());
        assert_eq!(
            format!("{:?}", IdentityKey::from_hex(KEY).unwrap()),
            "IdentityKey(..)"
        );
    }
}
