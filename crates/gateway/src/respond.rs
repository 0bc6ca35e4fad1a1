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
    /// No instance could be started.
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
            Self::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::StartFailed { .. } | Self::Upstream { .. } => StatusCode::BAD_GATEWAY,
            Self::StartTimeout { .. } | Self::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Throttled { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Busy => StatusCode::SERVICE_UNAVAILABLE,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    /// The response: a JSON body `{"error": "..."}` plus the headers the status calls for.
    pub fn into_response(self) -> Response<Body> {
        let status = self.status();
        let mut resp = json(status, &serde_json::json!({ "error": self.to_string() }));
        let h = resp.headers_mut();
        match self {
            Self::Unauthenticated => {
                h.insert(
                    header::WWW_AUTHENTICATE,
                    header::HeaderValue::from_static("Basic realm=\"warden\", charset=\"UTF-8\""),
                );
            }
            Self::Unavailable { .. } | Self::Busy => {
                h.insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
            }
            Self::Throttled { retry_after } => {
                h.insert(header::RETRY_AFTER, header::HeaderValue::from(retry_after));
            }
            _ => {}
        }
        resp
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
