//! The gateway: the single entry point through which users reach app instances.
//!
//! It owns the request path: accept (`accept`: listeners, the connection limit; `tls`: TLS
//! with handshake admission control), the downstream side (`downstream`: the HTTP/1.1 lane and
//! hyper's HTTP/1.1 and HTTP/2), authentication (`auth`: session tokens, or HTTP Basic
//! against Argon2id hashes with a verified-credential cache and failure throttling), routing and
//! authorisation (`route`), the gateway's own answers (`endpoints`), forwarding with
//! retries and taint (`dispatch`) and the upstream side (`upstream`: pooled HTTP/1.1
//! connections to instances). Header hygiene lives in `hygiene` alone and every path calls it.
//!
//! What it sees goes to the node's audit log through `audit`: sign-ins, accesses and refusals
//! summed per minute, taints as they happen.
//!
//! It reads only in-memory views fed by store watches (`views`); it writes to the store only
//! to log users in and out. It gets instances from a [`warden_core::Instances`] and never starts
//! processes itself.
//!
//! Logs never contain passwords, session tokens or Authorization headers: credentials are parsed
//! into values dropped after verification, and removed before forwarding. Each connection has
//! a span (`conn`: peer, TLS) and each request to an app another (`request`: app, label); both
//! are at debug level, because an enabled span costs the lane about 3,500 instructions per
//! request (callgrind, `bench/lane-instructions.sh`), an eighth of all it spends. So the lines
//! the request path logs at info and above name their app and instance themselves.
#![forbid(unsafe_code)]

mod accept;
mod audit;
mod auth;
mod client;
mod config;
mod date;
mod dispatch;
mod downstream;
mod endpoints;
mod error;
mod hashing;
mod hygiene;
mod metrics;
mod oidc;
mod phases;
mod prefixed;
mod requests;
mod response;
mod route;
mod shared;
mod state;
mod tls;
mod upstream;
mod views;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use warden_core::Instances;
use warden_store::Store;

pub use auth::AuthConfig;
pub use config::{GatewayConfig, SignInButton};
pub use endpoints::next::safe_next;
pub use endpoints::statics::PrivateData;
pub use error::{GatewayError, Origin, Retry};
pub use metrics::Metrics;
pub use oidc::{OidcConfig, OidcProvider};
pub use requests::Requests;
pub use response::Body;
pub use tls::{AdmissionConfig, CertFiles, TlsError, TlsSettings};

use state::State;

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// TLS could not be set up.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The metrics registry refused a metric (a bug).
    #[error("cannot register metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

/// A bound gateway, ready to serve.
pub struct Gateway {
    listener: TcpListener,
    tls_listener: Option<TcpListener>,
    state: Arc<State>,
}

// === impl Gateway ===

