//! The gateway: the single entry point through which users reach app instances.
//!
//! It owns the request path: accept, authenticate (HTTP Basic against Argon2id hashes), authorise
//! (the app's allowed groups), choose the instance whose label equals the user's clearance, ask
//! the local agent to start one if none runs, and forward. It reads only in-memory views fed by
//! store watches, never the store itself, and never starts processes itself.
//!
//! Logs never contain passwords or Authorization headers: credentials are parsed into a value
//! that is dropped after verification, and the header is removed before forwarding.
#![forbid(unsafe_code)]

mod auth;
mod proxy;
mod respond;
mod views;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use warden_agent::{Agent, AgentError};
use warden_store::Store;

pub use respond::{Body, GatewayError};

/// Time allowed for a client to send its request headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

struct State {
    views: Arc<views::Shared>,
    agent: Agent,
    client: proxy::Upstream,
    verify_pool: Semaphore,
}

/// A bound gateway, ready to serve.
pub struct Gateway {
    listener: TcpListener,
    state: Arc<State>,
}

// === impl Gateway ===

impl Gateway {
    /// Binds `addr` and loads the views of apps, users and instances before returning, so the
    /// first request already sees them.
    pub async fn bind(
        addr: SocketAddr,
        store: Arc<dyn Store>,
        agent: Agent,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let views = views::Shared::new();
        views::follow_all(store, views.clone()).await;
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let state = Arc::new(State {
            views,
            agent,
            client: proxy::client(),
            verify_pool: Semaphore::new(cores),
        });
        Ok(Self { listener, state })
    }

    /// The address the gateway listens on.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// A handle that tells when the gateway's views have caught up with a store revision; the API
    /// uses it so a client that created a user or app can use it at once.
    pub fn view_sync(&self) -> ViewSync {
        ViewSync {
            views: self.state.views.clone(),
        }
    }

