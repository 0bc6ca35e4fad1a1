//! The control-plane API: JSON over HTTP for apps, users, instances, nodes and the lattice.
//!
//! This crate owns the admin interface and its validation: every body is parsed into a type that
//! refuses unknown fields, every error is JSON saying what to do. It writes desired state to the
//! store and asks the instances source (the local agent, through [`warden_core::InstanceAdmin`]) to
//! start or kill instances; it never serves app traffic. Pushes are built and tried by the
//! local agent too (through [`warden_core::builds::Builds`]); `deliver` makes a release serve.
//!
//! Access needs a token (`Authorization: Bearer …`): an operator's (from `POST /v1/login` or
//! `POST /v1/tokens`), checked against their roles route by route (`authz`), or the break-glass
//! admin token, compared in constant time, unless it is turned off. Request bodies may hold
//! passwords: they are hashed at once and never logged or returned.
#![forbid(unsafe_code)]

mod audit;
mod authz;
mod deliver;
pub mod error;
mod router;
pub mod routes;
mod serve;
mod ui;

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use warden_api_types::Health;
use warden_core::InstanceAdmin;
use warden_store::Store;

pub use deliver::resume;
pub use error::ApiError;
pub use routes::node_releases::NodeReleases;
pub use routes::provider_operators::{OperatorIdp, OperatorProvider};
pub use serve::{serve, Limits};

/// The OpenAPI document of this API, kept in the repository beside the code it describes:
/// generated from `openapi.template.json` (the paths) and the types of `warden-api-types` (the
/// schemas) by `cargo run -p warden-api-types --features schema --example openapi`; a test
/// fails when it is not what they make.
pub const OPENAPI: &str = include_str!("../openapi.json");

/// Every (method, path) the router serves, in OpenAPI path syntax. A test checks it against
/// both the router and `openapi.json`.
pub const ROUTES: &[(&str, &str)] = &[
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
    ("get", "/v1/openapi.json"),
    ("get", "/v1/status"),
    ("get", "/v1/apps"),
    ("post", "/v1/apps"),
    ("get", "/v1/apps/{name}"),
    ("patch", "/v1/apps/{name}"),
    ("delete", "/v1/apps/{name}"),
    ("post", "/v1/apps/{name}/scale"),
    ("get", "/v1/apps/{name}/ps"),
    ("get", "/v1/apps/{name}/data"),
    ("get", "/v1/limits"),
    ("get", "/v1/apps/{name}/logs"),
    ("get", "/v1/apps/{name}/requests"),
    ("get", "/v1/apps/{name}/releases"),
    ("post", "/v1/apps/{name}/releases"),
    ("get", "/v1/apps/{name}/releases/{number}/log"),
    ("get", "/v1/apps/{name}/config"),
    ("post", "/v1/apps/{name}/config"),
    ("post", "/v1/apps/{name}/rollback"),
    ("post", "/v1/apps/{name}/restart"),
    ("get", "/v1/apps/{name}/git/info/refs"),
    ("post", "/v1/apps/{name}/git/git-receive-pack"),
    ("post", "/v1/apps/{name}/run"),
    ("get", "/v1/users"),
    ("post", "/v1/users"),
    ("get", "/v1/users/{name}"),
    ("patch", "/v1/users/{name}"),
    ("delete", "/v1/users/{name}"),
    ("get", "/v1/sessions"),
    ("delete", "/v1/users/{name}/sessions"),
    ("get", "/v1/instances"),
    ("post", "/v1/instances"),
    ("delete", "/v1/instances/{id}"),
    ("get", "/v1/instances/{id}/logs"),
    ("get", "/v1/nodes"),
    ("post", "/v1/nodes/{name}/drain"),
    ("delete", "/v1/nodes/{name}/drain"),
    ("get", "/v1/lattice"),
    ("put", "/v1/lattice"),
    ("get", "/v1/store/backup"),
    ("get", "/v1/audit"),
    ("get", "/v1/audit/verify"),
    ("get", "/v1/operators"),
    ("post", "/v1/operators"),
    ("get", "/v1/operators/{name}"),
    ("patch", "/v1/operators/{name}"),
    ("delete", "/v1/operators/{name}"),
    ("post", "/v1/login"),
    ("post", "/v1/login/device"),
    ("post", "/v1/login/device/poll"),
    ("post", "/v1/logout"),
    ("get", "/v1/tokens"),
    ("post", "/v1/tokens"),
    ("delete", "/v1/tokens/{id}"),
    ("get", "/v1/oidc/providers"),
    ("post", "/v1/oidc/providers"),
    ("get", "/v1/oidc/providers/{id}"),
    ("patch", "/v1/oidc/providers/{id}"),
    ("delete", "/v1/oidc/providers/{id}"),
];

