//! Locks of plain maps and counters.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`. A panic while holding one of the agent's locks leaves plain maps and counters
/// behind, still usable, so a poisoned lock is taken as it is.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
