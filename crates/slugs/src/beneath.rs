//! Opening files inside a pushed tree or a slug. A tree is the pusher's: its symlinks may chain
//! (`b/c -> ..`, then `a -> b/c/..`) to anywhere, and warden runs as root. So every path in a
//! tree is resolved by the kernel beneath the tree's root at the moment it is opened
//! (`openat2` with `RESOLVE_BENEATH`, no magic links), never checked as text first, and every
//! read is bounded. Every module of the build opens tree files through [`Root`].

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};

/// Why a file in a tree could not be opened or read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BeneathError {
    #[error("{0} leads outside the tree (through a symlink or an absolute path); a tree may use only its own files")]
    Outside(PathBuf),
    #[error("{0} goes through a symlink, which warden does not follow there")]
    Symlink(PathBuf),
    #[error("{0} is not a regular file")]
    NotAFile(PathBuf),
    #[error("{path} is larger than the {max} bytes warden reads of it")]
    TooLarge { path: PathBuf, max: u64 },
    #[error("cannot open {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl BeneathError {
    /// Whether the file is simply not there.
    pub(crate) fn is_absent(&self) -> bool {
        matches!(self, Self::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }
}

/// How symlinks inside the tree are treated on the way to a file.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Links {
    /// Followed, as long as each step stays beneath the root.
    Follow,
    /// Refused anywhere on the path, the last component included.
    Refuse,
}

/// The root of a tree, held open: paths are resolved beneath it.
pub(crate) struct Root {
    fd: OwnedFd,
}

// === impl Root ===

impl Root {
    /// Holds the directory `dir` open as a root.
    pub(crate) fn open(dir: &Path) -> std::io::Result<Self> {
        let fd = nix::fcntl::open(
            dir,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )?;
        Ok(Self { fd })
    }

    /// Opens `rel` beneath the root with `flags`.
    pub(crate) fn open_at(
        &self,
        rel: &Path,
        flags: OFlag,
        links: Links,
    ) -> Result<OwnedFd, BeneathError> {
        let mut resolve = ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS;
        let mut flags = flags | OFlag::O_CLOEXEC;
        if links == Links::Refuse {
            resolve |= ResolveFlag::RESOLVE_NO_SYMLINKS;
            flags |= OFlag::O_NOFOLLOW;
        }
        let how = OpenHow::new().flags(flags).resolve(resolve);
        nix::fcntl::openat2(&self.fd, rel, how).map_err(|e| match e {
            Errno::EXDEV => BeneathError::Outside(rel.to_owned()),
            Errno::ELOOP if links == Links::Refuse => BeneathError::Symlink(rel.to_owned()),
            e => BeneathError::Io {
                path: rel.to_owned(),
                source: e.into(),
            },
        })
    }

    /// The regular file `rel`, opened to read (without blocking on a FIFO).
    pub(crate) fn file(&self, rel: &Path, links: Links) -> Result<std::fs::File, BeneathError> {
        self.file_with(rel, OFlag::O_RDONLY, links)
    }

    /// The regular file `rel`, opened with `flags`.
    pub(crate) fn file_with(
        &self,
        rel: &Path,
        flags: OFlag,
        links: Links,
    ) -> Result<std::fs::File, BeneathError> {
        let file = std::fs::File::from(self.open_at(rel, flags | OFlag::O_NONBLOCK, links)?);
        let meta = file.metadata().map_err(|source| BeneathError::Io {
            path: rel.to_owned(),
            source,
        })?;
        if !meta.is_file() {
            return Err(BeneathError::NotAFile(rel.to_owned()));
        }
        Ok(file)
    }

    /// Whether `rel` is a regular file beneath the root.
    pub(crate) fn is_file(&self, rel: impl AsRef<Path>) -> bool {
        self.file(rel.as_ref(), Links::Follow).is_ok()
    }

    /// The bytes of the regular file `rel`, refusing one past `max` bytes; `None` when it is
    /// not there.
    pub(crate) fn read(
        &self,
        rel: impl AsRef<Path>,
        max: u64,
    ) -> Result<Option<Vec<u8>>, BeneathError> {
        let rel = rel.as_ref();
        let file = match self.file(rel, Links::Follow) {
            Ok(f) => f,
            Err(e) if e.is_absent() => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        file.take(max + 1)
            .read_to_end(&mut out)
            .map_err(|source| BeneathError::Io {
                path: rel.to_owned(),
                source,
            })?;
        if out.len() as u64 > max {
            return Err(BeneathError::TooLarge {
                path: rel.to_owned(),
                max,
            });
        }
        Ok(Some(out))
    }

    /// Checks that `rel`, symlinks followed, stays beneath the root (a dangling link is fine:
    /// it opens nothing).
    pub(crate) fn resolves_beneath(&self, rel: &Path) -> Result<(), BeneathError> {
        match self.open_at(rel, OFlag::O_PATH, Links::Follow) {
            Ok(_) => Ok(()),
            Err(BeneathError::Io { source, .. })
                if source.raw_os_error() == Some(libc::ENOENT)
                    || source.raw_os_error() == Some(libc::ENOTDIR) =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chained_links_do_not_lead_out() {
        let outer = tempfile::tempdir().expect("dir");
        std::fs::write(outer.path().join("secret"), "web: cat /etc/shadow").expect("write");
        let tree = outer.path().join("tree");
        std::fs::create_dir_all(tree.join("b")).expect("b");
        std::fs::write(tree.join("own"), "mine").expect("own");
        // Each looks inside as text; together they reach the tree's parent.
        std::os::unix::fs::symlink("..", tree.join("b/c")).expect("link");
        std::os::unix::fs::symlink("b/c/..", tree.join("a")).expect("link");
        std::os::unix::fs::symlink("a/secret", tree.join("Procfile")).expect("link");
        std::os::unix::fs::symlink("own", tree.join("alias")).expect("link");
        std::os::unix::fs::symlink("/dev/zero", tree.join("zero")).expect("link");
        let root = Root::open(&tree).expect("root");
        assert!(matches!(
            root.read("Procfile", 1 << 16),
            Err(BeneathError::Outside(_))
        ));
        assert!(root.resolves_beneath(Path::new("a")).is_err());
        assert!(matches!(
            root.read("zero", 1 << 16),
            Err(BeneathError::Outside(_))
        ));
        assert!(!root.is_file("../secret") && !root.is_file("/etc/passwd"));
        assert_eq!(
            root.read("alias", 16).expect("read"),
            Some(b"mine".to_vec())
        );
        assert!(matches!(
            root.file(Path::new("alias"), Links::Refuse),
            Err(BeneathError::Symlink(_))
        ));
        assert!(matches!(
            root.read("own", 3),
            Err(BeneathError::TooLarge { .. })
        ));
        assert_eq!(root.read("missing", 16).expect("absent"), None);
    }
}
