//! `/v1/apps/{name}/releases`, `/config` and `/rollback`: pushes, config vars and rollbacks,
//! each a numbered release delivered by `crate::deliver`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
pub use warden_api_types::{ConfigChange, PushQuery, Rollback, UploadLimits};
use warden_core::builds::{BuildError, Builds, Built};
use warden_core::model::validate_env_var;
use warden_core::{keys, validate_name, BuildKind, Release, ReleaseSource, ReleaseStatus};
use warden_store::{decode, get_json};

pub use super::upload::limits;
pub(crate) use super::upload::{receive, too_large, Upload};
use crate::deliver::{self, Step};
use crate::error::{ApiError, ApiJson};
use crate::Api;

/// Longest `from` or `by` text kept in a release.
const MAX_NOTE: usize = 200;

/// `text` without control characters, at most [`MAX_NOTE`] characters: it is shown in
/// terminals and logs.
pub(crate) fn note(text: &str) -> String {
    text.chars()
        .filter(|c| !c.is_control())
        .take(MAX_NOTE)
        .collect()
}

fn builds(api: &Api) -> Result<Arc<dyn Builds>, ApiError> {
    api.builds.clone().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "this node runs the api role without the agent and is not part of a cluster, so nothing here can build a release; run `warden up` with the agent role too (the default roles), or on a cluster (--store etcd://...) that has an agent node",
        )
    })
}

/// Where this node's releases are made: here (`Ok(Some)`, it builds), on another node of the
/// cluster (`Ok(None)`), or nowhere (503).
fn maker(api: &Api) -> Result<Option<Arc<dyn Builds>>, ApiError> {
    match (&api.builds, &api.releases) {
        (Some(b), _) => Ok(Some(b.clone())),
        (None, Some(_)) => Ok(None),
        (None, None) => builds(api).map(Some),
    }
}

pub(crate) fn by(headers: &HeaderMap) -> String {
    note(
        headers
            .get("x-warden-by")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("unknown"),
    )
}

/// The kind a push asks for, if it names one warden builds.
pub(crate) fn kind(asked: Option<&str>) -> Result<Option<BuildKind>, ApiError> {
    match asked {
        None => Ok(None),
        Some(k) => Ok(Some(BuildKind::parse(k).ok_or_else(|| {
            ApiError::bad_request(format!(
                "kind {k:?} is not one warden builds; use one of {}",
                BuildKind::NAMES.join(", ")
            ))
        })?)),
    }
}

/// `POST /v1/apps/{name}/releases`: a gzip'd tar of the app's source. Answers 4xx before
/// anything runs for a bad name, kind or archive or an oversized upload; else streams the
/// build and the release's outcome. A node that builds nothing passes it to one that does.
pub async fn push(
    State(api): State<Api>,
    Path(name): Path<String>,
    Query(q): Query<PushQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    validate_name("app", &name).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let maker = maker(&api)?;
    let kind = kind(q.kind.as_deref())?;
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > api.max_upload) {
        return Err(too_large(api.max_upload));
    }
    // Checked before the upload is taken: a bad name refuses the push at once.
    let groups = groups(q.groups.as_deref())?;
    let (upload, digest) = receive(&api, body).await?;
    let Some(builds) = maker else {
        return super::forward::push(&api, name, q, by(&headers), upload.path.clone(), digest)
            .await;
    };
    let from = note(q.from.as_deref().unwrap_or("an upload"));
    push_received(
        api,
        builds,
        Pushed {
            name,
            kind,
            upload,
            digest,
            from,
            by: by(&headers),
            groups,
        },
    )
    .await
}

/// The groups a push asks the app to admit, from `a,b`: each a valid group name, at least
/// one.
pub(crate) fn groups(asked: Option<&str>) -> Result<Option<Vec<String>>, ApiError> {
    let Some(asked) = asked else { return Ok(None) };
    let mut groups: Vec<String> = asked
        .split(',')
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .map(str::to_owned)
        .collect();
    if groups.is_empty() {
        return Err(ApiError::bad_request(
            "groups names no group; leave it out to keep the app's groups as they are",
        ));
    }
    for g in &groups {
        validate_name("group", g).map_err(|e| ApiError::bad_request(e.to_string()))?;
    }
    groups.sort();
    groups.dedup();
    Ok(Some(groups))
}

