//! `/v1/instances`: list, start and kill app instances.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use std::sync::Arc;

pub use warden_api_types::{
    AppLogEntry, AppLogsQuery, LogsQuery, RouterLine, RouterLines, RouterLinesQuery, StartRequest,
};
use warden_core::{keys, AppSpec, InstanceAdmin, InstanceError, InstanceRecord, Owner};
use warden_store::decode;

use crate::error::{ApiError, ApiJson};
use crate::Api;

/// Every instance the store records, and this process's agent's own. An instance of the agent
/// shows the agent's own record: the store's follows it behind a request (a start a request
/// waits for, and an instance that just became ready, are written after that request is on its
/// way), and an operator who just reached an app must see its instance as it is.
pub(crate) async fn all(api: &Api) -> Result<Vec<InstanceRecord>, ApiError> {
    let listing = api.store.list(keys::INSTANCES).await?;
    let mut all = listing
        .entries
        .iter()
        .map(|e| decode::<InstanceRecord>(&e.key, &e.value))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(agent) = &api.instances {
        for r in &mut all {
            let same = |own: &InstanceRecord| own.app == r.app && own.node == r.node;
            if let Some(own) = agent.record(&r.id).filter(same) {
                *r = own;
            }
        }
        let listed: std::collections::HashSet<String> = all.iter().map(|r| r.id.clone()).collect();
        let unlisted: Vec<_> = agent
            .own_records()
            .into_iter()
            .filter(|r| !listed.contains(&r.id))
            .collect();
        all.extend(unlisted);
    }
    Ok(all)
}

/// `GET /v1/instances`
pub async fn list(State(api): State<Api>) -> Result<Json<Vec<InstanceRecord>>, ApiError> {
    all(&api).await.map(Json)
}

/// The instances source of this process, or why there is none.
fn source(api: &Api) -> Result<&Arc<dyn InstanceAdmin>, ApiError> {
    api.instances.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no agent runs in this process; start warden with the agent role (warden up --roles …,agent)",
        )
    })
}

/// `POST /v1/instances`: the ready instance for app and label, started if none runs.
pub async fn start(
    State(api): State<Api>,
    ApiJson(req): ApiJson<StartRequest>,
) -> Result<(StatusCode, Json<InstanceRecord>), ApiError> {
    // A process type's spec is no app: its counts start its instances (`apps scale`).
    let Some((spec, _)) = warden_store::get_json::<AppSpec>(&*api.store, &keys::app_spec(&req.app))
        .await?
        .filter(|(s, _)| s.process.is_none())
    else {
        return Err(ApiError::no_app(&req.app));
    };
    let lattice = crate::routes::lattice::current(&api).await?;
    let label = lattice
        .canonical(&req.label)
        .map_err(|e| ApiError::bad_request(format!("label: {e}")))?;
    match source(&api)?.ensure(&spec, &label, &Owner::Shared).await {
        Ok(r) => Ok((StatusCode::CREATED, Json(r))),
        Err(InstanceError::UnknownApp(a)) => Err(ApiError::no_app(&a)),
        Err(e @ (InstanceError::StartFailed { .. } | InstanceError::StartTimeout { .. })) => {
            Err(ApiError::new(StatusCode::BAD_GATEWAY, e.to_string()))
        }
        Err(e) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            e.to_string(),
        )),
    }
}

/// `GET /v1/instances/{id}/logs?lines=N`: the last lines an instance of this node printed.
pub async fn logs(
    State(api): State<Api>,
    Path(id): Path<String>,
    axum::extract::Query(q): axum::extract::Query<LogsQuery>,
) -> Result<String, ApiError> {
    let lines = q.lines.unwrap_or(100).min(10_000);
    source(&api)?.logs(&id, lines).map_err(|_| {
        ApiError::not_found(format!(
            "no logs of instance {id:?} on this node; it never ran here or exited long ago"
        ))
    })
}

/// `DELETE /v1/instances/{id}`
pub async fn kill(State(api): State<Api>, Path(id): Path<String>) -> Result<StatusCode, ApiError> {
    match source(&api)?.kill(&id).await {
        Ok(()) => Ok(StatusCode::NO_CONTENT),
        Err(InstanceError::UnknownInstance(_)) => Err(ApiError::not_found(format!(
            "no instance {id:?} runs on this node; `warden instances list` shows the running ones"
        ))),
        Err(e) => Err(ApiError::internal(e)),
    }
}

