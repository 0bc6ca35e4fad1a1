//! hyper's half of the downstream side: HTTP/2 (cleartext by prior knowledge, or over TLS by
//! ALPN) and the HTTP/1.1 requests the lane hands over. Requests to apps go through the same
//! dispatch and upstream side as the lane's; their answers become hyper responses.

use std::sync::Arc;
use std::time::Instant;

use http::{header, Request, Response};
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body as _, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tracing::Instrument;
use warden_core::Owner;

use super::streams::{self, Streams};
use crate::client::Client;
use crate::dispatch;
use crate::error::GatewayError;
use crate::hygiene::{self, Identity, Signed};
use crate::metrics::Phase;
use crate::phases::{Clock, Timed};
use crate::response::{Ask, Body, TIMEOUT_408};
use crate::route::{admit, app_route, static_path};
use crate::shared::SharedTcp;
use crate::state::State;
use crate::upstream::Exchange;
use crate::{endpoints, views};

/// Serves HTTP/1.1 or HTTP/2 on an established connection. `spare` is a second handle on a
/// plain socket, used to answer 408 after hyper gives up on a slow request head.
pub(super) async fn serve<S>(
    state: Arc<State>,
    io: S,
    client: Client,
    spare: Option<SharedTcp>,
    clock: Arc<Clock>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let client = Arc::new(client);
    let (svc_state, svc_clock, svc_client) = (state.clone(), clock.clone(), client.clone());
    let svc = hyper::service::service_fn(move |req| {
        let (state, clock, client) = (svc_state.clone(), svc_clock.clone(), svc_client.clone());
        // Boxed: hyper moves a stream's future into its own stream future, which goes into a
        // box of its own (`streams`), and a request's future is large enough that copying it
        // twice costs more than the allocation.
        Box::pin(async move {
            clock.service_start();
            let resp = handle(&state, req, &client).await;
            clock.service_end();
            Ok::<_, std::convert::Infallible>(resp)
        })
    });
    let streams = Streams::default();
    let mut builder = hyper_util::server::conn::auto::Builder::new(streams.clone());
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
        .max_header_list_size(u32::try_from(state.config.max_header_bytes).unwrap_or(u32::MAX));
    let io = TokioIo::new(Timed::new(io, clock.clone()));
    let conn = builder.serve_connection(io, svc);
    // The error is read inside the block, so the future `drive` holds has a plain output.
    let ended = async {
        let e = conn.await.err()?;
        let timed_out = e
            .downcast_ref::<hyper::Error>()
            .is_some_and(|e| e.is_timeout());
        tracing::debug!(error = %e, "connection ended with an error");
        Some(timed_out)
    };
    // A keep-alive connection that timed out idle gets closed without a word; only a request
    // that began and did not arrive in time is answered 408.
    if let (Some(true), true, Some(spare)) = (
        streams::drive(ended, streams).await,
        clock.reading(),
        &spare,
    ) {
        spare.try_write_now(TIMEOUT_408);
    }
    clock.closed();
}

/// Where a request is going.
enum Route {
    /// To an app, with the path to send it and what was taken off its front.
    App {
        app: String,
        prefix: String,
        path_and_query: String,
    },
    /// To the same path with a trailing slash, so the app's relative links resolve.
    AddSlash(String),
    /// To the gateway itself.
    Gateway,
}

fn route(views: &views::Shared, req: &Request<Incoming>) -> Route {
    let path = req.uri().path();
    let target = req.uri().path_and_query().map_or(path, |pq| pq.as_str());
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| req.uri().authority().map(|a| a.as_str()));
    if let Some((app, skip)) = app_route(&views.read(), host, target) {
        return Route::App {
            app: app.to_owned(),
            prefix: target[..skip].to_owned(),
            path_and_query: target[skip..].to_owned(),
        };
    }
    if path.starts_with("/apps/") {
        let query = req
            .uri()
            .query()
            .map(|q| format!("?{q}"))
            .unwrap_or_default();
        return Route::AddSlash(format!("{path}/{query}"));
    }
    Route::Gateway
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

