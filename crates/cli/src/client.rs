//! A small JSON-over-HTTP client for the API.

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client as HyperClient};
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

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

    /// Sends a request and returns the JSON answer (Null for an empty one). A non-2xx answer
    /// becomes an error carrying the API's message.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let (status, bytes) = self.raw(method, path, body).await?;
        let value: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or(Value::Null)
        };
        if !status.is_success() {
            bail!(
                "{} (HTTP {})",
                error_message(&value, &bytes),
                status.as_u16()
            );
        }
        Ok(value)
    }

    /// GETs a plain-text answer with the token; a non-2xx answer becomes an error.
    pub async fn get_text(&self, path: &str) -> anyhow::Result<String> {
        let (status, bytes) = self.raw("GET", path, None).await?;
        if !status.is_success() {
            let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            bail!(
                "{} (HTTP {})",
                error_message(&value, &bytes),
                status.as_u16()
            );
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    async fn raw(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<(http::StatusCode, Bytes)> {
        let url = format!("{}{path}", self.endpoint.api);
        let body = body.map(|b| b.to_string()).unwrap_or_default();
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
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .context("reading the API's answer")?
            .to_bytes();
        Ok((status, bytes))
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

/// The API's error message, or the raw answer when it is not the usual JSON error.
fn error_message(value: &Value, bytes: &[u8]) -> String {
    value["error"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| String::from_utf8_lossy(bytes).into_owned())
}
