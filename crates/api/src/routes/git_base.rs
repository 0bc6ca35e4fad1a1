//! What every module of `git push` shares, below them all: where the repositories and the
//! hooks live, private directories, failures told to the pusher in short, and what the hook
//! and the API say to each other over a push's socket.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::ApiError;
use crate::Api;

/// The environment variable naming the socket the hook connects to.
pub const SOCKET_ENV: &str = "WARDEN_GIT_HOOK_SOCKET";
/// The environment variable holding the key the hook presents, for this push only.
pub const KEY_ENV: &str = "WARDEN_GIT_HOOK_KEY";

/// What the hook sends: the key, the ref updates git received, and where the pushed objects
/// wait (git quarantines them until the hook agrees).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookAsk {
    /// The key of this push.
    pub key: String,
    /// `<old> <new> <ref>` lines, as git gave them to the hook.
    pub updates: Vec<String>,
    /// `GIT_OBJECT_DIRECTORY` of the hook: the quarantine.
    pub objects: Option<String>,
    /// `GIT_ALTERNATE_OBJECT_DIRECTORIES` of the hook: the repository's own objects.
    pub alternates: Option<String>,
}

/// What the API answers, one JSON line each: a line to show, then the verdict.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum HookSay {
    /// A line for git to show.
    Line(String),
    /// Whether git may update the refs.
    Accept(bool),
}

/// A failure on the node: `detail` (server paths, git's own words) goes to the node's log,
/// the pusher is told a short reason.
pub(crate) fn on_node(detail: impl std::fmt::Display) -> ApiError {
    warden_core::log_limited!(warn, detail = %detail, "git push failed on this node");
    ApiError::internal(
        "warden could not take this push on its node; push again, and if it fails again ask the operator to look at warden's log",
    )
}

/// `DATA_DIR/git`, private to warden, as an absolute path: git runs in the repository (its
/// working directory) and the hook wherever git runs it, so a relative data directory (the
/// default) would name other places to them.
pub(crate) fn base_dir(api: &Api) -> Result<PathBuf, ApiError> {
    let dir = api
        .data_dir
        .as_ref()
        .ok_or_else(|| ApiError::internal("this API has no data directory for git repositories"))?;
    std::path::absolute(dir.join("git")).map_err(|e| {
        ApiError::internal(format!(
            "cannot find the data directory's absolute path: {e}"
        ))
    })
}

/// Where `app`'s repository is (made or not).
pub(crate) fn repository_path(api: &Api, app: &str) -> Result<PathBuf, ApiError> {
    Ok(base_dir(api)?.join("repos").join(format!("{app}.git")))
}

/// `DATA_DIR/git/hooks`: the only hooks git runs for warden's repositories.
pub(crate) fn hooks_dir(base: &Path) -> PathBuf {
    base.join("hooks")
}

/// Makes `dir` (mode 0700) unless it exists, and keeps it 0700.
pub(crate) fn private_dir(dir: &Path) -> Result<(), ApiError> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => private(dir),
        Err(e) => Err(on_node(format!("cannot create {}: {e}", dir.display()))),
    }
}

/// Sets `path` to mode 0700.
pub(crate) fn private(path: &Path) -> Result<(), ApiError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| on_node(format!("cannot make {} private: {e}", path.display())))
}