/// What an operator's session (`POST /v1/login`) lasts unless configured otherwise: 12 hours.
pub const DEFAULT_SESSION_TTL: std::time::Duration = std::time::Duration::from_secs(12 * 3600);

/// Ready when the store can commit: 200, else 503 saying why (a full disk, an I/O error).
/// `/healthz` only says the process answers.
async fn readyz(State(api): State<Api>) -> Response {
    let audit = api.audit.health().err();
    match api.store.ready() {
        Ok(()) => Json(Health {
            error: None,
            status: "ready".into(),
            audit,
        })
        .into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(Health {
                error: Some(e.to_string()),
                status: "not ready".into(),
                audit,
            }),
        )
            .into_response(),
    }
}

/// Waits until a local consumer (the gateway in the same process) has applied a write: key and
/// revision in, resolves when applied.
pub type SyncHook = Arc<dyn Fn(String, u64) -> BoxFuture + Send + Sync>;
/// The future a [`SyncHook`] returns.
pub type BoxFuture = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Largest upload a push may send unless configured otherwise: 256 MiB.
pub const DEFAULT_MAX_UPLOAD: u64 = 256 * 1024 * 1024;

/// Longest a write waits for the local gateway to apply it before answering anyway.
const SYNC_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// What handlers share: one allocation, so that each of the clones axum makes per request (one
/// for every middleware and handler) is one reference count, not twenty. Reads reach the
/// fields through `Deref`; the builder's `with_*` methods write through `DerefMut`, which
/// copies the state first if it is shared, so a change never shows in another clone (as when
/// `Api` was the fields themselves).
#[derive(Clone)]
pub struct Api(Arc<ApiState>);

impl std::ops::Deref for Api {
    type Target = ApiState;
    fn deref(&self) -> &ApiState {
        &self.0
    }
}

impl std::ops::DerefMut for Api {
    fn deref_mut(&mut self) -> &mut ApiState {
        Arc::make_mut(&mut self.0)
    }
}

/// The fields of [`Api`].
#[derive(Clone)]
pub struct ApiState {
    /// The state store.
    pub store: Arc<dyn Store>,
    /// Where instances come from, if this process runs the agent role.
    pub instances: Option<Arc<dyn InstanceAdmin>>,
    /// The cost of the Argon2id hashes of new passwords.
    pub argon2: warden_auth::Argon2Cost,
    /// warden's data directory, which no app may serve as static files; uploads and release
    /// logs live under it.
    pub data_dir: Option<std::path::PathBuf>,
    /// What builds pushed apps and tries releases, if this process runs the agent role.
    pub builds: Option<Arc<dyn warden_core::builds::Builds>>,
    /// The node that builds, which delivers the releases this API makes and resumes them at
    /// start (`None` where nothing builds).
    pub node: Option<Arc<str>>,
    /// Largest upload a push may send, in bytes.
    pub max_upload: u64,
    /// Where releases are made when this node builds nothing (another node of the cluster).
    pub releases: Option<Arc<dyn warden_core::Releases>>,
    /// The break-glass admin token; `None`: turned off.
    token: Option<Arc<str>>,
    /// What an operator's session lasts.
    pub(crate) session_ttl: std::time::Duration,
    /// Failed logins, throttled per name and address.
    pub(crate) throttle: Arc<authz::throttle::Throttle>,
    /// The identity providers operators sign in through (`warden login --provider`), if any.
    pub(crate) idp: Option<Arc<OperatorIdp>>,
    /// Device sign-ins started, and polls of unknown ones, throttled per address.
    pub(crate) device_throttle: Arc<authz::throttle::Throttle>,
    /// One-off commands (`warden run`) running on this node, bounded per app and in all.
    pub(crate) one_offs: Arc<routes::run::Running>,
    /// Device sign-ins in flight, by the network they began from.
    pub(crate) device_live: Arc<routes::device_live::Live>,
    /// The key backups are sealed under (the data dir's `backup-key`); `None`: no backups.
    backup_key: Option<Arc<str>>,
    /// Apps' databases, when warden has a data server (`None`: apps with `data` are refused).
    pub data: Option<Arc<dyn warden_core::data::DataPlane>>,
    sync: Option<SyncHook>,
    metrics: Option<Arc<dyn Fn() -> String + Send + Sync>>,
    /// The request lines of this process's gateway (`None`: no gateway here).
    pub(crate) requests: Option<Arc<dyn warden_core::requests::RequestLog>>,
    /// This node's audit log: every change through the API is recorded in it.
    pub audit: Arc<dyn warden_core::audit::Audit>,
    /// Refusals of the admin token, summed until the next flush.
    pub(crate) refusals: Arc<audit::Refusals>,
    /// How often `refusals` are written to the log.
    audit_flush: std::time::Duration,
    /// The key the dashboard's forms are signed under (`ui`): random per process unless set.
    ui_key: Arc<[u8; 32]>,
    /// Turns true when the server stops: the dashboard's event streams end then, or the
    /// graceful shutdown would wait on them for ever.
    pub(crate) stopping: Option<tokio::sync::watch::Receiver<bool>>,
    /// The origin a TLS proxy in front of the API serves the dashboard at (`https://…`), as the
    /// operator named it: the dashboard's cookies are `Secure` and its forms are taken from
    /// there; `None`: the API's own plain-HTTP origin.
    pub(crate) ui_origin: Option<Arc<str>>,
    /// Checks and seals identity providers added through the API (`None`: no gateway here).
    pub(crate) oidc: Option<Arc<dyn routes::oidc_providers::OidcCheck>>,
}

