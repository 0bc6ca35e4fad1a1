//! An app's other process types (`worker:`, `clock:`, every Procfile line but `web` and
//! `release`), each run as a derived spec `apps/<app>~<type>/spec` that the agents, the
//! scheduler, the rollout and the drain treat as any app keyed by (app, label); the gateway
//! never routes to one. This module alone writes them, from the app's spec as it serves: the
//! release's slug, env, driver and limits, the type's command, and the counts per label that
//! `apps scale APP TYPE:LABEL=N` set (0 for a new type). The store has no multi-key
//! transaction, so they are written right after the app's spec switches, and again when a
//! release found `switched` at start resumes: writing them is idempotent.

use std::collections::BTreeMap;

use warden_core::builds::Builds;
use warden_core::{keys, process_app, split_process_app, AppSpec, ProcessOf};
use warden_store::{get_json, CasOutcome, StoreError};

use crate::Api;

/// The specs of app `app`'s process types: the keys that begin `apps/<app>~`, read without
/// reading every app's.
pub(crate) async fn of_app(api: &Api, app: &str) -> Result<Vec<AppSpec>, StoreError> {
    let listing = api
        .store
        .list_text_prefix(&keys::process_specs_start(app))
        .await?;
    let mut out = Vec::new();
    for e in &listing.entries {
        let Some(name) = keys::app_of_spec(&e.key) else {
            continue;
        };
        if split_process_app(name).is_some_and(|(parent, _)| parent == app) {
            if let Ok(spec) = serde_json::from_slice::<AppSpec>(&e.value) {
                out.push(spec);
            }
        }
    }
    Ok(out)
}

/// What a derived spec of `parent` running `command` for type `kind` is, keeping the counts of
/// `before` (its spec until now).
fn derive(parent: &AppSpec, kind: &str, command: Vec<String>, before: Option<&AppSpec>) -> AppSpec {
    let mut spec = AppSpec::new(process_app(&parent.name, kind), command);
    spec.env = parent.env.clone();
    spec.groups = parent.groups.clone();
    spec.start_timeout_ms = parent.start_timeout_ms;
    spec.driver = parent.driver;
    spec.limits = parent.limits;
    spec.network = parent.network;
    spec.io_uring = parent.io_uring;
    spec.max_instances = parent.max_instances;
    spec.data = parent.data;
    spec.release = parent.release.clone();
    spec.restarts = parent.restarts.clone();
    // Kept instances only: nothing starts one on a request, so idleness stops none.
    spec.idle_timeout_ms = 0;
    spec.desired = before.map(|b| b.desired.clone()).unwrap_or_default();
    spec.process = Some(ProcessOf {
        app: parent.name.clone(),
        kind: kind.to_owned(),
    });
    spec
}

/// Brings app `app`'s derived specs in line with its spec as it is now, if it still serves
/// release `expect` (the caller's; `None`: no release yet): else a newer write of the spec is
/// the one to sync, and this one returns, writing nothing stale. With `builds`, the types are
/// those of the slug the spec serves, read here from the spec just read: a type not among
/// them loses its spec (its instances drain), a new one gets a spec with no count. Without
/// (or a slug not on this node), the types there are stay and only take the app's env,
/// release and restarts (an env change, a restart). Returns each type's spec as written.
pub(crate) async fn sync(
    api: &Api,
    app: &str,
    expect: Option<u64>,
    builds: Option<&dyn Builds>,
) -> Result<Vec<AppSpec>, StoreError> {
    let Some((parent, _)) = get_json::<AppSpec>(&*api.store, &keys::app_spec(app)).await? else {
        return Ok(Vec::new());
    };
    if release_of(&parent) != expect {
        return Ok(Vec::new());
    }
    let types = builds
        .zip(parent.release.as_ref())
        .and_then(|(b, r)| b.built(&r.slug))
        .map(|b| b.processes);
    let existing = of_app(api, app).await?;
    let wanted: BTreeMap<String, Vec<String>> = match types {
        Some(t) => t,
        None => existing
            .iter()
            .filter_map(|s| Some((s.process.as_ref()?.kind.clone(), s.command.clone())))
            .collect(),
    };
    for gone in existing.iter().filter(|s| {
        s.process
            .as_ref()
            .is_none_or(|p| !wanted.contains_key(&p.kind))
    }) {
        api.store.delete(&keys::app_spec(&gone.name)).await?;
        tracing::info!(app, spec = %gone.name, "process type gone from the release: its instances drain");
    }
    let mut written = Vec::new();
    for (kind, command) in &wanted {
        written.push(write_one(api, &parent, kind, command).await?);
    }
    Ok(written)
}

