//! `/v1/apps`: register, list, show and remove apps.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Extension;
use axum::Json;
use warden_core::{keys, AppSpec};
use warden_store::{decode, CasOutcome};

pub use warden_api_types::Scale;

use crate::authz::Principal;
use crate::error::{ApiError, ApiJson};
use crate::Api;

/// Refuses a static directory that is warden's data directory, holds it, or lies inside it:
/// its files (the admin token, keys, the store, other apps' data) would be served to users.
/// Symlinks are followed as far as the paths exist.
fn check_static_dir(api: &Api, dir: &str) -> Result<(), ApiError> {
    let Some(data) = &api.data_dir else {
        return Ok(());
    };
    let resolve = |p: &std::path::Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned());
    let (dir, data) = (resolve(std::path::Path::new(dir)), resolve(data));
    if data.starts_with(&dir) || dir.starts_with(&data) {
        return Err(ApiError::bad_request(format!(
            "static_dir {} would serve warden's data directory {} (or part of it) to users; choose a directory outside it",
            dir.display(),
            data.display()
        )));
    }
    Ok(())
}

/// Whether `dir` is the slug of the static site `spec` runs as its release: built by warden
/// under its data directory, and served on purpose.
fn is_release_site(api: &Api, spec: &AppSpec, dir: &str) -> bool {
    let (Some(builds), Some(r)) = (&api.builds, &spec.release) else {
        return false;
    };
    builds
        .built(&r.slug)
        .is_some_and(|b| b.dir.display().to_string() == dir)
}

/// Writes `spec`'s desired and warm counts under the lattice's canonical labels: instances
/// carry canonical labels, and a count under another spelling would never see its instances
/// and start them forever.
async fn canonical_counts(api: &Api, spec: &mut AppSpec) -> Result<(), ApiError> {
    if spec.desired.is_empty() && spec.warm.is_empty() {
        return Ok(());
    }
    let lattice = crate::routes::lattice::current(api).await?;
    for (what, counts) in [("desired", &mut spec.desired), ("warm", &mut spec.warm)] {
        let mut canonical = std::collections::BTreeMap::new();
        for (label, n) in counts.iter() {
            let c = lattice
                .canonical(label)
                .map_err(|e| ApiError::bad_request(format!("{what} label {label:?}: {e}")))?;
            canonical.insert(c, *n);
        }
        *counts = canonical;
    }
    Ok(())
}

/// `GET /v1/apps`: every app whose record reads; a damaged one is left out (`GET /v1/status`
/// lists it) rather than hiding every other.
pub(crate) async fn list(
    State(api): State<Api>,
    Extension(who): Extension<Principal>,
) -> Result<Json<Vec<AppSpec>>, ApiError> {
    let listing = api.store.list(keys::APPS).await?;
    let apps = listing
        .entries
        .iter()
        .filter(|e| e.key.ends_with("/spec"))
        .filter_map(|e| crate::routes::readable(decode::<AppSpec>(&e.key, &e.value)))
        // A process type is its app's, shown under it (`GET /v1/apps/{name}/ps`).
        .filter(|s: &AppSpec| s.process.is_none())
        .map(|mut s: AppSpec| {
            crate::authz::redact_env(&who, &s.name.clone(), &mut s.env);
            s
        })
        .collect();
    Ok(Json(apps))
}

/// Makes the database of an app with `data`, or says how to get a data server. Before the
/// spec is stored: an app whose instances would find no database is never written.
pub(crate) async fn create_database(api: &Api, spec: &AppSpec) -> Result<(), ApiError> {
    let Some(data) = &api.data else {
        return Err(ApiError::bad_request(
            "this warden has no data server, so no app can have data: install PostgreSQL's \
             server programs (Debian and Ubuntu: apt-get install postgresql) and restart \
             warden, or start it with --data postgres://ADMIN@HOST/DB",
        ));
    };
    if spec.start != warden_core::StartPath::Jit {
        return Err(ApiError::bad_request(
            "an app with data starts its instances jit (each gets a socket logged in as its \
             label's role when it starts); leave `start` out",
        ));
    }
    data.create_app(&spec.name).await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot make the app's database: {e}"),
        )
    })
}

