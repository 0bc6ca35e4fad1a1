//! The gateway's settings. Their defaults live in one place, the `warden` binary's
//! configuration, which builds these.

use std::net::SocketAddr;
use std::time::Duration;

use crate::auth::AuthConfig;
use crate::tls::TlsSettings;

/// Gateway settings.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Listen address.
    pub listen: SocketAddr,
    /// Lifetime of a login session.
    pub session_ttl: Duration,
    /// Open client connections beyond which new ones are refused with 503.
    pub max_connections: usize,
    /// Largest request body accepted (413 beyond).
    pub max_body_bytes: usize,
    /// Largest request head accepted (431 beyond).
    pub max_header_bytes: usize,
    /// Time a client gets to send a request head (408 after).
    pub header_timeout: Duration,
    /// How long an instance may take to answer a forwarded request before the client gets 504.
    pub upstream_timeout: Duration,
    /// Authentication tuning.
    pub auth: AuthConfig,
    /// A TLS listener besides the plain one.
    pub tls: Option<TlsSettings>,
    /// The node's identity key: signs the identity sent to each instance under its secret.
    pub identity: warden_core::identity::IdentityKey,
    /// What static files are never served from: warden's data directory.
    pub private: crate::PrivateData,
    /// On a cluster, which other nodes answer this one: instances of a silent node get no
    /// request, and requests in flight there stop waiting (`dispatch.rs`).
    pub peers: Option<std::sync::Arc<warden_core::Peers>>,
    /// How often the audit records' sums (sign-ins, accesses, refusals) are written: a
    /// minute, shorter in tests.
    pub audit_flush: Duration,
    /// OpenID Connect providers people may sign in with (none: password sign-in only).
    pub oidc: Option<std::sync::Arc<crate::oidc::OidcConfig>>,
    /// The key the sign-in and sign-out forms' CSRF fields are HMACs under: the same on every
    /// gateway of a cluster, so a form from one is taken by another (`endpoints/csrf.rs`).
    pub csrf_key: [u8; 32],
    /// A button per identity provider on the sign-in page (empty: none).
    pub providers: Vec<SignInButton>,
}

/// An identity provider's button on the sign-in page: a link to `/login/oidc/{id}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignInButton {
    /// The provider's id, as in its sign-in path.
    pub id: String,
    /// What the button says.
    pub label: String,
}
