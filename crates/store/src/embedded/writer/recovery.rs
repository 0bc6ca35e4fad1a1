//! After a failed commit: telling a full disk by name, reopening the file (the engine refuses
//! everything after a failed commit until then), and learning with an empty commit when writes
//! work again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Writer;
use crate::StoreError;

/// First pause between attempts to reopen the file after a failed commit; doubled up to
/// [`REOPEN_MAX`].
const REOPEN_START: Duration = Duration::from_millis(100);
const REOPEN_MAX: Duration = Duration::from_secs(5);

/// Whether `e` only echoes an earlier failure: the engine refusing everything after a failed
/// commit, or the file being reopened.
pub(crate) fn echo(e: &StoreError) -> bool {
    matches!(e, StoreError::Engine { reason, .. }
        if reason.contains("Previous I/O error") || reason.contains("being reopened"))
}

/// A full disk said as such, so that callers can tell the operator what to do.
pub(super) fn classified(e: StoreError) -> StoreError {
    match &e {
        StoreError::Engine { reason, .. }
            if reason.contains("No space left on device")
                || reason.contains("os error 28")
                || reason.contains("Disk quota exceeded") =>
        {
            StoreError::NoSpace {
                reason: reason.clone(),
            }
        }
        _ => e,
    }
}

// === impl Writer (recovery) ===

impl Writer {
    /// While writes fail: reopens the file when due (the engine refuses everything after a
    /// failed commit), and once it is open tries an empty commit, so that the store says it
    /// works again as soon as the disk has room, even with nothing to write.
    pub(super) fn recover(&mut self) {
        if let Some((due, pause)) = self.reopen {
            if Instant::now() < due {
                return;
            }
            match self.reopen_file() {
                Ok(()) => {
                    tracing::info!(path = %self.shared.path.display(), "store file reopened after a failed write");
                    self.reopen = None;
                }
                Err(e) => {
                    warden_core::log_limited!(warn, error = %e, "reopening the store file failed; trying again");
                    self.reopen = Some((Instant::now() + pause, (pause * 2).min(REOPEN_MAX)));
                    return;
                }
            }
        }
        if self.shared.failure().is_some() {
            self.process_probe();
        }
    }

    /// Closes the file (once the readers of the moment are done with it) and opens it again,
    /// which lets the engine recover its last commit.
    fn reopen_file(&mut self) -> Result<(), StoreError> {
        let old = self
            .shared
            .db
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(mut old) = old {
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match Arc::try_unwrap(old) {
                    Ok(db) => {
                        drop(db);
                        break;
                    }
                    Err(still) if Instant::now() < deadline => {
                        old = still;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(still) => {
                        *self.shared.db.write().unwrap_or_else(|p| p.into_inner()) = Some(still);
                        return Err(StoreError::Engine {
                            op: "reopen",
                            reason: "readers still hold the file".into(),
                        });
                    }
                }
            }
        }
        let db = crate::embedded::open_db(&self.shared.path)?;
        *self.shared.db.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(db));
        self.reload()
    }

    /// An empty commit, to learn whether writes work again.
    fn process_probe(&mut self) {
        let mut events = Vec::new();
        let mut answers = Vec::new();
        match self.apply_batch(Vec::new(), &[], &mut events, &mut answers) {
            Ok(()) => {
                tracing::info!("store writes work again");
                self.shared.set_failure(None);
            }
            Err(e) => self.failed(e),
        }
    }

    /// A commit failed: callers hear why, and the file is reopened before the next attempt.
    pub(super) fn failed(&mut self, e: StoreError) {
        let e = classified(e);
        // The first cause stays the one told until writes work again.
        if !(echo(&e) && self.shared.failure().is_some()) {
            self.shared.set_failure(Some(e));
        }
        if let Err(e) = self.reload() {
            tracing::debug!(error = %e, "store state reload after a failed commit failed");
        }
        self.schedule_reopen();
    }

    /// Opens the file again soon, unless a reopen is already due.
    pub(super) fn schedule_reopen(&mut self) {
        if self.reopen.is_none() {
            self.reopen = Some((Instant::now() + REOPEN_START, REOPEN_START * 2));
        }
    }
}