/// A push whose upload is on this node's disk.
pub(crate) struct Pushed {
    pub(crate) name: String,
    pub(crate) kind: Option<BuildKind>,
    pub(crate) upload: Upload,
    pub(crate) digest: String,
    pub(crate) from: String,
    pub(crate) by: String,
    pub(crate) groups: Option<Vec<String>>,
}

/// Prepares the pushed source, records its release and delivers it on this node.
pub(crate) async fn push_received(
    api: Api,
    builds: Arc<dyn Builds>,
    p: Pushed,
) -> Result<Response, ApiError> {
    let Pushed {
        name,
        kind,
        upload,
        digest,
        from,
        by,
        groups,
    } = p;
    let prepared = builds.prepare(&name, &upload.path, &digest, kind).await;
    let mut prepared = prepared.map_err(|e| match e {
        BuildError::BadArchive(m) | BuildError::Detect(m) => ApiError::bad_request(m),
        BuildError::Failed(m) | BuildError::Node(m) => ApiError::internal(m),
    })?;
    let source = ReleaseSource::Push { digest, from };
    let recorded = async {
        let current = get_json::<warden_core::AppSpec>(&*api.store, &keys::app_spec(&name)).await?;
        let existed = current.is_some();
        // The build may start from the dependencies of what serves now: this app's own.
        prepared.previous = current
            .as_ref()
            .and_then(|(s, _)| s.release.as_ref())
            .map(|r| r.slug.clone());
        data_asked(&api, &name, current.as_ref().map(|(s, _)| s), prepared.data).await?;
        if !existed {
            super::awaiting::made_by_push(
                &api,
                &name,
                prepared.data.unwrap_or(false),
                groups.clone(),
            )
            .await?;
        }
        let config = current.map(|(s, _)| s.env).unwrap_or_default();
        let mut release = deliver::fresh(&api, &name, source, config, by, ReleaseStatus::Received);
        release.slug = Some(prepared.slug.clone());
        release.kind = Some(prepared.kind);
        release.command = prepared.command.clone();
        release.release_command = prepared.release.clone();
        release.upload = Some(upload.name());
        release.new_app = !existed;
        release.groups = groups.clone();
        release.data = prepared.data;
        let (release, revision) = deliver::record(&api, release).await?;
        Ok::<_, ApiError>(deliver::Delivery::new(release, revision, existed))
    }
    .await;
    let delivery = match recorded {
        Ok(d) => d,
        Err(e) => {
            // The unpacked tree waits for a build that will not come.
            if let Some(tree) = &prepared.tree {
                let _ = std::fs::remove_dir_all(tree);
            }
            return Err(e);
        }
    };
    // The release's record names the upload now: it is kept until the release is built or
    // failed, across a restart of the node.
    upload.keep();
    tracing::info!(app = %name, release = delivery.number(), "push received");
    Ok(deliver::start(api, builds, delivery, Step::Build(prepared)))
}

/// What the pushed tree's `app.toml` asks of the app's data (`asked`): a new app's database is
/// made now, before anything is built (refused, saying how to get one, without a data server);
/// an existing app must have the data it asks for, which is fixed when an app is made.
async fn data_asked(
    api: &Api,
    name: &str,
    current: Option<&warden_core::AppSpec>,
    asked: Option<bool>,
) -> Result<(), ApiError> {
    // An app awaiting its first release takes what that release asks, as a new one does.
    let current = current.filter(|s| !s.awaits_release() || s.data);
    match (current, asked) {
        (_, None) | (None, Some(false)) => Ok(()),
        (Some(spec), Some(want)) if spec.data != want => Err(ApiError::bad_request(
            super::apps::data_fixed(name, spec.data),
        )),
        (Some(_), Some(_)) => Ok(()),
        (None, Some(true)) => {
            let mut spec = warden_core::AppSpec::new(name, Vec::new());
            spec.data = true;
            super::apps::create_database(api, &spec).await
        }
    }
}

/// `GET /v1/apps/{name}/releases`: every release, newest last.
pub(crate) async fn list(
    State(api): State<Api>,
    axum::Extension(who): axum::Extension<crate::authz::Principal>,
    Path(name): Path<String>,
) -> Result<Json<Vec<Release>>, ApiError> {
    let listing = api.store.list(&keys::releases(&name)).await?;
    let releases = listing
        .entries
        .iter()
        .filter_map(|e| crate::routes::readable(decode::<Release>(&e.key, &e.value)))
        .map(|mut r: Release| {
            crate::authz::redact_env(&who, &name, &mut r.config);
            r
        })
        .collect();
    Ok(Json(releases))
}

