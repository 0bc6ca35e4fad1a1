//! Crash bookkeeping of every instance on this node, per app, label and owner (the user of a
//! per-user instance; nobody for the rest).
//!
//! An instance that exits without being asked to (or fails to start) counts as a crash. The
//! first crash in a row may be restarted at once; after that every start for the same key
//! waits out one exponential backoff, whoever asks for it: a request (which gets 503 with
//! `Retry-After` meanwhile, see `Lifecycle::ensure`), a desired count or a warm pool. Enough
//! crashes in a row mark a crash loop, published with the last lines of output at
//! `health/<app>/<node>` for `warden status`. An instance that stays up ends the run. This
//! module holds that state and the starts of kept instances under way; it starts nothing
//! itself (see `crate::supervise`).
//!
//! During a run of crashes, each backoff window admits one start of a key, whoever asks
//! ([`Restarts::admit`]): the caller that gets it holds a [`Ticket`] until its start is over;
//! concurrent requests wait for that start and then get its answer (the next window if it
//! crashed too), kept and spare starts skip the turn. N clients never make N starts at once.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use warden_core::{model::now_ms, AppHealth, LabelHealth};

use crate::sync::lock;

/// Restart delay after the second crash in a row (the first is restarted at once); doubled
/// per crash after that.
const BACKOFF_START: Duration = Duration::from_millis(500);
/// Longest restart delay.
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Crashes in a row that make a crash loop.
const CRASH_LOOP: u32 = 3;
/// An instance that stays up this long ends a run of crashes: its own exit after that is a
/// first crash again, restarted at once. Short, so that an instance killed now and then (an
/// operator, the out-of-memory killer) is replaced without delay, while an app that dies on
/// its first requests is still a loop.
const STABLE_AFTER: Duration = Duration::from_secs(2);
/// The same for a process type's instance (`APP~TYPE`, a worker): it is ready half a second
/// after it starts, serves no requests that would show it dead, and a job that exits every few
/// seconds must still be a crash loop rather than restarted at once forever.
const WORKER_STABLE_AFTER: Duration = Duration::from_secs(30);
/// Least delay before a worker is started again after it exits, crash loop or not.
const WORKER_MIN_DELAY: Duration = Duration::from_secs(1);

/// How long an instance of `app` stays up to end a run of crashes.
fn stable_after(app: &str) -> Duration {
    match warden_core::split_process_app(app) {
        Some(_) => WORKER_STABLE_AFTER,
        None => STABLE_AFTER,
    }
}

/// The delay before `app` is started again after its `crashes`-th crash in a row.
fn restart_delay(app: &str, crashes: u32) -> Duration {
    match warden_core::split_process_app(app) {
        Some(_) => backoff(crashes).max(WORKER_MIN_DELAY),
        None => backoff(crashes),
    }
}

/// (app, label).
pub(crate) type LabelKey = (String, String);
/// (app, label, owner): the owner is the user of a per-user instance, empty for the rest.
type CrashKey = (String, String, String);

#[derive(Default)]
struct LabelState {
    crashes: u32,
    next_start: Option<Instant>,
    next_start_ms: u64,
    last_exit: String,
    last_lines: String,
    last_instance: String,
    up_since: Option<Instant>,
    /// The one start of this window under way, while the run lasts; dropped when it is over,
    /// which wakes those waiting for it.
    probe: Option<watch::Sender<()>>,
}

#[derive(Default)]
struct State {
    labels: HashMap<CrashKey, LabelState>,
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

/// What a start of (app, label, owner) may do now: [`Restarts::admit`].
pub(crate) enum Admission {
    /// Start, holding the ticket until the start is over (ready or failed).
    Go(Ticket),
    /// This window's start is under way: wait until it is over (`changed()` returns), then ask
    /// again.
    Wait(watch::Receiver<()>),
    /// The last start crashed: none until the backoff is over; how long still, and how the
    /// last instance ended.
    Backoff(Duration, String),
}

/// Leave to start an instance of a key, held until the start is over. During a run of
/// crashes it is the window's only one: dropping it lets the next caller ask.
pub(crate) struct Ticket {
    probe: Option<(Arc<Restarts>, CrashKey)>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some((restarts, key)) = self.probe.take() {
            if let Some(l) = lock(&restarts.state).labels.get_mut(&key) {
                l.probe = None;
            }
        }
    }
}

