//! Bodies that say how a call or the process went: errors, `/healthz`, `/readyz`.

use serde::{Deserialize, Serialize};

/// Every error the API answers: what happened and what to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ErrorBody {
    /// The message, for a person.
    pub error: String,
}

/// Body of `GET /healthz` and `GET /readyz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Health {
    /// Why the process is not ready (`/readyz` with 503 only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// `ok` (`/healthz`), `ready` or `not ready` (`/readyz`).
    pub status: String,
    /// `/readyz` only: why this node's audit log is not writing (a full queue, a full disk);
    /// absent while it writes. The node still serves: an alarm, not a refusal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<String>,
}

/// What the CLI prints for `--json` after a call that answers nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Ok {
    /// Always true.
    pub ok: bool,
}
