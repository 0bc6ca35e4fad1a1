//! Argon2id runs shared fairly between sources, so one network's flood of new credentials
//! cannot deny sign-in to everyone else.
//!
//! A fixed number of verifications run at once (one per core); the others wait in one queue per
//! source (an IPv4 /24, an IPv6 /48: what one network holds), served in turn, one from each
//! source that waits (round robin). The queues together hold a bounded number of waiters; when
//! they are full, a newcomer takes the place of the newest waiter of the source with most
//! waiting, if that source has more than the newcomer's would, and is refused otherwise. So a
//! flood fills the queue only with itself: a sign-in from another network waits for about one
//! verification per network that waits, never for the flood's whole queue. The TLS listener's
//! admission does the same for handshakes, favouring resumed sessions.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::oneshot;

/// Where a sign-in comes from, for fairness: an IPv4 /24 or an IPv6 /48.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Source {
    V4([u8; 3]),
    V6([u16; 3]),
}

impl From<IpAddr> for Source {
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(a) => {
                let o = a.octets();
                Self::V4([o[0], o[1], o[2]])
            }
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => Self::from(IpAddr::V4(v4)),
                None => {
                    let s = a.segments();
                    Self::V6([s[0], s[1], s[2]])
                }
            },
        }
    }
}

struct Queue {
    /// Waiters by ticket, oldest first; a waiter's sender gets `()` with its slot.
    waiters: VecDeque<(u64, oneshot::Sender<()>)>,
}

#[derive(Default)]
struct State {
    running: usize,
    waiting: usize,
    queues: HashMap<Source, Queue>,
    /// Sources with waiters, in the order they are served.
    turn: VecDeque<Source>,
    next_ticket: u64,
}

impl State {
    /// Takes the waiter `ticket` of `source` out of its queue; whether it was there.
    fn remove(&mut self, source: Source, ticket: u64) -> bool {
        let Some(q) = self.queues.get_mut(&source) else {
            return false;
        };
        let Some(at) = q.waiters.iter().position(|(t, _)| *t == ticket) else {
            return false;
        };
        q.waiters.remove(at);
        self.waiting -= 1;
        if q.waiters.is_empty() {
            self.queues.remove(&source);
            self.turn.retain(|s| *s != source);
        }
        true
    }
}

/// Slots for verifications, handed out fairly between sources.
pub(crate) struct FairPool {
    slots: usize,
    max_waiting: usize,
    state: Mutex<State>,
}

/// A running verification's slot, given back when dropped.
pub(crate) struct Slot<'a>(&'a FairPool);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.release();
    }
}

enum Entry {
    Now,
    Busy,
    Wait(u64, oneshot::Receiver<()>),
}

/// A place in a queue; leaving it (the request went away) gives it, or the slot it was just
/// handed, back.
struct Waiter<'a> {
    pool: &'a FairPool,
    source: Source,
    ticket: u64,
    rx: Option<oneshot::Receiver<()>>,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else {
            return;
        };
        let mut s = self.pool.lock();
        if !s.remove(self.source, self.ticket) && rx.try_recv().is_ok() {
            // Handed a slot in the instant it left: pass it on.
            drop(s);
            self.pool.release();
        }
    }
}

