//! The images the agent starts, held open from the start, so that replacing or deleting the
//! files on disk, as any package upgrade does, never breaks a running warden nor mixes versions:
//! the running warden's own (the user namespace check, the reaper) and the instance image
//! beside it, `warden-instance` (every sandbox's `sandbox-init`, and the demo app's command).

use std::os::fd::AsRawFd;
use std::path::PathBuf;

/// The file name of the instance image, installed in the same directory as `warden`.
pub const INSTANCE_IMAGE: &str = "warden-instance";

/// The running image, opened close-on-exec (std's default): no instance inherits it.
static IMAGE: std::sync::OnceLock<std::fs::File> = std::sync::OnceLock::new();

/// The instance image as opened at the start (close-on-exec too), or why it could not be.
static INSTANCE: std::sync::OnceLock<Result<Held, InstanceImageError>> = std::sync::OnceLock::new();

/// An image file held open, with the path it was opened at.
#[derive(Debug)]
struct Held {
    path: PathBuf,
    file: std::fs::File,
}

/// Why the instance image cannot be started.
#[derive(Debug, Clone, thiserror::Error)]
pub enum InstanceImageError {
    /// It is not beside the running `warden`, or cannot be opened.
    #[error("cannot open {}, the image every instance's own processes run (the sandbox's init, the demo app): {reason}; install it in the same directory as the warden binary (cargo builds both into one directory)", path.display())]
    Unopened {
        /// Where it was looked for.
        path: PathBuf,
        /// What opening it said.
        reason: String,
    },
    /// The running binary's own path is unknown, so nothing can be found beside it.
    #[error("cannot find the running warden binary's directory, where {INSTANCE_IMAGE} is looked for: {0}")]
    NoOwnPath(String),
}

/// Opens the running image and the instance image beside it. Call it first thing, before the
/// files on disk can change; a warden that cannot hold its own image starts its helpers from
/// the binary's path instead, and one that cannot open the instance image says so when its
/// agent starts (`Agent::start`).
pub fn hold_own_image() {
    match std::fs::File::open("/proc/self/exe") {
        Ok(f) => {
            let _ = IMAGE.set(f);
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot hold the running binary open; replacing it on disk will break sandbox starts until warden restarts")
        }
    }
    let _ = INSTANCE.set(open_instance_image());
}

/// The instance image's path beside the running binary, opened.
fn open_instance_image() -> Result<Held, InstanceImageError> {
    let own = std::env::current_exe().map_err(|e| InstanceImageError::NoOwnPath(e.to_string()))?;
    let path = own.with_file_name(INSTANCE_IMAGE);
    match std::fs::File::open(&path) {
        Ok(file) => Ok(Held { path, file }),
        Err(e) => Err(InstanceImageError::Unopened {
            path,
            reason: e.to_string(),
        }),
    }
}

/// A path that runs the running image: its held descriptor under `/proc/self/fd`, which a
/// child has until it execs (and execs through it). Without one, the binary's path.
pub(crate) fn own_image() -> std::io::Result<PathBuf> {
    match IMAGE.get() {
        Some(f) => Ok(PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()))),
        None => std::env::current_exe(),
    }
}

/// A path that runs the instance image as it was when this process started: its held
/// descriptor under `/proc/self/fd`, as `own_image`. In a process that never called
/// [`hold_own_image`], the file beside the running binary, opened now.
pub fn instance_image() -> Result<PathBuf, InstanceImageError> {
    match INSTANCE.get() {
        Some(Ok(held)) => Ok(PathBuf::from(format!(
            "/proc/self/fd/{}",
            held.file.as_raw_fd()
        ))),
        Some(Err(e)) => Err(e.clone()),
        None => open_instance_image().map(|held| held.path),
    }
}

/// Where the instance image is on disk, for commands stored to run later (the demo app's): a
/// held descriptor means nothing to another process.
pub fn instance_image_path() -> Result<PathBuf, InstanceImageError> {
    match INSTANCE.get() {
        Some(Ok(held)) => Ok(held.path.clone()),
        Some(Err(e)) => Err(e.clone()),
        None => open_instance_image().map(|held| held.path),
    }
}
