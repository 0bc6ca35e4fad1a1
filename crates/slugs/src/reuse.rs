//! A build that starts from the dependencies its app's serving slug installed: the virtual
//! environment of a Python app or the `node_modules` of a Node app are copied from that slug
//! into the tree about to be built. When the files that name the dependencies are the same
//! byte for byte, nothing is installed at all (no registry is asked, so it works while one is
//! unreachable); when they changed, the package manager starts from the copy and installs
//! only what changed.
//!
//! Only the slug of the app's own current release is a source (the API names it), so one
//! app's build never starts from what another app's build wrote; slugs are content-addressed,
//! so an app pushing the same tree as another shares that slug already. The copy is warden's,
//! made from a sealed slug (nothing writes it), walking the tree without following a link:
//! links are copied as links, anything but directories, files and links is left out, and
//! modes are made writable by the build (the slug's are read-only) so the package manager can
//! change what it must.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use warden_core::BuildKind;

use crate::beneath::Root;
use crate::store;

/// Largest file naming dependencies that is compared.
const MAX_MANIFEST: u64 = 4 << 20;

/// What a build takes from the app's serving slug.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reuse {
    /// The dependencies are copied and the files naming them are the same: nothing to install.
    Unchanged,
    /// The dependencies are copied; the files naming them changed: install what changed.
    Changed,
}

/// Where a kind keeps its installed dependencies in the tree, and which files name them (the
/// first must exist for a reuse). A Python app installed from a `pyproject.toml` has itself
/// in its venv, so only a `requirements.txt` app's venv is reused.
fn layout(kind: BuildKind) -> Option<(&'static str, &'static [&'static str])> {
    match kind {
        BuildKind::Python => Some((".venv", &["requirements.txt"])),
        BuildKind::Node => Some(("node_modules", &["package-lock.json", "package.json"])),
        _ => None,
    }
}

/// The interpreter a kind's dependencies were built for, as this node has it now: its path
/// as the kernel resolves it, size and change time. A venv or a native module built for
/// another one is not reused.
pub(crate) fn interpreter(kind: BuildKind) -> Option<String> {
    let candidates: &[&str] = match kind {
        BuildKind::Python => &[crate::detect::PYTHON],
        BuildKind::Node => &["/usr/bin/node", "/usr/local/bin/node"],
        _ => return None,
    };
    let path = candidates.iter().find(|p| Path::new(p).is_file())?;
    let real = std::fs::canonicalize(path).ok()?;
    let m = std::fs::metadata(&real).ok()?;
    Some(format!(
        "{} {} {}.{}",
        real.display(),
        m.len(),
        m.ctime(),
        m.ctime_nsec()
    ))
}

/// Copies the dependencies of slug `previous` (the app's serving release) into `tree`, about
/// to be built as `kind`, when that slug is complete here, of the same kind, built for this
/// node's interpreter, and both trees name their dependencies the same way. `None`: build
/// from nothing. Blocking.
pub fn reuse(slugs: &Path, previous: &str, tree: &Path, kind: BuildKind) -> Option<Reuse> {
    let (deps, manifests) = layout(kind)?;
    let (mark, _) = store::mark(slugs, previous)?;
    if mark.kind != kind || mark.built_with.is_none() || mark.built_with != interpreter(kind) {
        return None;
    }
    let old_tree = store::tree(slugs, previous);
    let (old, new) = (Root::open(&old_tree).ok()?, Root::open(tree).ok()?);
    let read = |root: &Root, name: &str| root.read(name, MAX_MANIFEST).ok().flatten();
    // The first file must be there in the new tree: without a lock file (or requirements)
    // there is nothing to compare.
    read(&new, manifests[0])?;
    let same = manifests
        .iter()
        .all(|m| read(&old, m).is_some() && read(&old, m) == read(&new, m));
    let from = old_tree.join(deps);
    if !std::fs::symlink_metadata(&from).ok()?.is_dir() {
        return None;
    }
    let to = tree.join(deps);
    // What the pushed tree brought under that name gives way to what was built.
    match std::fs::symlink_metadata(&to) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(&to).ok()?,
        Ok(_) => std::fs::remove_file(&to).ok()?,
        Err(_) => {}
    }
    if let Err(e) = copy_tree(&from, &to) {
        tracing::warn!(error = %e, "cannot copy the dependencies of the serving release; building from nothing");
        let _ = std::fs::remove_dir_all(&to);
        return None;
    }
    Some(if same {
        Reuse::Unchanged
    } else {
        Reuse::Changed
    })
}

/// Copies the directory `from` to `to` (which must not exist) without following links.
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir(to)?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755))?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type()?;
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src)?, &dst)?;
        } else if kind.is_dir() {
            copy_tree(&src, &dst)?;
        } else if kind.is_file() {
            let mode = entry.metadata()?.mode();
            std::fs::copy(&src, &dst)?;
            let exec = if mode & 0o111 != 0 { 0o755 } else { 0o644 };
            std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(exec))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_without_following_links_and_leaves_out_the_rest() {
        let d = tempfile::tempdir().unwrap();
        let from = d.path().join("from");
        std::fs::create_dir_all(from.join("bin")).unwrap();
        std::fs::write(from.join("bin/tool"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(
            from.join("bin/tool"),
            std::fs::Permissions::from_mode(0o555),
        )
        .unwrap();
        std::fs::write(from.join("lib.py"), "x = 1\n").unwrap();
        std::fs::set_permissions(from.join("lib.py"), std::fs::Permissions::from_mode(0o444))
            .unwrap();
        let outside = d.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(&outside, from.join("escape")).unwrap();
        nix::unistd::mkfifo(&from.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let to = d.path().join("to");
        copy_tree(&from, &to).unwrap();
        assert_eq!(std::fs::read_link(to.join("escape")).unwrap(), outside);
        assert!(std::fs::symlink_metadata(to.join("escape"))
            .unwrap()
            .is_symlink());
        assert!(!to.join("fifo").exists());
        let mode = |p: &str| std::fs::metadata(to.join(p)).unwrap().mode() & 0o777;
        assert_eq!(mode("bin/tool"), 0o755);
        assert_eq!(mode("lib.py"), 0o644);
        assert_eq!(mode("bin"), 0o755);
    }
}
