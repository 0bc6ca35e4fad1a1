//! The demo app that `warden up --demo` registers: a tiny HTTP server that says who it is.
//!
//! It answers every request with JSON naming its clearance label and instance id, which makes
//! the gateway's routing visible from a plain curl. It listens on 127.0.0.1:$PORT as every
//! warden app must. When warden gave it a database, its answers also list the notes its label
//! may read, and `?note=TEXT` adds one ([`notes`]).
#![forbid(unsafe_code)]

pub mod notes;

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::{body::Incoming, Request, Response};
use hyper_util::rt::TokioIo;

/// What the demo app knows about itself, from the env the agent sets.
#[derive(Debug, Clone)]
pub struct Identity {
    /// App name (`WARDEN_APP`).
    pub app: String,
    /// Clearance label (`WARDEN_LABEL`).
    pub label: String,
    /// Instance id (`WARDEN_INSTANCE`).
    pub instance: String,
    /// How many requests to `/_health` answer 503 before the instance is healthy
    /// (`WARDEN_DEMO_UNHEALTHY_CHECKS`, default 0). Until then every request answers 503, as an
    /// app still loading would: this lets tests see whether the agent waits for health.
    pub unhealthy_checks: u64,
    /// Checks the gateway's signature of the identity headers, from the instance's secret
    /// (`WARDEN_INSTANCE_SECRET`); `None` when there is none.
    pub signer: Option<warden_core::identity::Signer>,
    /// The instance's database, when its app has data (`DATABASE_URL`, `PGHOST`,
    /// `PGDATABASE`).
    pub data: Option<notes::Database>,
}

impl Identity {
    /// Reads the identity from the environment; missing values read as "unknown".
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).unwrap_or_else(|_| "unknown".into());
        Self {
            app: var("WARDEN_APP"),
            label: var("WARDEN_LABEL"),
            instance: var("WARDEN_INSTANCE"),
            unhealthy_checks: std::env::var("WARDEN_DEMO_UNHEALTHY_CHECKS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            signer: std::env::var(warden_core::identity::SECRET_ENV)
                .ok()
                .map(|s| warden_core::identity::Signer::for_secret(&s)),
            data: notes::Database::from_env(),
        }
    }
}

/// What a request asks of the demo app besides the usual answer. These hooks let tests make an
/// instance misbehave on purpose.
enum Action {
    Answer,
    /// Not healthy yet: 503 to everything.
    Unhealthy,
    /// `/_health` once healthy.
    Healthy,
    /// `?taint=LABEL`: report taint, as an instance that read data of that class would.
    Taint(String),
    /// `/_close`: stop accepting connections but keep running, as a wedged instance would; the
    /// answer comes once every other connection has hung up.
    Close,
    /// `/_drop?instance=ID`: if this is that instance, abort the connection without answering.
    Drop,
    /// `/_hang`: never answer, as a wedged instance would (other requests are still served).
    Hang,
    /// `/_hanging`: how many `/_hang` requests are waiting now, so a test can tell which
    /// instance holds one.
    Hanging,
    /// `/_echo`: answer with the request's body, the Cookie header it arrived with in
    /// `x-echo-cookie`, the names of its headers in `x-echo-headers`, and each header's values
    /// in `x-echo-h-<name>`.
    Echo,
    /// `/_set-cookie?c=COOKIE[&h=NAME&v=VALUE]`: answer as usual with `Set-Cookie: COOKIE`,
    /// `Set-Cookie: theme=dark` and, given `h`, the header `NAME: VALUE`, as an app planting a
    /// cookie (or clearing them) would.
    SetCookie(String, Option<(String, String)>),
    /// `/_bytes?n=N[&chunked=1]`: N bytes of `x`, with a length or chunked in 16 KiB frames.
    Bytes {
        n: usize,
        chunked: bool,
    },
    /// `/_slow?ms=N`: answer as usual after N milliseconds (at most 10 s), as a request that
    /// takes a while does.
    Slow(u64),
}

fn query_param(req: &Request<Incoming>, name: &str) -> Option<String> {
    req.uri().query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| {
            percent_encoding::percent_decode_str(&v.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        })
    })
}

