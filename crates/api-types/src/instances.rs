//! Bodies of `/v1/instances`, `/v1/apps/{name}/logs` and `/v1/apps/{name}/requests`.

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
    /// How many of the app's last lines in all (default 100, at most 10000): the newest lines
    /// of the instance whose log was written last, then of the one before it, and so on.
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

/// Query of `GET /v1/apps/{name}/requests`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct RouterLinesQuery {
    /// How many of the newest request lines (default 100, at most 10000).
    pub lines: Option<usize>,
}

/// One request this node's gateway answered through an instance of the app. No query string,
/// header, cookie or user name: those may carry secrets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RouterLine {
    /// When the answer came, RFC 3339 in UTC with milliseconds.
    pub at: String,
    /// The method, control characters replaced by `?`, at most 16 bytes.
    pub method: String,
    /// The path without its query string, control characters replaced by `?`, at most 200
    /// bytes.
    pub path: String,
    /// The instance's status code.
    pub status: u16,
    /// From sending to the instance until its answer's head, in milliseconds.
    pub duration_ms: u64,
    /// The instance that answered.
    pub instance: String,
    /// The label it was served at.
    pub label: String,
}

/// Answer of `GET /v1/apps/{name}/requests`: the request lines this node's gateway keeps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RouterLines {
    /// The newest lines, oldest first.
    pub lines: Vec<RouterLine>,
    /// Why lines may be missing: no gateway on this node, other nodes' gateways, or the
    /// bound on apps kept.
    pub note: Option<String>,
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