    /// Serves until `shutdown` turns true.
    pub async fn serve(self, mut shutdown: watch::Receiver<bool>) {
        loop {
            let (stream, peer) = tokio::select! {
                r = self.listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                },
                _ = async { let _ = shutdown.wait_for(|s| *s).await; } => return,
            };
            let _ = stream.set_nodelay(true);
            let state = self.state.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req| {
                    let state = state.clone();
                    async move { Ok::<_, std::convert::Infallible>(handle(&state, req, peer).await) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .serve_connection(TokioIo::new(stream), svc);
                if let Err(e) = conn.await {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
            });
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

/// Where a request is going.
enum Route {
    /// To an app, with the path to send it.
    App { app: String, path_and_query: String },
    /// To the same path with a trailing slash, so the app's relative links resolve.
    AddSlash(String),
    /// Nowhere.
    Nowhere(String),
}

fn route(state: &State, req: &Request<Incoming>) -> Route {
    let path = req.uri().path();
    let query = req
        .uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    if let Some(rest) = path.strip_prefix("/apps/") {
        return match rest.split_once('/') {
            Some((app, tail)) => Route::App {
                app: app.to_owned(),
                path_and_query: format!("/{tail}{query}"),
            },
            None => Route::AddSlash(format!("{path}/{query}")),
        };
    }
    let host = req
        .headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(|h| {
            h.rsplit_once(':')
                .map_or(h, |(name, _)| name)
                .to_ascii_lowercase()
        });
    match host.and_then(|h| state.views.read().hosts.get(&h).cloned()) {
        Some(app) => Route::App {
            app,
            path_and_query: format!("{path}{query}"),
        },
        None => Route::Nowhere(format!(
            "nothing is served at {path}; apps are under /apps/<name>/ or at their host names"
        )),
    }
}

fn redirect(location: &str) -> Response<Body> {
    let mut resp = Response::new(respond::full(bytes::Bytes::new()));
    *resp.status_mut() = StatusCode::PERMANENT_REDIRECT;
    if let Ok(v) = http::HeaderValue::from_str(location) {
        resp.headers_mut().insert(http::header::LOCATION, v);
    }
    resp
}

async fn handle(state: &State, req: Request<Incoming>, peer: SocketAddr) -> Response<Body> {
    if req.uri().path() == "/healthz" {
        return respond::json(StatusCode::OK, &serde_json::json!({ "status": "ok" }));
    }
    let (app, path_and_query) = match route(state, &req) {
        Route::App {
            app,
            path_and_query,
        } => (app, path_and_query),
        Route::AddSlash(location) => return redirect(&location),
        Route::Nowhere(why) => return GatewayError::NotFound(why).into_response(),
    };
    // Authenticate before saying whether the app exists, so strangers learn nothing.
    let Some(creds) = auth::basic(req.headers()) else {
        return GatewayError::Unauthenticated.into_response();
    };
    let (user, spec) = {
        let v = state.views.read();
        (v.users.get(&creds.user).cloned(), v.apps.get(&app).cloned())
    };
    if !auth::verify(&state.verify_pool, user.clone(), creds.password).await {
        tracing::info!(user = %creds.user, %peer, "authentication failed");
        return GatewayError::Unauthenticated.into_response();
    }
    let Some(user) = user else {
        return GatewayError::Unauthenticated.into_response();
    };
    let Some(spec) = spec else {
        return GatewayError::NotFound(format!("no app named {app:?}")).into_response();
    };
    if !spec.groups.is_empty() && !spec.groups.iter().any(|g| user.groups.contains(g)) {
        return GatewayError::Forbidden {
            user: user.name.clone(),
            app: spec.name.clone(),
        }
        .into_response();
    }
    let label = user.clearance.as_str();
    let instance = match state.views.pick(&spec.name, label) {
        Some(i) => i,
        None => match start(state, &spec, label).await {
            Ok(i) => i,
            Err(e) => return e.into_response(),
        },
    };
    let who = proxy::Forwarded {
        user: &user.name,
        label,
        client: peer.ip(),
    };
    match proxy::forward(
        &state.client,
        req,
        &instance.addr,
        &path_and_query,
        who,
        &spec.name,
    )
    .await
    {
        Ok(resp) => resp,
        Err((e, refused)) => {
            if refused {
                // The instance is gone; route around it until its record's delete arrives.
                state.views.drop_instance(&instance.id);
            }
            tracing::warn!(app = %spec.name, instance = %instance.id, error = %e, "forwarding failed");
            e.into_response()
        }
    }
}

/// Asks the local agent for an instance and holds the request until it is ready.
async fn start(
    state: &State,
    spec: &warden_core::AppSpec,
    label: &str,
) -> Result<warden_core::InstanceRecord, GatewayError> {
    let wait = Duration::from_millis(spec.start_timeout_ms);
    let app = spec.name.clone();
    // The agent enforces the start timeout itself; this bound only covers its own stalls.
    match tokio::time::timeout(
        wait + Duration::from_secs(1),
        state.agent.ensure(&spec.name, label),
    )
    .await
    {
        Err(_) | Ok(Err(AgentError::Timeout { .. })) => Err(GatewayError::StartTimeout {
            app,
            ms: spec.start_timeout_ms,
        }),
        Ok(Ok(r)) => {
            state.views.add_instance(r.clone());
            Ok(r)
        }
        Ok(Err(AgentError::UnknownApp(_))) => {
            Err(GatewayError::NotFound(format!("no app named {app:?}")))
        }
        Ok(Err(e @ (AgentError::Exited { .. } | AgentError::Spawn { .. }))) => {
            tracing::warn!(app = %spec.name, label, error = %e, "instance failed to start");
            Err(GatewayError::StartFailed { app })
        }
        Ok(Err(e)) => Err(GatewayError::Unavailable {
            app,
            reason: e.to_string(),
        }),
    }
}
