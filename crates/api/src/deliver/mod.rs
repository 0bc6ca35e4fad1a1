//! Making a release serve: every push, config change and rollback goes through here. A
//! numbered release record is written first (status `building`); then, in a task that outlives
//! the request, the slug is built (pushes only), one instance of the new spec is tried outside
//! all routing, and only then is the app's spec switched to the release by compare-and-swap.
//! The agents' rollout does the rest: new instances start and become ready before the old
//! ones drain. A failure at any step marks the release failed and leaves the app's spec, and
//! so what serves, as it was.
//!
//! Progress goes to the client as NDJSON events (`{"log": …}`, then one `{"done": …}` or
//! `{"failed": …}`) and to the release's log file, which `GET …/releases/{n}/log` serves
//! (both bounded: see [`sink`]).

mod sink;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc;
use warden_core::builds::{Builds, Built};
use warden_core::model::now_ms;
use warden_core::{keys, AppSpec, BuildKind, Release, ReleaseSource, ReleaseStatus, SpecRelease};
use warden_store::{get_json, put_json, CasOutcome, EventKind, Follower, Update};

use crate::error::ApiError;
use crate::Api;
use sink::Sink;

/// What a release runs, before it is built.
pub(crate) enum Step {
    /// Build this pushed source first.
    Build(warden_core::builds::Prepared),
    /// Reuse an earlier release's slug.
    Reuse(Built),
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

/// Writes `release` under the next free number of its app and returns it.
pub(crate) async fn record(api: &Api, mut release: Release) -> Result<Release, ApiError> {
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
        if let CasOutcome::Done(_) = api
            .store
            .compare_and_swap(&key, None, Some(bytes), None)
            .await?
        {
            return Ok(release);
        }
    }
    Err(ApiError::conflict(
        "too many releases of this app are being made at once; try again",
    ))
}

