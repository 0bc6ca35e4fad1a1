//! The bodies the control-plane API takes and answers, shared by the API (`warden-api`), the
//! CLI (`warden-cli`) and any other client, so that both ends read one definition.
//!
//! This crate owns every request and response body that is not a record of `warden-core`
//! (those it re-exports: the API answers with them as they are stored). It is data only: no
//! I/O, no axum, no HTTP client, no store; validation that needs state (the lattice, the store)
//! stays in the API. The JSON each type makes is the API's wire format: changing a field here
//! changes the API.
//!
//! Fields of previously ad-hoc bodies are declared in alphabetical order, the order
//! `serde_json::json!` wrote them in, so the bytes on the wire did not change when they became
//! types.
#![forbid(unsafe_code)]

pub mod device;
pub mod health;
pub mod instances;
pub mod nodes;
pub mod oidc;
#[cfg(feature = "schema")]
pub mod openapi;
pub mod operators;
pub mod ps;
pub mod releases;
pub mod run;
pub mod status;
pub mod users;

pub use device::{DeviceLogin, DevicePollAnswer, DevicePollRequest, DeviceStarted};
pub use health::{ErrorBody, Health, Ok};
pub use instances::{
    AppLogEntry, AppLogsQuery, LogsQuery, RouterLine, RouterLines, RouterLinesQuery, StartRequest,
};
pub use nodes::DrainQuery;
pub use oidc::{NewOidcProvider, OidcProviderChange, OidcProviderView};
pub use operators::{
    IssuedToken, Login, NewOperator, NewToken, OperatorChange, OperatorView, TokenView,
};
pub use ps::{ProcessLabel, ProcessType};
pub use releases::{ConfigChange, PushQuery, ReleaseEvent, Rollback, UploadLimits};
pub use run::{RunQuery, RunRequest};
pub use status::{AppStatus, BackupHead, BackupRecord, CrashReport, Damaged, NodeStatus, Status};
pub use users::{NewUser, SessionView, UserChange, UserView};

/// The stored records the API answers with as they are.
pub use warden_auth::Lattice;
/// What an app's database holds (`GET /v1/apps/{name}/data`), as the data plane reports it.
pub use warden_core::audit::{
    Event as AuditEvent, NodeEvent, Problem, Query as AuditQuery, Record as AuditRecord, Verified,
};
pub use warden_core::data::{AppData, TableRows};
pub use warden_core::{
    AppSpec, DrainOrder, InstanceRecord, InstanceState, LabelHealth, Move, NodeRecord,
    OperatorSource, Release, ReleaseSource, ReleaseStatus, Role, TokenKind,
};

/// Body of `POST /v1/apps/{name}/scale`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Scale {
    /// Instances the cluster keeps for each label named; 0 stops keeping that label. Labels
    /// not named keep their counts.
    pub desired: std::collections::BTreeMap<String, u32>,
    /// The Procfile's process type whose counts these are (`worker`); the app's web
    /// instances when absent or `web`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<String>,
}

/// Body of `POST /v1/apps/{name}/restart`: `{}` restarts every label of the app.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Restart {
    /// The one label whose instances are replaced; every label's when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

/// Answer of `POST /v1/apps/{name}/restart`: the restart is asked for; the agents replace the
/// instances it names as they roll out a changed spec (each new one ready before its old one
/// drains), and no release is made.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct Restarted {
    /// The app.
    pub app: String,
    /// The label restarted (canonical spelling); absent: every label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// How many restarts of this app (or label) were asked for so far, this one included.
    pub restart: u64,
    /// Instances running when it was asked for, each to be replaced.
    pub replacing: u32,
    /// The release the new instances run, as the old ones did (`None`: the app runs no
    /// release, only its command).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<u64>,
}

/// Body of `PATCH /v1/apps/{name}`: an RFC 7396 JSON merge patch of the app's spec (members
/// replace, objects merge, `null` removes). It stays a JSON object because a merge patch is
/// defined on JSON, not on the spec's type; the patched spec is then read as an [`AppSpec`].
pub type AppPatch = serde_json::Map<String, serde_json::Value>;
