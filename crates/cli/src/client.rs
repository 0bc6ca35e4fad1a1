//! A small JSON-over-HTTP client for the API.

use anyhow::{anyhow, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client as HyperClient};
use hyper_util::rt::TokioExecutor;
use serde::de::DeserializeOwned;
use serde::Serialize;
use warden_api_types::ErrorBody;

use crate::Endpoint;

pub(crate) struct Client {
    endpoint: Endpoint,
    http: HyperClient<HttpConnector, Full<Bytes>>,
}

impl Client {
    pub fn new(endpoint: Endpoint) -> Self {
        Self {
            endpoint,
            http: HyperClient::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// Sends a request without a body and reads the JSON answer as a `T`. A non-2xx answer
    /// becomes an error carrying the API's message.
    pub async fn call<T: DeserializeOwned>(&self, method: &str, path: &str) -> anyhow::Result<T> {
        let bytes = self.checked(method, path, None).await?;
        self.read(&bytes)
    }

    /// Sends `body` as JSON and reads the JSON answer as a `T`.
    pub async fn call_with<T: DeserializeOwned, B: Serialize>(
        &self,
        method: &str,
        path: &str,
        body: &B,
    ) -> anyhow::Result<T> {
        let body = serde_json::to_vec(body).context("encoding the request")?;
        let bytes = self.checked(method, path, Some(body)).await?;
        self.read(&bytes)
    }

    /// Like [`Client::call_with`], for a caller that retries: a failure is `Err((transient,
    /// error))`, transient when no answer came (the connection failed or was cut) or the answer
    /// was 502, 503 or 504 (a proxy or the API's upstream briefly down); any other answer is a
    /// definite one.
    pub async fn attempt_with<T: DeserializeOwned, B: Serialize>(
        &self,
        method: &str,
        path: &str,
        body: &B,
    ) -> Result<T, (bool, anyhow::Error)> {
        let body = serde_json::to_vec(body)
            .context("encoding the request")
            .map_err(|e| (false, e))?;
        let (status, bytes) = self
            .raw(method, path, Some(body))
            .await
            .map_err(|e| (true, e))?;
        if !status.is_success() {
            let transient = matches!(status.as_u16(), 502..=504);
            return Err((transient, failure(status, &bytes)));
        }
        self.read(&bytes).map_err(|e| (false, e))
    }

    /// Sends a request whose answer has no body worth reading (a delete, a drain).
    pub async fn act(&self, method: &str, path: &str) -> anyhow::Result<()> {
        self.checked(method, path, None).await.map(drop)
    }

    /// An answer read as a `T`, or an error naming the field that does not read: an answer
    /// this CLI cannot read most likely comes from an API of another version.
    pub fn read<T: DeserializeOwned>(&self, bytes: &[u8]) -> anyhow::Result<T> {
        let mut de = serde_json::Deserializer::from_slice(bytes);
        serde_path_to_error::deserialize(&mut de).map_err(|e| {
            anyhow!(
                "the API at {} answered something this CLI cannot read: {e}; is it the same version as this CLI?",
                self.endpoint.api
            )
        })
    }

    /// The body of a 2xx answer; any other answer becomes an error carrying the API's message.
    async fn checked(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> anyhow::Result<Bytes> {
        let (status, bytes) = self.raw(method, path, body).await?;
        if !status.is_success() {
            return Err(failure(status, &bytes));
        }
        Ok(bytes)
    }

    /// GETs a plain-text answer with the token; a non-2xx answer becomes an error.
    pub async fn get_text(&self, path: &str) -> anyhow::Result<String> {
        let (status, bytes) = self.raw("GET", path, None).await?;
        if !status.is_success() {
            return Err(failure(status, &bytes));
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    async fn raw(
        &self,
        method: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> anyhow::Result<(http::StatusCode, Bytes)> {
        let url = format!("{}{path}", self.endpoint.api);
        let body = body.unwrap_or_default();
        let req = http::Request::builder()
            .method(method)
            .uri(&url)
            .header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", self.endpoint.token),
            )
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .with_context(|| {
                format!("{url} is not a usable URL; pass --api like http://127.0.0.1:7701")
            })?;
        let resp = self.http.request(req).await.map_err(|e| {
            anyhow!(
                "cannot reach the warden API at {}: {e}; is `warden up` running there?",
                self.endpoint.api
            )
        })?;
        Ok((resp.status(), read_all(resp.into_body()).await?))
    }

    /// POSTs `body` as JSON asking to switch the connection to `protocol` (`Upgrade`), and
    /// returns the upgraded connection; any answer but `101` becomes an error carrying the
    /// API's message.
    pub async fn upgrade<B: Serialize>(
        &self,
        path: &str,
        body: &B,
        protocol: &str,
    ) -> anyhow::Result<hyper::upgrade::Upgraded> {
        let url = format!("{}{path}", self.endpoint.api);
        let body = serde_json::to_vec(body).context("encoding the request")?;
        let req = http::Request::builder()
            .method("POST")
            .uri(&url)
            .header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", self.endpoint.token),
            )
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::CONNECTION, "upgrade")
            .header(http::header::UPGRADE, protocol)
            .body(Full::new(Bytes::from(body)))
            .with_context(|| {
                format!("{url} is not a usable URL; pass --api like http://127.0.0.1:7701")
            })?;
        let resp = self.http.request(req).await.map_err(|e| {
            anyhow!(
                "cannot reach the warden API at {}: {e}; is `warden up` running there?",
                self.endpoint.api
            )
        })?;
        if resp.status() != http::StatusCode::SWITCHING_PROTOCOLS {
            let status = resp.status();
            return Err(failure(status, &read_all(resp.into_body()).await?));
        }
        hyper::upgrade::on(resp)
            .await
            .context("the API accepted the command but its connection could not be taken over")
    }

    /// Sends `body` (sent in chunks, `progress` told of each) and returns the answer's status and
    /// body unread, for answers that stream (a push's build output). A non-2xx answer becomes
    /// an error carrying the API's message.
    pub async fn stream(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        headers: &[(&str, String)],
        body: Bytes,
        progress: impl Fn(u64, u64) + Send + Sync + 'static,
    ) -> anyhow::Result<hyper::body::Incoming> {
        use futures_util::StreamExt;
        const CHUNK: usize = 256 * 1024;
        let url = format!("{}{path}", self.endpoint.api);
        let total = body.len() as u64;
        let chunks: Vec<Bytes> = (0..body.len())
            .step_by(CHUNK)
            .map(|i| body.slice(i..(i + CHUNK).min(body.len())))
            .collect();
        let mut sent = 0u64;
        let frames = futures_util::stream::iter(chunks).map(move |c| {
            sent += c.len() as u64;
            progress(sent, total);
            Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(c))
        });
        let mut req = http::Request::builder()
            .method(method)
            .uri(&url)
            .header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", self.endpoint.token),
            )
            .header(http::header::CONTENT_TYPE, content_type)
            .header(http::header::CONTENT_LENGTH, total);
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        let req = req
            .body(http_body_util::StreamBody::new(frames))
            .with_context(|| {
                format!("{url} is not a usable URL; pass --api like http://127.0.0.1:7701")
            })?;
        let http = HyperClient::builder(TokioExecutor::new()).build_http();
        let resp = http.request(req).await.map_err(|e| {
            anyhow!(
                "cannot reach the warden API at {}: {e}; is `warden up` running there?",
                self.endpoint.api
            )
        })?;
        let status = resp.status();
        if !status.is_success() {
            return Err(failure(status, &read_all(resp.into_body()).await?));
        }
        Ok(resp.into_body())
    }

    /// GETs a plain-text document (such as `/metrics`); `None` if it cannot be had.
    pub async fn text(&self, path: &str) -> Option<String> {
        let req = http::Request::get(format!("{}{path}", self.endpoint.api))
            .body(Full::new(Bytes::new()))
            .ok()?;
        let resp = self.http.request(req).await.ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let bytes = resp.into_body().collect().await.ok()?.to_bytes();
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// A non-2xx answer as an error carrying the API's message.
fn failure(status: http::StatusCode, bytes: &[u8]) -> anyhow::Error {
    anyhow!("{} (HTTP {})", error_message(bytes), status.as_u16())
}

/// The whole body of an answer.
async fn read_all(body: hyper::body::Incoming) -> anyhow::Result<Bytes> {
    Ok(body
        .collect()
        .await
        .context("reading the API's answer")?
        .to_bytes())
}

/// The API's error message, or the raw answer when it is not the usual JSON error.
fn error_message(bytes: &[u8]) -> String {
    serde_json::from_slice::<ErrorBody>(bytes)
        .map(|e| e.error)
        .unwrap_or_else(|_| String::from_utf8_lossy(bytes).into_owned())
}
