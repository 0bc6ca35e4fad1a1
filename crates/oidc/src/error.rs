//! What can go wrong talking to a provider or checking what it sent.

/// A failure of discovery, a key fetch, a token exchange, a refresh or a token check.
#[derive(Debug, thiserror::Error)]
pub enum OidcError {
    /// The provider could not be reached, timed out or closed the connection.
    #[error("the identity provider at {url} did not answer ({reason}); try again later")]
    Unreachable {
        /// What was asked for (no query, no token).
        url: String,
        /// What failed.
        reason: String,
    },
    /// The provider answered with an unexpected status.
    #[error("the identity provider at {url} answered {status}; check its logs and warden's client registration")]
    Status {
        /// What was asked for.
        url: String,
        /// Its HTTP status.
        status: u16,
    },
    /// The provider's answer could not be read.
    #[error("the identity provider's answer from {url} is not usable: {reason}")]
    BadAnswer {
        /// What was asked for.
        url: String,
        /// Why it is not usable.
        reason: String,
    },
    /// A URL warden was given or discovered is not one it will call.
    #[error("refusing to call {url}: {reason}")]
    BadUrl {
        /// The URL (never one with a token in it).
        url: String,
        /// Why.
        reason: String,
    },
    /// Discovery named another issuer than the configured one.
    #[error("the discovery document at {configured} names the issuer {found:?}; the configured issuer must equal it exactly")]
    IssuerMismatch {
        /// The issuer in the config.
        configured: String,
        /// The issuer the document names.
        found: String,
    },
    /// The provider refused the code or the refresh token (OAuth error `invalid_grant` and the
    /// like): the sign-in or the session is over.
    #[error("the identity provider refused the grant ({error}); sign in again")]
    Refused {
        /// The OAuth error code (never the token).
        error: String,
    },
    /// The ID token failed a check.
    #[error("the ID token was refused: {0}")]
    Token(String),
    /// The provider's discovery names no device authorization endpoint (RFC 8628).
    #[error("the identity provider {issuer} offers no device sign-in (its discovery names no device_authorization_endpoint); enable the device flow there, or log in with a password")]
    NoDeviceFlow {
        /// The issuer.
        issuer: String,
    },
    /// The trust roots could not be read.
    #[error("cannot read the trust roots for the identity provider: {0}")]
    Roots(String),
}

// === impl OidcError ===

impl OidcError {
    /// True when the provider did not answer or answered in a way that says it is unwell (5xx):
    /// the page says so and offers a password sign-in, rather than "refused".
    pub fn provider_down(&self) -> bool {
        match self {
            Self::Unreachable { .. } => true,
            Self::Status { status, .. } => *status >= 500,
            _ => false,
        }
    }
}
