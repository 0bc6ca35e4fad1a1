//! Handshake admission control (seed 004 §8).
//!
//! A full handshake costs a signature and a key exchange, a resumed one almost nothing. When
//! more full handshakes arrive than the CPUs can finish before clients give up, every one of
//! them gets slow, clients time out and come back with yet another full handshake, and the
//! server collapses to a fraction of its peak. So full handshakes are admitted only up to a
//! concurrency limit, with a short bounded queue; the rest are refused at once, which costs a
//! few bytes. Resumption attempts never wait.
//!
//! The queueing delay counts from the kernel's arrival stamp of the ClientHello (see
//! `arrival`), not from when the gateway reads it: under overload a hello can wait in the listen
//! backlog longer than its client does, and a server that signs for clients already gone serves
//! no one (measured: zero replies at 5x overload with RSA-4096 before this). A full handshake that
//! has already waited `queue_wait` is refused even if a slot is free, as CoDel drops packets that
//! sat in a queue too long: the wait itself says the server is behind. Resumptions are never
//! refused, however long they waited: they cost little and finish sessions.
//!
//! A handshake admitted while the runtime is behind delays everyone else: its signature runs on
//! the same threads as the requests of sessions already served, and under overload those
//! requests waited past their clients' patience (measured: most timeouts at 5x were requests,
//! not handshakes). So a timer that should fire every `LAG_TICK` measures how late it fires,
//! which is how long a ready task waits for a thread; while that is past `LAG_LIMIT`, full
//! handshakes are refused and the threads go to sessions already under way.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often the runtime's lag is measured.
const LAG_TICK: Duration = Duration::from_millis(10);
/// Lag beyond which the runtime counts as behind: well above what a busy but coping runtime
/// shows (a few milliseconds: one RSA-4096 signature is about 1.5 ms) and well below a client's
/// patience. 20 ms (tried) refused handshakes at half the saturating load, and a tenth of them
/// with 32 clients making RSA-4096 handshakes back to back.
const LAG_LIMIT: Duration = Duration::from_millis(50);

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Tuning of admission control.
#[derive(Debug, Clone)]
pub struct AdmissionConfig {
    /// Off: every handshake is admitted (to show the difference in benchmarks).
    pub enabled: bool,
    /// Full handshakes in progress at once. A full handshake needs about a millisecond of CPU
    /// (RSA-2048; ECDSA less) but holds its slot for much longer: across the client's round
    /// trip and, under load, across the scheduling delay of a busy runtime. The benchmark
    /// (docs/BENCHMARKS.md, TLS) found 16 per core refusing handshakes the CPU could have done,
    /// halving throughput at 3x load, and 64 per core keeping the peak.
    pub concurrency: usize,
    /// Full handshakes that may wait for a slot; beyond, refused.
    pub queue: usize,
    /// Longest wait in the queue before a full handshake is refused.
    pub queue_wait: Duration,
}