/// A request whose head cannot be served as it is: too large, or without exactly one host
/// (RFC 9112 §3.2: HTTP/1.1 needs one `Host`; no request may carry two).
fn malformed(state: &State, req: &Request<Incoming>) -> Option<GatewayError> {
    if head_size(req) > state.config.max_header_bytes {
        return Some(GatewayError::HeadTooLarge {
            limit: state.config.max_header_bytes,
        });
    }
    let hosts = req.headers().get_all(header::HOST).iter().count();
    if hosts > 1 {
        return Some(GatewayError::BadRequest(
            "the request has more than one Host header; send one".into(),
        ));
    }
    if hosts == 0 && req.version() == http::Version::HTTP_11 {
        return Some(GatewayError::BadRequest(
            "an HTTP/1.1 request needs a Host header".into(),
        ));
    }
    None
}

async fn handle(state: &State, req: Request<Incoming>, client: &Client) -> Response<Body> {
    let started = Instant::now();
    if let Some(e) = malformed(state, &req) {
        state.metrics.request("-", e.status().as_u16());
        let accept = req.headers().get(header::ACCEPT).map(|v| v.as_bytes());
        return e.respond(&Ask::new(accept, req.method().as_str().as_bytes(), None));
    }
    let (app, resp) = match route(&state.views, &req) {
        Route::App {
            app,
            prefix,
            path_and_query,
        } => {
            let span = tracing::debug_span!("request", app = %app, label = tracing::field::Empty);
            // Kept for a refusal, which answers a browser otherwise than a program.
            let (accept, method) = (
                req.headers().get(header::ACCEPT).cloned(),
                req.method().clone(),
            );
            let resp = match to_app(state, req, client, &app, &prefix, &path_and_query)
                .instrument(span)
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    // The sign-in page is on this host only when the app is reached by path.
                    let target = format!("{prefix}{path_and_query}");
                    let target = (!prefix.is_empty()).then_some(target.as_str());
                    let accept = accept.as_ref().map(|v| v.as_bytes());
                    e.respond(&Ask::new(accept, method.as_str().as_bytes(), target))
                }
            };
            // Metric labels come from bounded sets: registered apps, else one name for the rest.
            let known = state.views.read().apps.contains_key(&app);
            (if known { app } else { "unknown".to_owned() }, resp)
        }
        Route::AddSlash(location) => ("-".to_owned(), endpoints::redirect(&location)),
        Route::Gateway => ("-".to_owned(), endpoints::answer(state, req, client).await),
    };
    state.metrics.request(&app, resp.status().as_u16());
    state
        .metrics
        .request_time(&app, started.elapsed().as_secs_f64());
    resp
}

