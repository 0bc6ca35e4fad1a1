//! Slugs: pushed trees built once into directories instances run from, and the trial start
//! that a release passes before it serves. [`Builder`] implements [`warden_core::builds::Builds`]
//! for the API.
//!
//! A slug's id is the SHA-256 of the pushed archive's digest and the build kind, so pushing the
//! same tree twice builds nothing. A slug is built in place, at `<slugs>/<id>/app`, because
//! virtual environments remember where they were made; its shebangs are then rewritten to find
//! Python through PATH (see [`relocate`]), so the tree runs from another node's copy too. The
//! slug is complete when its mark (`slug.json`) is written; an unmarked directory is a failed
//! or interrupted build and is removed before the next. Built slugs belong to warden and are
//! read-only to everyone else: instances see them read-only (the sandbox binds them so).

mod archive;
mod beneath;
mod detect;
mod relocate;
mod run;
pub(crate) mod slugs;
mod trial;
mod unpack;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use warden_core::builds::{BuildError, Builds, Built, Output, Prepared, TrialError};
use warden_core::{AppSpec, BuildKind};

use crate::drivers::Drivers;
use crate::paths::Paths;

/// Builds slugs and tries releases on this node.
pub struct Builder {
    drivers: Arc<Drivers>,
    paths: Paths,
    time_limit: Duration,
    max_unpacked: u64,
    /// One lock per slug, shared with the fetcher: two pushes of one tree build it once, and
    /// a fetch never meets a build of the same slug.
    locks: Arc<slugs::Fetcher>,
}

impl Builder {
    pub(crate) fn new(
        drivers: Arc<Drivers>,
        paths: Paths,
        time_limit: Duration,
        max_unpacked: u64,
        locks: Arc<slugs::Fetcher>,
    ) -> Self {
        Self {
            drivers,
            paths,
            time_limit,
            max_unpacked,
            locks,
        }
    }

    fn node_error(what: &str, e: impl std::fmt::Display) -> BuildError {
        BuildError::Node(format!("cannot {what}: {e}"))
    }

    /// The built slug `id`, if it is complete.
    fn complete(&self, id: &str, cached: bool) -> Option<Built> {
        let (mark, archive) = slugs::mark(&self.paths.slugs, id)?;
        Some(Built {
            slug: id.to_owned(),
            kind: mark.kind,
            command: mark.command,
            dir: slugs::tree(&self.paths.slugs, id),
            archive,
            cached,
        })
    }
}

/// Sets its flag when dropped: a blocking task watching the flag stops.
#[derive(Default)]
struct CallOff(Arc<AtomicBool>);

impl Drop for CallOff {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The slug id of archive `digest` built as `kind`.
fn slug_id(digest: &str, kind: BuildKind) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(format!("{digest}:{}", kind.name()).as_bytes());
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Gives every file under `dir` to `uid`:`gid` (symlinks themselves, not their targets).
pub(crate) fn chown_tree(dir: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(dir, Some(uid), Some(gid))?;
    if std::fs::symlink_metadata(dir)?.is_dir() {
        for e in std::fs::read_dir(dir)? {
            chown_tree(&e?.path(), uid, gid)?;
        }
    }
    Ok(())
}

/// Makes a built tree warden's and read-only to everyone else: whatever the build left
/// writable by group or others (or owned by the build's uid) is taken back.
fn seal_tree(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let (uid, gid) = (
        nix::unistd::geteuid().as_raw(),
        nix::unistd::getegid().as_raw(),
    );
    chown_tree(dir, uid, gid)?;
    fn walk(p: &Path) -> std::io::Result<()> {
        let m = std::fs::symlink_metadata(p)?;
        if m.file_type().is_symlink() {
            return Ok(());
        }
        let mode = m.permissions().mode() & 0o7777;
        // Readable by all, executable by all where anyone could run it, writable by warden
        // alone, no set-id bits.
        let runnable = m.is_dir() || mode & 0o111 != 0;
        let sealed = (mode & 0o0755 & !0o022) | 0o444 | if runnable { 0o111 } else { 0 };
        if sealed != mode {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(sealed))?;
        }
        if m.is_dir() {
            for e in std::fs::read_dir(p)? {
                walk(&e?.path())?;
            }
        }
        Ok(())
    }
    walk(dir)
}

