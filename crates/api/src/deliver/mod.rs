//! Making a release serve: every push, config change and rollback goes through here, as a
//! controller whose phases live in the release's record. The record is written first
//! (`received` for a push, its upload kept on disk; `built` for a config change or a rollback,
//! which reuse a slug); then, in a task of the node that builds (never one tied to the
//! request), each phase is done and written to the record by compare-and-swap before the next
//! begins: the slug is built (`built`), one instance of the new spec is tried outside all
//! routing (`tried`), the app's spec is switched to the release by compare-and-swap
//! (`switched`), and the agents' rollout replaces the older instances (`released`). A failure
//! at any step marks the release `failed` with a typed reason and leaves the app's spec, and so
//! what serves, as it was. A node killed at any point finds its unfinished releases at start
//! (`resume.rs`) and resumes each from its record and its disk, or fails it as interrupted.
//!
//! Progress goes to the client as NDJSON events (`{"log": …}`, then one `{"done": …}` or
//! `{"failed": …}`) and to the release's log file, which `GET …/releases/{n}/log` serves
//! (both bounded: see [`sink`]).

mod phases;
pub(crate) mod processes;
mod resume;
mod rollout;
mod sink;
pub(crate) use sink::{cut_tail, read_tail};

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc;
use warden_api_types::ReleaseEvent;
use warden_core::builds::{BuildError, Builds, Built, Prepared, ReleasePhaseError, TrialError};
use warden_core::model::now_ms;
use warden_core::{keys, AppSpec, FailReason, Release, ReleaseSource, ReleaseStatus};
use warden_store::{get_json, CasOutcome, Revision, StoreError};

use crate::error::ApiError;
use crate::Api;
pub use resume::resume;
use sink::Sink;

/// Where a release's delivery starts (or resumes).
pub(crate) enum Step {
    /// Build this pushed source first (phase `received`).
    Build(Prepared),
    /// Its slug is built: try it, then switch to it (phases `built`, `tried`).
    Try(Built),
    /// The app's spec names it: wait for its rollout (phase `switched`).
    Rollout,
}

/// Why a release does not serve.
#[derive(Debug)]
pub(crate) struct Failure {
    reason: FailReason,
    text: String,
}

impl Failure {
    pub(crate) fn new(reason: FailReason, text: impl Into<String>) -> Self {
        Self {
            reason,
            text: text.into(),
        }
    }
}

impl From<BuildError> for Failure {
    fn from(e: BuildError) -> Self {
        let reason = match &e {
            BuildError::BadArchive(_) | BuildError::Detect(_) => FailReason::DetectFailed,
            BuildError::Failed(_) => FailReason::BuildFailed,
            BuildError::Node(_) => FailReason::Node,
        };
        Self::new(reason, e.to_string())
    }
}

impl From<TrialError> for Failure {
    fn from(e: TrialError) -> Self {
        let reason = match &e {
            TrialError::NotReady(_) => FailReason::TrialFailed,
            TrialError::Node(_) => FailReason::Node,
        };
        Self::new(reason, e.to_string())
    }
}

impl From<ReleasePhaseError> for Failure {
    fn from(e: ReleasePhaseError) -> Self {
        let reason = match &e {
            ReleasePhaseError::Failed(_) => FailReason::ReleaseFailed,
            ReleasePhaseError::Node(_) => FailReason::Node,
        };
        Self::new(reason, e.to_string())
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Self::new(
            FailReason::Node,
            format!("the store did not answer ({e}); push again once it does"),
        )
    }
}

/// A release being delivered, with its record's revision: each phase is written to the record
/// by compare-and-swap on it, so two deliveries of one release cannot both go on.
pub(crate) struct Delivery {
    release: Release,
    revision: Revision,
    /// The app existed when the release was asked for, so one deleted meanwhile is not
    /// brought back.
    must_exist: bool,
    /// The app's spec names the release: from here it serves, and a later failure (of the
    /// store, of its record) must not mark it failed. Its record stays `switched`, which the
    /// node finishes at its next start.
    switched: bool,
}