/// `POST /v1/apps`
pub async fn create(
    State(api): State<Api>,
    ApiJson(mut spec): ApiJson<AppSpec>,
) -> Result<(StatusCode, Json<AppSpec>), ApiError> {
    spec.validate()
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    if spec.release.is_some() {
        return Err(ApiError::bad_request(
            "an app's release is made by `warden push` (POST /v1/apps/NAME/releases); leave it out",
        ));
    }
    if !spec.restarts.is_none() {
        return Err(ApiError::bad_request(
            "an app's restarts are counted by `warden apps restart` (POST /v1/apps/NAME/restart); leave them out",
        ));
    }
    // A process type's spec is derived from its app's Procfile by a push, never written by
    // hand: else one could attach code of its own under another app's name.
    if spec.process.is_some() {
        return Err(ApiError::bad_request(PROCESS_BY_PUSH));
    }
    if let Some(dir) = &spec.static_dir {
        check_static_dir(&api, dir)?;
    }
    canonical_counts(&api, &mut spec).await?;
    crate::routes::data::check_mark(&api, &mut spec).await?;
    if spec.data {
        create_database(&api, &spec).await?;
    }
    let _marking = match spec.data {
        true => Some(crate::routes::data::lock().await),
        false => None,
    };
    // A process type left by an earlier app of the name (a crash mid-`apps rm`, a failed
    // removal) must not be adopted by this one: it would run the old code against this app's
    // database. Removed only when no app holds the name, before the new one is written.
    if warden_store::get_json::<AppSpec>(&*api.store, &keys::app_spec(&spec.name))
        .await?
        .is_some()
    {
        return Err(already_exists(&spec.name));
    }
    crate::deliver::processes::remove_all(&api, &spec.name).await?;
    let bytes = serde_json::to_vec(&spec).map_err(ApiError::internal)?;
    match api
        .store
        .compare_and_swap(&keys::app_spec(&spec.name), None, Some(bytes), None)
        .await?
    {
        CasOutcome::Done(rev) => {
            // Also without a mark: a database left by an earlier app of the name keeps none.
            if spec.data {
                crate::routes::data::apply_mark(&api, &spec, rev, None).await?;
            }
            api.applied(&keys::app_spec(&spec.name), rev).await;
            tracing::info!(app = %spec.name, "app created");
            Ok((StatusCode::CREATED, Json(spec)))
        }
        CasOutcome::Conflict { .. } => Err(already_exists(&spec.name)),
    }
}

/// What `create` answers when `name` is taken.
fn already_exists(name: &str) -> ApiError {
    ApiError::conflict(format!(
        "app {name:?} already exists; remove it first with `warden apps rm {name}`"
    ))
}

/// Why a spec naming a process type (`process`) is refused.
const PROCESS_BY_PUSH: &str = "`process` is set only on a process type's spec, which a push derives from the Procfile; leave it out and add a line to the Procfile instead";