// === impl Api ===

impl Api {
    /// API state guarded by operators' tokens and the break-glass `admin_token` (`None`: off);
    /// new passwords are hashed at `argon2`.
    pub fn new(
        store: Arc<dyn Store>,
        instances: Option<Arc<dyn InstanceAdmin>>,
        admin_token: Option<&str>,
        argon2: warden_auth::Argon2Cost,
    ) -> Self {
        Self(Arc::new(ApiState {
            store,
            instances,
            argon2,
            data_dir: None,
            builds: None,
            node: None,
            max_upload: DEFAULT_MAX_UPLOAD,
            releases: None,
            token: admin_token.map(Into::into),
            session_ttl: DEFAULT_SESSION_TTL,
            throttle: Arc::default(),
            idp: None,
            device_throttle: Arc::default(),
            one_offs: Arc::default(),
            device_live: Arc::default(),
            backup_key: None,
            data: None,
            sync: None,
            metrics: None,
            requests: None,
            audit: Arc::new(warden_core::audit::NoAudit),
            refusals: Arc::default(),
            audit_flush: std::time::Duration::from_secs(60),
            ui_key: Arc::new(random_key()),
            stopping: None,
            ui_origin: None,
            oidc: None,
        }))
    }

    /// Takes identity providers through `/v1/oidc/providers`, checked and sealed by `check`.
    pub fn with_oidc(mut self, check: Arc<dyn routes::oidc_providers::OidcCheck>) -> Self {
        self.oidc = Some(check);
        self
    }

    /// Signs the dashboard's forms under `key` (the data dir's or the cluster's, so a page one
    /// process served is taken after a restart or by another node).
    pub fn with_ui_key(mut self, key: [u8; 32]) -> Self {
        self.ui_key = Arc::new(key);
        self
    }

    /// Serves the dashboard as `origin` (a TLS proxy's, `https://HOST[:PORT]`), or, `None`,
    /// as the API's own plain-HTTP origin.
    pub fn with_ui_origin(mut self, origin: Option<&str>) -> Self {
        self.ui_origin = origin.map(Into::into);
        self
    }

    /// Operators' sessions (`POST /v1/login`) last `ttl`.
    pub fn with_session_ttl(mut self, ttl: std::time::Duration) -> Self {
        self.session_ttl = ttl;
        self
    }

    /// Lets operators sign in through the providers of `idp` (`POST /v1/login/device`).
    pub fn with_identity_providers(mut self, idp: Arc<OperatorIdp>) -> Self {
        self.idp = Some(idp);
        self
    }

    /// The break-glass admin token, unless turned off.
    pub(crate) fn admin_token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// Records changes in `audit` and reads it back through `/v1/audit`.
    pub fn with_audit(mut self, audit: Arc<dyn warden_core::audit::Audit>) -> Self {
        self.audit = audit;
        self
    }

    /// Writes the refusals of the admin token summed over each `period` to the audit log.
    pub fn with_audit_flush(mut self, period: std::time::Duration) -> Self {
        self.audit_flush = period;
        self
    }