// === impl Delivery ===

impl Delivery {
    pub(crate) fn new(release: Release, revision: Revision, must_exist: bool) -> Self {
        let switched = release.status == ReleaseStatus::Switched;
        Self {
            release,
            revision,
            must_exist,
            switched,
        }
    }

    /// The release's number.
    pub(crate) fn number(&self) -> u64 {
        self.release.number
    }

    /// Writes the release in phase `status` to its record, before anything of the next phase
    /// happens.
    async fn advance(&mut self, api: &Api, status: ReleaseStatus) -> Result<(), Failure> {
        self.release.status = status;
        let key = keys::release(&self.release.app, self.release.number);
        let bytes = serde_json::to_vec(&self.release).map_err(|e| {
            Failure::new(FailReason::Node, format!("cannot encode the release: {e}"))
        })?;
        match api
            .store
            .compare_and_swap(&key, Some(self.revision), Some(bytes), None)
            .await?
        {
            CasOutcome::Done(rev) => {
                self.revision = rev;
                Ok(())
            }
            CasOutcome::Conflict { .. } => Err(Failure::new(
                FailReason::Node,
                "the release's record was changed by someone else during its delivery; push again",
            )),
        }
    }

    /// Removes the upload the release kept, once its record no longer names it (a kill in
    /// between leaves a file no release names, which the next start removes).
    fn drop_upload(api: &Api, name: Option<String>) {
        if let (Some(name), Some(dir)) = (name, uploads_dir(api)) {
            let _ = std::fs::remove_file(dir.join(name));
        }
    }
}

/// Where pushes' archives wait for their build.
pub(crate) fn uploads_dir(api: &Api) -> Option<PathBuf> {
    Some(api.data_dir.as_ref()?.join("uploads"))
}

/// The log file of release `number` of `app`.
pub(crate) fn log_path(api: &Api, app: &str, number: u64) -> Option<PathBuf> {
    Some(
        api.data_dir
            .as_ref()?
            .join("releases")
            .join(app)
            .join(format!("{number}.log")),
    )
}

