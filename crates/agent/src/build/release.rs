//! A push's release phase: the Procfile's `release` command (schema changes, as on Heroku),
//! run once before the release's trial as a one-off process of the app (its driver, so
//! sandboxed where the app is; its slug; its config vars), at most the build time limit, its
//! output streamed to the push. For an app with data it reaches the app's database as the
//! owner role (the only process that ever does: instances log in as their label's role), and
//! once it exits 0 the tables it made are labelled; a table that cannot be fails the release.

use std::path::Path;
use std::time::Duration;

use warden_core::builds::{Output, ReleasePhaseError};
use warden_core::data::{DataPlane, DataSocket};
use warden_core::{AppSpec, DriverKind};

use super::run::{run_to_end, stopped_by_shutdown, Ended, TAIL_LINES};
use crate::drivers::{Drivers, Launch};
use crate::paths::Paths;

/// What a release phase runs with.
pub(crate) struct ReleaseRun<'a> {
    pub drivers: &'a Drivers,
    pub paths: &'a Paths,
    pub data: Option<&'a dyn DataPlane>,
    /// The build time limit: a migration is part of making the release.
    pub limit: Duration,
}

fn node(what: &str, e: impl std::fmt::Display) -> ReleasePhaseError {
    ReleasePhaseError::Node(format!("cannot {what}: {e}"))
}

// === impl ReleaseRun ===

impl ReleaseRun<'_> {
    /// Runs `command` as a one-off process of `spec`, then labels the tables it made.
    pub(crate) async fn run(
        &self,
        spec: &AppSpec,
        command: &[String],
        out: &Output,
    ) -> Result<(), ReleasePhaseError> {
        let mut run = warden_slugs::run_spec(&self.paths.slugs, spec)
            .map_err(|e| ReleasePhaseError::Node(e.to_string()))?
            .into_owned();
        run.command = command.to_vec();
        let id = warden_core::id::short_id();
        let dir = self
            .paths
            .create_instance(&id)
            .map_err(|e| node("create the release command's directory", e))?;
        let log = self.paths.logs.join(format!("release-{id}.log"));
        let result = self.run_in(&run, &id, &dir, &log, out).await;
        crate::drivers::leftovers::remove_instance_dir(&dir);
        let _ = std::fs::remove_file(&log);
        if result.is_err() && self.drivers.children().ending() {
            stopped_by_shutdown().await;
        }
        result
    }

    async fn run_in(
        &self,
        spec: &AppSpec,
        id: &str,
        dir: &Path,
        log: &Path,
        out: &Output,
    ) -> Result<(), ReleasePhaseError> {
        let mut env = self
            .drivers
            .base_env(spec, id)
            .map_err(|e| node("start the release command", e))?;
        let driver = spec.driver_on(self.drivers.default().0);
        let socket = self
            .owner_socket(spec, dir, driver == DriverKind::Sandbox, &mut env)
            .await?;
        out("-----> running the release command");
        let launch = Launch {
            spec,
            env,
            log,
            dir,
            build: false,
        };
        let ended = run_to_end(self.drivers, driver, &launch, self.limit, out)
            .await
            .map_err(|e| node("start the release command", e))?;
        // Its connections as the owner end here, before the tables are labelled.
        drop(socket);
        let tail = || crate::logs::tail(log, TAIL_LINES);
        match ended {
            Ended::Exited(s) if s.success() => {}
            Ended::Exited(s) => {
                let how = match (s.code(), std::os::unix::process::ExitStatusExt::signal(&s)) {
                    (Some(code), _) => code.to_string(),
                    (None, Some(sig)) => format!("on signal {sig}"),
                    (None, None) => s.to_string(),
                };
                return Err(ReleasePhaseError::Failed(format!(
                    "the release command exited {how}; the release is not applied; last lines:\n{}",
                    tail()
                )));
            }
            Ended::TimedOut => {
                return Err(ReleasePhaseError::Failed(format!(
                    "the release command ran out of its {} s (the build time limit); the release is not applied; last lines:\n{}",
                    self.limit.as_secs(),
                    tail()
                )))
            }
            Ended::Lost(e) => return Err(node("wait for the release command", e)),
        }
        out("-----> the release command exited 0");
        self.label(spec, out).await
    }

    /// For an app with data: a socket in `dir` logged in as the app's owner role, and the
    /// environment naming it added to `env`.
    async fn owner_socket(
        &self,
        spec: &AppSpec,
        dir: &Path,
        sandboxed: bool,
        env: &mut std::collections::BTreeMap<String, String>,
    ) -> Result<Option<DataSocket>, ReleasePhaseError> {
        if !spec.data {
            return Ok(None);
        }
        let plane = self
            .data
            .ok_or_else(|| ReleasePhaseError::Node(crate::drivers::data::NO_SERVER.into()))?;
        let place = crate::drivers::data::place(dir, &spec.name, sandboxed)
            .map_err(|e| node("make the release command's database socket", e))?;
        let socket = plane
            .attach_owner(&spec.name, &place.socket)
            .await
            .map_err(|e| node("reach the app's database as its owner", e))?;
        env.extend(place.env);
        Ok(Some(socket))
    }

    /// Labels the tables the release command made (an app with data only).
    async fn label(&self, spec: &AppSpec, out: &Output) -> Result<(), ReleasePhaseError> {
        let Some(plane) = self.data.filter(|_| spec.data) else {
            return Ok(());
        };
        let tables = plane.label_tables(&spec.name).await.map_err(|e| {
            ReleasePhaseError::Failed(format!(
                "the release command left a table warden cannot label: {e}; the release is not applied (instances cannot reach that table: change or drop it in the next push's release command)"
            ))
        })?;
        out(&format!(
            "-----> labelled tables: {}",
            match tables.is_empty() {
                true => "none".to_owned(),
                false => tables.join(", "),
            }
        ));
        Ok(())
    }
}
