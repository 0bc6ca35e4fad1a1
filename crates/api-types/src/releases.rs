//! Bodies of pushes, config changes and rollbacks, and the events their answers stream.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use warden_core::Release;

/// Body of `GET /v1/limits`: what the API takes, so that a client can refuse an upload before
/// sending it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct UploadLimits {
    /// Largest upload a push may send, in bytes.
    pub max_upload_bytes: u64,
}

/// Query of `POST /v1/apps/{name}/releases`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct PushQuery {
    /// How to build: python, node, static or procfile; detected when absent.
    pub kind: Option<String>,
    /// Where the source came from (a directory, a git URL and commit).
    pub from: Option<String>,
    /// The groups whose users may reach the app, comma-separated (`staff,ops`); the app's
    /// groups become these when the release serves. Absent: they stay as they are (a new app:
    /// every signed-in user, at their clearance).
    pub groups: Option<String>,
}

/// Body of `POST /v1/apps/{name}/config`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct ConfigChange {
    /// Vars to set.
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    /// Vars to remove.
    #[serde(default)]
    pub unset: Vec<String>,
}

/// Body of `POST /v1/apps/{name}/rollback`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Rollback {
    /// The release to run again; the last released one before the current when absent.
    #[serde(default)]
    pub to: Option<u64>,
    /// The release the asker saw serving: when set and another one serves now, the rollback
    /// is refused (409) rather than acting on a stale view (a confirm page left open).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect: Option<u64>,
}

/// One line of the answer of a push, a config change or a rollback (newline-delimited JSON):
/// progress lines, then exactly one `Done`, `Failed`, `Lost` or (a config change of an app
/// with no release yet) `Saved`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(untagged)]
pub enum ReleaseEvent {
    /// The release serves.
    Done {
        /// The release, as recorded.
        done: Release,
        /// Where the app is served at the gateway (`/apps/NAME/`).
        path: String,
        /// False while instances of earlier releases are still handing over.
        rolled_out: bool,
    },
    /// The release failed; the app keeps serving what it served before.
    Failed {
        /// The release, as recorded, with its error.
        failed: Release,
    },
    /// A line of build or delivery output.
    Log {
        /// The line.
        log: String,
    },
    /// The node that delivers the release (another than the API's) was lost before its
    /// outcome; the release resumes or fails when that node starts again.
    Lost {
        /// What happened and what to do.
        lost: String,
    },
    /// The config of an app that has no release yet was saved (the app made if it did not
    /// exist): its first push runs with it. No release was made.
    Saved {
        /// What was saved, for a person.
        saved: String,
    },
}