impl Gateway {
    /// Binds the listen address and loads the views before returning, so the first request
    /// already sees apps, users and sessions. Instances come from `instances`.
    pub async fn bind(
        config: GatewayConfig,
        store: Arc<dyn Store>,
        instances: Arc<dyn Instances>,
        audit: Arc<dyn warden_core::audit::Audit>,
    ) -> Result<Self, StartError> {
        // Certificates first: a bad file must stop the start before anything listens.
        let tls = config.tls.as_ref().map(tls::Tls::new).transpose()?;
        let bind = |addr: SocketAddr| {
            accept::listen(addr).map_err(|source| StartError::Listen { addr, source })
        };
        let listener = bind(config.listen)?;
        let tls_listener = match &config.tls {
            Some(t) => {
                let l = bind(t.listen)?;
                // Without arrival stamps, admission counts a handshake's wait from when it is
                // read: it still works, but cannot tell a ClientHello gone stale in the backlog.
                if let Err(e) = tls::arrival::stamp_arrivals(&l) {
                    tracing::warn!(error = %e, "cannot ask the kernel to stamp arrivals on the TLS listener; handshakes that waited in the backlog will not be recognised as stale");
                }
                if let Some(tune) = t.tune_listener {
                    use std::os::fd::AsFd;
                    if let Err(e) = tune(l.as_fd()) {
                        tracing::warn!(error = %e, "cannot tune the TLS listener; connections are accepted before their first bytes, and refusing them costs more");
                    }
                }
                Some(l)
            }
            None => None,
        };
        let upstream = Arc::new(upstream::Upstream::new(instances.clone()));
        // Idle connections to an instance that leaves routing (draining, stopped) close now,
        // so that its requests in flight are all that keep it.
        let pool = upstream.clone();
        let views = views::Shared::with_hook(Some(Box::new(move |id: &str, routed: bool| {
            pool.routing(id, routed)
        })));
        // An instance of this node relabelled after a taint another node's gateway saw leaves
        // this one's routing for its old label now, not when the store's record arrives.
        // Weak: the agent outlives no gateway through it (the views hold the upstream pool,
        // which holds the agent).
        let withdraw = Arc::downgrade(&views);
        instances.on_relabel(Arc::new(move |id: &str, label: Option<&str>| {
            if let Some(views) = withdraw.upgrade() {
                views.withdraw_tainted(id, label.map(str::to_owned))
            }
        }));
        views::follow_all(store.clone(), views.clone()).await;
        let metrics = Arc::new(Metrics::new()?);
        let log = audit.clone();
        let audit = Arc::new(audit::Recorder::new(audit));
        let mut auth = auth::Authenticator::new(&config.auth, audit.clone());
        if let Some(o) = &config.oidc {
            auth.refresher = Some(oidc::refresh::Refresher::new(
                store.clone(),
                o.clone(),
                config.session_ttl,
                audit.clone(),
            ));
        }
        let state = Arc::new(State {
            config,
            store,
            views,
            upstream,
            instances,
            auth,
            metrics,
            tls,
            audit,
            log,
            requests: Arc::default(),
        });
        Ok(Self {
            listener,
            tls_listener,
            state,
        })
    }

    /// The address of the TLS listener, if there is one.
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls_listener.as_ref()?.local_addr().ok()
    }

    /// The address the gateway listens on.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The gateway's metrics, for whoever serves `/metrics`.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.state.metrics.clone()
    }

    /// The request lines this gateway keeps per app, which the API of this process reads.
    pub fn requests(&self) -> Arc<Requests> {
        self.state.requests.clone()
    }

    /// A handle that tells when the gateway's views have caught up with a store revision; the API
    /// uses it so a client that created a user or app can use it at once.
    pub fn view_sync(&self) -> ViewSync {
        ViewSync {
            views: self.state.views.clone(),
        }
    }

    /// Serves until `shutdown` turns true.
    pub async fn serve(self, shutdown: watch::Receiver<bool>) {
        // One connection limit across both listeners.
        let slots = Arc::new(Semaphore::new(self.state.config.max_connections));
        // Admission control refuses full handshakes while this runtime is behind.
        let lag = self.state.tls.is_some().then(|| {
            let state = self.state.clone();
            tokio::spawn(async move {
                if let Some(tls) = &state.tls {
                    tls.admission.measure_lag().await;
                }
            })
        });
        let tls_task = self.tls_listener.map(|l| {
            tokio::spawn(tls::accept::run(
                l,
                self.state.clone(),
                slots.clone(),
                shutdown.clone(),
            ))
        });
        // Flushes each period and once after the listeners stop (see `audit`).
        let flush = tokio::spawn(
            self.state
                .audit
                .clone()
                .run(self.state.config.audit_flush, shutdown.clone()),
        );
        accept::run(self.listener, self.state, slots, shutdown).await;
        if let Some(t) = tls_task {
            let _ = t.await;
        }
        let _ = flush.await;
        if let Some(l) = lag {
            l.abort();
        }
    }
}

/// See [`Gateway::view_sync`].
#[derive(Clone)]
pub struct ViewSync {
    views: Arc<views::Shared>,
}

impl ViewSync {
    /// Resolves once the view following `key` has applied every change up to `revision`.
    pub async fn caught_up(&self, key: &str, revision: u64) {
        self.views.caught_up(key, revision).await
    }
}
