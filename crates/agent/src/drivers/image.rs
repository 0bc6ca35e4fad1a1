//! The running warden's own image, which starts its helpers (`warden sandbox-init`, the user
//! namespace check): held open from the start, so that replacing or deleting the binary on
//! disk, as any package upgrade does, never breaks a running warden.

use std::os::fd::AsRawFd;
use std::path::PathBuf;

/// The image, opened close-on-exec (std's default): no instance inherits it.
static IMAGE: std::sync::OnceLock<std::fs::File> = std::sync::OnceLock::new();

/// Opens the running image. Call it first thing, before the file on disk can change; a warden
/// that cannot starts its helpers from the binary's path instead.
pub fn hold_own_image() {
    match std::fs::File::open("/proc/self/exe") {
        Ok(f) => {
            let _ = IMAGE.set(f);
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot hold the running binary open; replacing it on disk will break sandbox starts until warden restarts")
        }
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
