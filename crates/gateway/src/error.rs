//! Every failure the gateway answers for, where it came from, whether a retry is safe, and the
//! one place failures become HTTP statuses.

use http::{header, StatusCode};

/// Where a failure came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The client's request: its credentials, its rights, its size or form.
    Client,
    /// The gateway itself: it is busy, or has nothing to send the request to.
    Gateway,
    /// An instance: it failed to start, to take the connection, or to answer.
    Instance,
}

/// Whether a request may be sent to another instance after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// The request never reached an app: any other instance may get it.
    Safe,
    /// An app may have seen it: only a request that may be repeated (RFC 9110 §9.2.2) goes on.
    IfIdempotent,
    /// Not retried.
    Never,
}

/// What the gateway was doing with an instance when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Opening a connection (or joining one through another node's port).
    Connect,
    /// Writing the request.
    Send,
    /// Reading the response head.
    Head,
    /// Reading the response body.
    Body,
    /// Waiting while the instance's node answered none of this node's pings.
    NodeSilent,
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Connect => "connecting",
            Self::Send => "sending the request",
            Self::Head => "reading the response head",
            Self::Body => "reading the response body",
            Self::NodeSilent => "waiting for the instance's node",
        })
    }
}

/// One failure with one instance, kept whole for the decision (retry, route around) and the
/// log: the step, the I/O error's kind if it was one, and whether the connection had carried
/// a request before (a pooled connection the app may have closed as it went idle).
#[derive(Debug)]
pub struct Fault {
    /// What the gateway was doing.
    pub step: Stage,
    /// The kind of the I/O error, when it was one.
    pub kind: Option<std::io::ErrorKind>,
    /// Whether the connection came from the pool.
    pub reused: bool,
    /// What happened, for a person.
    pub detail: String,
}

impl Fault {
    /// A failure that was no I/O error (a malformed answer, a silent node).
    pub fn new(step: Stage, detail: impl Into<String>) -> Self {
        Self {
            step,
            kind: None,
            reused: false,
            detail: detail.into(),
        }
    }

    /// An I/O error at `step`.
    pub fn io(step: Stage, e: &std::io::Error, reused: bool) -> Self {
        Self {
            step,
            kind: Some(e.kind()),
            reused,
            detail: e.to_string(),
        }
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.step, self.detail)
    }
}

