//! Files in the data directory that hold secrets: created with mode 0600, replaced atomically.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use anyhow::Context;

/// Creates `dir` (mode 0700) if missing.
pub fn ensure_private_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create data directory {}", dir.display()))
}

/// Creates the data directory. Run as root it is mode 0711, passable but not listable, and
/// nothing else: `process` instances run under uids of their own and must reach their private
/// directory under `instances/`, while every file here is mode 0600 and every other directory
/// 0700, so they read nothing of warden's. Run as a user, 0700.
pub fn ensure_data_dir(dir: &Path) -> anyhow::Result<()> {
    ensure_private_dir(dir)?;
    let mode = if nix::unistd::geteuid().is_root() {
        0o711
    } else {
        0o700
    };
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of data directory {}", dir.display()))
}

/// Makes the store's file, if the backend keeps one in `dir`, readable by warden alone: it
/// holds password hashes and sessions.
pub fn protect_store_file(dir: &Path) -> anyhow::Result<()> {
    let file = dir.join("store.redb");
    match std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("cannot make {} private (chmod 600)", file.display()))
        }
        _ => Ok(()),
    }
}

/// Writes `contents` to `path` with mode 0600 via a temporary file and rename, so a crash never
/// leaves a half-written secret behind.
pub fn write_private(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("cannot create {}", tmp.display()))?;
    f.write_all(contents)
        .and_then(|_| f.sync_all())
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("cannot move {} into place", path.display()))?;
    Ok(())
}

/// Reads a secret file, refusing one that others can read.
pub fn read_private(path: &Path) -> anyhow::Result<Option<String>> {
    match std::fs::metadata(path) {
        Ok(m) if m.permissions().mode() & 0o077 != 0 => anyhow::bail!(
            "{} is readable by other users (mode {:o}); run `chmod 600 {}` and start again",
            path.display(),
            m.permissions().mode() & 0o777,
            path.display()
        ),
        Ok(_) => {
            Ok(Some(std::fs::read_to_string(path).with_context(|| {
                format!("cannot read {}", path.display())
            })?))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// The secret in the file at `path`, made by `make` and written (mode 0600) when the file is
/// missing or empty.
pub(crate) fn load_or_create(path: &Path, make: impl FnOnce() -> String) -> anyhow::Result<String> {
    if let Some(v) = read_private(path)? {
        let v = v.trim().to_owned();
        if !v.is_empty() {
            return Ok(v);
        }
    }
    let v = make();
    write_private(path, v.as_bytes())?;
    Ok(v)
}
