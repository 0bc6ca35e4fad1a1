//! Unprivileged uids for `process` instances when the agent runs as root: each live instance
//! gets one no other live instance holds, so an app can neither read another's private
//! directory nor signal or trace its processes, and never holds root's rights over the node.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use super::launch::Held;

/// First uid (and gid) of `process` instances, above the sandbox's range (200,000–299,999) and
/// far above any account a distribution creates.
pub(crate) const BASE: u32 = 300_000;
/// How many there are: the most `process` instances one node runs at once.
pub(crate) const RANGE: u32 = 100_000;

/// The uids in use, and where the next search starts: a released uid is handed out again
/// only after every other one has been, so nothing a previous holder left behind (a process
/// that escaped its group, a file in /tmp) meets a new app under the same uid soon.
#[derive(Default)]
struct Table {
    used: BTreeSet<u32>,
    next: u32,
}

/// The pool of instance uids.
#[derive(Clone, Default)]
pub(crate) struct Uids {
    table: Arc<Mutex<Table>>,
}

/// One uid, held until the instance's process is reaped.
pub(crate) struct Lease {
    uid: u32,
    table: Arc<Mutex<Table>>,
}

impl Uids {
    /// A uid no live instance holds; `None` when all `RANGE` are taken.
    pub(crate) fn take(&self) -> Option<Lease> {
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let start = t.next;
        for i in 0..RANGE {
            let offset = (start + i) % RANGE;
            let uid = BASE + offset;
            if t.used.insert(uid) {
                t.next = (offset + 1) % RANGE;
                return Some(Lease {
                    uid,
                    table: self.table.clone(),
                });
            }
        }
        None
    }
}

impl Lease {
    /// The uid, also used as the gid.
    pub(crate) fn uid(&self) -> u32 {
        self.uid
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        t.used.remove(&self.uid);
    }
}

impl Held for Lease {
    fn oom_note(&self) -> Option<String> {
        None
    }

    fn release(self: Box<Self>) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        // Dropping the lease frees the uid.
        Box::pin(async move { drop(self) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_instances_never_share_a_uid_and_a_freed_one_waits_its_turn() {
        let uids = Uids::default();
        let a = uids.take().unwrap();
        let b = uids.take().unwrap();
        assert_ne!(a.uid(), b.uid());
        assert!((BASE..BASE + RANGE).contains(&a.uid()));
        let freed = a.uid();
        drop(a);
        let c = uids.take().unwrap();
        assert_ne!(
            c.uid(),
            freed,
            "a freed uid is not handed out again at once"
        );
        assert_ne!(c.uid(), b.uid());
    }

    #[test]
    fn a_full_pool_says_so() {
        let uids = Uids::default();
        let held: Vec<Lease> = (0..RANGE).map_while(|_| uids.take()).collect();
        assert_eq!(held.len(), RANGE as usize);
        assert!(uids.take().is_none());
    }
}
