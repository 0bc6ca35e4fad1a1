//! Unfinished handshakes of the node port, bounded without ever blocking the accept loop.
//!
//! Before its handshake ends, a connection is nobody: a peer and a stranger look the same. A
//! limit that made new connections wait while it was reached (a semaphore before `accept`)
//! let a stranger holding that many connections open, one byte each, stop the node port
//! accepting at all: peers' connections waited in the listen backlog behind the stranger's
//! until they gave up, and gateways answered 503 for the node's instances. So the accept loop
//! never waits here: when as many handshakes as the limit allows are unfinished, the oldest is
//! shed (its connection closed) to make room for the newest. A peer finishes its
//! handshake in a few round trips; to shed it, a stranger must open `max` connections within
//! that time, not merely keep them open. A finished handshake leaves the count at once, so a
//! peer, once admitted, is never shed.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

/// The unfinished handshakes of one node port.
pub(crate) struct Pending {
    max: usize,
    inner: Mutex<Inner>,
}

struct Inner {
    /// Number of the next handshake: handshakes are shed in this order, oldest first.
    next: u64,
    /// Each unfinished handshake's trigger: dropping it sheds the handshake.
    open: BTreeMap<u64, oneshot::Sender<()>>,
}

/// One unfinished handshake: it leaves the count when dropped.
pub(crate) struct Entry {
    number: u64,
    pending: Arc<Pending>,
    shed: oneshot::Receiver<()>,
}

// === impl Pending ===

impl Pending {
    /// At most `max` unfinished handshakes at once.
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            inner: Mutex::new(Inner {
                next: 0,
                open: BTreeMap::new(),
            }),
        })
    }

    /// Counts a new handshake in, shedding the oldest unfinished ones beyond the limit; never
    /// waits. Returns how many were shed.
    pub(crate) fn enter(self: &Arc<Self>) -> (Entry, usize) {
        let (tx, shed) = oneshot::channel();
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let mut dropped = 0;
        while inner.open.len() >= self.max {
            // Dropping the trigger wakes the handshake's task, which closes its connection.
            if inner.open.pop_first().is_none() {
                break;
            }
            dropped += 1;
        }
        let number = inner.next;
        inner.next += 1;
        inner.open.insert(number, tx);
        let entry = Entry {
            number,
            pending: self.clone(),
            shed,
        };
        (entry, dropped)
    }

    /// Handshakes unfinished now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .open
            .len()
    }
}

// === impl Entry ===

impl Entry {
    /// Runs `handshake` until it ends (`Some`) or is shed to make room for newer ones (`None`).
    pub(crate) async fn run<F: Future>(mut self, handshake: F) -> Option<F::Output> {
        tokio::select! {
            // A handshake that finished as it was shed is a node's: it wins.
            biased;
            out = handshake => Some(out),
            _ = &mut self.shed => None,
        }
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.pending
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .open
            .remove(&self.number);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn beyond_the_limit_the_oldest_is_shed_and_the_newest_runs() {
        let pending = Pending::new(2);
        let (first, shed) = pending.enter();
        assert_eq!(shed, 0);
        let (second, _) = pending.enter();
        let (third, shed) = pending.enter();
        assert_eq!(shed, 1, "the third sheds one");
        assert_eq!(pending.len(), 2);
        // The first was shed: its handshake ends at once, however long it would take (bounded:
        // a broken shed fails here instead of hanging the test run).
        let ended = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            first.run(std::future::pending::<()>()),
        )
        .await;
        assert_eq!(ended, Ok(None), "the oldest was shed");
        // The others run theirs to the end.
        assert_eq!(second.run(async { 2 }).await, Some(2));
        assert_eq!(third.run(async { 3 }).await, Some(3));
        assert_eq!(pending.len(), 0, "finished handshakes leave the count");
    }

    #[tokio::test]
    async fn a_finished_handshake_takes_no_room() {
        let pending = Pending::new(1);
        for i in 0..10 {
            let (entry, shed) = pending.enter();
            assert_eq!(shed, 0, "handshake {i} found room");
            assert_eq!(entry.run(async { i }).await, Some(i));
        }
    }
}
