//! Slugs: pushed trees unpacked, recognised and built once into directories instances run
//! from; where a node keeps them, what an instance of a release runs, and fetching a slug this
//! node did not build through the [`warden_core::builds::SlugSource`] seam.
//!
//! A slug's id is the SHA-256 of the pushed archive's digest and the build kind, so pushing the
//! same tree twice builds nothing. A slug is built in place, at `<slugs>/<id>/app`, because
//! virtual environments remember where they were made; its shebangs are then rewritten to find
//! Python through PATH (see `relocate`), so the tree runs from another node's copy too. The
//! slug is complete when its digest file is written (after its mark, `slug.json`, and its
//! archive); an incomplete directory is a failed or interrupted build and is removed before the
//! next. Built slugs belong to warden and are read-only to everyone else.
//!
//! This crate owns the files of slugs and nothing that runs: it never starts a process, so
//! running a build script or a trial stays with the agent, which calls in here before and
//! after. It must not depend on the agent or on the sandbox crate (nor they on its internals:
//! only what lib.rs exports). Every file of an untrusted tree is opened beneath its root
//! (`beneath`), never by a path a symlink could redirect.

#![forbid(unsafe_code)]

mod app_toml;
mod archive;
mod beneath;
mod detect;
mod relocate;
mod reuse;
mod store;
mod unpack;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use warden_core::builds::{BuildError, Built, Prepared};
use warden_core::BuildKind;

pub use detect::Recipe;
pub use reuse::{reuse, Reuse};
pub use store::{run_spec, sweep, tree, FetchError, Fetcher, SlugError};

fn node_error(what: &str, e: impl std::fmt::Display) -> BuildError {
    BuildError::Node(format!("cannot {what}: {e}"))
}

/// The built slug `id` under `slugs`, if it is complete; `cached` says it was there before.
pub fn complete(slugs: &Path, id: &str, cached: bool) -> Option<Built> {
    let (mark, archive) = store::mark(slugs, id)?;
    let dir = tree(slugs, id);
    let processes = match mark.processes {
        Some(p) => p,
        None => detect::process_types(&dir, mark.kind),
    };
    Some(Built {
        slug: id.to_owned(),
        kind: mark.kind,
        command: mark.command,
        release: mark.release,
        processes,
        dir,
        archive,
        cached,
    })
}

/// The slug id of archive `digest` built as `kind`.
fn slug_id(digest: &str, kind: BuildKind) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(format!("{digest}:{}", kind.name()).as_bytes());
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// Unpacks the pushed `archive` (whose digest is `digest`) into a scratch directory under
/// `slugs`, at most `max_unpacked` bytes, and tells what it is (`kind`, or from its files).
/// Blocking; stops early, leaving nothing, once `cancel` is set. The prepared slug's `built`
/// is left to the caller ([`complete`]).
pub fn unpack_pushed(
    slugs: &Path,
    archive: &Path,
    digest: &str,
    kind: Option<BuildKind>,
    max_unpacked: u64,
    cancel: &AtomicBool,
) -> Result<Prepared, BuildError> {
    std::fs::create_dir_all(slugs).map_err(|e| node_error("create the slug directory", e))?;
    let scratch = slugs.join(format!(".unpack-{}", warden_core::id::short_id()));
    std::fs::create_dir(&scratch)
        .map_err(|e| node_error("create a directory to unpack into", e))?;
    let recipe = unpack::unpack(archive, &scratch, max_unpacked, false, cancel)
        .and_then(|_| detect::detect(&scratch, kind))
        .and_then(|r| Ok((r, app_toml::read(&scratch)?)))
        .and_then(|r| match cancel.load(Ordering::Relaxed) {
            true => Err(BuildError::Node("the push was called off".into())),
            false => Ok(r),
        });
    let (recipe, asked) = match recipe {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&scratch);
            return Err(e);
        }
    };
    Ok(Prepared {
        slug: slug_id(digest, recipe.kind),
        kind: recipe.kind,
        command: recipe.command,
        release: recipe.release,
        data: asked.data,
        built: None,
        tree: Some(scratch),
        previous: None,
    })
}