    /// Flushes the summed refusals every period until `shutdown` turns true, then once more.
    pub(crate) fn refusals_task(
        &self,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> impl std::future::Future<Output = ()> {
        let refusals = self.refusals.clone();
        refusals.run(self.audit.clone(), self.audit_flush, shutdown)
    }

    /// Keeps apps from serving `dir` (warden's data directory), or any part of it, as static
    /// files.
    pub fn protecting(mut self, dir: std::path::PathBuf) -> Self {
        self.data_dir = Some(dir);
        self
    }

    /// Gives apps with `data` their databases on `data`.
    pub fn with_data(mut self, data: Arc<dyn warden_core::data::DataPlane>) -> Self {
        self.data = Some(data);
        self
    }

    /// Seals backups under `key`, which the operator keeps with them to restore them.
    pub fn with_backup_key(mut self, key: &str) -> Self {
        self.backup_key = Some(key.into());
        self
    }

    /// The key backups are sealed under, if any.
    pub(crate) fn backup_key(&self) -> Option<&str> {
        self.backup_key.as_deref()
    }

    /// Takes pushes, building them with `builds`, of at most `max_upload` bytes, and delivers
    /// releases as node `node`.
    pub fn with_builds(
        mut self,
        builds: Arc<dyn warden_core::builds::Builds>,
        max_upload: u64,
        node: &str,
    ) -> Self {
        self.builds = Some(builds);
        self.node = Some(node.into());
        self.max_upload = max_upload;
        self
    }

    /// Has releases made by `releases` (another node of the cluster, which builds), taking
    /// uploads of at most `max_upload` bytes: for a node that builds nothing.
    pub fn with_remote_releases(
        mut self,
        releases: Arc<dyn warden_core::Releases>,
        max_upload: u64,
    ) -> Self {
        self.releases = Some(releases);
        self.max_upload = max_upload;
        self
    }

    /// Serves `/metrics` (Prometheus text) from `render`.
    pub fn with_metrics(mut self, render: Arc<dyn Fn() -> String + Send + Sync>) -> Self {
        self.metrics = Some(render);
        self
    }

    /// Serves `GET /v1/apps/{name}/requests` from the request lines of this process's gateway.
    pub fn with_requests(mut self, log: Arc<dyn warden_core::requests::RequestLog>) -> Self {
        self.requests = Some(log);
        self
    }

    /// Makes writes answer only once `hook` says they are applied, so that a user or app created
    /// through this API is usable at the gateway of this process as soon as the call returns.
    pub fn with_sync(mut self, hook: SyncHook) -> Self {
        self.sync = Some(hook);
        self
    }

    /// Waits (bounded) until the local consumers have applied the write of `key` at `revision`.
    pub(crate) async fn applied(&self, key: &str, revision: u64) {
        if let Some(hook) = &self.sync {
            if tokio::time::timeout(SYNC_WAIT, hook(key.to_owned(), revision))
                .await
                .is_err()
            {
                tracing::warn!(
                    key,
                    revision,
                    "the local gateway has not applied a write yet; answering anyway"
                );
            }
        }
    }
}

/// 32 random bytes (a fresh secret token's hex, decoded).
fn random_key() -> [u8; 32] {
    let hex = warden_core::id::secret_token();
    let mut key = [0u8; 32];
    for (i, b) in key.iter_mut().enumerate() {
        *b = hex
            .get(i * 2..i * 2 + 2)
            .and_then(|h| u8::from_str_radix(h, 16).ok())
            .unwrap_or_default();
    }
    key
}

/// Prometheus text; no token needed, as scrapers expect, and nothing secret in it.
async fn metrics(State(api): State<Api>) -> Response {
    let body = api
        .metrics
        .as_ref()
        .map(|render| render())
        .unwrap_or_default();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openapi_document_lists_exactly_the_routes() {
        let doc: serde_json::Value = serde_json::from_str(OPENAPI).expect("openapi.json is JSON");
        let mut documented: Vec<(String, String)> = Vec::new();
        for (path, ops) in doc["paths"].as_object().expect("paths object") {
            for method in ops.as_object().expect("operations").keys() {
                documented.push((method.clone(), path.clone()));
            }
        }
        documented.sort();
        let mut served: Vec<(String, String)> = ROUTES
            .iter()
            .map(|(m, p)| (m.to_string(), p.to_string()))
            .collect();
        served.sort();
        assert_eq!(documented, served);
    }

    #[test]
    fn openapi_json_is_what_the_generator_makes_of_the_template_and_the_types() {
        use warden_api_types::openapi::{document, REGENERATE};
        let made =
            document(include_str!("../openapi.template.json")).expect("the template is JSON");
        assert!(
            made == OPENAPI,
            "crates/api/openapi.json is not what the API's types and crates/api/openapi.template.json make; \
             regenerate it with `{REGENERATE}` (change paths in the template, never in openapi.json)"
        );
    }
}
