//! An app's push lock: one `git push` of an app builds at a time, and `apps rm` removes the
//! app's repository only while no push holds it. It is held, through clones of one `Arc`, by
//! the task that waits for `git receive-pack` to exit (so git has moved its ref, or not, before
//! the next push reads it) and by the task that follows the push's release to its last event
//! (a push cut off mid-build does not stop the release). In this process only: one API process
//! owns a data directory, and so the repositories in it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The repositories a push (or a removal) holds, in this process.
static HELD: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// One repository's lock, given back when the last clone is dropped.
pub(crate) type Lock = Arc<Taken>;

/// The lock of one repository, given back when dropped.
#[derive(Debug)]
pub(crate) struct Taken(PathBuf);

impl Taken {
    /// The lock of `repo`, unless something holds it.
    pub(crate) fn take(repo: &Path) -> Option<Lock> {
        // A poisoned list still holds the right names: a panic cannot leave it half-changed.
        let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
        if held.iter().any(|r| r == repo) {
            return None;
        }
        held.push(repo.to_owned());
        Some(Arc::new(Self(repo.to_owned())))
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        let mut held = HELD.lock().unwrap_or_else(|p| p.into_inner());
        held.retain(|r| *r != self.0);
    }
}

/// Where a push keeps its lock once its hook took it; the task waiting for git holds this
/// slot until git exits.
pub(crate) type Slot = Arc<Mutex<Option<Lock>>>;
