//! The demo app that `warden up --demo` registers: a tiny HTTP server that says who it is.
//!
//! It answers every request with JSON naming its clearance label and instance id, which makes
//! the gateway's routing visible from a plain curl. It listens on 127.0.0.1:$PORT as every
//! warden app must, and owns nothing else.
#![forbid(unsafe_code)]

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
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
    /// `/_close`: stop accepting connections but keep running, as a wedged instance would.
    Close,
    /// `/_drop?instance=ID`: if this is that instance, abort the connection without answering.
    Drop,
    /// `/_hang`: never answer, as a wedged instance would (other requests are still served).
    Hang,
}

fn query_param(req: &Request<Incoming>, name: &str) -> Option<String> {
    req.uri().query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == name).then(|| v.replace("%20", " ").replace('+', " "))
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
        "/_drop" if query_param(req, "instance").as_deref() == Some(id.instance.as_str()) => {
            Action::Drop
        }
        _ => query_param(req, "taint").map_or(Action::Answer, Action::Taint),
    }
}

fn respond(id: &Identity, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let user = req
        .headers()
        .get("x-warden-user")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let body = serde_json::json!({
        "app": id.app,
        "label": id.label,
        "instance": id.instance,
        "pid": std::process::id(),
        "method": req.method().as_str(),
        "path": req.uri().path(),
        "user": user,
        // Lets tests prove the gateway never passes the user's credentials on.
        "saw_authorization": req.headers().contains_key(http::header::AUTHORIZATION),
    });
    Response::builder()
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string() + "\n")))
        .unwrap_or_default()
}

fn plain(status: hyper::StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(Bytes::from(text)));
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
    loop {
        let mut closing = closed.clone();
        let (stream, _) = tokio::select! {
            r = listener.accept() => r?,
            _ = closing.wait_for(|c| *c) => break,
        };
        let id = id.clone();
        let health = health.clone();
        let closed_tx = closed_tx.clone();
        let mut closing = closed.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let action = action(&id, &health, &req);
                let hang = matches!(action, Action::Hang);
                let result = match action {
                    Action::Hang => Ok(plain(hyper::StatusCode::OK, "never sent")),
                    Action::Answer => Ok(respond(&id, &req)),
                    Action::Unhealthy => {
                        Ok(plain(hyper::StatusCode::SERVICE_UNAVAILABLE, "loading"))
                    }
                    Action::Healthy => Ok(plain(hyper::StatusCode::OK, "ok")),
                    Action::Taint(label) => {
                        let mut resp = respond(&id, &req);
                        if let Ok(v) = http::HeaderValue::from_str(&label) {
                            resp.headers_mut().insert("x-warden-taint", v);
                        }
                        Ok(resp)
                    }
                    Action::Close => {
                        let _ = closed_tx.send(true);
                        Ok(respond(&id, &req))
                    }
                    Action::Drop => Err(std::io::Error::other("dropped on request")),
                };
                async move {
                    if hang {
                        std::future::pending::<()>().await;
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
