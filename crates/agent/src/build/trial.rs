//! Trying a release before it serves: one instance of the new spec, started outside all
//! routing and records, must become ready (its health path, else accepting connections) within
//! the app's start timeout; then it stops. A release that fails here never reaches users. An
//! app with data gets its database as an instance of the trial's label would (a socket logged
//! in as that label's role), so an app that reads `DATABASE_URL` at start can be tried.

use std::collections::BTreeMap;
use std::time::Duration;

use warden_core::builds::TrialError;
use warden_core::data::{DataPlane, DataSocket};
use warden_core::{AppSpec, DriverKind};

use super::run::TAIL_LINES;
use crate::drivers::{Drivers, Launch};
use crate::lifecycle::ready::{wait_ready, Listening, Ready};
use crate::paths::Paths;

/// Runs the trial; on failure, why and the last lines the instance printed.
pub(crate) async fn trial(
    drivers: &Drivers,
    paths: &Paths,
    data: Option<&dyn DataPlane>,
    spec: &AppSpec,
    label: &str,
) -> Result<(), TrialError> {
    let run =
        warden_slugs::run_spec(&paths.slugs, spec).map_err(|e| TrialError::Node(e.to_string()))?;
    let id = warden_core::id::short_id();
    let dir = paths.create_instance(&id).map_err(|e| {
        TrialError::Node(format!("cannot create the trial instance's directory: {e}"))
    })?;
    let log = paths.logs.join(format!("trial-{id}.log"));
    let result = match data_socket(drivers, data, spec, label, &dir).await {
        Ok((socket, env)) => {
            let result = run_trial(drivers, &run, label, &id, &dir, &log, env).await;
            drop(socket);
            result
        }
        Err(e) => Err(e),
    };
    crate::drivers::leftovers::remove_instance_dir(&dir);
    let _ = std::fs::remove_file(&log);
    if result.is_err() && drivers.children().ending() {
        super::run::stopped_by_shutdown().await;
    }
    result
}

/// For an app with data: a socket in the trial's directory `dir` logged in as `label`'s
/// role, and the environment that names it; nothing for other apps.
async fn data_socket(
    drivers: &Drivers,
    data: Option<&dyn DataPlane>,
    spec: &AppSpec,
    label: &str,
    dir: &std::path::Path,
) -> Result<(Option<DataSocket>, BTreeMap<String, String>), TrialError> {
    if !spec.data {
        return Ok((None, BTreeMap::new()));
    }
    let plane = data.ok_or_else(|| TrialError::Node(crate::drivers::data::NO_SERVER.to_owned()))?;
    let sandboxed = spec.driver_on(drivers.default().0) == DriverKind::Sandbox;
    let node = |e: &dyn std::fmt::Display| {
        TrialError::Node(format!(
            "cannot give the release's instance its database: {e}"
        ))
    };
    let place = crate::drivers::data::place(dir, &spec.name, sandboxed).map_err(|e| node(&e))?;
    let socket = plane
        .attach(&spec.name, label, None, &place.socket)
        .await
        .map_err(|e| node(&e))?;
    Ok((Some(socket), place.env))
}

#[allow(clippy::too_many_arguments)]
async fn run_trial(
    drivers: &Drivers,
    spec: &AppSpec,
    label: &str,
    id: &str,
    dir: &std::path::Path,
    log: &std::path::Path,
    data_env: BTreeMap<String, String>,
) -> Result<(), TrialError> {
    let mut env = drivers
        .base_env(spec, id)
        .map_err(|e| TrialError::Node(format!("cannot start the release's instance: {e}")))?;
    env.insert("WARDEN_LABEL".into(), label.to_owned());
    env.extend(data_env);
    let launch = Launch {
        spec,
        env,
        log,
        dir,
        build: false,
    };
    let driver = spec.driver_on(drivers.default().0);
    let started = drivers
        .get(driver)
        .start(&launch)
        .map_err(|e| TrialError::Node(format!("cannot start the release's instance: {e}")))?;
    let mut child = started.child;
    let (exited_tx, exited) = tokio::sync::watch::channel(false);
    let timeout = Duration::from_millis(spec.start_timeout_ms);
    let ready = {
        let mut listening = started.listening.and_then(Listening::new);
        let health = spec.health_path.as_deref();
        let wait = wait_ready(
            &started.addr,
            started.owner,
            health,
            exited,
            timeout,
            listening.as_mut(),
        );
        tokio::pin!(wait);
        let mut status = None;
        let ready = loop {
            tokio::select! {
                r = &mut wait => break r,
                s = child.wait(), if status.is_none() => {
                    status = Some(s);
                    let _ = exited_tx.send(true);
                }
            }
        };
        (ready, status)
    };
    child.signal(nix::sys::signal::Signal::SIGKILL);
    let status = match ready.1 {
        Some(s) => s.ok(),
        None => child.wait().await.ok(),
    };
    if let Some(held) = started.held {
        held.release().await;
    }
    let tail = || crate::logs::tail(log, TAIL_LINES);
    match ready.0 {
        Ready::Yes => Ok(()),
        Ready::Exited => Err(TrialError::NotReady(format!(
            "the release's instance exited before it was ready ({}); last lines:\n{}",
            status.map_or("status unknown".to_owned(), |s| s.to_string()),
            tail()
        ))),
        Ready::TimedOut(missing) => Err(TrialError::NotReady(format!(
            "the release's instance was not ready within {} ms: {missing}; last lines:\n{}",
            spec.start_timeout_ms,
            tail()
        ))),
        // Not the release's fault: a process of the node took the port it was told.
        Ready::Foreign(why) => Err(TrialError::Node(format!(
            "the release's instance was not tried: {why}"
        ))),
    }
}