/// Why the gateway answered a request itself instead of forwarding it, or why one attempt to
/// forward it failed. [`GatewayError::origin`] says where the failure came from,
/// [`GatewayError::retry`] whether another instance may get the request, and
/// [`GatewayError::status`] is the one place a failure becomes an HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// No or wrong credentials.
    #[error("authentication required: send valid HTTP Basic credentials")]
    Unauthenticated,
    /// Authenticated, but the app does not admit the user's groups.
    #[error("user {user:?} is not in a group allowed to use app {app:?} (it admits members of: {}); ask an operator to add you to one of them", groups.join(", "))]
    Forbidden {
        /// User name.
        user: String,
        /// App name.
        app: String,
        /// The groups the app admits.
        groups: Vec<String>,
    },
    /// Password sign-in is turned off on this gateway (`password_sign_in = false`).
    #[error("password sign-in is turned off on this gateway; sign in with an identity provider")]
    PasswordsOff,
    /// A form POST failed its cross-site request forgery check: why.
    #[error("this form could not be accepted: {0}; reload the sign-in page and try again")]
    Csrf(String),
    /// No app by that name or host.
    #[error("{0}")]
    NotFound(String),
    /// The app awaits its first release: there is nothing to run yet.
    #[error("app {app:?} has no release yet: an operator pushes one (`warden push {app} DIR`)")]
    NoRelease {
        /// App name.
        app: String,
    },
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
    /// A session could not be recorded: the store cannot write now.
    #[error("cannot start a session now: {0}")]
    NoSessions(String),
    /// The app keeps crashing; no start is tried before `retry_after` seconds.
    #[error(
        "app {app:?} keeps crashing; an operator can read its log; try again in {retry_after} s"
    )]
    CrashLoop {
        /// App name.
        app: String,
        /// Seconds until the next start may be tried (at least 1).
        retry_after: u64,
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
    /// The request carries credentials of two different users.
    #[error("bad request: the request carries credentials of more than one user; send one (a session cookie, a bearer token or Basic credentials)")]
    TwoUsers,
    /// Too many failed sign-ins from this user or address.
    #[error("too many failed sign-ins; try again in {retry_after} s")]
    Throttled {
        /// Seconds until the window ends.
        retry_after: u64,
    },
    /// The password verification queue is full.
    #[error("the gateway is busy verifying passwords; try again shortly")]
    Busy,
    /// The node requires its audit log (`--audit required`) and the log cannot record: why,
    /// and whether to say it as plain text (a browser) rather than JSON.
    #[error("{why}")]
    AuditRefused {
        /// Why, for a person.
        why: String,
        /// Answer `text/plain`: the client accepts HTML, so a person reads it.
        text: bool,
    },
    /// The body is larger than allowed.
    #[error("request body is larger than {limit} bytes")]
    PayloadTooLarge {
        /// The limit.
        limit: usize,
    },
    /// Method not allowed on a gateway endpoint.
    #[error("{0}")]
    MethodNotAllowed(&'static str),
    /// The request head is larger than allowed.
    #[error("request head is larger than {limit} bytes")]
    HeadTooLarge {
        /// The limit.
        limit: usize,
    },
    /// An instance refused the connection: it is not listening, and the request never reached
    /// it.
    #[error("the instance refused the connection: {0}")]
    Refused(Fault),
    /// No connection to an instance for another reason (the gateway out of descriptors or
    /// ports, a sandbox's backlog full): the request never left, but the instance may be fine.
    #[error("no connection to the instance: {0}")]
    Unsent(Fault),
    /// An instance failed while it had the request: it may have seen it.
    #[error("the instance failed the request: {0}")]
    Broken(Fault),
}

// === impl GatewayError ===

impl GatewayError {
    /// Where the failure came from.
    pub fn origin(&self) -> Origin {
        match self {
            Self::Unauthenticated
            | Self::Forbidden { .. }
            | Self::PasswordsOff
            | Self::Csrf(_)
            | Self::NotFound(_)
            | Self::BadRequest(_)
            | Self::TwoUsers
            | Self::Throttled { .. }
            | Self::PayloadTooLarge { .. }
            | Self::MethodNotAllowed(_)
            | Self::HeadTooLarge { .. } => Origin::Client,
            Self::Busy
            | Self::Unavailable { .. }
            | Self::NoRelease { .. }
            | Self::NoSessions(_)
            | Self::AuditRefused { .. } => Origin::Gateway,
            Self::StartFailed { .. }
            | Self::CrashLoop { .. }
            | Self::StartTimeout { .. }
            | Self::Upstream { .. }
            | Self::UpstreamTimeout { .. }
            | Self::Refused(_)
            | Self::Unsent(_)
            | Self::Broken(_) => Origin::Instance,
        }
    }

    /// Whether the request may go to another instance after this failure.
    pub fn retry(&self) -> Retry {
        match self {
            Self::Refused(_) | Self::Unsent(_) => Retry::Safe,
            Self::Broken(_) => Retry::IfIdempotent,
            _ => Retry::Never,
        }
    }

    /// The status this error is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::Unauthenticated => StatusCode::UNAUTHORIZED,
            Self::Forbidden { .. } | Self::PasswordsOff | Self::Csrf(_) => StatusCode::FORBIDDEN,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            // No instance runs and none could be started: the client may try again later.
            Self::Unavailable { .. }
            | Self::NoRelease { .. }
            | Self::NoSessions(_)
            | Self::StartFailed { .. }
            | Self::CrashLoop { .. }
            | Self::StartTimeout { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::Upstream { .. } | Self::Broken(_) => StatusCode::BAD_GATEWAY,
            // Only reaches a client if a caller skips the dispatch that turns it into
            // `Unavailable`: no instance took the connection.
            Self::Refused(_) | Self::Unsent(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::HeadTooLarge { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::BadRequest(_) | Self::TwoUsers => StatusCode::BAD_REQUEST,
            Self::Throttled { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Busy | Self::AuditRefused { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
        }
    }

    /// The header this error's status calls for, if any.
    pub(crate) fn extra_header(&self) -> Option<(header::HeaderName, header::HeaderValue)> {
        match self {
            Self::Unauthenticated => Some((
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Basic realm=\"warden\", charset=\"UTF-8\""),
            )),
            Self::Unavailable { .. }
            | Self::NoSessions(_)
            | Self::StartFailed { .. }
            | Self::StartTimeout { .. }
            | Self::Refused(_)
            | Self::Unsent(_)
            | Self::Busy => Some((header::RETRY_AFTER, header::HeaderValue::from_static("1"))),
            Self::AuditRefused { .. } => {
                Some((header::RETRY_AFTER, header::HeaderValue::from_static("5")))
            }
            // The rest of an oversized head is still on the connection: it cannot go on.
            Self::HeadTooLarge { .. } => Some((
                header::CONNECTION,
                header::HeaderValue::from_static("close"),
            )),
            Self::Throttled { retry_after } | Self::CrashLoop { retry_after, .. } => {
                Some((header::RETRY_AFTER, header::HeaderValue::from(*retry_after)))
            }
            _ => None,
        }
    }
}
