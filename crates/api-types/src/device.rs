//! Bodies of `POST /v1/login/device` and `POST /v1/login/device/poll`: an operator's sign-in
//! through an identity provider's device flow (RFC 8628), for `warden login --provider`. The
//! provider's device code never leaves the API; the CLI holds a handle to it.

use serde::{Deserialize, Serialize};

use crate::IssuedToken;

/// Body of `POST /v1/login/device`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct DeviceLogin {
    /// The provider's id (an `[[oidc]]` table with `operator_rules`).
    pub provider: String,
}

/// Answer of `POST /v1/login/device`: what the person does, and the handle to poll with. No
/// `Debug`: the handle is a secret while the sign-in goes on.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct DeviceStarted {
    /// What `POST /v1/login/device/poll` takes: secret until the sign-in ends.
    pub handle: String,
    /// The code the person enters on the provider's page.
    pub user_code: String,
    /// The provider's page.
    pub verification_uri: String,
    /// The page with the code in it, where the provider gives one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification_uri_complete: Option<String>,
    /// Seconds between two polls.
    pub interval: u64,
    /// Seconds the codes last.
    pub expires_in: u64,
}

/// Body of `POST /v1/login/device/poll`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct DevicePollRequest {
    /// The handle `POST /v1/login/device` gave.
    pub handle: String,
}

/// Answer of `POST /v1/login/device/poll` while the sign-in goes on, or its token once done.
/// A refusal (codes expired, the person declined, no operator role) is an error instead.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum DevicePollAnswer {
    /// The person has not yet approved: poll again after `interval` seconds.
    Pending {
        /// Seconds to wait before the next poll.
        interval: u64,
    },
    /// Polled too soon: wait `interval` seconds (longer than before) between polls.
    SlowDown {
        /// Seconds to wait before the next poll.
        interval: u64,
    },
    /// Signed in: the operator's session token, shown this once.
    Done {
        /// The token.
        token: IssuedToken,
    },
}
