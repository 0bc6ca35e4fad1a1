//! API errors: one JSON shape, `{"error": "..."}`, with the status chosen in one place.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;

/// An error answered to an API client.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

// === impl ApiError ===

impl ApiError {
    /// 404 for an app that is not registered, saying how to list those that are.
    pub(crate) fn no_app(name: &str) -> Self {
        Self::not_found(format!(
            "no app named {name:?}; `warden apps list` shows the registered apps"
        ))
    }

    /// An error with a status and a message that says what to do.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    /// 400 Bad Request.
    pub fn bad_request(m: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, m)
    }

    /// 404 Not Found.
    pub fn not_found(m: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, m)
    }

    /// 409 Conflict.
    pub fn conflict(m: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, m)
    }

    /// Its HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// What it says to do.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// 500, for failures of the platform itself.
    pub fn internal(m: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, m.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(warden_api_types::ErrorBody {
                error: self.message,
            }),
        )
            .into_response()
    }
}

impl From<warden_store::StoreError> for ApiError {
    fn from(e: warden_store::StoreError) -> Self {
        warden_core::log_limited!(error, error = %e, "store failure in the API");
        let status = match e {
            warden_store::StoreError::NoSpace { .. } => StatusCode::INSUFFICIENT_STORAGE,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        };
        Self::new(status, format!("{e}"))
    }
}

/// `Json<T>` whose rejections (bad syntax, unknown fields, wrong content type) are answered in
/// the API's JSON error shape instead of axum's plain text.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(Self(v)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

fn json_rejection(r: JsonRejection) -> ApiError {
    let status = match r {
        JsonRejection::MissingJsonContentType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        JsonRejection::JsonDataError(_) => StatusCode::UNPROCESSABLE_ENTITY,
        _ => StatusCode::BAD_REQUEST,
    };
    ApiError::new(
        status,
        format!(
            "{}; the body must be a JSON object as the OpenAPI document describes",
            r.body_text()
        ),
    )
}
