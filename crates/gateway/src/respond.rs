//! Responses the gateway makes itself, and the one place errors become HTTP statuses.

use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full};

/// Body type of every gateway response.
pub type Body = BoxBody<Bytes, hyper::Error>;

/// Why the gateway answered a request itself instead of forwarding it.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// No or wrong credentials.
    #[error("authentication required: send valid HTTP Basic credentials")]
    Unauthenticated,
    /// Authenticated, but the app does not admit the user's groups.
    #[error("user {user:?} is not in a group allowed to use app {app:?}")]
    Forbidden {
        /// User name.
        user: String,
        /// App name.
        app: String,
    },
    /// No app by that name or host.
    #[error("{0}")]
    NotFound(String),
    /// No instance took the connection and none could be started, or a limit was reached.
    #[error("app {app:?} has no instance available: {reason}")]
    Unavailable {
        /// App name.
        app: String,
        /// Why.
        reason: String,
    },
    /// The app failed to start.
    #[error("app {app:?} failed to start; an operator can read its log")]
    StartFailed {
        /// App name.
        app: String,
    },
    /// The instance did not become ready in time.
    #[error("app {app:?} did not become ready within {ms} ms")]
    StartTimeout {
        /// App name.
        app: String,
        /// Time waited.
        ms: u64,
    },
    /// The instance failed while answering.
    #[error("app {app:?} did not answer: {reason}")]
    Upstream {
        /// App name.
        app: String,
        /// Error from the connection.
        reason: String,
    },
    /// The instance did not answer in time.
    #[error("app {app:?} did not answer within {ms} ms")]
    UpstreamTimeout {
        /// App name.
        app: String,
        /// Time waited.
        ms: u64,
    },
    /// The request is malformed.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// Too many failed sign-ins from this user or address.
    #[error("too many failed sign-ins; try again in {retry_after} s")]
    Throttled {
        /// Seconds until the window ends.
        retry_after: u64,
    },
    /// The password verification queue is full.
    #[error("the gateway is busy verifying passwords; try again shortly")]
    Busy,
    /// The body is larger than allowed.
    #[error("request body is larger than {limit} bytes")]
    PayloadTooLarge {
        /// The limit.
        limit: usize,
    },
    /// Method not allowed on a gateway endpoint.
    #[error("{0}")]
    MethodNotAllowed(&'static str),
}

// === impl GatewayError ===

impl GatewayError {
    /// The status this error is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Unauthenticated => StatusCode::UNAUTHORIZED,
            Self::Forbidden { .. } => StatusCode::FORBIDDEN,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            // No instance runs and none could be started: the client may try again later.
            Self::Unavailable { .. } | Self::StartFailed { .. } | Self::StartTimeout { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::Upstream { .. } => StatusCode::BAD_GATEWAY,
            Self::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Throttled { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Busy => StatusCode::SERVICE_UNAVAILABLE,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    /// The header this error's status calls for, if any.
    fn extra_header(&self) -> Option<(header::HeaderName, header::HeaderValue)> {
        match self {
            Self::Unauthenticated => Some((
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Basic realm=\"warden\", charset=\"UTF-8\""),
            )),
            Self::Unavailable { .. }
            | Self::StartFailed { .. }
            | Self::StartTimeout { .. }
            | Self::Busy => Some((header::RETRY_AFTER, header::HeaderValue::from_static("1"))),
            Self::Throttled { retry_after } => {
                Some((header::RETRY_AFTER, header::HeaderValue::from(*retry_after)))
            }
            _ => None,
        }
    }

    /// The response: a JSON body `{"error": "..."}` plus the headers the status calls for.
    pub fn into_response(self) -> Response<Body> {
        let mut resp = json(
            self.status(),
            &serde_json::json!({ "error": self.to_string() }),
        );
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
        let message = serde_json::Value::String(self.to_string());
        let body = format!("{{\"error\":{message}}}\n");
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(status.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
        out.extend_from_slice(b"\r\ncontent-type: application/json\r\n");
        if let Some((name, value)) = self.extra_header() {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        if close {
            out.extend_from_slice(b"connection: close\r\n");
        }
        crate::h1::date::write_header(out);
        out.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
        if !head_only {
            out.extend_from_slice(body.as_bytes());
        }
    }
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