pub(crate) fn backoff(crashes: u32) -> Duration {
    if crashes <= 1 {
        return Duration::ZERO;
    }
    let exp = crashes.saturating_sub(2).min(16);
    (BACKOFF_START * 2u32.pow(exp)).min(BACKOFF_MAX)
}

fn crash_key(app: &str, label: &str, owner: &str) -> CrashKey {
    (app.to_owned(), label.to_owned(), owner.to_owned())
}

// === impl Restarts ===

impl Restarts {
    /// Instance `instance` ("" when it never got one) of (app, label) for `owner` ("" for
    /// none) crashed or failed to start.
    pub(crate) fn crashed(
        &self,
        app: &str,
        label: &str,
        owner: &str,
        instance: &str,
        status: &str,
        tail: &str,
    ) {
        let mut s = lock(&self.state);
        let l = s.labels.entry(crash_key(app, label, owner)).or_default();
        if l.up_since.is_some_and(|t| t.elapsed() >= stable_after(app)) {
            l.crashes = 0;
        }
        l.crashes += 1;
        l.up_since = None;
        let delay = restart_delay(app, l.crashes);
        l.next_start = Some(Instant::now() + delay);
        l.next_start_ms = now_ms() + delay.as_millis() as u64;
        l.last_exit = status.to_owned();
        l.last_lines = tail.to_owned();
        l.last_instance = instance.to_owned();
        tracing::warn!(app, label, owner, crashes = l.crashes, retry_ms = delay.as_millis() as u64, %status, "instance crashed; the next start waits out the backoff");
        s.dirty.insert(app.to_owned());
    }

    /// An instance of (app, label) for `owner` started: it ends the run of crashes once it
    /// has stayed up a while.
    pub(crate) fn started(&self, app: &str, label: &str, owner: &str) {
        let mut s = lock(&self.state);
        if let Some(l) = s.labels.get_mut(&crash_key(app, label, owner)) {
            l.up_since = Some(Instant::now());
        }
    }

    /// Whether a start of (app, label, owner) may begin now. Outside a run of crashes, always;
    /// in one, once per backoff window, whoever asks: the first caller after the window opens
    /// gets the ticket, and until its start is over the others wait (or, not waiting, skip).
    pub(crate) fn admit(self: &Arc<Self>, app: &str, label: &str, owner: &str) -> Admission {
        let key = crash_key(app, label, owner);
        let mut s = lock(&self.state);
        let Some(l) = s.labels.get_mut(&key).filter(|l| l.crashes > 0) else {
            return Admission::Go(Ticket { probe: None });
        };
        if let Some(p) = &l.probe {
            return Admission::Wait(p.subscribe());
        }
        if let Some(left) = l
            .next_start
            .and_then(|t| t.checked_duration_since(Instant::now()))
            .filter(|left| !left.is_zero())
        {
            return Admission::Backoff(left, l.last_exit.clone());
        }
        l.probe = Some(watch::channel(()).0);
        Admission::Go(Ticket {
            probe: Some((self.clone(), key)),
        })
    }

    /// [`Restarts::admit`] for a start that does not wait: a ticket, or `None` when the window
    /// is closed or its start is under way.
    pub(crate) fn try_admit(self: &Arc<Self>, key: &LabelKey) -> Option<Ticket> {
        match self.admit(&key.0, &key.1, "") {
            Admission::Go(t) => Some(t),
            Admission::Wait(_) | Admission::Backoff(..) => None,
        }
    }

    /// How long a start for (app, label, owner) must still wait, and how the last instance
    /// ended; `None` when it may start now.
    pub(crate) fn waiting(
        &self,
        app: &str,
        label: &str,
        owner: &str,
    ) -> Option<(Duration, String)> {
        let s = lock(&self.state);
        let l = s.labels.get(&crash_key(app, label, owner))?;
        let left = l.next_start?.checked_duration_since(Instant::now())?;
        (!left.is_zero()).then(|| (left, l.last_exit.clone()))
    }

