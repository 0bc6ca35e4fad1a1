//! Where a node keeps built slugs, and what an instance of a release runs: the spec with the
//! slug as its working directory and the slug's own bin directories first on its PATH.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use warden_core::{AppSpec, BuildKind};

use crate::drivers::spawn::INSTANCE_PATH;
use crate::drivers::LaunchError;

/// File beside a slug's tree, written last: the slug is complete when it is there.
pub(crate) const MARK: &str = "slug.json";

/// What [`MARK`] holds.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Mark {
    pub kind: BuildKind,
    pub command: Vec<String>,
}

/// The tree of slug `id` under `slugs`.
pub(crate) fn tree(slugs: &Path, id: &str) -> PathBuf {
    slugs.join(id).join("app")
}

/// The mark of slug `id`, if it is built here.
pub(crate) fn mark(slugs: &Path, id: &str) -> Option<Mark> {
    if !warden_core::model::is_slug_id(id) {
        return None;
    }
    let bytes = std::fs::read(slugs.join(id).join(MARK)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// What an instance of `spec` runs on this node: `spec` itself, or for a release the spec in
/// its slug, with the slug's virtual environment and node_modules/.bin first on PATH (unless
/// the app sets PATH itself).
pub(crate) fn run_spec<'a>(
    slugs: &Path,
    spec: &'a AppSpec,
) -> Result<Cow<'a, AppSpec>, LaunchError> {
    let Some(release) = &spec.release else {
        return Ok(Cow::Borrowed(spec));
    };
    if mark(slugs, &release.slug).is_none() {
        return Err(LaunchError::NoSlug {
            slug: release.slug.clone(),
        });
    }
    let tree = tree(slugs, &release.slug);
    let t = tree.display();
    let mut run = spec.clone();
    run.workdir = Some(t.to_string());
    run.env
        .entry("PATH".into())
        .or_insert_with(|| format!("{t}/.venv/bin:{t}/node_modules/.bin:{INSTANCE_PATH}"));
    Ok(Cow::Owned(run))
}