/// Held by an admitted full handshake until it ends.
pub(crate) struct Admitted(#[allow(dead_code)] Option<OwnedSemaphorePermit>);

pub(crate) struct Admission {
    config: AdmissionConfig,
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
    /// The runtime's lag at the last tick, in microseconds.
    lag_micros: AtomicU64,
}

impl Admission {
    pub fn new(config: AdmissionConfig) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(config.concurrency)),
            waiting: AtomicUsize::new(0),
            lag_micros: AtomicU64::new(0),
            config,
        }
    }

    /// Whether a full handshake whose hello arrived `waited` ago is refused without waiting: it
    /// has spent its whole queueing budget before the gateway even read it, or the runtime is
    /// behind.
    pub fn too_late(&self, waited: Option<Duration>) -> bool {
        self.config.enabled
            && (waited.is_some_and(|w| w >= self.config.queue_wait) || self.behind())
    }

    /// Whether the runtime is behind while full handshakes are what keeps it busy: at least
    /// one per 64 slots (one per core with the default limit) is under way. A stall with no
    /// handshake in progress (a start, a pause of the process, a busy neighbour) refuses no
    /// one: the lag is not theirs, and the server always makes progress on handshakes.
    fn behind(&self) -> bool {
        let in_progress = self.config.concurrency - self.slots.available_permits();
        let floor = (self.config.concurrency / 64).max(1);
        self.lag_micros.load(Ordering::Relaxed) > LAG_LIMIT.as_micros() as u64
            && in_progress >= floor
    }

    /// Measures the runtime's lag for as long as it runs (spawned once per gateway).
    pub async fn measure_lag(&self) {
        loop {
            let due = tokio::time::Instant::now() + LAG_TICK;
            tokio::time::sleep_until(due).await;
            let late = u64::try_from(due.elapsed().as_micros()).unwrap_or(u64::MAX);
            // The last tick alone: an average over a few (tried) let the lag build up for
            // longer before refusing, and at 5x overload lost a quarter of the replies to it.
            self.lag_micros.store(late, Ordering::Relaxed);
        }
    }

    /// A slot for a full handshake whose hello arrived `waited` ago (`None`: not known), or
    /// `None`: refuse it.
    pub async fn admit_full(&self, waited: Option<Duration>) -> Option<Admitted> {
        if !self.config.enabled {
            return Some(Admitted(None));
        }
        if self.too_late(waited) {
            return None;
        }
        if let Ok(p) = self.slots.clone().try_acquire_owned() {
            return Some(Admitted(Some(p)));
        }
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.config.queue {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        // What is left of the budget after the wait before the gateway read the hello.
        let budget = self.config.queue_wait - waited.unwrap_or_default();
        let r = tokio::time::timeout(budget, self.slots.clone().acquire_owned()).await;
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        match r {
            Ok(Ok(p)) => Some(Admitted(Some(p))),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(concurrency: usize, queue: usize) -> AdmissionConfig {
        AdmissionConfig {
            enabled: true,
            concurrency,
            queue,
            queue_wait: Duration::from_secs(30),
        }
    }

    #[tokio::test]
    async fn beyond_limit_and_queue_is_refused_at_once() {
        let a = Admission::new(config(1, 0));
        let first = a.admit_full(None).await;
        assert!(first.is_some());
        assert!(a.admit_full(None).await.is_none());
        drop(first);
        assert!(a.admit_full(None).await.is_some());
    }

    #[tokio::test]
    async fn a_queued_handshake_gets_the_next_free_slot() {
        let a = Arc::new(Admission::new(config(1, 1)));
        let first = a.admit_full(None).await;
        let a2 = a.clone();
        let queued = tokio::spawn(async move { a2.admit_full(None).await.is_some() });
        // Bounded: broken admission fails here instead of hanging the test run.
        let bound = Duration::from_secs(10);
        tokio::time::timeout(bound, async {
            while a.waiting.load(Ordering::Acquire) == 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the second handshake never queued");
        // The queue holds one; the next is refused.
        let third = tokio::time::timeout(bound, a.admit_full(None)).await;
        assert!(third
            .expect("a full queue did not refuse at once")
            .is_none());
        drop(first);
        let got = tokio::time::timeout(bound, queued).await;
        assert!(got
            .expect("the queued handshake never got the freed slot")
            .unwrap());
    }

    #[tokio::test]
    async fn a_handshake_that_waited_its_budget_in_the_backlog_is_refused_even_with_slots_free() {
        let mut c = config(4, 4);
        c.queue_wait = Duration::from_millis(250);
        let a = Admission::new(c);
        let stale = Some(Duration::from_millis(250));
        assert!(a.too_late(stale));
        assert!(a.admit_full(stale).await.is_none());
        // A recent hello, or one whose arrival is unknown, takes a free slot.
        assert!(!a.too_late(Some(Duration::from_millis(249))));
        assert!(a
            .admit_full(Some(Duration::from_millis(249)))
            .await
            .is_some());
        assert!(a.admit_full(None).await.is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn the_backlog_wait_counts_against_the_queue_budget() {
        let mut c = config(1, 1);
        c.queue_wait = Duration::from_millis(250);
        let a = Arc::new(Admission::new(c));
        let held = a.admit_full(None).await;
        let a2 = a.clone();
        let began = tokio::time::Instant::now();
        let queued = tokio::spawn(async move {
            let r = a2.admit_full(Some(Duration::from_millis(200))).await;
            (r.is_some(), began.elapsed())
        });
        let (admitted, waited) = queued.await.unwrap();
        assert!(!admitted);
        // The paused clock makes this exact: only 50 ms of the 250 were left to wait.
        assert_eq!(waited, Duration::from_millis(50));
        drop(held);
    }

    #[tokio::test]
    async fn while_the_runtime_is_behind_with_handshakes_under_way_more_are_refused() {
        let a = Admission::new(config(4, 4));
        a.lag_micros
            .store(LAG_LIMIT.as_micros() as u64 + 1, Ordering::Relaxed);
        // Behind, but no handshake under way: the lag is not theirs.
        assert!(!a.too_late(None));
        let first = a.admit_full(None).await;
        assert!(first.is_some());
        // One under way and the runtime behind: the next is refused, slots free or not.
        assert!(a.too_late(None));
        assert!(a.admit_full(None).await.is_none());
        a.lag_micros.store(0, Ordering::Relaxed);
        assert!(a.admit_full(None).await.is_some());
    }

    #[tokio::test]
    async fn a_runtime_blocked_past_the_limit_is_measured_as_behind() {
        let a = Arc::new(Admission::new(config(4, 4)));
        let _measuring = tokio::spawn({
            let a = a.clone();
            async move { a.measure_lag().await }
        });
        tokio::task::yield_now().await;
        let _under_way = a.admit_full(None).await;
        // The only thread of this runtime is held: the timer cannot fire on time.
        std::thread::sleep(LAG_LIMIT * 3);
        for _ in 0..10_000 {
            if a.behind() {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("a blocked runtime was not measured as behind");
    }

    #[tokio::test]
    async fn switched_off_admits_everything() {
        let mut c = config(0, 0);
        c.enabled = false;
        let a = Admission::new(c);
        assert!(a.admit_full(None).await.is_some());
        assert!(!a.too_late(Some(Duration::from_secs(60))));
        assert!(a.admit_full(Some(Duration::from_secs(60))).await.is_some());
    }
}