    pub(crate) fn forget_app(&self, app: &str) {
        let mut s = lock(&self.state);
        s.labels.retain(|(a, _, _), _| a != app);
        s.pending.retain(|(a, _), _| a != app);
        s.dirty.remove(app);
    }

    /// After a new lease every health record must be written again.
    pub(crate) fn republish_all(&self) {
        let mut s = lock(&self.state);
        let apps: Vec<String> = s.labels.keys().map(|(a, _, _)| a.clone()).collect();
        s.dirty.extend(apps);
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
        for ((app, _, _), l) in s.labels.iter_mut() {
            if l.crashes > 0 && l.up_since.is_some_and(|t| t.elapsed() >= stable_after(app)) {
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
                // Per label, the owner whose run of crashes is longest.
                let mut labels: BTreeMap<String, LabelHealth> = BTreeMap::new();
                for ((a, label, _), l) in &s.labels {
                    if *a != app || l.crashes == 0 {
                        continue;
                    }
                    if labels.get(label).is_some_and(|h| h.crashes >= l.crashes) {
                        continue;
                    }
                    labels.insert(
                        label.clone(),
                        LabelHealth {
                            crashes: l.crashes,
                            crash_loop: l.crashes >= CRASH_LOOP,
                            last_exit: l.last_exit.clone(),
                            last_lines: l.last_lines.clone(),
                            last_instance: l.last_instance.clone(),
                            next_start_ms: l.next_start_ms,
                        },
                    );
                }
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
        assert_eq!(backoff(1), Duration::ZERO);
        assert_eq!(backoff(2), Duration::from_millis(500));
        assert_eq!(backoff(3), Duration::from_secs(1));
        assert_eq!(backoff(5), Duration::from_secs(4));
        assert_eq!(backoff(40), BACKOFF_MAX);
    }

    #[test]
    fn crashes_in_a_row_make_a_crash_loop_and_are_reported() {
        let k = Arc::new(Restarts::default());
        for _ in 0..CRASH_LOOP {
            k.crashed(
                "web",
                "PUBLIC",
                "",
                "0123456789abcdef",
                "exit status: 3",
                "boom",
            );
        }
        assert!(k.try_admit(&("web".into(), "PUBLIC".into())).is_none());
        let dirty = k.take_dirty();
        let h = dirty[0].1.as_ref().expect("health record");
        let l = &h.labels["PUBLIC"];
        assert!(l.crash_loop);
        assert_eq!(l.crashes, CRASH_LOOP);
        assert_eq!(l.last_lines, "boom");
        assert!(k.take_dirty().is_empty());
    }

    #[test]
    fn a_window_admits_one_start_whoever_asks() {
        let k = Arc::new(Restarts::default());
        // Outside a run of crashes, every start goes.
        let free: Vec<_> = (0..4).map(|_| k.admit("web", "PUBLIC", "")).collect();
        assert!(free.iter().all(|a| matches!(a, Admission::Go(_))));
        drop(free);
        // The first crash opens a window at once, for one start.
        k.crashed("web", "PUBLIC", "", "i1", "exit status: 3", "");
        let Admission::Go(ticket) = k.admit("web", "PUBLIC", "") else {
            panic!("the window's start is refused");
        };
        let waiting = match k.admit("web", "PUBLIC", "") {
            Admission::Wait(rx) => rx,
            _ => panic!("a second start in the window"),
        };
        assert!(k.try_admit(&("web".into(), "PUBLIC".into())).is_none());
        // Another owner's key is its own.
        assert!(matches!(k.admit("web", "PUBLIC", "bob"), Admission::Go(_)));
        // The window's start crashes too: those waiting hear of it and get the backoff.
        k.crashed("web", "PUBLIC", "", "i2", "exit status: 3", "");
        drop(ticket);
        assert!(waiting.has_changed().is_err(), "the waiters are woken");
        assert!(matches!(
            k.admit("web", "PUBLIC", ""),
            Admission::Backoff(..)
        ));
    }
}