/// The query of `GET /v1/apps/{name}/releases/{number}/log`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogQuery {
    /// Only the last this many bytes (a page shows the end of a long build).
    tail: Option<u64>,
}

/// `GET /v1/apps/{name}/releases/{number}/log`: the release's build and delivery output (bytes
/// that are not UTF-8 shown as U+FFFD), or its last `?tail=BYTES`.
pub async fn log(
    State(api): State<Api>,
    Path((name, number)): Path<(String, u64)>,
    Query(q): Query<LogQuery>,
) -> Result<Response, ApiError> {
    validate_name("app", &name).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let release = get_release(&api, &name, number).await?;
    let text = match api.builds {
        // A node that builds nothing keeps no log: the node that delivered the release does.
        None => deliver::cut_tail(super::forward::log(&api, &release).await?, q.tail),
        Some(_) => match deliver::log_path(&api, &name, release.number) {
            // Read by seeking, off the runtime's threads: a long build's log is megabytes.
            Some(p) => tokio::task::spawn_blocking(move || deliver::read_tail(&p, q.tail))
                .await
                .ok()
                .flatten()
                .unwrap_or_default(),
            None => String::new(),
        },
    };
    Ok((
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

pub(crate) async fn get_release(api: &Api, app: &str, number: u64) -> Result<Release, ApiError> {
    get_json::<Release>(&*api.store, &keys::release(app, number))
        .await?
        .map(|(r, _)| r)
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "app {app:?} has no release {number}; `warden releases {app}` lists them"
            ))
        })
}

/// `GET /v1/apps/{name}/config`: the app's config vars.
pub async fn config_show(
    State(api): State<Api>,
    Path(name): Path<String>,
) -> Result<Json<BTreeMap<String, String>>, ApiError> {
    get_json::<warden_core::AppSpec>(&*api.store, &keys::app_spec(&name))
        .await?
        .map(|(s, _)| Json(s.env))
        .ok_or_else(|| ApiError::no_app(&name))
}

/// The release the app runs now, as a slug to reuse.
async fn current_release(
    api: &Api,
    builds: &dyn Builds,
    app: &str,
) -> Result<(Release, Built), ApiError> {
    let spec = get_json::<warden_core::AppSpec>(&*api.store, &keys::app_spec(app))
        .await?
        .map(|(s, _)| s)
        .ok_or_else(|| ApiError::no_app(app))?;
    let Some(r) = spec.release else {
        return Err(ApiError::conflict(format!(
            "app {app:?} runs no release yet; push it first (`warden push {app} DIR`), or change its environment with `warden apps update {app} --env K=V`"
        )));
    };
    let release = get_release(api, app, r.number).await?;
    let built = reuse(builds, &release)?;
    Ok((release, built))
}

/// The built slug of `release`, to run it again.
fn reuse(builds: &dyn Builds, release: &Release) -> Result<Built, ApiError> {
    let (Some(slug), Some(kind)) = (&release.slug, release.kind) else {
        return Err(ApiError::conflict(format!(
            "release {} was never built",
            release.number
        )));
    };
    let built = builds.built(slug).ok_or_else(|| {
        ApiError::conflict(format!(
            "release {}'s slug is not on this node any more; push the app again",
            release.number
        ))
    })?;
    Ok(Built {
        kind,
        command: release.command.clone(),
        release: release.release_command.clone(),
        ..built
    })
}

/// `POST /v1/apps/{name}/config`: a release of the current slug with changed config vars.
pub async fn config_change(
    State(api): State<Api>,
    Path(name): Path<String>,
    headers: HeaderMap,
    ApiJson(change): ApiJson<ConfigChange>,
) -> Result<Response, ApiError> {
    validate_name("app", &name).map_err(|e| ApiError::bad_request(e.to_string()))?;
    if let Some(saved) = super::awaiting::config_before_release(&api, &name, &change).await? {
        return Ok(saved);
    }
    match maker(&api)? {
        Some(builds) => config_with(api, builds, name, change, by(&headers)).await,
        None => super::forward::config(&api, name, change, by(&headers)).await,
    }
}

