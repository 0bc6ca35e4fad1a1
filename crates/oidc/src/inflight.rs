//! What a code-flow sign-in in flight keeps in its store record (the gateway's
//! `oidc/flows/<hash>`, the dashboard's `oidc/ui-flows/<hash>`): the PKCE verifier and the
//! nonce, sealed together for that record's key, so a sealed value moved to another record does
//! not open. One rule for every place that begins a sign-in.

use serde::{Deserialize, Serialize};

use crate::{AuthStart, Sealer, Secret};

/// The sealed part of a sign-in in flight.
pub struct FlowSecrets {
    /// The PKCE verifier the exchange sends.
    pub verifier: Secret,
    /// The nonce the ID token must carry.
    pub nonce: Secret,
}

/// As sealed: JSON of both (kept as it was when the gateway alone sealed it, so records made
/// before an upgrade still open).
#[derive(Serialize, Deserialize)]
struct Sealed {
    verifier: String,
    nonce: String,
}

/// The sealing context of the record whose key ends in `state_hash`.
fn context(state_hash: &str) -> String {
    format!("oidc-flow:{state_hash}")
}

// === impl FlowSecrets ===

impl FlowSecrets {
    /// The secrets of a sign-in `begun`.
    pub fn of(begun: &AuthStart) -> Self {
        Self {
            verifier: begun.verifier.clone(),
            nonce: begun.nonce.clone(),
        }
    }

    /// Sealed for the record keyed by `state_hash` (the SHA-256 of the flow's `state`).
    pub fn seal(&self, sealer: &Sealer, state_hash: &str) -> String {
        let sealed = Sealed {
            verifier: self.verifier.expose().to_owned(),
            nonce: self.nonce.expose().to_owned(),
        };
        // Two strings always serialize.
        let json = serde_json::to_string(&sealed).unwrap_or_default();
        sealer.seal(&context(state_hash), &Secret::new(json))
    }

    /// What [`FlowSecrets::seal`] made for the same `state_hash`; `None` when it does not open
    /// (another key, another record, altered).
    pub fn open(sealer: &Sealer, state_hash: &str, sealed: &str) -> Option<Self> {
        let s = sealer.open(&context(state_hash), sealed).ok()?;
        let s: Sealed = serde_json::from_str(s.expose()).ok()?;
        Some(Self {
            verifier: Secret::new(s.verifier),
            nonce: Secret::new(s.nonce),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_secrets_open_only_for_their_record() {
        let sealer = Sealer::new(&[7u8; 32]).unwrap();
        // Long enough that random ciphertext in base64 never holds either by chance (two-letter
        // secrets did, about once in twenty runs).
        let (verifier, nonce) = ("verifier-0123456789", "nonce-9876543210");
        let f = FlowSecrets {
            verifier: Secret::new(verifier),
            nonce: Secret::new(nonce),
        };
        let sealed = f.seal(&sealer, "abc");
        assert!(!sealed.contains(verifier) && !sealed.contains(nonce));
        let back = FlowSecrets::open(&sealer, "abc", &sealed).unwrap();
        assert_eq!(back.verifier.expose(), verifier);
        assert_eq!(back.nonce.expose(), nonce);
        assert!(FlowSecrets::open(&sealer, "abd", &sealed).is_none());
    }
}
