//! The demo app that `warden up --demo` registers: a tiny HTTP server that says who it is.
//!
//! It answers every request with JSON naming its clearance label and instance id, which makes
//! the gateway's routing visible from a plain curl. It listens on 127.0.0.1:$PORT as every
//! warden app must, and owns nothing else.
#![forbid(unsafe_code)]

use std::convert::Infallible;
use std::net::{Ipv4Addr, SocketAddr};

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
}

impl Identity {
    /// Reads the identity from the environment; missing values read as "unknown".
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).unwrap_or_else(|_| "unknown".into());
        Self {
            app: var("WARDEN_APP"),
            label: var("WARDEN_LABEL"),
            instance: var("WARDEN_INSTANCE"),
        }
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

/// Serves on 127.0.0.1:`port` until the process is killed.
pub async fn serve(port: u16, id: Identity) -> std::io::Result<()> {
    let listener =
        tokio::net::TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let id = id.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let resp = respond(&id, &req);
                async move { Ok::<_, Infallible>(resp) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