fn action(id: &Identity, health: &AtomicU64, req: &Request<Incoming>) -> Action {
    let is_check = req.uri().path() == "/_health";
    let left = if is_check {
        // Counts down to zero and stays there.
        health
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .unwrap_or(0)
    } else {
        health.load(Ordering::Relaxed)
    };
    if left > 0 {
        return Action::Unhealthy;
    }
    match req.uri().path() {
        "/_health" => Action::Healthy,
        "/_close" => Action::Close,
        "/_hang" => Action::Hang,
        "/_hanging" => Action::Hanging,
        "/_echo" => Action::Echo,
        "/_set-cookie" => Action::SetCookie(
            query_param(req, "c").unwrap_or_default(),
            query_param(req, "h").map(|h| (h, query_param(req, "v").unwrap_or_default())),
        ),
        "/_bytes" => Action::Bytes {
            // Capped, so no request can make the instance allocate without bound.
            n: query_param(req, "n")
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
                .min(64 << 20),
            chunked: query_param(req, "chunked").as_deref() == Some("1"),
        },
        "/_slow" => Action::Slow(
            query_param(req, "ms")
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
                .min(10_000),
        ),
        "/_drop" if query_param(req, "instance").as_deref() == Some(id.instance.as_str()) => {
            Action::Drop
        }
        _ => query_param(req, "taint").map_or(Action::Answer, Action::Taint),
    }
}

/// Body type of the demo app's responses.
type Body = BoxBody<Bytes, std::convert::Infallible>;

/// A guard counting one hanging request while it lives.
/// One more of something counted (requests hanging, connections open) while it lives.
struct Hanging(Arc<AtomicU64>);

impl Hanging {
    fn new(count: &Arc<AtomicU64>) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Self(count.clone())
    }
}

impl Drop for Hanging {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

fn respond(id: &Identity, req: &Request<Incoming>, peer: SocketAddr) -> Response<Body> {
    json_response(&answer(id, req, peer))
}

fn json_response(body: &serde_json::Value) -> Response<Body> {
    Response::builder()
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string() + "\n")).boxed())
        .unwrap_or_else(|_| Response::new(Body::default()))
}

/// The usual answer, with the notes this instance may read (or why it could not read them).
async fn answer_with_notes(
    id: &Identity,
    db: &notes::Database,
    req: &Request<Incoming>,
    peer: SocketAddr,
) -> Response<Body> {
    let mut body = answer(id, req, peer);
    match db.notes(query_param(req, "note").as_deref()).await {
        Ok(n) => body["notes"] = serde_json::json!(n),
        Err(e) => body["notes_error"] = serde_json::json!(e),
    }
    json_response(&body)
}

fn answer(id: &Identity, req: &Request<Incoming>, peer: SocketAddr) -> serde_json::Value {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    };
    let user = header("x-warden-user");
    // Whether the identity headers came from the gateway: anyone else who reaches this port
    // cannot sign them.
    let verified = id.signer.as_ref().is_some_and(|s| {
        s.verify(
            user,
            header("x-warden-label"),
            header(warden_core::identity::SIGNATURE_HEADER).as_bytes(),
        )
    });
    serde_json::json!({
        "app": id.app,
        "label": id.label,
        "instance": id.instance,
        "pid": std::process::id(),
        "method": req.method().as_str(),
        "path": req.uri().path(),
        "user": user,
        "verified": verified,
        // The connection's far end: a gateway that reuses its connections shows the same one.
        "peer": peer.to_string(),
        // Lets tests prove the gateway never passes the user's credentials on.
        "saw_authorization": req.headers().contains_key(http::header::AUTHORIZATION),
    })
}

/// `n` bytes of `x`: with a length, or in frames of unknown total length (sent chunked).
fn bytes(n: usize, chunked: bool) -> Response<Body> {
    if !chunked {
        return Response::new(Full::new(Bytes::from(vec![b'x'; n])).boxed());
    }
    Response::new(Frames { left: n }.boxed())
}

/// A body of `left` bytes of `x` in 16 KiB frames, whose size it does not tell.
struct Frames {
    left: usize,
}

impl hyper::body::Body for Frames {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        let n = self.left.min(16 * 1024);
        if n == 0 {
            return std::task::Poll::Ready(None);
        }
        self.left -= n;
        std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(Bytes::from(vec![
            b'x';
            n
        ])))))
    }
}

fn plain(status: hyper::StatusCode, text: &'static str) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(text)).boxed());
    *resp.status_mut() = status;
    resp
}

