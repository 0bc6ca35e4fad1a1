//! Who commits: the caller, or the writer thread.
//!
//! A write is queued, and the caller that finds no commit under way commits the queue itself,
//! on its own thread: one transaction, one fsync, then the answers and the watchers. It first
//! yields once to the runtime, so that writes of the other tasks ready on its thread join the
//! same commit (they could not run while it commits); writes queued meanwhile by other callers
//! go in its next commit (a group commit), so they wait for it without a thread of their own.
//! Nobody hears "done" for a write that is not on disk.
//!
//! A caller leads for at most [`CALLER_ROUNDS`] commits: under a steady flood the queue never
//! empties, and one request must not pay for everyone's. It then hands the lead to the writer
//! thread, which commits until the queue is empty. That thread also expires leases and probes a
//! failing file when nothing else writes.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::writer::{Op, Writer, MAX_BATCH};
use crate::StoreError;

/// Commits a caller makes before it hands the rest of the queue to the writer thread: its own
/// and one of the writes that queued behind it.
const CALLER_ROUNDS: usize = 2;
/// The longest the writer thread sleeps when nothing is due: a failing file is probed this often.
const IDLE: Duration = Duration::from_secs(1);
/// How long a caller may hold the lead without starting to commit before the writer thread
/// takes it: a caller's future polled once and then kept, never polled again nor dropped,
/// would otherwise hold every write (and every lease's end) for good. The thread sees it when
/// it next wakes by itself (within [`IDLE`]): waking it at every caller's lead would cost every
/// commit a thread wake, for a case no caller in the workspace makes.
const STALLED: Duration = Duration::from_millis(100);

/// The queue of writes and who leads.
pub(super) struct Committer {
    queue: Mutex<Queue>,
    /// Wakes the writer thread: a hand-over, or the store closing.
    wake: Condvar,
    writer: Mutex<Writer>,
}

struct Queue {
    ops: Vec<Op>,
    /// Someone (a caller or the thread) is committing; they will take what is queued.
    leading: bool,
    /// A caller handed the lead to the writer thread.
    handed: bool,
    /// Counts leads: a caller's [`Lead`] is void once the thread took the lead from it.
    lead_gen: u64,
    /// Since when a caller holds the lead without having begun to commit.
    caller_since: Option<Instant>,
    closed: bool,
    /// When the writer must look next (a lease ends), as its last commit said.
    due: Instant,
    /// When the writer thread wakes by itself; a leader finding `due` earlier wakes it.
    thread_until: Instant,
}

/// A caller's lead: it commits the queue, or hands it to the writer thread if dropped first.
pub(super) struct Lead<'c> {
    committer: &'c Committer,
    gen: u64,
    done: bool,
}

// === impl Lead ===

impl Lead<'_> {
    /// Commits what is queued, on this thread, up to [`CALLER_ROUNDS`] commits; nothing if the
    /// writer thread took the lead meanwhile (it commits this caller's write too).
    pub(super) fn commit(mut self) {
        self.done = true;
        if self.committer.begin(self.gen) {
            self.committer.lead(Some(CALLER_ROUNDS));
        }
    }
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.committer.hand_over(self.gen);
        }
    }
}

// === impl Committer ===

impl Committer {
    pub(super) fn new(writer: Writer) -> Arc<Self> {
        Arc::new(Self {
            queue: Mutex::new(Queue {
                ops: Vec::new(),
                leading: false,
                handed: false,
                lead_gen: 0,
                caller_since: None,
                closed: false,
                due: Instant::now() + IDLE,
                thread_until: Instant::now(),
            }),
            wake: Condvar::new(),
            writer: Mutex::new(writer),
        })
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `op`. `Some` when no one else is committing: the caller then leads, committing
    /// the queue with [`Lead::commit`]; else whoever leads takes `op` in their next commit. The
    /// answer comes through the op's reply either way.
    pub(super) fn submit(&self, op: Op) -> Result<Option<Lead<'_>>, StoreError> {
        let mut q = self.queue();
        if q.closed {
            return Err(StoreError::Closed);
        }
        q.ops.push(op);
        let lead = !std::mem::replace(&mut q.leading, true);
        if lead {
            q.lead_gen += 1;
            q.caller_since = Some(Instant::now());
        }
        let gen = q.lead_gen;
        drop(q);
        // Made only for the leader (lazily: a `Lead` dropped unused hands the queue to the
        // thread).
        Ok(lead.then(|| Lead {
            committer: self,
            gen,
            done: false,
        }))
    }

