//! Restart bookkeeping of kept instances and warm-pool spares on this node, per app and label.
//!
//! A kept instance or a spare that crashes (or fails to start) is replaced after an exponential
//! backoff; enough crashes in a row mark a crash loop, published with the last lines of output
//! at `health/<app>/<node>` for `warden status`. This module holds that state and the starts of
//! kept instances under way; it starts nothing itself (see `crate::supervise`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use warden_core::{model::now_ms, AppHealth, LabelHealth};

use crate::sync::lock;

/// First restart delay after a crash; doubled per crash in a row.
const BACKOFF_START: Duration = Duration::from_millis(500);
/// Longest restart delay.
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Crashes in a row that make a crash loop.
const CRASH_LOOP: u32 = 3;
/// An instance that stays up this long ends a run of crashes.
const STABLE_AFTER: Duration = Duration::from_secs(10);

/// (app, label).
pub(crate) type LabelKey = (String, String);

#[derive(Default)]
struct LabelState {
    crashes: u32,
    next_start: Option<Instant>,
    next_start_ms: u64,
    last_exit: String,
    last_lines: String,
    up_since: Option<Instant>,
}

#[derive(Default)]
struct State {
    labels: HashMap<LabelKey, LabelState>,
    /// Starts of kept instances in progress on this node.
    pending: HashMap<LabelKey, u32>,
    /// Apps whose health record must be written again.
    dirty: HashSet<String>,
}

/// Restart bookkeeping of kept instances and warm-pool spares on this node, per app and label.
#[derive(Default)]
pub(crate) struct Restarts {
    state: Mutex<State>,
}

pub(crate) fn backoff(crashes: u32) -> Duration {
    let exp = crashes.saturating_sub(1).min(16);
    (BACKOFF_START * 2u32.pow(exp)).min(BACKOFF_MAX)
}

// === impl Restarts ===

impl Restarts {
    /// A kept instance or a spare of (app, label) crashed or failed to start.
    pub(crate) fn crashed(&self, app: &str, label: &str, status: &str, tail: &str) {
        let mut s = lock(&self.state);
        let l = s
            .labels
            .entry((app.to_owned(), label.to_owned()))
            .or_default();
        l.crashes += 1;
        l.up_since = None;
        let delay = backoff(l.crashes);
        l.next_start = Some(Instant::now() + delay);
        l.next_start_ms = now_ms() + delay.as_millis() as u64;
        l.last_exit = status.to_owned();
        l.last_lines = tail.to_owned();
        tracing::warn!(app, label, crashes = l.crashes, retry_ms = delay.as_millis() as u64, %status, "kept instance or spare crashed; restarting after backoff");
        s.dirty.insert(app.to_owned());
    }

    pub(crate) fn started(&self, app: &str, label: &str) {
        let mut s = lock(&self.state);
        let key = (app.to_owned(), label.to_owned());
        if let Some(l) = s.labels.get_mut(&key) {
            l.up_since = Some(Instant::now());
        }
    }

    pub(crate) fn forget_app(&self, app: &str) {
        let mut s = lock(&self.state);
        s.labels.retain(|(a, _), _| a != app);
        s.pending.retain(|(a, _), _| a != app);
        s.dirty.remove(app);
    }

    /// After a new lease every health record must be written again.
    pub(crate) fn republish_all(&self) {
        let mut s = lock(&self.state);
        let apps: Vec<String> = s.labels.keys().map(|(a, _)| a.clone()).collect();
        s.dirty.extend(apps);
    }

    pub(crate) fn may_start(&self, key: &LabelKey) -> bool {
        let s = lock(&self.state);
        s.labels
            .get(key)
            .and_then(|l| l.next_start)
            .is_none_or(|t| Instant::now() >= t)
    }

    pub(crate) fn pending(&self, key: &LabelKey) -> u32 {
        lock(&self.state).pending.get(key).copied().unwrap_or(0)
    }

    pub(crate) fn add_pending(&self, key: &LabelKey, delta: i32) {
        let mut s = lock(&self.state);
        let n = s.pending.entry(key.clone()).or_default();
        *n = n.saturating_add_signed(delta);
        if *n == 0 {
            s.pending.remove(key);
        }
    }

    /// Ends runs of crashes whose instance has stayed up.
    pub(crate) fn settle(&self) {
        let mut s = lock(&self.state);
        let mut settled = Vec::new();
        for ((app, _), l) in s.labels.iter_mut() {
            if l.crashes > 0 && l.up_since.is_some_and(|t| t.elapsed() >= STABLE_AFTER) {
                l.crashes = 0;
                l.next_start = None;
                l.next_start_ms = 0;
                settled.push(app.clone());
            }
        }
        s.dirty.extend(settled);
    }

    /// Health records to write (Some) or delete (None), per app, clearing the dirty marks.
    pub(crate) fn take_dirty(&self) -> Vec<(String, Option<AppHealth>)> {
        let mut s = lock(&self.state);
        let dirty: Vec<String> = s.dirty.drain().collect();
        dirty
            .into_iter()
            .map(|app| {
                let labels: BTreeMap<String, LabelHealth> = s
                    .labels
                    .iter()
                    .filter(|((a, _), l)| *a == app && l.crashes > 0)
                    .map(|((_, label), l)| {
                        (
                            label.clone(),
                            LabelHealth {
                                crashes: l.crashes,
                                crash_loop: l.crashes >= CRASH_LOOP,
                                last_exit: l.last_exit.clone(),
                                last_lines: l.last_lines.clone(),
                                next_start_ms: l.next_start_ms,
                            },
                        )
                    })
                    .collect();
                let health = (!labels.is_empty()).then_some(AppHealth { labels });
                (app, health)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        assert_eq!(backoff(1), Duration::from_millis(500));
        assert_eq!(backoff(2), Duration::from_secs(1));
        assert_eq!(backoff(4), Duration::from_secs(4));
        assert_eq!(backoff(40), BACKOFF_MAX);
    }

    #[test]
    fn crashes_in_a_row_make_a_crash_loop_and_are_reported() {
        let k = Restarts::default();
        for _ in 0..CRASH_LOOP {
            k.crashed("web", "PUBLIC", "exit status: 3", "boom");
        }
        assert!(!k.may_start(&("web".into(), "PUBLIC".into())));
        let dirty = k.take_dirty();
        let h = dirty[0].1.as_ref().expect("health record");
        let l = &h.labels["PUBLIC"];
        assert!(l.crash_loop);
        assert_eq!(l.crashes, CRASH_LOOP);
        assert_eq!(l.last_lines, "boom");
        assert!(k.take_dirty().is_empty());
    }
}
