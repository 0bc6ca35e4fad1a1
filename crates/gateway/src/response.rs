//! Responses the gateway makes itself: JSON answers, and errors as hyper responses or as
//! HTTP/1.1 bytes for the lane.

use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full};

use crate::error::GatewayError;

/// The answer to a request head that did not arrive in time.
pub(crate) const TIMEOUT_408: &[u8] =
    b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

/// Errors a response body can end with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Body type of every gateway response.
pub type Body = BoxBody<Bytes, BoxError>;

// === impl GatewayError (responses) ===

impl GatewayError {
    /// The response: a JSON body `{"error": "..."}` plus the headers the status calls for.
    pub fn into_response(self) -> Response<Body> {
        let mut resp = match self.plain_text() {
            true => text(self.status(), &self.to_string()),
            false => json(
                self.status(),
                &serde_json::json!({ "error": self.to_string() }),
            ),
        };
        if let Some((name, value)) = self.extra_header() {
            resp.headers_mut().insert(name, value);
        }
        resp
    }

    /// The same response as [`Self::into_response`] (less the `Date` header hyper adds),
    /// written as HTTP/1.1 bytes to `out`, for the fast lane, which answers errors without
    /// building a response object.
    /// `close` adds `connection: close`, for a client that asked for it.
    pub(crate) fn write_http1(&self, head_only: bool, close: bool, out: &mut Vec<u8>) {
        let status = self.status();
        let (body, kind) = match self.plain_text() {
            true => (format!("{self}\n"), TEXT),
            false => {
                let message = serde_json::Value::String(self.to_string());
                (format!("{{\"error\":{message}}}\n"), "application/json")
            }
        };
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(status.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
        out.extend_from_slice(b"\r\ncontent-type: ");
        out.extend_from_slice(kind.as_bytes());
        out.extend_from_slice(b"\r\n");
        if let Some((name, value)) = self.extra_header() {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        if close {
            out.extend_from_slice(b"connection: close\r\n");
        }
        crate::date::write_header(out);
        out.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
        if !head_only {
            out.extend_from_slice(body.as_bytes());
        }
    }
}

/// The content type of the answers a person reads.
const TEXT: &str = "text/plain; charset=utf-8";

impl GatewayError {
    /// Whether this error is answered as plain text rather than JSON.
    fn plain_text(&self) -> bool {
        matches!(self, Self::AuditRefused { text: true, .. })
    }
}

/// A plain text response: `message` and a newline.
fn text(status: StatusCode, message: &str) -> Response<Body> {
    let mut resp = Response::new(full(Bytes::from(format!("{message}\n"))));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(TEXT));
    resp
}

/// A JSON response.
pub fn json(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    let mut resp = Response::new(full(Bytes::from(value.to_string() + "\n")));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

/// A body from bytes.
pub fn full(b: Bytes) -> Body {
    Full::new(b).map_err(|never| match never {}).boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn the_lane_writes_the_same_error_responses_as_hyper() {
        for e in [
            || GatewayError::Unauthenticated,
            || GatewayError::Throttled { retry_after: 7 },
            || GatewayError::StartTimeout {
                app: "demo".into(),
                ms: 500,
            },
            || GatewayError::Forbidden {
                user: "dave".into(),
                app: "admin \"x\"".into(),
            },
        ] {
            let resp = e().into_response();
            let (parts, body) = resp.into_parts();
            let body = body.collect().await.expect("body").to_bytes();
            let mut want = format!(
                "HTTP/1.1 {} {}\r\n",
                parts.status.as_str(),
                parts.status.canonical_reason().unwrap_or("")
            );
            for (n, v) in &parts.headers {
                want += &format!("{}: {}\r\n", n, v.to_str().expect("ascii"));
            }
            // hyper adds the date as it writes the head; the lane writes its own before the
            // length. The second may turn between two calls, so the time itself is left out.
            want += "date: <now>\r\n";
            want += &format!("content-length: {}\r\n\r\n", body.len());
            let mut head = Vec::new();
            e().write_http1(true, false, &mut head);
            let head = String::from_utf8(head).expect("utf-8");
            let dated: Vec<String> = head
                .split_inclusive("\r\n")
                .map(|l| match l.strip_prefix("date: ") {
                    Some(v) => {
                        httpdate::parse_http_date(v.trim_end()).expect("an HTTP date");
                        "date: <now>\r\n".to_owned()
                    }
                    None => l.to_owned(),
                })
                .collect();
            assert_eq!(dated.concat(), want);
            let head = want.len() - "<now>".len() + 29;
            let mut whole = Vec::new();
            e().write_http1(false, false, &mut whole);
            assert_eq!(&whole[head..], &body[..]);
        }
    }
}