/// Moves the unpacked `scratch` tree into place as slug `id`'s tree (anything of an earlier
/// try is removed first) and tells again how to build it, from the files that will be built.
/// Returns the tree's path and the recipe.
pub fn place(
    slugs: &Path,
    id: &str,
    scratch: &Path,
    kind: BuildKind,
) -> Result<(PathBuf, Recipe), BuildError> {
    let recipe = detect::detect(scratch, Some(kind))?;
    let home = slugs.join(id);
    let tree = tree(slugs, id);
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home)
        .and_then(|()| std::fs::rename(scratch, &tree))
        .map_err(|e| node_error("move the unpacked tree into place", e))?;
    Ok((tree, recipe))
}

/// Removes whatever there is of slug `id` (a build that failed).
pub fn discard(slugs: &Path, id: &str) {
    let _ = std::fs::remove_dir_all(slugs.join(id));
}

/// Makes a built `tree` final: warden's and read-only to everyone else, then its virtual
/// environment's shebangs rewritten to run from any copy. Blocking; call it once whatever
/// built the tree is gone.
pub fn finish_tree(tree: &Path) -> std::io::Result<()> {
    // Sealed first: from here on nobody but warden may change the tree, so rewriting files in
    // it by path is safe.
    seal_tree(tree)?;
    relocate::relocate(tree)
}

/// Completes slug `id` built by `recipe`: writes its mark, packs its archive and writes its
/// digest last. Blocking.
pub fn complete_build(slugs: &Path, id: &str, recipe: &Recipe) -> Result<Built, BuildError> {
    let home = slugs.join(id);
    let mark = store::Mark {
        kind: recipe.kind,
        command: recipe.command.clone(),
        release: recipe.release.clone(),
        processes: Some(recipe.processes.clone()),
        built_with: reuse::interpreter(recipe.kind),
    };
    let bytes = serde_json::to_vec(&mark).map_err(|e| node_error("encode the slug's mark", e))?;
    std::fs::write(home.join(store::MARK), bytes)
        .map_err(|e| node_error("write the slug's mark", e))?;
    let digest = archive::pack(&home).map_err(|e| node_error("pack the slug", e))?;
    // Written whole, then renamed: a reader sees no digest or all of it.
    let part = home.join(format!(".{}.part", store::DIGEST));
    std::fs::write(&part, digest)
        .and_then(|()| std::fs::rename(&part, home.join(store::DIGEST)))
        .map_err(|e| node_error("write the slug's digest", e))?;
    complete(slugs, id, false)
        .ok_or_else(|| BuildError::Node("the slug's mark cannot be read back".into()))
}

/// Gives every file under `dir` to `uid`:`gid` (symlinks themselves, not their targets).
pub fn chown_tree(dir: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
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

#[cfg(test)]
mod tests {
    use warden_core::model::BuildKind;

    /// A slug as the build leaves it: its tree with `procfile`, its digest and a mark written
    /// as `mark` (JSON).
    fn slug(slugs: &std::path::Path, id: &str, procfile: &str, mark: &str) {
        let dir = slugs.join(id);
        std::fs::create_dir_all(dir.join("app")).expect("dir");
        std::fs::write(dir.join("app/Procfile"), procfile).expect("procfile");
        std::fs::write(dir.join(super::store::DIGEST), "d").expect("digest");
        std::fs::write(dir.join(super::store::MARK), mark).expect("mark");
    }

    #[test]
    fn a_slug_from_before_process_types_has_its_procfiles_types_and_a_new_one_its_marks() {
        let slugs = tempfile::tempdir().expect("dir");
        let (old, new) = ("ab".repeat(32), "cd".repeat(32));
        let procfile = "web: ./serve\nworker: ./work\n";
        slug(
            slugs.path(),
            &old,
            procfile,
            r#"{"kind":"procfile","command":["./serve"]}"#,
        );
        slug(
            slugs.path(),
            &new,
            procfile,
            r#"{"kind":"procfile","command":["./serve"],"processes":{}}"#,
        );
        let built = super::complete(slugs.path(), &old, true).expect("old slug");
        assert_eq!(built.kind, BuildKind::Procfile);
        assert_eq!(
            built.processes.keys().collect::<Vec<_>>(),
            ["worker"],
            "read again from the Procfile"
        );
        let built = super::complete(slugs.path(), &new, true).expect("new slug");
        assert!(built.processes.is_empty(), "the mark says none");
    }
}