/// `GET /v1/apps/{name}`
pub(crate) async fn show(
    State(api): State<Api>,
    Extension(who): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Json<AppSpec>, ApiError> {
    let mut spec = warden_store::get_json::<AppSpec>(&*api.store, &keys::app_spec(&name))
        .await?
        .map(|(s, _)| s)
        .ok_or_else(|| ApiError::no_app(&name))?;
    crate::authz::redact_env(&who, &name, &mut spec.env);
    Ok(Json(spec))
}

/// `DELETE /v1/apps/{name}`: agents stop the app's instances when they see the delete.
pub async fn remove(
    State(api): State<Api>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let had_data = warden_store::get_json::<AppSpec>(&*api.store, &keys::app_spec(&name))
        .await
        .ok()
        .flatten()
        .is_some_and(|(s, _)| s.data);
    // Its git repository goes with it, under the push lock (refused while a push builds).
    let git = super::git_repo::Removal::begin(&api, &name)?;
    match api.store.delete(&keys::app_spec(&name)).await? {
        Some(rev) => {
            git.finish();
            // Its database goes with it (backups are `pg_dump`'s): a later app of the name
            // must not read this one's rows.
            if let (true, Some(data)) = (had_data, &api.data) {
                if let Err(e) = data.drop_app(&name).await {
                    tracing::warn!(app = %name, error = %e, "dropping the removed app's database failed");
                }
            }
            api.applied(&keys::app_spec(&name), rev).await;
            // Its process types go with it (their instances stop as the app's do).
            if let Err(e) = crate::deliver::processes::remove_all(&api, &name).await {
                tracing::warn!(app = %name, error = %e, "removing the removed app's process types failed");
            }
            // Its releases go with it: an app made later under the name starts at release 1
            // and can never roll back to this one's code or config vars.
            if let Ok(listing) = api.store.list(&keys::releases(&name)).await {
                for e in listing.entries {
                    let _ = api.store.delete(&e.key).await;
                }
            }
            // And their logs on this node: release 1 of a later app of the name would append
            // to this one's. (`name` is an app's name: it was stored, so it passed the rule.)
            if let Some(dir) = &api.data_dir {
                let _ = std::fs::remove_dir_all(dir.join("releases").join(&name));
            }
            tracing::info!(app = %name, "app removed");
            Ok(StatusCode::NO_CONTENT)
        }
        None => Err(ApiError::no_app(&name)),
    }
}

/// RFC 7396 JSON merge patch: `patch`'s members replace `target`'s, objects merge member by
/// member, and `null` removes.
fn merge_patch(target: &mut serde_json::Value, patch: &serde_json::Value) {
    use serde_json::Value;
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(serde_json::Map::new());
    }
    let t = target.as_object_mut().expect("made an object above");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// `PATCH /v1/apps/{name}`: changes an app with a JSON merge patch of its spec (RFC 7396:
/// `{"env": {"GREETING": "hi", "OLD": null}, "hosts": ["a.example"]}`). What instances run
/// (command, environment, limits, driver, network, working directory) rolls out with no failed
/// request: each instance is replaced by one of the new spec, which must be ready first; the
/// rest (hosts, groups, counts, static files, timeouts) takes effect at once.
pub async fn update(
    State(api): State<Api>,
    Path(name): Path<String>,
    ApiJson(patch): ApiJson<serde_json::Value>,
) -> Result<Json<AppSpec>, ApiError> {
    if !patch.is_object() {
        return Err(ApiError::bad_request(
            "the body must be a JSON object of the spec's fields to change (a merge patch)",
        ));
    }
    if patch
        .get("name")
        .is_some_and(|n| n.as_str() != Some(name.as_str()))
    {
        return Err(ApiError::bad_request(
            "an app cannot be renamed; create one under the new name and remove this one",
        ));
    }
    if patch.get("restarts").is_some() {
        return Err(ApiError::bad_request(
            "an app's restarts change only through `warden apps restart` (POST /v1/apps/NAME/restart); leave them out",
        ));
    }
    if patch.get("process").is_some() {
        return Err(ApiError::bad_request(PROCESS_BY_PUSH));
    }
    if patch.get("release").is_some() {
        return Err(ApiError::bad_request(
            "an app's release changes only through `warden push`, `warden config` and `warden rollback`",
        ));
    }
    let patch = canonical_patch_counts(&api, patch).await?;
    let key = keys::app_spec(&name);
    let _marking = match patch.get("declassify_to") {
        Some(_) => Some(crate::routes::data::lock().await),
        None => None,
    };
    for _ in 0..8 {
        let Some((spec, rev)) = warden_store::get_json::<AppSpec>(&*api.store, &key).await? else {
            return Err(ApiError::no_app(&name));
        };
        let mut value = serde_json::to_value(&spec).map_err(ApiError::internal)?;
        merge_patch(&mut value, &patch);
        let mut next: AppSpec = serde_path_to_error::deserialize(value)
            .map_err(|e| ApiError::bad_request(format!("the patched spec does not read: {e}")))?;
        next.validate()
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        data_unchanged(&spec, &next)?;
        let marks = next.declassify_to != spec.declassify_to;
        if marks {
            crate::routes::data::check_mark(&api, &mut next).await?;
        }
        if let Some(dir) = &next.static_dir {
            if !is_release_site(&api, &next, dir) {
                check_static_dir(&api, dir)?;
            }
        }
        canonical_counts(&api, &mut next).await?;
        let bytes = serde_json::to_vec(&next).map_err(ApiError::internal)?;
        if let CasOutcome::Done(rev) = api
            .store
            .compare_and_swap(&key, Some(rev), Some(bytes), None)
            .await?
        {
            if marks && next.declassify_to != spec.declassify_to {
                crate::routes::data::apply_mark(&api, &next, rev, Some(&spec)).await?;
            }
            api.applied(&key, rev).await;
            // Its process types run with its env, driver and limits.
            if let Err(e) = crate::deliver::processes::sync(
                &api,
                &name,
                crate::deliver::processes::release_of(&next),
                None,
            )
            .await
            {
                tracing::warn!(app = %name, error = %e, "updating the app's process types failed");
            }
            let rolls = next.generation("") != spec.generation("");
            tracing::info!(app = %name, rolls, "app updated");
            return Ok(Json(next));
        }
    }
    Err(ApiError::conflict(format!(
        "app {name:?} kept changing while it was updated; try again"
    )))
}

/// Why a push whose `app.toml` says `data = <not has>` is refused for app `app`.
pub(crate) fn data_fixed(app: &str, has: bool) -> String {
    let (is, asked) = match has {
        true => ("has data", "false"),
        false => ("has no data", "true"),
    };
    format!(
        "an app's data is fixed when it is made: app {app:?} {is}, and this push's app.toml says `data = {asked}`; change app.toml, or push to a new app name (and remove this app, which drops its database)"
    )
}

/// Refuses a patch that would give an app data it has no database for, take it away from
/// instances that hold a database's socket, or start a data app's instances other than jit:
/// an app's data is decided when it is made (`create_database`) and removed with it.
fn data_unchanged(before: &AppSpec, after: &AppSpec) -> Result<(), ApiError> {
    if before.data != after.data {
        return Err(ApiError::bad_request(
            "whether an app has data is chosen when it is created: create an app with \
             `--data` (its database is made then) and remove this one (which drops its database)",
        ));
    }
    if after.data && after.start != warden_core::StartPath::Jit {
        return Err(ApiError::bad_request(
            "an app with data starts its instances jit (each gets a socket logged in as its \
             label's role when it starts); leave `start` as it is",
        ));
    }
    Ok(())
}

/// A patch's `desired` and `warm` keys under the lattice's canonical labels, so that they
/// meet the stored ones (which are canonical) in the merge; two spellings of one label are
/// refused.
async fn canonical_patch_counts(
    api: &Api,
    mut patch: serde_json::Value,
) -> Result<serde_json::Value, ApiError> {
    for what in ["desired", "warm"] {
        let Some(counts) = patch.get(what).and_then(|c| c.as_object()).cloned() else {
            continue;
        };
        let lattice = crate::routes::lattice::current(api).await?;
        let mut canonical = serde_json::Map::new();
        for (label, n) in counts {
            let c = lattice
                .canonical(&label)
                .map_err(|e| ApiError::bad_request(format!("{what} label {label:?}: {e}")))?;
            if canonical.insert(c.clone(), n).is_some() {
                return Err(ApiError::bad_request(format!(
                    "{what} names the label {c:?} twice, in two spellings"
                )));
            }
        }
        patch[what] = serde_json::Value::Object(canonical);
    }
    Ok(patch)
}

/// `POST /v1/apps/{name}/scale`: sets how many instances of each named label the cluster
/// keeps running, across nodes.
pub async fn scale(
    State(api): State<Api>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<Scale>,
) -> Result<Json<AppSpec>, ApiError> {
    let lattice = crate::routes::lattice::current(&api).await?;
    let mut counts = std::collections::BTreeMap::new();
    for (label, n) in &body.desired {
        let c = lattice
            .canonical(label)
            .map_err(|e| ApiError::bad_request(format!("label {label:?}: {e}")))?;
        counts.insert(c, *n);
    }
    let key = match body.process.as_deref() {
        None | Some("web") => keys::app_spec(&name),
        Some(kind) => process_key(&api, &name, kind).await?,
    };
    // Another writer may change the spec meanwhile: read, change, compare-and-swap, again.
    for _ in 0..8 {
        let Some((mut spec, rev)) = warden_store::get_json::<AppSpec>(&*api.store, &key).await?
        else {
            return Err(ApiError::no_app(&name));
        };
        for (label, n) in &counts {
            if *n == 0 {
                spec.desired.remove(label);
            } else {
                spec.desired.insert(label.clone(), *n);
            }
        }
        spec.validate()
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        let bytes = serde_json::to_vec(&spec).map_err(ApiError::internal)?;
        if let CasOutcome::Done(rev) = api
            .store
            .compare_and_swap(&key, Some(rev), Some(bytes), None)
            .await?
        {
            api.applied(&key, rev).await;
            tracing::info!(app = %name, desired = ?spec.desired, "app scaled");
            return Ok(Json(spec));
        }
    }
    Err(ApiError::conflict(format!(
        "app {name:?} kept changing while it was scaled; try again"
    )))
}

/// The key of process type `kind`'s spec of app `app`, or why there is none.
async fn process_key(api: &Api, app: &str, kind: &str) -> Result<String, ApiError> {
    // Checked before it goes into a key: a `/` or `~` would name another record.
    warden_core::validate_process_type(kind).map_err(|e| ApiError::bad_request(e.to_string()))?;
    if warden_store::get_json::<AppSpec>(&*api.store, &keys::app_spec(app))
        .await?
        .is_none()
    {
        return Err(ApiError::no_app(app));
    }
    let key = keys::app_spec(&warden_core::process_app(app, kind));
    if warden_store::get_json::<AppSpec>(&*api.store, &key)
        .await?
        .is_some()
    {
        return Ok(key);
    }
    let types: Vec<String> = crate::deliver::processes::of_app(api, app)
        .await?
        .into_iter()
        .filter_map(|s| s.process.map(|p| p.kind))
        .collect();
    Err(ApiError::new(
        StatusCode::NOT_FOUND,
        format!(
            "app {app:?} has no process type {kind:?} in the release it serves (its Procfile's other types: {}); add a `{kind}:` line to the Procfile and push",
            if types.is_empty() { "none".to_owned() } else { types.join(", ") }
        ),
    ))
}
