//! `POST /v1/apps/{name}/run` (`warden run`): a command run once as a fresh process of the
//! app's current release, at a label, attached to the caller over the upgraded connection.
//!
//! Everything that can be refused is refused before the upgrade, as the API's usual JSON
//! errors: no app, no release yet, a label the lattice lacks or that disagrees with `user`'s
//! clearance, an unknown user, no agent on this node. Then the process is started through the
//! `Builds` seam (the agent: the app's driver, so sandboxed where the app is) and the answer
//! is `101 Switching Protocols`; from then on frames carry stdin in and stdout, stderr and the
//! exit out (`warden_api_types::run`). The connection's end kills the process. The label and
//! user are in the query string, so the audit's `change` record names them.

use axum::body::Body;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::response::Response;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use warden_api_types::run::{decode_input, encode_output, UPGRADE};
use warden_api_types::{RunQuery, RunRequest};
use warden_core::oneoff::{OneOff, OneOffError, Output};
use warden_core::{keys, AppSpec, UserRecord};

use crate::authz::Principal;
use crate::error::ApiError;
use crate::Api;

/// Largest request body: the command line.
const MAX_BODY: usize = 64 * 1024;

/// One-off commands of one app running at once on this node. A one-off holds a sandbox (up to
/// the app's limits) for as long as its client stays, and counts against no instance limit, so
/// without a bound a deployer could fill the node.
const PER_APP: usize = 4;

/// One-off commands of all apps running at once on this node.
const PER_NODE: usize = 16;

/// The one-off commands running on this node, per app.
#[derive(Default)]
pub(crate) struct Running(Mutex<HashMap<String, usize>>);

/// A place among the running one-offs, given back when dropped (the command ended or its
/// client went).
struct Place {
    running: Arc<Running>,
    app: String,
}

impl Running {
    fn take(self: &Arc<Self>, app: &str) -> Result<Place, ApiError> {
        let mut by_app = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let total: usize = by_app.values().sum();
        let mine = by_app.get(app).copied().unwrap_or(0);
        if mine >= PER_APP || total >= PER_NODE {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "{} one-off commands already run (at most {PER_APP} of an app and {PER_NODE} on a node at once); end one, or wait for one to end",
                    if mine >= PER_APP { mine } else { total }
                ),
            ));
        }
        *by_app.entry(app.to_owned()).or_default() += 1;
        Ok(Place {
            running: self.clone(),
            app: app.to_owned(),
        })
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut by_app = self
            .running
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = by_app.get_mut(&self.app) {
            *n -= 1;
            if *n == 0 {
                by_app.remove(&self.app);
            }
        }
    }
}

/// `POST /v1/apps/{name}/run`
pub async fn run(
    State(api): State<Api>,
    Path(name): Path<String>,
    Query(query): Query<RunQuery>,
    req: Request,
) -> Result<Response, ApiError> {
    let (mut parts, body) = req.into_parts();
    let wants_upgrade = parts
        .headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case(UPGRADE));
    if !wants_upgrade {
        return Err(ApiError::bad_request(format!(
            "POST /v1/apps/{name}/run needs `Connection: upgrade` and `Upgrade: {UPGRADE}`: the command's input and output travel over the upgraded connection (use `warden run`)"
        )));
    }
    let bytes = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|e| ApiError::bad_request(format!("cannot read the request body: {e}")))?;
    let body: RunRequest = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("the body is not a run request: {e}")))?;
    if body.command.is_empty() {
        return Err(ApiError::bad_request(
            "no command to run; name it after `--`: warden run APP -- CMD ARGS…",
        ));
    }
    let Some(builds) = api.builds.clone() else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            OneOffError::NoAgent.to_string(),
        ));
    };
    let spec = warden_store::get_json::<AppSpec>(&*api.store, &keys::app_spec(&name))
        .await?
        .map(|(s, _)| s)
        .ok_or_else(|| ApiError::no_app(&name))?;
    if spec.release.is_none() {
        return Err(ApiError::conflict(format!(
            "app {name:?} has no release yet: a command runs in the current release's slug and environment; push one first with `warden push {name} DIR`"
        )));
    }
    // A user's clearance is read only by those who may read users (`GET /v1/users/{name}`):
    // a deployer naming a user would learn it from the label.
    if query.user.is_some() {
        let reads_users = parts.extensions.get::<Principal>().is_none_or(|p| {
            p.owner()
                || matches!(p, Principal::Operator { roles, .. }
                    if roles.contains(&warden_core::Role::Viewer))
        });
        if !reads_users {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "--user reads the user's clearance, which needs the viewer or the owner role; name the label with --label instead",
            ));
        }
    }
    let label = label(&api, &query).await?;
    let place = api.one_offs.take(&name)?;
    let on_upgrade = parts
        .extensions
        .remove::<hyper::upgrade::OnUpgrade>()
        .ok_or_else(|| {
            ApiError::bad_request("this connection cannot be upgraded (HTTP/1.1 only)")
        })?;
    let oneoff = builds
        .one_off(&spec, &label, &body.command)
        .await
        .map_err(|e| match e {
            OneOffError::NoAgent => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
            OneOffError::Node(m) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("cannot run the command on this node: {m}"),
            ),
        })?;
    tracing::info!(app = %name, %label, user = ?query.user, command = ?body.command.first(), "one-off command started");
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                attach(hyper_util::rt::TokioIo::new(upgraded), oneoff).await;
                drop(place);
            }
            Err(e) => {
                tracing::info!(app = %name, error = %e, "one-off command's client left before the upgrade")
            }
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "upgrade")
        .header(header::UPGRADE, UPGRADE)
        .body(Body::empty())
        .map_err(ApiError::internal)
}

