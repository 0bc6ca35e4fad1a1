//! Rate limits for log lines that a tenant can trigger (an app that refuses connections, a
//! client that fails to sign in): a few lines per second per call site, and a count of what was
//! left out, so a flood can neither fill the disk nor slow the gateway down. Use it through
//! [`crate::log_limited!`].

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Lines a call site may log per window.
pub const LINES_PER_WINDOW: u32 = 10;
/// The window, in milliseconds.
pub const WINDOW_MS: u64 = 1_000;

/// The limit of one call site.
#[derive(Debug, Default)]
pub struct RateLimit {
    window_start_ms: AtomicU64,
    in_window: AtomicU32,
    suppressed: AtomicU64,
}

// === impl RateLimit ===

impl RateLimit {
    /// A limit with nothing logged yet.
    pub const fn new() -> Self {
        Self {
            window_start_ms: AtomicU64::new(0),
            in_window: AtomicU32::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// Whether a line may be logged at `now_ms`: `Some(n)` with the lines left out since the
    /// last one logged, `None` to leave this one out. Lock-free; under a race a window may let
    /// a line or two more through, never fewer.
    pub fn allow_at(&self, now_ms: u64) -> Option<u64> {
        let start = self.window_start_ms.load(Ordering::Relaxed);
        if now_ms.saturating_sub(start) >= WINDOW_MS
            && self
                .window_start_ms
                .compare_exchange(start, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.in_window.store(0, Ordering::Relaxed);
        }
        if self.in_window.fetch_add(1, Ordering::Relaxed) < LINES_PER_WINDOW {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }

    /// [`RateLimit::allow_at`] now.
    pub fn allow(&self) -> Option<u64> {
        self.allow_at(crate::model::now_ms())
    }
}

/// Logs like `tracing::$level!`, at most [`LINES_PER_WINDOW`] lines per [`WINDOW_MS`] from
/// this call site; the next line logged says how many were left out (`suppressed`).
#[macro_export]
macro_rules! log_limited {
    ($level:ident, $($rest:tt)+) => {{
        static LIMIT: $crate::ratelimit::RateLimit = $crate::ratelimit::RateLimit::new();
        if let Some(suppressed) = LIMIT.allow() {
            ::tracing::$level!(suppressed, $($rest)+);
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_cut_to_the_window_and_counted() {
        let l = RateLimit::new();
        let t = 10_000;
        let logged = (0..1000).filter(|_| l.allow_at(t).is_some()).count();
        assert_eq!(logged, LINES_PER_WINDOW as usize);
        // The next window logs again and says how many were left out.
        assert_eq!(
            l.allow_at(t + WINDOW_MS),
            Some(1000 - u64::from(LINES_PER_WINDOW))
        );
        assert_eq!(l.allow_at(t + WINDOW_MS), Some(0));
    }
}
