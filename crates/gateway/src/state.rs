//! What every connection of the gateway shares.

use std::sync::Arc;

use warden_core::Instances;
use warden_store::Store;

use crate::config::GatewayConfig;
use crate::metrics::Metrics;
use crate::upstream::Upstream;
use crate::{audit, auth, tls, views};

/// The gateway's shared state.
pub(crate) struct State {
    pub config: GatewayConfig,
    /// Written only to log users in and out; the request path reads the views.
    pub store: Arc<dyn Store>,
    pub views: Arc<views::Shared>,
    /// Where instances come from.
    pub instances: Arc<dyn Instances>,
    /// Connections to instances.
    pub upstream: Arc<Upstream>,
    pub auth: auth::Authenticator,
    pub metrics: Arc<Metrics>,
    pub tls: Option<tls::Tls>,
    /// The audit records' sums, flushed each period.
    pub audit: Arc<audit::Recorder>,
    /// The node's audit log itself: asked, on every request that would reach an instance or
    /// sign in, whether it refuses access (`--audit required` and it cannot record).
    pub log: Arc<dyn warden_core::audit::Audit>,
    /// The last request lines per app, for `warden logs --source router`.
    pub requests: Arc<crate::requests::Requests>,
}

// === impl State ===

impl State {
    /// `Err` while the node refuses access because its audit log cannot record: one atomic
    /// load otherwise. `accept` (the request's `Accept`) decides between JSON for programs and
    /// plain text for a browser (one that accepts `text/html`).
    pub fn audit_gate(&self, accept: Option<&[u8]>) -> Result<(), crate::error::GatewayError> {
        match self.log.refusing() {
            None => Ok(()),
            Some(why) => Err(crate::error::GatewayError::AuditRefused {
                why,
                text: crate::response::wants_html(accept),
            }),
        }
    }
}
