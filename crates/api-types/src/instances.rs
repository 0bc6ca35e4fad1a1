//! Bodies of `/v1/instances` and `/v1/apps/{name}/logs`.

use serde::{Deserialize, Serialize};
use warden_core::InstanceState;

/// Body of `POST /v1/instances`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct StartRequest {
    /// App to run.
    pub app: String,
    /// Clearance label the instance serves.
    pub label: String,
}

/// Query of `GET /v1/instances/{id}/logs`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LogsQuery {
    /// How many of the last lines to return (default 100, at most 10000).
    pub lines: Option<usize>,
}

/// Query of `GET /v1/apps/{name}/logs`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct AppLogsQuery {
    /// How many of each instance's last lines (default 100, at most 10000).
    pub lines: Option<usize>,
    /// Only instances of this release.
    pub release: Option<u64>,
    /// Only instances serving this label.
    pub label: Option<String>,
    /// Only this instance.
    pub instance: Option<String>,
}

/// One instance's last lines in the answer of `GET /v1/apps/{name}/logs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct AppLogEntry {
    /// Instance id.
    pub instance: String,
    /// The label it serves.
    pub label: String,
    /// The node it runs on.
    pub node: String,
    /// Why `text` is empty: its lines are on another node.
    pub note: Option<String>,
    /// The release it runs, if it runs one.
    pub release: Option<u64>,
    /// Its state.
    pub state: InstanceState,
    /// Its last lines, newline-separated.
    pub text: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The entry was a `json!` object, whose keys serde_json sorts: the type writes the same
    /// bytes, so clients that read the raw answer see no change.
    #[test]
    fn a_log_entry_writes_the_bytes_the_json_macro_wrote() {
        let e = AppLogEntry {
            instance: "i1".into(),
            label: "public".into(),
            node: "n1".into(),
            note: None,
            release: Some(3),
            state: InstanceState::Ready,
            text: "hello\n".into(),
        };
        let before = serde_json::json!({
            "instance": "i1",
            "label": "public",
            "release": 3,
            "node": "n1",
            "state": "ready",
            "text": "hello\n",
            "note": null,
        });
        assert_eq!(
            serde_json::to_string(&e).expect("serializes"),
            before.to_string()
        );
    }
}