/// `GET /v1/apps/{name}/logs`: the app's last `lines` lines in all, with each instance's label
/// and release: instances ordered by their log's last write, the newest lines taken from the
/// last written first (app output carries no time of its own, so this is the order there is).
/// Instances on other nodes are listed with an empty text and a note: their lines are on their
/// node.
pub async fn app_logs(
    State(api): State<Api>,
    Path(name): Path<String>,
    axum::extract::Query(q): axum::extract::Query<AppLogsQuery>,
) -> Result<Json<Vec<AppLogEntry>>, ApiError> {
    if warden_store::get_json::<AppSpec>(&*api.store, &keys::app_spec(&name))
        .await?
        .is_none()
    {
        return Err(ApiError::no_app(&name));
    }
    let lines = q.lines.unwrap_or(100).min(10_000);
    let mut out = Vec::new();
    let mut written = Vec::new();
    for r in all(&api).await? {
        // Its process types' instances too (`worker`): their app field names the type.
        let wanted = (r.app == name
            || warden_core::split_process_app(&r.app).is_some_and(|(app, _)| app == name))
            && q.release.is_none_or(|n| r.release == Some(n))
            && q.label.as_ref().is_none_or(|l| &r.label == l)
            && q.instance.as_ref().is_none_or(|i| &r.id == i);
        if !wanted {
            continue;
        }
        written.push(api.instances.as_ref().and_then(|s| s.log_written(&r.id)));
        let (text, note) = match api.instances.as_ref().map(|s| s.logs(&r.id, lines)) {
            Some(Ok(t)) => (t, None),
            _ => (
                String::new(),
                Some(format!(
                    "its lines are on node {}; ask that node's API",
                    r.node
                )),
            ),
        };
        out.push(AppLogEntry {
            instance: r.id,
            label: r.label,
            release: r.release,
            node: r.node,
            state: r.state,
            text,
            note,
        });
    }
    Ok(Json(newest(out, written, lines)))
}

/// `entries` ordered by when their log was last `written` (never: first), each text cut so
/// that the newest `total` lines remain in all.
fn newest(
    entries: Vec<AppLogEntry>,
    written: Vec<Option<std::time::SystemTime>>,
    total: usize,
) -> Vec<AppLogEntry> {
    let mut entries: Vec<_> = written.into_iter().zip(entries).collect();
    entries.sort_by_key(|(w, _)| *w);
    let mut left = total;
    for (_, e) in entries.iter_mut().rev() {
        let lines: Vec<&str> = e.text.lines().collect();
        let keep = lines.len().min(left);
        left -= keep;
        if keep < lines.len() {
            let mut text = lines[lines.len() - keep..].join("\n");
            if keep > 0 {
                text.push('\n');
            }
            e.text = text;
        }
    }
    entries.into_iter().map(|(_, e)| e).collect()
}

/// `GET /v1/apps/{name}/requests`: the newest request lines of the app that this node's
/// gateway served, with a note where lines are elsewhere (no gateway here, other nodes).
pub async fn router_lines(
    State(api): State<Api>,
    Path(name): Path<String>,
    axum::extract::Query(q): axum::extract::Query<RouterLinesQuery>,
) -> Result<Json<RouterLines>, ApiError> {
    if warden_store::get_json::<AppSpec>(&*api.store, &keys::app_spec(&name))
        .await?
        .is_none()
    {
        return Err(ApiError::no_app(&name));
    }
    let lines = q.lines.unwrap_or(100).min(10_000);
    let Some(log) = &api.requests else {
        return Ok(Json(RouterLines {
            lines: Vec::new(),
            note: Some(
                "no gateway runs in this process, so it keeps no request lines; ask the API of a node that runs the gateway role"
                    .into(),
            ),
        }));
    };
    let kept = log.recent(&name, lines);
    let nodes = api.store.list(keys::NODES).await?.entries.len();
    let elsewhere = (nodes > 1).then(|| {
        format!("this node's gateway only: the {} other nodes' gateways keep the requests they served; ask their APIs", nodes - 1)
    });
    let note = match (kept.note, elsewhere) {
        (Some(a), Some(b)) => Some(format!("{a}; {b}")),
        (a, b) => a.or(b),
    };
    let lines = kept
        .lines
        .into_iter()
        .map(|l| RouterLine {
            at: warden_core::requests::rfc3339_ms(l.at_ms),
            method: l.method,
            path: l.path,
            status: l.status,
            duration_ms: l.duration_ms,
            instance: l.instance,
            label: l.label,
        })
        .collect();
    Ok(Json(RouterLines { lines, note }))
}