    /// Whether the caller holding lead `gen` still leads, as it begins to commit.
    fn begin(&self, gen: u64) -> bool {
        let mut q = self.queue();
        if q.lead_gen != gen {
            return false;
        }
        q.caller_since = None;
        true
    }

    /// Gives the lead to the writer thread (a leading caller that went away before it led),
    /// unless the thread took it already.
    fn hand_over(&self, gen: u64) {
        let mut q = self.queue();
        if q.lead_gen == gen {
            q.caller_since = None;
            q.handed = true;
            self.wake.notify_one();
        }
    }

    /// Commits batches until the queue is empty, or hands over after `rounds` commits. Called
    /// with `leading` set by the caller.
    fn lead(&self, rounds: Option<usize>) {
        let mut done = 0;
        let mut due = None;
        loop {
            let batch = {
                let mut q = self.queue();
                if let Some(due) = due {
                    q.due = due;
                    // A lease that ends before the thread would look: wake it to look then.
                    if due < q.thread_until {
                        self.wake.notify_one();
                    }
                }
                if q.ops.is_empty() && done > 0 {
                    q.leading = false;
                    return;
                }
                if rounds.is_some_and(|r| done >= r) {
                    q.handed = true;
                    self.wake.notify_one();
                    return;
                }
                let n = q.ops.len().min(MAX_BATCH);
                q.ops.drain(..n).collect::<Vec<_>>()
            };
            let wait = self
                .writer
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .step(batch);
            due = Some(Instant::now() + wait);
            done += 1;
        }
    }

    /// The writer thread: takes the lead when a caller hands it over, and when nobody leads at
    /// the writer's next due time (a lease's end, or a second), to expire leases and probe a
    /// failing file. Returns once the store is closed and the queue is empty.
    pub(super) fn run(&self) {
        let mut q = self.queue();
        loop {
            let now = Instant::now();
            let lead = if std::mem::take(&mut q.handed) {
                true
            } else if q.closed && !q.leading && q.ops.is_empty() {
                return;
            } else if !q.leading && q.due <= now {
                q.leading = true;
                true
            } else if q
                .caller_since
                .is_some_and(|t| now.saturating_duration_since(t) >= STALLED)
            {
                // A caller took the lead and never began: its `Lead` is void from now on.
                tracing::warn!("a write's caller held the store's commit without running it; the writer thread commits instead");
                q.lead_gen += 1;
                q.caller_since = None;
                true
            } else {
                false
            };
            if lead {
                drop(q);
                self.lead(None);
                q = self.queue();
                continue;
            }
            // While someone leads, they expire what is due; look again later, or when a
            // caller's lead not yet begun would count as stalled.
            let until = match (q.leading, q.caller_since) {
                (true, Some(since)) => (since + STALLED).max(now + Duration::from_millis(1)),
                (true, None) => now + IDLE,
                (false, _) => q.due.min(now + IDLE),
            };
            q.thread_until = until;
            q = self
                .wake
                .wait_timeout(q, until.saturating_duration_since(now))
                .unwrap_or_else(|p| p.into_inner())
                .0;
            // Awake: nobody needs to wake it until it sleeps again.
            q.thread_until = now;
        }
    }

    /// Refuses new writes and wakes the thread to end once the queue is empty.
    pub(super) fn close(&self) {
        self.queue().closed = true;
        self.wake.notify_one();
    }
}