impl FairPool {
    /// `slots` verifications at once, at most `max_waiting` waiting in all.
    pub(crate) fn new(slots: usize, max_waiting: usize) -> Self {
        Self {
            slots: slots.max(1),
            max_waiting,
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for a verification from `source`, after its turn; `None` when the queue is full
    /// and `source` already has as many waiting as any other (or its place was taken).
    pub(crate) async fn acquire(&self, source: Source) -> Option<Slot<'_>> {
        let (ticket, rx) = match self.enter(source) {
            Entry::Now => return Some(Slot(self)),
            Entry::Busy => return None,
            Entry::Wait(ticket, rx) => (ticket, rx),
        };
        let mut waiter = Waiter {
            pool: self,
            source,
            ticket,
            rx: Some(rx),
        };
        let handed = match waiter.rx.as_mut() {
            Some(rx) => rx.await.is_ok(),
            None => false,
        };
        waiter.rx = None;
        // Not `then_some`: a slot made and dropped would give back one never taken.
        if handed {
            Some(Slot(self))
        } else {
            None
        }
    }

    fn enter(&self, source: Source) -> Entry {
        let mut s = self.lock();
        if s.running < self.slots && s.waiting == 0 {
            s.running += 1;
            return Entry::Now;
        }
        if s.waiting >= self.max_waiting {
            let mine = s.queues.get(&source).map_or(0, |q| q.waiters.len());
            let Some((&biggest, len)) = s
                .queues
                .iter()
                .map(|(src, q)| (src, q.waiters.len()))
                .max_by_key(|(_, len)| *len)
            else {
                return Entry::Busy;
            };
            if len <= mine + 1 {
                return Entry::Busy;
            }
            // The newest of the largest queue gives way; its sender dropped, it answers 503.
            let evicted = s
                .queues
                .get_mut(&biggest)
                .and_then(|q| q.waiters.back().map(|(t, _)| *t));
            if let Some(t) = evicted {
                s.remove(biggest, t);
            }
        }
        let ticket = s.next_ticket;
        s.next_ticket += 1;
        let (tx, rx) = oneshot::channel();
        match s.queues.get_mut(&source) {
            Some(q) => q.waiters.push_back((ticket, tx)),
            None => {
                s.queues.insert(
                    source,
                    Queue {
                        waiters: VecDeque::from([(ticket, tx)]),
                    },
                );
                s.turn.push_back(source);
            }
        }
        s.waiting += 1;
        Entry::Wait(ticket, rx)
    }

    /// Hands a finished verification's slot to the next source's oldest waiter, or frees it.
    fn release(&self) {
        let mut s = self.lock();
        loop {
            let Some(source) = s.turn.pop_front() else {
                s.running -= 1;
                return;
            };
            let Some(q) = s.queues.get_mut(&source) else {
                continue;
            };
            let Some((_, tx)) = q.waiters.pop_front() else {
                s.queues.remove(&source);
                continue;
            };
            let empty = q.waiters.is_empty();
            s.waiting -= 1;
            if empty {
                s.queues.remove(&source);
            } else {
                s.turn.push_back(source);
            }
            if tx.send(()).is_ok() {
                return;
            }
        }
    }

    /// Verifications waiting now.
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.lock().waiting
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn src(net: u8) -> Source {
        Source::from(IpAddr::from([10, 0, net, 1]))
    }

    async fn until(what: &str, mut f: impl FnMut() -> bool) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while !f() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{what}"));
    }

    #[tokio::test]
    async fn a_flooding_source_cannot_keep_another_waiting_behind_it() {
        let pool = Arc::new(FairPool::new(1, 4));
        let running = pool.acquire(src(1)).await.expect("a free slot");
        // The flood fills the whole queue...
        let mut flood = Vec::new();
        for _ in 0..4 {
            let p = pool.clone();
            flood.push(tokio::spawn(
                async move { p.acquire(src(1)).await.is_some() },
            ));
        }
        until("the flood to queue", || pool.waiting() == 4).await;
        // ...and the next of its own is refused at once...
        assert!(pool.acquire(src(1)).await.is_none());
        // ...while another network takes the place of the flood's newest waiter...
        let p = pool.clone();
        let other = tokio::spawn(async move { p.acquire(src(2)).await.is_some() });
        until("the other source to queue", || {
            pool.lock().queues.contains_key(&src(2))
        })
        .await;
        assert_eq!(pool.waiting(), 4);
        // ...and is served next, before the flood's older waiters.
        drop(running);
        assert!(tokio::time::timeout(Duration::from_secs(10), other)
            .await
            .expect("served")
            .unwrap());
        let served: Vec<bool> = futures_util::future::join_all(flood)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(served.iter().filter(|s| !**s).count(), 1, "{served:?}");
    }

    #[tokio::test]
    async fn sources_take_turns_and_a_waiter_that_leaves_gives_its_place_back() {
        let pool = Arc::new(FairPool::new(1, 16));
        let first = pool.acquire(src(1)).await.expect("a free slot");
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for net in [1, 1, 1, 2, 3] {
            let (p, o) = (pool.clone(), order.clone());
            let want = tasks.len() + 1;
            tasks.push(tokio::spawn(async move {
                let slot = p.acquire(src(net)).await;
                o.lock().unwrap().push(net);
                drop(slot);
            }));
            until("queued", || pool.waiting() == want).await;
        }
        // One more that goes away while it waits.
        let p = pool.clone();
        let gone = tokio::spawn(async move { p.acquire(src(4)).await.is_some() });
        until("queued", || pool.waiting() == 6).await;
        gone.abort();
        until("its place given back", || pool.waiting() == 5).await;
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), vec![1, 2, 3, 1, 1]);
        assert_eq!(pool.lock().running, 0);
    }
}