/// Serves on 127.0.0.1:`port` until the process is killed.
pub async fn serve(port: u16, id: Identity) -> std::io::Result<()> {
    let listener =
        tokio::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await?;
    let (closed_tx, closed) = tokio::sync::watch::channel(false);
    let closed_tx = Arc::new(closed_tx);
    let health = Arc::new(AtomicU64::new(id.unhealthy_checks));
    let hanging = Arc::new(AtomicU64::new(0));
    let open = Arc::new(AtomicU64::new(0));
    loop {
        let mut closing = closed.clone();
        let (stream, peer) = tokio::select! {
            r = listener.accept() => r?,
            _ = closing.wait_for(|c| *c) => break,
        };
        let connection = Hanging::new(&open);
        let open = open.clone();
        let id = id.clone();
        let health = health.clone();
        let hanging = hanging.clone();
        let closed_tx = closed_tx.clone();
        let mut closing = closed.clone();
        tokio::spawn(async move {
            let _connection = connection;
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let action = action(&id, &health, &req);
                let hang = matches!(action, Action::Hang);
                // `/_close` answers once every other connection has hung up, so whoever asked
                // knows no pooled connection to this instance is left (bounded: 5 s).
                let others_gone = matches!(action, Action::Close).then(|| open.clone());
                let echo = matches!(action, Action::Echo);
                // The plain answer of an instance with a database carries its notes.
                let with_notes = match action {
                    Action::Answer => id.data.clone().map(|db| (db, id.clone())),
                    _ => None,
                };
                let slow = match action {
                    Action::Slow(ms) => Some(std::time::Duration::from_millis(ms)),
                    _ => None,
                };
                let result = match action {
                    Action::Hang => Ok(plain(hyper::StatusCode::OK, "never sent")),
                    Action::Hanging => Ok(Response::new(
                        Full::new(Bytes::from(hanging.load(Ordering::Relaxed).to_string())).boxed(),
                    )),
                    Action::Answer | Action::Echo | Action::Slow(_) => Ok(respond(&id, &req, peer)),
                    Action::Unhealthy => {
                        Ok(plain(hyper::StatusCode::SERVICE_UNAVAILABLE, "loading"))
                    }
                    Action::Healthy => Ok(plain(hyper::StatusCode::OK, "ok")),
                    Action::Taint(label) => {
                        let mut resp = respond(&id, &req, peer);
                        if let Ok(v) = http::HeaderValue::from_str(&label) {
                            resp.headers_mut().insert("x-warden-taint", v);
                        }
                        Ok(resp)
                    }
                    Action::Close => {
                        let _ = closed_tx.send(true);
                        Ok(respond(&id, &req, peer))
                    }
                    Action::SetCookie(cookie, extra) => {
                        let mut resp = respond(&id, &req, peer);
                        for c in [cookie.as_str(), "theme=dark"] {
                            if let Ok(v) = http::HeaderValue::from_str(c) {
                                resp.headers_mut().append(http::header::SET_COOKIE, v);
                            }
                        }
                        if let Some((name, value)) = extra {
                            if let (Ok(n), Ok(v)) = (
                                http::HeaderName::from_bytes(name.as_bytes()),
                                http::HeaderValue::from_str(&value),
                            ) {
                                resp.headers_mut().append(n, v);
                            }
                        }
                        Ok(resp)
                    }
                    Action::Drop => Err(std::io::Error::other("dropped on request")),
                    Action::Bytes { n, chunked } => Ok(bytes(n, chunked)),
                };
                let hanging = hang.then(|| Hanging::new(&hanging));
                async move {
                    if let Some(_counted) = hanging {
                        std::future::pending::<()>().await;
                    }
                    if let Some(open) = others_gone {
                        let until = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
                        while open.load(Ordering::Relaxed) > 1
                            && tokio::time::Instant::now() < until
                        {
                            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                        }
                    }
                    if let Some(pause) = slow {
                        tokio::time::sleep(pause).await;
                    }
                    if let Some((db, id)) = with_notes {
                        return Ok(answer_with_notes(&id, &db, &req, peer).await);
                    }
                    if echo {
                        let cookie = req.headers().get(http::header::COOKIE).cloned();
                        let names: Vec<&str> =
                            req.headers().iter().map(|(n, _)| n.as_str()).collect();
                        let names = http::HeaderValue::from_str(&names.join(","));
                        let values: Vec<(http::HeaderName, http::HeaderValue)> = req
                            .headers()
                            .iter()
                            .filter_map(|(n, v)| {
                                let n = format!("x-echo-h-{}", n.as_str());
                                Some((http::HeaderName::from_bytes(n.as_bytes()).ok()?, v.clone()))
                            })
                            .collect();
                        let body = req
                            .into_body()
                            .collect()
                            .await
                            .map_err(std::io::Error::other)?;
                        let mut resp = Response::new(Full::new(body.to_bytes()).boxed());
                        if let Some(c) = cookie {
                            resp.headers_mut().insert("x-echo-cookie", c);
                        }
                        if let Ok(n) = names {
                            resp.headers_mut().insert("x-echo-headers", n);
                        }
                        for (n, v) in values {
                            resp.headers_mut().append(n, v);
                        }
                        return Ok(resp);
                    }
                    result
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => return,
                _ = closing.wait_for(|c| *c) => {}
            }
            // Finish the answer in flight (the one to `/_close` itself), then hang up.
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        });
    }
    // Closed: stay alive without listening or talking, so only refused connections tell.
    drop(listener);
    std::future::pending::<()>().await;
    Ok(())
}
