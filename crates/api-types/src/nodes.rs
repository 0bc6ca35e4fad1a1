//! Bodies of `/v1/nodes`.

use serde::{Deserialize, Serialize};

/// Query of `POST /v1/nodes/{name}/drain`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct DrainQuery {
    /// Drain a node that is not running (yet).
    #[serde(default)]
    pub ahead: bool,
}
