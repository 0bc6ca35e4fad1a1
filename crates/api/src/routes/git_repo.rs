//! Questions a push asks of an app's repository under its lock (where its branch is, what a
//! pushed object is), the sweeping of quarantines a killed git left, and the removal of the
//! repository with its app. Git's own words and the server's paths go to the node's log; the
//! pusher is told a short reason.

use std::path::Path;
use std::process::Stdio;

use axum::http::StatusCode;

use super::git_base::HookAsk;
use super::git_lock::Taken;
use crate::error::ApiError;
use crate::Api;

/// A quarantine of another push older than this is a dead git's (git removes its own when it
/// ends, or is stopped by a signal it can catch; not when SIGKILLed).
const STALE: std::time::Duration = std::time::Duration::from_secs(3600);

/// `git` for `repo`, with a cleared environment and no config but the repository's.
fn git(repo: &Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new("git");
    cmd.env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
        )
        .env("GIT_DIR", repo)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// Runs `cmd`; its trimmed output, or None when git says no.
async fn output(mut cmd: tokio::process::Command, what: &str) -> Result<Option<String>, String> {
    let out = cmd.output().await.map_err(|e| {
        tracing::warn!(error = %e, "cannot run git {what}");
        "warden could not run git to check the push; push again".to_owned()
    })?;
    if !out.status.success() {
        return Ok(None);
    }
    Ok(Some(String::from_utf8_lossy(&out.stdout).trim().to_owned()))
}

/// The commit `reference` names in the repository itself (not a push's quarantine), if any.
pub(crate) async fn rev_parse(repo: &Path, reference: &str) -> Result<Option<String>, String> {
    let mut cmd = git(repo);
    cmd.args(["rev-parse", "--verify", "--quiet", reference]);
    output(cmd, "rev-parse").await
}

/// The type of object `id` (`commit`, `tree`, `tag`, `blob`) as the push's quarantine sees it.
pub(crate) async fn object_type(repo: &Path, ask: &HookAsk, id: &str) -> Result<String, String> {
    let mut cmd = git(repo);
    cmd.envs(super::git_archive::objects_env(repo, ask)?)
        .args(["cat-file", "-t", id]);
    output(cmd, "cat-file")
        .await?
        .ok_or_else(|| "the pushed object is not in the push; push again with git".to_owned())
}

/// Removes the quarantines (`objects/*incoming-*`) of pushes that died, keeping `ours`.
pub(crate) fn remove_stale_quarantines(repo: &Path, ours: Option<&str>) {
    let ours = ours.and_then(|o| Path::new(o).canonicalize().ok());
    let Ok(entries) = std::fs::read_dir(repo.join("objects")) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let quarantine = e
            .file_name()
            .to_str()
            .is_some_and(super::git_archive::is_quarantine);
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > STALE));
        if quarantine && old && path.canonicalize().ok() != ours {
            if let Err(err) = std::fs::remove_dir_all(&path) {
                tracing::warn!(path = %path.display(), error = %err, "cannot remove a dead push's quarantine");
            }
        }
    }
}

/// The removal of an app's repository with the app, holding the push lock from before the
/// app is deleted until the repository is gone: a later app of the name must not inherit
/// this one's commits, and no push may build into it meanwhile.
pub(crate) struct Removal {
    repo: Option<(std::path::PathBuf, super::git_lock::Lock)>,
}

impl Removal {
    /// Takes the push lock of `app`; 409 while a push of it is being built.
    pub(crate) fn begin(api: &Api, app: &str) -> Result<Self, ApiError> {
        if api.data_dir.is_none() {
            return Ok(Self { repo: None });
        }
        let repo = super::git_base::repository_path(api, app)?;
        let lock = Taken::take(&repo).ok_or_else(|| {
            ApiError::new(
                StatusCode::CONFLICT,
                format!("a git push of {app} is being built; remove the app once it has ended"),
            )
        })?;
        Ok(Self {
            repo: Some((repo, lock)),
        })
    }

    /// Removes the repository (the app is deleted); a failure is logged.
    pub(crate) fn finish(self) {
        let Some((repo, _lock)) = self.repo else {
            return;
        };
        match std::fs::remove_dir_all(&repo) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                tracing::warn!(repo = %repo.display(), error = %e, "cannot remove a removed app's git repository");
            }
            _ => {}
        }
    }
}