/// Starts the release's delivery in the background and answers with its progress.
/// `must_exist`: the app existed when the release was asked for, so one deleted meanwhile
/// is not brought back.
pub(crate) fn start(
    api: Api,
    builds: Arc<dyn Builds>,
    release: Release,
    step: Step,
    must_exist: bool,
) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(sink::QUEUE);
    let sink = Sink::new(tx, log_path(&api, &release.app, release.number));
    tokio::spawn(async move {
        let number = release.number;
        let app = release.app.clone();
        let outcome = deliver(&api, &*builds, release.clone(), step, must_exist, &sink).await;
        let mut release = release;
        match outcome {
            Ok(Delivered {
                built: done,
                config,
                rolled_out,
            }) => {
                release.status = ReleaseStatus::Released;
                release.slug = Some(done.slug.clone());
                release.kind = Some(done.kind);
                release.command = done.command.clone();
                release.config = config;
                if let Err(e) =
                    put_json(&*api.store, &keys::release(&app, number), &release, None).await
                {
                    tracing::warn!(app, number, error = %e, "cannot mark a release released");
                }
                tracing::info!(app, release = number, "release serving");
                sink.finish(serde_json::json!({
                    "done": release,
                    "path": format!("/apps/{app}/"),
                    "rolled_out": rolled_out,
                }))
                .await;
            }
            Err(error) => {
                release.status = ReleaseStatus::Failed;
                release.error = Some(error.clone());
                if let Err(e) =
                    put_json(&*api.store, &keys::release(&app, number), &release, None).await
                {
                    tracing::warn!(app, number, error = %e, "cannot mark a release failed");
                }
                tracing::info!(app, release = number, "release failed");
                sink.log_only(&format!("release {number} failed: {error}"));
                sink.finish(serde_json::json!({ "failed": release })).await;
            }
        }
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx))
    });
    (
        [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response()
}

/// What a release that serves ended with.
struct Delivered {
    built: Built,
    /// The config vars it runs with.
    config: BTreeMap<String, String>,
    /// Whether every ready instance ran it before the wait ended.
    rolled_out: bool,
}

/// Builds, tries and switches to the release; the error says why it does not serve.
async fn deliver(
    api: &Api,
    builds: &dyn Builds,
    release: Release,
    step: Step,
    must_exist: bool,
    sink: &Sink,
) -> Result<Delivered, String> {
    let app = &release.app;
    let built = match step {
        Step::Reuse(b) => b,
        Step::Build(p) if p.built.is_some() => {
            sink.line("-----> this tree was built before: reusing its slug");
            builds
                .build(p, sink.output())
                .await
                .map_err(|e| e.to_string())?
        }
        Step::Build(p) => builds
            .build(p, sink.output())
            .await
            .map_err(|e| e.to_string())?,
    };
    for _attempt in 0..8 {
        let current = get_json::<AppSpec>(&*api.store, &keys::app_spec(app))
            .await
            .map_err(|e| e.to_string())?;
        let revision = current.as_ref().map(|(_, r)| *r);
        let current = current.map(|(s, _)| s);
        match current.as_ref().and_then(|s| s.release.as_ref()) {
            Some(newer) if newer.number > release.number => {
                return Err(format!(
                    "release {} serves already, made after this one; this one is not applied",
                    newer.number
                ))
            }
            _ if current.is_none() && must_exist => {
                return Err(format!(
                    "app {app:?} was removed meanwhile; nothing is applied"
                ))
            }
            _ => {}
        }
        let (spec, config) = compose(builds, current, app, &release, &built)?;
        if built.kind != BuildKind::Static {
            let label = crate::routes::lattice::current(api)
                .await
                .ok()
                .and_then(|l| l.levels.first().cloned())
                .ok_or("no clearance lattice is defined yet; define it first with `warden lattice set`")?;
            sink.line(&format!(
                "-----> trying release {} (one instance, label {label})",
                release.number
            ));
            builds.trial(&spec, &label).await?;
            sink.line("-----> the instance is ready");
        }
        let bytes = serde_json::to_vec(&spec).map_err(|e| e.to_string())?;
        match api
            .store
            .compare_and_swap(&keys::app_spec(app), revision, Some(bytes), None)
            .await
            .map_err(|e| e.to_string())?
        {
            CasOutcome::Done(rev) => {
                api.applied(&keys::app_spec(app), rev).await;
                let rolled_out = rolled_out(api, &spec, sink).await;
                return Ok(Delivered {
                    built,
                    config,
                    rolled_out,
                });
            }
            CasOutcome::Conflict { .. } => {
                sink.line("the app changed meanwhile; applying the release to its new spec");
            }
        }
    }
    Err("the app's spec kept changing; push again".into())
}

/// Longest a release waits for its rollout before it answers anyway.
const ROLLOUT_WAIT: std::time::Duration = std::time::Duration::from_secs(150);

/// Waits (bounded) until no ready instance of `spec`'s app runs an earlier spec and this
/// node's gateway has seen as much: the agents start new instances, hand them the old ones'
/// traffic and drain the old ones. False if the wait ended first.
async fn rolled_out(api: &Api, spec: &AppSpec, sink: &Sink) -> bool {
    let generation = spec.generation();
    let deadline = tokio::time::Instant::now() + ROLLOUT_WAIT;
    let mut told = None;
    let prefix = keys::app_instances(&spec.name);
    // The app's instance records, followed: each change is counted as it happens. A store
    // that does not answer says nothing; the follower asks again until the wait ends.
    let mut instances = Follower::new(api.store.clone(), prefix.clone());
    let mut records: BTreeMap<String, warden_core::InstanceRecord> = BTreeMap::new();
    loop {
        let update = tokio::select! {
            u = instances.next() => u,
            () = tokio::time::sleep_until(deadline) => None,
        };
        let revision = match update {
            Some(Update::Listed(listing)) => {
                records = listing
                    .entries
                    .iter()
                    .filter_map(|e| Some((e.key.clone(), serde_json::from_slice(&e.value).ok()?)))
                    .collect();
                listing.revision
            }
            Some(Update::Changes { events, revision }) => {
                for ev in events {
                    match ev.kind {
                        EventKind::Put(v) => match serde_json::from_slice(&v) {
                            Ok(r) => records.insert(ev.key, r),
                            Err(_) => records.remove(&ev.key),
                        },
                        EventKind::Delete => records.remove(&ev.key),
                    };
                }
                revision
            }
            None => {
                sink.line(&format!(
                    "-----> not rolled out within {} s: new requests go to this release, earlier instances still hand over; `warden status` follows it",
                    ROLLOUT_WAIT.as_secs()
                ));
                return false;
            }
        };
        let old = records
            .values()
            .filter(|r| r.state == warden_core::InstanceState::Ready && r.generation != generation)
            .count();
        if old == 0 {
            api.applied(&prefix, revision).await;
            sink.line("-----> rolled out: every ready instance runs this release");
            return true;
        }
        if told != Some(old) {
            sink.line(&format!(
                "-----> rolling out: {old} instance(s) of the earlier release still serving; they hand over without dropping a request"
            ));
            told = Some(old);
        }
    }
}

/// The app's spec running `release` of slug `built`, and the config vars it runs with: the
/// current spec (or a new app's defaults) with the release's command; a push keeps the app's
/// config vars as they are now (a `config set` during its build stays), a config change or a
/// rollback brings its own. A static site clears the command and is served from the slug; a
/// static directory an earlier static release set is dropped.
fn compose(
    builds: &dyn Builds,
    current: Option<AppSpec>,
    app: &str,
    release: &Release,
    built: &Built,
) -> Result<(AppSpec, BTreeMap<String, String>), String> {
    let mut spec = current.unwrap_or_else(|| AppSpec::new(app, Vec::new()));
    let earlier_static = spec
        .release
        .as_ref()
        .and_then(|r| builds.built(&r.slug))
        .map(|b| b.dir)
        .map(|d| d.display().to_string());
    if earlier_static.is_some() && spec.static_dir == earlier_static {
        spec.static_dir = None;
        spec.static_prefix = AppSpec::new(app, Vec::new()).static_prefix;
    }
    spec.release = Some(SpecRelease {
        number: release.number,
        slug: built.slug.clone(),
        archive: Some(built.archive.clone()),
    });
    spec.workdir = None;
    spec.command = built.command.clone();
    if !matches!(release.source, ReleaseSource::Push { .. }) {
        spec.env = release.config.clone();
    }
    if built.kind == BuildKind::Static {
        spec.static_dir = Some(built.dir.display().to_string());
        spec.static_prefix = "/".into();
        spec.desired.clear();
        spec.warm.clear();
    }
    spec.validate()
        .map_err(|e| format!("the release does not make a usable app: {e}"))?;
    let config = spec.env.clone();
    Ok((spec, config))
}

/// The config vars an app has now (its spec's environment), empty for a new app.
pub(crate) async fn config_of(api: &Api, app: &str) -> Result<BTreeMap<String, String>, ApiError> {
    Ok(get_json::<AppSpec>(&*api.store, &keys::app_spec(app))
        .await?
        .map(|(s, _)| s.env)
        .unwrap_or_default())
}

/// A new release record of `app` in state `building`.
pub(crate) fn fresh(
    app: &str,
    source: ReleaseSource,
    config: BTreeMap<String, String>,
    by: String,
) -> Release {
    Release {
        app: app.to_owned(),
        number: 0,
        source,
        slug: None,
        kind: None,
        command: Vec::new(),
        config,
        by,
        at_ms: now_ms(),
        status: ReleaseStatus::Building,
        error: None,
    }
}