#[async_trait]
impl Builds for Builder {
    async fn prepare(
        &self,
        _app: &str,
        archive: &Path,
        digest: &str,
        kind: Option<BuildKind>,
    ) -> Result<Prepared, BuildError> {
        let slugs = self.paths.slugs.clone();
        let max = self.max_unpacked;
        let (archive, digest) = (archive.to_owned(), digest.to_owned());
        // Dropped with this future (the client went away, warden is stopping): the unpack
        // stops at its next read and leaves nothing behind.
        let called_off = CallOff::default();
        let cancel = called_off.0.clone();
        tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&slugs)
                .map_err(|e| Self::node_error("create the slug directory", e))?;
            let scratch = slugs.join(format!(".unpack-{}", warden_core::id::short_id()));
            std::fs::create_dir(&scratch)
                .map_err(|e| Self::node_error("create a directory to unpack into", e))?;
            let recipe = unpack::unpack(&archive, &scratch, max, false, &cancel)
                .and_then(|_| detect::detect(&scratch, kind))
                .and_then(|r| match cancel.load(Ordering::Relaxed) {
                    true => Err(BuildError::Node("the push was called off".into())),
                    false => Ok(r),
                });
            let recipe = match recipe {
                Ok(r) => r,
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&scratch);
                    return Err(e);
                }
            };
            let id = slug_id(&digest, recipe.kind);
            Ok(Prepared {
                slug: id,
                kind: recipe.kind,
                command: recipe.command,
                built: None,
                tree: Some(scratch),
            })
        })
        .await
        .map_err(|e| Self::node_error("unpack the archive", e))?
        .map(|mut p| {
            if let Some(b) = self.complete(&p.slug, true) {
                if let Some(t) = p.tree.take() {
                    let _ = std::fs::remove_dir_all(t);
                }
                p.built = Some(b);
            }
            p
        })
    }

    async fn build(&self, prepared: Prepared, out: Output) -> Result<Built, BuildError> {
        if let Some(b) = prepared.built {
            return Ok(b);
        }
        let Some(scratch) = prepared.tree else {
            return Err(BuildError::Node("nothing was unpacked to build".into()));
        };
        let id = prepared.slug.clone();
        let gate = self.locks.gate(&id);
        let _building = gate.lock().await;
        let result = self.build_locked(&id, &scratch, prepared.kind, &out).await;
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&scratch)).await;
        result
    }

    async fn trial(&self, spec: &AppSpec, label: &str) -> Result<(), TrialError> {
        trial::trial(&self.drivers, &self.paths, spec, label).await
    }

    fn built(&self, slug: &str) -> Option<Built> {
        self.complete(slug, true)
    }
}

impl Builder {
    async fn build_locked(
        &self,
        id: &str,
        scratch: &Path,
        kind: BuildKind,
        out: &Output,
    ) -> Result<Built, BuildError> {
        if let Some(b) = self.complete(id, true) {
            return Ok(b);
        }
        // The recipe again, from the tree that will be built (the same files prepare saw).
        let recipe = detect::detect(scratch, Some(kind))?;
        let home = self.paths.slugs.join(id);
        let tree = slugs::tree(&self.paths.slugs, id);
        let _ = std::fs::remove_dir_all(&home);
        std::fs::create_dir_all(&home)
            .and_then(|()| std::fs::rename(scratch, &tree))
            .map_err(|e| Self::node_error("move the unpacked tree into place", e))?;
        let result = self.run_recipe(&recipe, &tree, out).await;
        if let Err(e) = result {
            let _ = std::fs::remove_dir_all(&home);
            return Err(e);
        }
        let mark = slugs::Mark {
            kind: recipe.kind,
            command: recipe.command,
        };
        let bytes =
            serde_json::to_vec(&mark).map_err(|e| Self::node_error("encode the slug's mark", e))?;
        std::fs::write(home.join(slugs::MARK), bytes)
            .map_err(|e| Self::node_error("write the slug's mark", e))?;
        let home2 = home.clone();
        let digest = tokio::task::spawn_blocking(move || archive::pack(&home2))
            .await
            .map_err(|e| Self::node_error("pack the slug", e))?
            .map_err(|e| Self::node_error("pack the slug", e))?;
        // Written whole, then renamed: a reader sees no digest or all of it.
        let part = home.join(format!(".{}.part", slugs::DIGEST));
        std::fs::write(&part, digest)
            .and_then(|()| std::fs::rename(&part, home.join(slugs::DIGEST)))
            .map_err(|e| Self::node_error("write the slug's digest", e))?;
        self.complete(id, false)
            .ok_or_else(|| BuildError::Node("the slug's mark cannot be read back".into()))
    }

    async fn run_recipe(
        &self,
        recipe: &detect::Recipe,
        tree: &Path,
        out: &Output,
    ) -> Result<(), BuildError> {
        if let Some(script) = &recipe.script {
            out(&format!("-----> building a {} app", recipe.kind.name()));
            run::run_script(
                &self.drivers,
                &self.paths,
                "build",
                tree,
                script,
                self.time_limit,
                out,
            )
            .await?;
        } else {
            out(&format!(
                "-----> a {} app: nothing to build",
                recipe.kind.name()
            ));
        }
        let tree2 = tree.to_owned();
        // Sealed first: from here on nobody but warden may change the tree, so rewriting
        // files in it by path is safe (the build's processes died with its sandbox).
        tokio::task::spawn_blocking(move || {
            seal_tree(&tree2)?;
            relocate::relocate(&tree2)
        })
        .await
        .map_err(|e| Self::node_error("finish the slug", e))?
        .map_err(|e| Self::node_error("finish the slug", e))
    }
}
