//! The sandbox's file system: what the helper opens while it can still see the host, and the
//! fresh read-only root init builds from it and pivots into.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

use super::SetupError;
use crate::{Plan, DATA_MOUNT};

/// Host directories shown read-only inside (those that exist; symlinks are recreated).
const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32", "/etc",
];
/// Device nodes bound inside.
const DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
];

/// A host path opened before the namespaces hide it.
pub(super) enum Shown {
    Dir {
        path: String,
        fd: OwnedFd,
        writable: bool,
    },
    File {
        path: String,
        fd: OwnedFd,
    },
    Link {
        path: String,
        target: PathBuf,
    },
}

fn open_path(path: &Path) -> std::io::Result<OwnedFd> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(path)?;
    Ok(OwnedFd::from(f))
}

fn under_system_dir(path: &str) -> bool {
    SYSTEM_DIRS
        .iter()
        .any(|d| path == *d || path.starts_with(&format!("{d}/")))
}

/// Opens everything the sandbox shows: the system directories, the program, the workdir and
/// the instance's data directory.
pub(super) fn open_shown(plan: &Plan, data: &Path) -> std::io::Result<Vec<Shown>> {
    let mut shown = Vec::new();
    for d in SYSTEM_DIRS {
        let p = Path::new(d);
        match std::fs::symlink_metadata(p) {
            Ok(m) if m.file_type().is_symlink() => shown.push(Shown::Link {
                path: (*d).into(),
                target: std::fs::read_link(p)?,
            }),
            Ok(m) if m.is_dir() => shown.push(Shown::Dir {
                path: (*d).into(),
                fd: open_path(p)?,
                writable: false,
            }),
            _ => {}
        }
    }
    let program = &plan.argv[0];
    if !under_system_dir(program) {
        shown.push(Shown::File {
            path: program.clone(),
            fd: open_path(Path::new(program))?,
        });
    }
    if let Some(w) = &plan.workdir {
        if !under_system_dir(w) {
            shown.push(Shown::Dir {
                path: w.clone(),
                fd: open_path(Path::new(w))?,
                writable: plan.build,
            });
        }
    }
    shown.push(Shown::Dir {
        path: DATA_MOUNT.into(),
        fd: open_path(data)?,
        writable: true,
    });
    Ok(shown)
}

/// Flags a read-only bind must keep: in a user namespace the kernel refuses a remount that
/// would drop nosuid, nodev, noexec or the atime flags of the original mount.
fn kept_flags(path: &Path) -> MsFlags {
    use nix::sys::statvfs::FsFlags;
    let Ok(st) = nix::sys::statvfs::statvfs(path) else {
        return MsFlags::empty();
    };
    let f = st.flags();
    let mut m = MsFlags::empty();
    for (fs, ms) in [
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if f.contains(fs) {
            m |= ms;
        }
    }
    m
}

fn bind(source: &Path, target: &Path, read_only: bool) -> Result<(), SetupError> {
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| {
        SetupError::sys(
            format!("bind {} on {}", source.display(), target.display()),
            e,
        )
    })?;
    if read_only {
        let flags =
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | kept_flags(target);
        mount(None::<&str>, target, None::<&str>, flags, None::<&str>).map_err(|e| {
            SetupError::sys(format!("read-only remount of {}", target.display()), e)
        })?;
    }
    Ok(())
}

fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

fn mkdir(path: &Path) -> Result<(), SetupError> {
    std::fs::create_dir_all(path).map_err(|e| SetupError::path("mkdir", path, e))
}

fn create(path: &Path) -> Result<(), SetupError> {
    std::fs::write(path, b"").map_err(|e| SetupError::path("create", path, e))
}

/// Builds the root under `stage` from what the helper opened.
fn build_root(stage: &Path, shown: &[Shown]) -> Result<(), SetupError> {
    // The private /tmp comes first: a program or workdir under the host's /tmp is bound on top
    // of it afterwards instead of being hidden by it.
    let tmp = stage.join("tmp");
    mkdir(&tmp)?;
    mount(
        Some("tmpfs"),
        &tmp,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=1777,size=64m"),
    )
    .map_err(|e| SetupError::sys("mount /tmp", e))?;
    for s in shown {
        match s {
            Shown::Link { path, target } => {
                let at = stage.join(path.trim_start_matches('/'));
                std::os::unix::fs::symlink(target, &at)
                    .map_err(|e| SetupError::path("symlink", &at, e))?;
            }
            Shown::Dir { path, fd, writable } => {
                let at = stage.join(path.trim_start_matches('/'));
                mkdir(&at)?;
                bind(&fd_path(fd), &at, !writable)?;
            }
            Shown::File { path, fd } => {
                let at = stage.join(path.trim_start_matches('/'));
                if let Some(parent) = at.parent() {
                    mkdir(parent)?;
                }
                create(&at)?;
                bind(&fd_path(fd), &at, true)?;
            }
        }
    }
    mkdir(&stage.join("dev"))?;
    for d in DEVICES {
        let at = stage.join(d.trim_start_matches('/'));
        if Path::new(d).exists() {
            create(&at)?;
            bind(Path::new(d), &at, false)?;
        }
    }
    for d in ["proc", ".old"] {
        mkdir(&stage.join(d))?;
    }
    Ok(())
}

/// Builds the sandbox's root from what the helper opened and makes it this mount namespace's
/// root, read-only, with a fresh /proc.
pub(super) fn enter_root(shown: &[Shown]) -> Result<(), SetupError> {
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| SetupError::sys("make mounts private", e))?;
    // Any directory works as the staging point: the helper already opened everything the
    // sandbox shows, so hiding the host's /tmp in this mount namespace costs nothing.
    let stage = Path::new("/tmp");
    mount(
        Some("tmpfs"),
        stage,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=0755,size=4m"),
    )
    .map_err(|e| SetupError::sys("mount the new root", e))?;
    build_root(stage, shown)?;
    // Before the pivot: the kernel allows a new proc mount in a user namespace only while a
    // fully visible one exists in the mount namespace, and the host's goes with the old root.
    if let Err(e) = mount(
        Some("proc"),
        &stage.join("proc"),
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    ) {
        // Some container runtimes mask parts of /proc, and the kernel then refuses a fresh
        // proc mount in a user namespace. The app runs without /proc rather than not at all.
        eprintln!("warden-sandbox: no /proc inside ({e}); continuing without it");
    }
    nix::unistd::pivot_root(stage, &stage.join(".old"))
        .map_err(|e| SetupError::sys("pivot_root", e))?;
    nix::unistd::chdir("/").map_err(|e| SetupError::sys("chdir /", e))?;
    umount2("/.old", MntFlags::MNT_DETACH)
        .map_err(|e| SetupError::sys("detach the old root", e))?;
    let _ = std::fs::remove_dir("/.old");
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None::<&str>,
    )
    .map_err(|e| SetupError::sys("make the root read-only", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_dir_prefixes_match_whole_components() {
        assert!(under_system_dir("/usr/bin/python3"));
        assert!(under_system_dir("/etc"));
        assert!(!under_system_dir("/usrlocal/app"));
        assert!(!under_system_dir("/work/app"));
    }
}
