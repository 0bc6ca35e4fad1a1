//! The gateway: the single entry point through which users reach app instances.
//!
//! It owns the request path: accept (HTTP/1.1 with keep-alive, or HTTP/2 over cleartext or TLS;
//! HTTP/1.1 requests to running apps, plain or over TLS, take the gateway's own lane in the `h1`
//! module, the rest hyper), authenticate (session tokens, or HTTP Basic against Argon2id hashes with a
//! verified-credential cache and failure throttling), authorise (the app's allowed groups),
//! choose an instance whose label equals the user's clearance, ask the local agent to start one
//! if none runs, forward with retries, and apply taint. It reads only in-memory views fed by
//! store watches; it writes to the store only to log users in and out. It never starts
//! processes itself.
//!
//! Logs never contain passwords, session tokens or Authorization headers: credentials are parsed
//! into values dropped after verification, and removed before forwarding.
#![forbid(unsafe_code)]

mod auth;
mod forward;
mod h1;
mod idle;
mod login;
mod metrics;
mod phases;
mod prefixed;
mod proxy;
mod respond;
mod statics;
mod tls;
mod upstream;
mod views;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use warden_agent::Agent;
use warden_store::Store;

pub use auth::AuthConfig;
pub use metrics::Metrics;
pub use respond::{Body, GatewayError};
pub use tls::{AdmissionConfig, CertFiles, TlsError, TlsSettings};

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
}

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

impl GatewayConfig {
    /// Defaults for `listen`.
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            session_ttl: Duration::from_secs(12 * 3600),
            max_connections: 10_000,
            max_body_bytes: 10 * 1024 * 1024,
            max_header_bytes: 16 * 1024,
            header_timeout: Duration::from_secs(15),
            upstream_timeout: Duration::from_secs(60),
            auth: AuthConfig::default(),
            tls: None,
        }
    }
}

struct State {
    config: GatewayConfig,
    store: Arc<dyn Store>,
    views: Arc<views::Shared>,
    agent: Agent,
    upstream: upstream::Pool,
    /// Connections to instances for the fast lane.
    raw_upstream: h1::Pool,
    auth: auth::Authenticator,
    metrics: Arc<Metrics>,
    tls: Option<tls::Tls>,
}

/// A bound gateway, ready to serve.
pub struct Gateway {
    listener: TcpListener,
    tls_listener: Option<TcpListener>,
    state: Arc<State>,
}

// === impl Gateway ===

/// Accept queue length asked of the kernel (which caps it at net.core.somaxconn). tokio's
/// default of 1024 overflows in a burst of new clients; a dropped SYN is retried by the client
/// only after a second or more, which under overload turns into client timeouts.
const LISTEN_BACKLOG: u32 = 65_535;

fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