/// A config change made on this node.
pub(crate) async fn config_with(
    api: Api,
    builds: Arc<dyn Builds>,
    name: String,
    change: ConfigChange,
    by: String,
) -> Result<Response, ApiError> {
    // The same rule as every other way an app's environment is set (`AppSpec::validate`).
    for (k, v) in &change.set {
        validate_env_var(k, v).map_err(|e| ApiError::bad_request(e.to_string()))?;
    }
    // Any key may be unset, so that one stored before this rule can be removed.
    if change.set.is_empty() && change.unset.is_empty() {
        return Err(ApiError::bad_request(
            "nothing to change: give vars to set or unset",
        ));
    }
    let (current, built) = current_release(&api, &*builds, &name).await?;
    let mut config = deliver::config_of(&api, &name).await?;
    let mut changed: Vec<String> = Vec::new();
    for k in &change.unset {
        if config.remove(k).is_some() {
            changed.push(k.clone());
        }
    }
    for (k, v) in change.set {
        if config.get(&k) != Some(&v) {
            changed.push(k.clone());
            config.insert(k, v);
        }
    }
    if changed.is_empty() {
        return Err(ApiError::bad_request(
            "the config already holds these values; nothing to release",
        ));
    }
    let source = ReleaseSource::Config { changed };
    rerelease(api, builds, &current, source, config, built, note(&by)).await
}

/// A new release of `of`'s slug and command with `config`, delivered.
async fn rerelease(
    api: Api,
    builds: Arc<dyn Builds>,
    of: &Release,
    source: ReleaseSource,
    config: BTreeMap<String, String>,
    built: Built,
    by: String,
) -> Result<Response, ApiError> {
    // Its slug is built already: it starts in phase `built`.
    let mut release = deliver::fresh(&api, &of.app, source, config, by, ReleaseStatus::Built);
    release.slug = of.slug.clone();
    release.kind = of.kind;
    release.command = of.command.clone();
    // Carried for the record (a later rollback to this one knows it), never run: the release
    // phase runs on pushes only.
    release.release_command = of.release_command.clone();
    let (release, revision) = deliver::record(&api, release).await?;
    let delivery = deliver::Delivery::new(release, revision, true);
    Ok(deliver::start(api, builds, delivery, Step::Try(built)))
}

/// `POST /v1/apps/{name}/rollback`: a release that runs an earlier one's slug and config.
pub async fn rollback(
    State(api): State<Api>,
    Path(name): Path<String>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<Rollback>,
) -> Result<Response, ApiError> {
    match maker(&api)? {
        Some(builds) => rollback_with(api, builds, name, body, by(&headers)).await,
        None => super::forward::rollback(&api, name, body, by(&headers)).await,
    }
}

/// A rollback made on this node.
pub(crate) async fn rollback_with(
    api: Api,
    builds: Arc<dyn Builds>,
    name: String,
    body: Rollback,
    by: String,
) -> Result<Response, ApiError> {
    let spec = get_json::<warden_core::AppSpec>(&*api.store, &keys::app_spec(&name))
        .await?
        .map(|(s, _)| s)
        .ok_or_else(|| ApiError::no_app(&name))?;
    let current = spec.release.as_ref().map(|r| r.number);
    if let Some(expect) = body.expect {
        if current != Some(expect) {
            let now = current.map_or("no release".to_owned(), |n| format!("release {n}"));
            return Err(ApiError::conflict(format!(
                "app {name:?} now serves {now}, not release {expect} as asked; look again \
                 (`warden releases {name}`) and roll back from what serves now"
            )));
        }
    }
    let target = match body.to {
        Some(n) => get_release(&api, &name, n).await?,
        None => {
            let listing = api.store.list(&keys::releases(&name)).await?;
            let released: Vec<Release> = listing
                .entries
                .iter()
                .filter_map(|e| decode::<Release>(&e.key, &e.value).ok())
                .filter(|r| r.status == ReleaseStatus::Released && Some(r.number) < current)
                .collect();
            released.into_iter().last().ok_or_else(|| {
                ApiError::conflict(format!(
                    "app {name:?} has no earlier release that served; `warden releases {name}` lists them"
                ))
            })?
        }
    };
    if target.status != ReleaseStatus::Released {
        return Err(ApiError::conflict(format!(
            "release {} never served (it is {:?}); roll back to one that did",
            target.number, target.status
        )));
    }
    let built = reuse(&*builds, &target)?;
    let source = ReleaseSource::Rollback { to: target.number };
    let config = target.config.clone();
    rerelease(api, builds, &target, source, config, built, note(&by)).await
}
