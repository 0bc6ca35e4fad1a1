//! At start: the releases this node was delivering when it stopped (a `kill -9`, a power cut)
//! are resumed from their records and the disk, or failed as interrupted, so that none stays
//! unfinished; uploads that no unfinished release waits for are removed.

use std::collections::BTreeSet;

use axum::body::Bytes;
use tokio::sync::mpsc;
use warden_core::builds::{Builds, Built};
use warden_core::{FailReason, Release, ReleaseSource, ReleaseStatus};
use warden_store::decode;

use super::sink::Sink;
use super::{Delivery, Failure, Step};
use crate::Api;

/// Resumes (in tasks of their own) or fails every unfinished release this node took, and
/// removes the uploads none of them waits for. Records written before releases named their
/// node are taken by whichever node resumes first: they can only fail as interrupted.
/// Does nothing on a node that builds nothing, but first sweeps process types left without
/// their app (any API node may).
pub async fn resume(api: &Api) {
    if let Err(e) = super::processes::sweep_orphans(api).await {
        tracing::warn!(error = %e, "cannot sweep the process types of removed apps; they are tried again at the next start");
    }
    let (Some(builds), Some(node)) = (api.builds.clone(), api.node.clone()) else {
        return;
    };
    let listing = match api.store.list("releases/").await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list releases to resume; unfinished ones stay as they are until the next start");
            return;
        }
    };
    let mut waiting = BTreeSet::new();
    let mut unfinished = Vec::new();
    for e in &listing.entries {
        let Ok(release) = decode::<Release>(&e.key, &e.value) else {
            continue;
        };
        let ours = release.node.as_deref().is_none_or(|n| n == &*node);
        if release.status.finished() || !ours {
            continue;
        }
        if release.status == ReleaseStatus::Received {
            waiting.extend(release.upload.clone());
        }
        unfinished.push(Delivery::new(release, e.mod_revision, true));
    }
    remove_stray_uploads(api, &waiting);
    for mut d in unfinished {
        d.must_exist = !d.release.new_app;
        let (api, builds) = (api.clone(), builds.clone());
        tokio::spawn(async move {
            let (tx, rx) = mpsc::channel::<Bytes>(1);
            // Nobody listens: the log file has it all.
            drop(rx);
            let (app, number) = (d.release.app.clone(), d.release.number);
            let sink = Sink::new(tx, super::log_path(&api, &app, number));
            sink.line(&format!(
                "-----> warden started again: release {number} was {}",
                phase(d.release.status)
            ));
            tracing::info!(app, release = number, status = ?d.release.status, "resuming a release");
            let step = step(&api, &*builds, &d.release).await;
            super::drive(api, builds, d, step, sink).await;
        });
    }
}

fn phase(status: ReleaseStatus) -> &'static str {
    match status {
        ReleaseStatus::Received => "received: building it",
        // A push's release command runs again from `built` (migrations are idempotent).
        ReleaseStatus::Built => "built: running its release command, if any, and trying it",
        ReleaseStatus::Tried => "built: trying it",
        ReleaseStatus::Switched => "switched to: waiting for its rollout",
        ReleaseStatus::Released | ReleaseStatus::Failed => "finished",
    }
}

/// Where the release resumes, from its record and what this node still has.
async fn step(api: &Api, builds: &dyn Builds, release: &Release) -> Result<Step, Failure> {
    match release.status {
        ReleaseStatus::Received => {
            let upload = match (&release.upload, super::uploads_dir(api)) {
                (Some(name), Some(dir)) => Some(dir.join(name)).filter(|p| p.is_file()),
                _ => None,
            };
            let (Some(upload), ReleaseSource::Push { digest, .. }) = (upload, &release.source)
            else {
                return Err(interrupted(
                    "before its upload was built, and the upload is gone",
                ));
            };
            let prepared = builds
                .prepare(&release.app, &upload, digest, release.kind)
                .await?;
            Ok(Step::Build(prepared))
        }
        // A trial proves the release against the app's spec as it is now, which may have
        // changed while the node was down: a release stopped after its trial is tried again.
        ReleaseStatus::Built | ReleaseStatus::Tried => {
            let built = match (&release.slug, release.kind) {
                (Some(slug), Some(kind)) => builds.built(slug).map(|b| Built {
                    kind,
                    command: release.command.clone(),
                    release: release.release_command.clone(),
                    ..b
                }),
                _ => None,
            };
            built.map(Step::Try).ok_or_else(|| {
                interrupted("after its build, and its slug is not on this node any more")
            })
        }
        ReleaseStatus::Switched => Ok(Step::Rollout),
        ReleaseStatus::Released | ReleaseStatus::Failed => {
            Err(interrupted("after it had finished"))
        }
    }
}

fn interrupted(when: &str) -> Failure {
    Failure::new(
        FailReason::Interrupted,
        format!("the node stopped while delivering this release ({when}); push again"),
    )
}

/// Removes every file under `uploads/` but those unfinished releases wait for: pushes cut
/// off before their release was recorded, and uploads of releases finished before the node
/// could remove them.
fn remove_stray_uploads(api: &Api, waiting: &BTreeSet<String>) {
    let Some(dir) = super::uploads_dir(api) else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        if !name.to_str().is_some_and(|n| waiting.contains(n)) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}