/// Writes `release` under the next free number of its app and returns it with its record's
/// revision.
pub(crate) async fn record(
    api: &Api,
    mut release: Release,
) -> Result<(Release, Revision), ApiError> {
    for _ in 0..16 {
        let listing = api.store.list(&keys::releases(&release.app)).await?;
        let last = listing
            .entries
            .iter()
            .filter_map(|e| e.key.rsplit('/').next()?.parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        release.number = last + 1;
        let bytes = serde_json::to_vec(&release).map_err(ApiError::internal)?;
        let key = keys::release(&release.app, release.number);
        if let CasOutcome::Done(rev) = api
            .store
            .compare_and_swap(&key, None, Some(bytes), None)
            .await?
        {
            return Ok((release, rev));
        }
    }
    Err(ApiError::conflict(
        "too many releases of this app are being made at once; try again",
    ))
}

/// Hands the recorded release to this node's delivery and answers with its progress. The
/// delivery goes on when the client goes away.
pub(crate) fn start(api: Api, builds: Arc<dyn Builds>, delivery: Delivery, step: Step) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(sink::QUEUE);
    let sink = Sink::new(
        tx,
        log_path(&api, &delivery.release.app, delivery.release.number),
    );
    tokio::spawn(drive(api, builds, delivery, Ok(step), sink));
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx))
    });
    (
        [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response()
}

/// Delivers the release from `step` to its end, and says how it ended.
async fn drive(
    api: Api,
    builds: Arc<dyn Builds>,
    mut d: Delivery,
    step: Result<Step, Failure>,
    sink: Sink,
) {
    let outcome = match step {
        Ok(step) => phases::run(&api, &*builds, &mut d, step, &sink).await,
        Err(f) => Err(f),
    };
    let (app, number) = (d.release.app.clone(), d.release.number);
    match outcome {
        Ok(rolled_out) => {
            tracing::info!(app, release = number, "release serving");
            sink.finish(ReleaseEvent::Done {
                done: d.release,
                path: format!("/apps/{app}/"),
                rolled_out,
            })
            .await;
        }
        Err(f) if d.switched => {
            // It serves: saying `failed` would make rollbacks skip the code that runs.
            tracing::warn!(app, release = number, error = %f.text, "a release that serves could not be brought to its end; its record stays `switched` until the node's next start");
            sink.log_only(&format!(
                "release {number} serves, but its record could not be brought to its end: {}",
                f.text
            ));
            sink.finish(ReleaseEvent::Done {
                done: d.release,
                path: format!("/apps/{app}/"),
                rolled_out: false,
            })
            .await;
        }
        Err(f) => {
            let upload = d.release.upload.take();
            d.release.reason = Some(f.reason);
            d.release.error = Some(f.text.clone());
            if let Err(e) = d.advance(&api, ReleaseStatus::Failed).await {
                tracing::warn!(app, number, error = %e.text, "cannot mark a release failed");
            }
            Delivery::drop_upload(&api, upload);
            tracing::info!(app, release = number, reason = ?f.reason, "release failed");
            sink.log_only(&format!("release {number} failed: {}", f.text));
            if d.release.new_app && d.release.data == Some(true) {
                drop_unmade_database(&api, &app, number, &sink).await;
            }
            sink.finish(ReleaseEvent::Failed { failed: d.release })
                .await;
        }
    }
}

/// Drops the database made at push for release `number`, which was to make its app and
/// failed: no app owns it, so not even `apps rm` would. Kept if the app exists by now, or
/// another release of the name is under way (its push made the same database, or will find
/// it made).
async fn drop_unmade_database(api: &Api, app: &str, number: u64, sink: &Sink) {
    let Some(data) = &api.data else { return };
    let in_use = async {
        if get_json::<AppSpec>(&*api.store, &keys::app_spec(app))
            .await?
            .is_some()
        {
            return Ok::<_, StoreError>(true);
        }
        let listing = api.store.list(&keys::releases(app)).await?;
        Ok(listing.entries.iter().any(|e| {
            warden_store::decode::<Release>(&e.key, &e.value)
                .is_ok_and(|r| r.number != number && !r.status.finished())
        }))
    };
    match in_use.await {
        Ok(true) => {}
        Ok(false) => match data.drop_app(app).await {
            Ok(()) => sink.line(&format!(
                "-----> the database this push made for app {app:?} is dropped: no app of the name has it"
            )),
            Err(e) => {
                tracing::warn!(app, error = %e, "dropping the database of an app whose first release failed failed");
            }
        },
        Err(e) => {
            tracing::warn!(app, error = %e, "cannot tell whether the database of an app whose first release failed is still used; it is kept");
        }
    }
}

/// The config vars an app has now (its spec's environment), empty for a new app.
pub(crate) async fn config_of(api: &Api, app: &str) -> Result<BTreeMap<String, String>, ApiError> {
    Ok(get_json::<AppSpec>(&*api.store, &keys::app_spec(app))
        .await?
        .map(|(s, _)| s.env)
        .unwrap_or_default())
}

/// A new release of `app`, delivered by this node, in phase `status`.
pub(crate) fn fresh(
    api: &Api,
    app: &str,
    source: ReleaseSource,
    config: BTreeMap<String, String>,
    by: String,
    status: ReleaseStatus,
) -> Release {
    Release {
        app: app.to_owned(),
        number: 0,
        source,
        slug: None,
        kind: None,
        command: Vec::new(),
        release_command: Vec::new(),
        config,
        by,
        at_ms: now_ms(),
        status,
        reason: None,
        error: None,
        node: api.node.as_deref().map(str::to_owned),
        upload: None,
        new_app: false,
        groups: None,
        data: None,
    }
}
