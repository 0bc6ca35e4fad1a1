//! `GET /v1/apps/{name}/ps`: an app's process types (`web` and its Procfile's others), each
//! with how many instances it keeps and runs per label.

use serde::{Deserialize, Serialize};

/// One process type of an app.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ProcessType {
    /// The Procfile line's name: `web`, or another (`worker`, `clock`).
    pub kind: String,
    /// What its instances run.
    pub command: Vec<String>,
    /// Each label it keeps or runs instances at, in label order.
    pub labels: Vec<ProcessLabel>,
}

/// A process type's instances at one label.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ProcessLabel {
    /// The label.
    pub label: String,
    /// How many the cluster keeps (`apps scale`); 0 when none are kept (a web instance that
    /// requests started still runs).
    pub desired: u32,
    /// How many are ready now, on every node.
    pub running: u32,
}