/// The label the command runs at: `label`, else `user`'s clearance, else the lattice's
/// lowest level; in the lattice's canonical form. With both, they must agree.
async fn label(api: &Api, query: &RunQuery) -> Result<String, ApiError> {
    let lattice = crate::routes::lattice::current(api).await?;
    let canonical = |l: &str| {
        lattice
            .canonical(l)
            .map_err(|e| ApiError::bad_request(format!("label {l:?}: {e}")))
    };
    let clearance = match &query.user {
        Some(user) => Some(
            warden_store::get_json::<UserRecord>(&*api.store, &keys::user(user))
                .await?
                .map(|(u, _)| u.clearance)
                .ok_or_else(|| {
                    ApiError::not_found(format!("no user {user:?}; `warden users list` shows them"))
                })?,
        ),
        None => None,
    };
    match (&query.label, clearance) {
        (Some(l), Some(c)) => {
            let l = canonical(l)?;
            if l != canonical(&c)? {
                return Err(ApiError::bad_request(format!(
                    "label {l:?} is not the clearance of user {:?}; give one of --label and --user, or both agreeing",
                    query.user.as_deref().unwrap_or_default()
                )));
            }
            Ok(l)
        }
        (Some(l), None) => canonical(l),
        (None, Some(c)) => canonical(&c),
        (None, None) => match lattice.levels.first() {
            Some(l) => canonical(l),
            None => Err(ApiError::bad_request(
                "the lattice has no levels: name the label with --label",
            )),
        },
    }
}

/// Carries frames between the client and the process until it ends, or the client goes
/// (then the process is killed: the `OneOff` is dropped). Each direction runs on its own, so
/// a process that writes before it reads never waits on input it has not asked for.
async fn attach<S>(io: S, oneoff: OneOff)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let OneOff { input, mut output } = oneoff;
    let (mut rd, mut wr) = tokio::io::split(io);
    let outward = async move {
        while let Some(out) = output.recv().await {
            let last = matches!(out, Output::Exited(_));
            if wr.write_all(&encode_output(&out)).await.is_err() {
                return;
            }
            if last {
                let _ = wr.shutdown().await;
                return;
            }
        }
    };
    let inward = async move {
        let mut buf = Vec::new();
        let mut chunk = vec![0u8; 16 * 1024];
        loop {
            let n = match rd.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            buf.extend_from_slice(&chunk[..n]);
            loop {
                match decode_input(&mut buf) {
                    Ok(Some(i)) => {
                        if input.send(i).await.is_err() {
                            return;
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::info!(error = %e, "a one-off command's client sent a bad frame; ending it");
                        return;
                    }
                }
            }
        }
    };
    tokio::select! {
        () = outward => {}
        () = inward => {}
    }
}
