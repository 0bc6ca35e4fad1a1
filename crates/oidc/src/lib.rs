//! OpenID Connect relying-party logic (issue 36): discovery, the provider's keys (JWKS, fetched
//! again when a token names a key not yet seen, at most once per [`JWKS_REFETCH`]), the
//! authorization code flow with PKCE (S256), `state` and `nonce`, the token exchange and
//! refresh, the device authorization grant (RFC 8628) for `warden login --provider`, ID token
//! validation, and the mappings from a person's claims to a clearance and to operator roles.
//!
//! This crate may call core and auth; it must not touch the store, route HTTP or keep sessions:
//! the gateway keeps the in-flight sign-in and the session, sealed with [`Sealer`].
//!
//! Tokens never reach a log or an error message: [`Secret`] and every type holding one redact
//! themselves in `Debug`, and errors carry the provider's error code, never a token.

#![forbid(unsafe_code)]

mod claims;
mod device;
mod error;
mod flow;
mod http;
mod inflight;
mod jwks;
mod operators;
mod provider;
mod seal;
mod token;

use std::fmt;
use std::time::Duration;

pub use claims::{check_rules, map_claims, ClaimRule, Clearance, MappingError};
pub use device::{DevicePoll, DeviceStart};
pub use error::OidcError;
pub use flow::{AuthStart, Pkce};
pub use inflight::FlowSecrets;
pub use operators::{
    check_operator_rules, map_operator, operator_name, OperatorRoles, OperatorRule,
    OperatorRuleError, RuleRole,
};
pub use provider::{Provider, ProviderConfig};
pub use seal::{SealError, Sealer};
pub use token::{IdClaims, Tokens};

/// Shortest time between two fetches of a provider's keys caused by an unknown `kid`: a forged
/// token naming random keys cannot make warden hammer the provider.
pub const JWKS_REFETCH: Duration = Duration::from_secs(10);

/// A secret string (client secret, refresh token, PKCE verifier, nonce): `Debug` and `Display`
/// never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

// === impl Secret ===

impl Secret {
    /// Wraps `s`.
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    /// The secret itself, for the one place that must send or seal it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_debug_redacts() {
        let s = Secret::new("hunter2");
        assert!(!format!("{s:?}").contains("hunter2"));
    }
}