impl Gateway {
    /// Binds the listen address and loads the views before returning, so the first request
    /// already sees apps, users and sessions.
    pub async fn bind(
        config: GatewayConfig,
        store: Arc<dyn Store>,
        agent: Agent,
    ) -> Result<Self, StartError> {
        // Certificates first: a bad file must stop the start before anything listens.
        let tls = config.tls.as_ref().map(tls::Tls::new).transpose()?;
        let bind =
            |addr: SocketAddr| listen(addr).map_err(|source| StartError::Listen { addr, source });
        let listener = bind(config.listen)?;
        let tls_listener = match &config.tls {
            Some(t) => Some(bind(t.listen)?),
            None => None,
        };
        let views = views::Shared::new();
        views::follow_all(store.clone(), views.clone()).await;
        let metrics = Arc::new(Metrics::new()?);
        let auth = auth::Authenticator::new(&config.auth);
        let state = Arc::new(State {
            config,
            store,
            views,
            agent,
            upstream: upstream::Pool::default(),
            raw_upstream: h1::Pool::default(),
            auth,
            metrics,
            tls,
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
        let tls_task = self.tls_listener.map(|l| {
            tokio::spawn(accept_loop(
                l,
                self.state.clone(),
                slots.clone(),
                shutdown.clone(),
                true,
            ))
        });
        accept_loop(self.listener, self.state, slots, shutdown, false).await;
        if let Some(t) = tls_task {
            let _ = t.await;
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    state: Arc<State>,
    slots: Arc<Semaphore>,
    mut shutdown: watch::Receiver<bool>,
    tls: bool,
) {
    {
        loop {
            let (stream, peer) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        // Out of file descriptors, usually: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                },
                _ = async { let _ = shutdown.wait_for(|s| *s).await; } => return,
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                state.metrics.refused_connections.inc();
                if !tls {
                    tokio::spawn(refuse(stream));
                }
                continue;
            };
            let state = state.clone();
            tokio::spawn(async move {
                state.metrics.connections.inc();
                if tls {
                    serve_tls(state.clone(), stream, peer).await;
                } else {
                    serve_plain(state.clone(), stream, peer).await;
                }
                state.metrics.connections.dec();
                drop(slot);
            });
        }
    }
}

/// Answers a connection over the limit with 503 and closes it; costs one write.
async fn refuse(mut stream: TcpStream) {
    use tokio::io::AsyncWriteExt;
    let _ = stream
        .write_all(b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        .await;
}

/// A fatal `internal_error` alert: the cheapest clear "not now" a TLS client understands.
const TLS_REFUSAL: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x50];

async fn serve_tls(state: Arc<State>, mut stream: TcpStream, peer: SocketAddr) {
    use tokio::io::AsyncWriteExt;
    let Some(tls) = state.tls.as_ref() else {
        return;
    };
    let _ = stream.set_nodelay(true);
    let m = &state.metrics;
    let started = Instant::now();
    let first = match tokio::time::timeout(
        state.config.header_timeout,
        tls::hello::read_first_record(&mut stream),
    )
    .await
    {
        Ok(Ok(b)) => b,
        _ => return,
    };
    let resumption = match tls::hello::classify(&first, |id| tls.sessions.contains(id)) {
        tls::hello::First::NotTls => {
            tls::answer_plain_http(prefixed::Prefixed::new(first, stream)).await;
            return;
        }
        tls::hello::First::Tls { resumption } => resumption,
    };
    // Resumption attempts are always admitted: they are cheap and finish sessions.
    let admitted = if resumption {
        None
    } else {
        match tls.admission.admit_full().await {
            Some(a) => Some(a),
            None => {
                m.tls.refused.inc();
                let _ = stream.write_all(&TLS_REFUSAL).await;
                return;
            }
        }
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.config.clone());
    let io = prefixed::Prefixed::new(first, stream);
    let conn = match tokio::time::timeout(tls.handshake_timeout, acceptor.accept(io)).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            m.tls.failed.inc();
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            m.tls.failed.inc();
            tracing::debug!(%peer, "TLS handshake timed out");
            return;
        }
    };
    drop(admitted);
    let took = started.elapsed().as_secs_f64();
    if conn.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed) {
        m.tls.resumed.inc();
        m.conn_phase.handshake_resumed.observe(took);
    } else {
        m.tls.full.inc();
        m.conn_phase.handshake_full.observe(took);
        if resumption {
            m.tls.resumption_missed.inc();
        }
    }
    let clock = phases::Clock::new(state.metrics.clone());
    if conn.get_ref().1.alpn_protocol() == Some(b"h2") {
        serve_io(state, conn, peer, None, true, clock).await;
    } else {
        h1::serve(state, conn, peer, None, true, clock).await;
    }
}

async fn serve_plain(state: Arc<State>, stream: TcpStream, peer: SocketAddr) {
    let _ = stream.set_nodelay(true);
    // A second handle on the socket lets us answer 408 after hyper gives up on a slow head.
    let spare = stream.into_std().and_then(|s| Ok((s.try_clone()?, s)));
    let (spare, stream) = match spare.and_then(|(spare, s)| Ok((spare, TcpStream::from_std(s)?))) {
        Ok(x) => x,
        Err(e) => {
            tracing::debug!(error = %e, "cannot set up a connection");
            return;
        }
    };
    let clock = phases::Clock::new(state.metrics.clone());
    h1::serve(state, stream, peer, Some(spare), false, clock).await;
}