/// Authenticates, authorises, and serves the request from the app's static files or one of
/// its instances.
async fn to_app(
    state: &State,
    req: Request<Incoming>,
    client: &Client,
    app: &str,
    prefix: &str,
    path_and_query: &str,
) -> Result<Response<Body>, GatewayError> {
    let m = &state.metrics;
    // Before anything is signed in or served: nothing of it could be recorded.
    let accept = req.headers().get(header::ACCEPT).map(|v| v.as_bytes());
    state.audit_gate(accept)?;
    // Authenticate before saying whether the app exists, so strangers learn nothing.
    let t = Instant::now();
    let refused = |e: GatewayError, user: Option<&str>| {
        // An app name from the path that no app has is recorded as one name (see UNKNOWN).
        let known = state.views.read().apps.contains_key(app);
        let app = if known { app } else { crate::audit::UNKNOWN };
        state
            .audit
            .refusal(e.status().as_u16(), user, client.ip, Some(app));
        e
    };
    let user = state
        .auth
        .authenticate(&state.views, req.headers(), client.ip, m)
        .await
        .map_err(|e| refused(e, None))?;
    m.phase(Phase::Auth, t.elapsed());
    let name = Some(user.record.name.as_str());
    let spec = state.views.read().apps.get(app).cloned();
    let spec = spec.ok_or_else(|| {
        refused(
            GatewayError::NotFound(format!("no app named {app:?}")),
            name,
        )
    })?;
    admit(&spec, &user).map_err(|e| refused(e, name))?;
    if let (Some(root), Some(rel)) = (&spec.static_dir, static_path(&spec, path_and_query)) {
        return Ok(endpoints::statics::file(
            root,
            rel,
            &state.config.private,
            req.method(),
            req.headers(),
        )
        .await);
    }
    let label = user.record.clearance.as_str();
    tracing::Span::current().record("label", label);

    let limit = state.config.max_body_bytes;
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(GatewayError::PayloadTooLarge { limit });
    }
    let (mut parts, body) = req.into_parts();
    // Buffered so a request refused by a dying instance can be sent to the next one.
    let body = if body.is_end_stream() {
        // Most requests have none (over HTTP/2, the head ends the stream): nothing to wait for.
        bytes::Bytes::new()
    } else {
        collect_body(body, limit).await?
    };
    with_host(&mut parts);
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let who = Identity {
        user: &user.record.name,
        label,
        client: &client.text,
        https: client.https,
        host,
        prefix,
    };
    let (bytes, signed) = for_app(&parts, path_and_query, &body, &who);
    let x = Exchange {
        bytes: &bytes,
        signed,
        head_only: parts.method == http::Method::HEAD,
        idempotent: parts.method.is_idempotent(),
        pooled: true,
        user: &user.record.name,
        method: parts.method.as_str().as_bytes(),
        target: path_and_query.as_bytes(),
    };
    let owner = Owner::for_lifetime(spec.lifetime, &user.record.name);
    let forwarded = dispatch::forward(state, &spec, label, &owner, &x).await?;
    let resp = forwarded.answer.into_response(state.upstream.clone())?;
    let Some(retire) = forwarded.retire else {
        return Ok(resp);
    };
    // The per-request instance lives until its response body is through or dropped.
    let (parts, body) = resp.into_parts();
    let body = body
        .map_frame(move |f| {
            let _ = &retire;
            f
        })
        .boxed();
    Ok(Response::from_parts(parts, body))
}

/// Reads a request body whole, refusing one larger than `limit`.
async fn collect_body(body: Incoming, limit: usize) -> Result<bytes::Bytes, GatewayError> {
    let body = Limited::new(body, limit).collect().await.map_err(|e| {
        if e.downcast_ref::<http_body_util::LengthLimitError>()
            .is_some()
        {
            GatewayError::PayloadTooLarge { limit }
        } else {
            GatewayError::BadRequest(format!("reading the request body failed: {e}"))
        }
    })?;
    Ok(body.to_bytes())
}

/// Gives the request a `Host`: HTTP/2 carries the host in the URI, and an HTTP/1.0 client may
/// send none; HTTP/1.1 to the app needs one.
fn with_host(parts: &mut http::request::Parts) {
    if !parts.headers.contains_key(header::HOST) {
        let host = parts.uri.authority().map_or("localhost", |a| a.as_str());
        if let Ok(v) = header::HeaderValue::from_str(host) {
            parts.headers.insert(header::HOST, v);
        }
    }
}

/// The request as the app gets it, with the body read whole.
fn for_app<'w>(
    parts: &http::request::Parts,
    path_and_query: &str,
    body: &[u8],
    who: &Identity<'w>,
) -> (Vec<u8>, Signed<'w>) {
    // The body is whole: the gateway frames it, unless there is none to frame.
    let framed = parts.headers.contains_key(header::CONTENT_LENGTH)
        || parts.headers.contains_key(header::TRANSFER_ENCODING);
    let reframed = (framed || !body.is_empty()).then_some(body.len());
    let headers: Vec<(&[u8], &[u8])> = parts
        .headers
        .iter()
        .map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes()))
        .collect();
    let mut bytes = Vec::with_capacity(512 + body.len());
    let signed = hygiene::write_request(
        &mut bytes,
        parts.method.as_str().as_bytes(),
        path_and_query.as_bytes(),
        headers.iter().copied(),
        reframed,
        who,
        body,
    );
    (bytes, signed)
}