/// The number of the release `spec` serves.
pub(crate) fn release_of(spec: &AppSpec) -> Option<u64> {
    spec.release.as_ref().map(|r| r.number)
}

/// Writes the derived spec of `kind` by compare-and-swap (`apps scale` may write its counts
/// meanwhile); an unchanged one is left alone.
async fn write_one(
    api: &Api,
    parent: &AppSpec,
    kind: &str,
    command: &[String],
) -> Result<AppSpec, StoreError> {
    let key = keys::app_spec(&process_app(&parent.name, kind));
    // Bounded: a scale keeps no write busy for long, but nothing here may spin.
    for _ in 0..8 {
        let before = get_json::<AppSpec>(&*api.store, &key).await?;
        let spec = derive(
            parent,
            kind,
            command.to_vec(),
            before.as_ref().map(|(s, _)| s),
        );
        if before.as_ref().is_some_and(|(s, _)| *s == spec) {
            return Ok(spec);
        }
        let bytes = serde_json::to_vec(&spec).map_err(|e| StoreError::Engine {
            op: "encode a process type's spec",
            reason: e.to_string(),
        })?;
        let before_bytes = match &before {
            Some((s, _)) => Some(serde_json::to_vec(s).map_err(|e| StoreError::Engine {
                op: "encode a process type's spec",
                reason: e.to_string(),
            })?),
            None => None,
        };
        match api
            .store
            .compare_and_swap(&key, before.map(|(_, r)| r), Some(bytes), None)
            .await?
        {
            CasOutcome::Done(rev) => {
                // `apps rm` may have removed the app (and swept its types) while this was
                // written: then nobody would see or remove this spec, and a later app of the
                // name would find it. Or a newer release switched meanwhile and its sync ran
                // first: this spec is the older release's. Either way, put back what was
                // there, unless something wrote over it since.
                let now = get_json::<AppSpec>(&*api.store, &keys::app_spec(&parent.name)).await?;
                let stale = match &now {
                    None => true,
                    Some((p, _)) => release_of(p) != release_of(parent),
                };
                if stale {
                    let back = match now {
                        None => None,
                        Some(_) => before_bytes,
                    };
                    api.store
                        .compare_and_swap(&key, Some(rev), back, None)
                        .await?;
                    tracing::info!(app = %parent.name, spec = %spec.name, "the app was removed or released again while its process type was written: taken back");
                }
                return Ok(spec);
            }
            CasOutcome::Conflict { .. } => continue,
        }
    }
    Err(StoreError::Engine {
        op: "write a process type's spec",
        reason: format!("{key} kept changing meanwhile; push or scale again"),
    })
}

/// Removes every derived spec whose app is gone, left by a crash between `apps rm`'s deletes
/// or a failed removal: nobody sees or removes one otherwise. Run at start; each is deleted
/// only as it was listed (compare-and-swap), so a spec rewritten meanwhile stays.
pub(crate) async fn sweep_orphans(api: &Api) -> Result<usize, StoreError> {
    let listing = api.store.list(keys::APPS).await?;
    let apps: std::collections::BTreeSet<&str> = listing
        .entries
        .iter()
        .filter_map(|e| keys::app_of_spec(&e.key))
        .filter(|n| split_process_app(n).is_none())
        .collect();
    let mut swept = 0;
    for e in &listing.entries {
        let Some((parent, _)) = keys::app_of_spec(&e.key).and_then(split_process_app) else {
            continue;
        };
        if apps.contains(parent) {
            continue;
        }
        if let CasOutcome::Done(_) = api
            .store
            .compare_and_swap(&e.key, Some(e.mod_revision), None, None)
            .await?
        {
            tracing::info!(spec = %e.key, "process type of a removed app swept");
            swept += 1;
        }
    }
    Ok(swept)
}

/// Removes every derived spec of app `app` (the app is being removed).
pub(crate) async fn remove_all(api: &Api, app: &str) -> Result<(), StoreError> {
    for spec in of_app(api, app).await? {
        api.store.delete(&keys::app_spec(&spec.name)).await?;
    }
    Ok(())
}

/// The push output's line for each process type: how many it keeps and how to change it.
pub(crate) fn summary(app: &str, specs: &[AppSpec]) -> Vec<String> {
    specs
        .iter()
        .filter_map(|s| {
            let kind = &s.process.as_ref()?.kind;
            let counts: Vec<String> = s.desired.iter().map(|(l, n)| format!("{l}={n}")).collect();
            Some(if counts.is_empty() {
                format!(
                    "-----> {kind}: 0 running; `warden apps scale {app} {kind}:LABEL=N` starts it"
                )
            } else {
                format!("-----> {kind}: kept at {}", counts.join(" "))
            })
        })
        .collect()
}