/// Serves HTTP/1.1 or HTTP/2 on an established connection with hyper. `spare` is a second handle
/// on a plain socket, used to answer 408 after hyper gives up on a slow request head.
async fn serve_io<S>(
    state: Arc<State>,
    io: S,
    peer: SocketAddr,
    spare: Option<std::net::TcpStream>,
    https: bool,
    clock: Arc<phases::Clock>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let svc_state = state.clone();
    let svc_clock = clock.clone();
    let svc = hyper::service::service_fn(move |req| {
        let state = svc_state.clone();
        let clock = svc_clock.clone();
        async move {
            clock.service_start();
            let resp = handle(&state, req, peer, https).await;
            clock.service_end();
            Ok::<_, std::convert::Infallible>(resp)
        }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(state.config.header_timeout)
        // hyper's own cut-off (431 and close) sits well above ours, so a head just over the limit
        // is refused by `handle` on a connection that stays in a clean state.
        .max_buf_size((state.config.max_header_bytes * 4).max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(state.config.max_header_bytes as u32);
    let io = TokioIo::new(phases::Timed::new(io, clock.clone()));
    if let Err(e) = builder.serve_connection(io, svc).await {
        let timed_out = e
            .downcast_ref::<hyper::Error>()
            .is_some_and(|e| e.is_timeout());
        if let (true, Some(spare)) = (timed_out, &spare) {
            use std::io::Write;
            let _ = (&*spare).write(
                b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            );
        }
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
    clock.closed();
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
    /// To the gateway itself.
    Gateway,
}

/// The app a request for `target` (path and query) with Host `host` goes to, and where in
/// `target` the app's own target starts: by host name first, then by `/apps/<name>/`. One rule
/// for hyper's path and the fast lane.
pub(crate) fn app_route<'a>(
    views: &'a views::Views,
    host: Option<&str>,
    target: &'a str,
) -> Option<(&'a str, usize)> {
    let host = host.map(|h| h.rsplit_once(':').map_or(h, |(name, _)| name));
    if let Some(app) = host.and_then(|h| views.hosts.get(&h.to_ascii_lowercase())) {
        return Some((app.as_str(), 0));
    }
    let path = target.split('?').next().unwrap_or(target);
    let (app, _) = path.strip_prefix("/apps/")?.split_once('/')?;
    Some((app, "/apps/".len() + app.len()))
}

fn route(state: &State, req: &Request<Incoming>) -> Route {
    let path = req.uri().path();
    let query = req
        .uri()
        .query()
        .map(|q| format!("?{q}"))
        .unwrap_or_default();
    let target = format!("{path}{query}");
    let host = req
        .headers()
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()));
    if let Some((app, skip)) = app_route(&state.views.read(), host, &target) {
        return Route::App {
            app: app.to_owned(),
            path_and_query: target[skip..].to_owned(),
        };
    }
    if path.starts_with("/apps/") {
        return Route::AddSlash(format!("{path}/{query}"));
    }
    Route::Gateway
}

fn redirect(location: &str) -> Response<Body> {
    let mut resp = Response::new(respond::full(bytes::Bytes::new()));
    *resp.status_mut() = StatusCode::PERMANENT_REDIRECT;
    if let Ok(v) = http::HeaderValue::from_str(location) {
        resp.headers_mut().insert(http::header::LOCATION, v);
    }
    resp
}

/// Bytes of a request head as sent on the wire, near enough for a limit.
fn head_size(req: &Request<Incoming>) -> usize {
    let uri = req.uri().path_and_query().map_or(1, |p| p.as_str().len());
    uri + req
        .headers()
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len() + 4)
        .sum::<usize>()
}

async fn handle(
    state: &State,
    req: Request<Incoming>,
    peer: SocketAddr,
    https: bool,
) -> Response<Body> {
    let started = Instant::now();
    if head_size(&req) > state.config.max_header_bytes {
        let mut resp = respond::json(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            &serde_json::json!({ "error": format!("request head is larger than {} bytes", state.config.max_header_bytes) }),
        );
        resp.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
        state.metrics.request("-", 431);
        return resp;
    }
    let (app, resp) = match route(state, &req) {
        Route::App {
            app,
            path_and_query,
        } => {
            let resp = forward::to_app(state, req, peer, https, &app, &path_and_query).await;
            (app, resp)
        }
        Route::AddSlash(location) => ("-".to_owned(), redirect(&location)),
        Route::Gateway => (
            "-".to_owned(),
            gateway_endpoint(state, req, peer, https).await,
        ),
    };
    state.metrics.request(&app, resp.status().as_u16());
    state
        .metrics
        .request_seconds
        .observe(started.elapsed().as_secs_f64());
    resp
}

/// The gateway's own endpoints, reached when no app route matched.
async fn gateway_endpoint(
    state: &State,
    req: Request<Incoming>,
    peer: SocketAddr,
    https: bool,
) -> Response<Body> {
    match req.uri().path() {
        "/healthz" => respond::json(StatusCode::OK, &serde_json::json!({ "status": "ok" })),
        "/login" => login::login(state, req, peer, https).await,
        "/logout" => login::logout(state, req, https).await,
        path => GatewayError::NotFound(format!(
            "nothing is served at {path}; apps are under /apps/<name>/ or at their host names"
        ))
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apps_are_routed_by_host_name_then_by_path() {
        let mut views = views::Views::default();
        views
            .hosts
            .insert("demo.example".to_owned(), "demo".to_owned());
        assert_eq!(
            app_route(&views, Some("Demo.Example:7700"), "/x?y=1"),
            Some(("demo", 0))
        );
        assert_eq!(
            app_route(&views, Some("other"), "/apps/a/b?c=/d"),
            Some(("a", 7))
        );
        assert_eq!(app_route(&views, None, "/apps/a?x=/y"), None);
        assert_eq!(app_route(&views, None, "/healthz"), None);
    }
}
