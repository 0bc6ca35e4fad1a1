//! Handshake admission control (seed 004 §8).
//!
//! A full handshake costs a signature and a key exchange, a resumed one almost nothing. When
//! more full handshakes arrive than the CPUs can finish before clients give up, every one of
//! them gets slow, clients time out and come back with yet another full handshake, and the
//! server collapses to a fraction of its peak. So full handshakes are admitted only up to a
//! concurrency limit, with a short bounded queue; the rest are refused at once, which costs a
//! few bytes. Resumption attempts never wait.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

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
}

impl Admission {
    pub fn new(config: AdmissionConfig) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(config.concurrency)),
            waiting: AtomicUsize::new(0),
            config,
        }
    }

    /// A slot for a full handshake, or `None`: refuse it.
    pub async fn admit_full(&self) -> Option<Admitted> {
        if !self.config.enabled {
            return Some(Admitted(None));
        }
        if let Ok(p) = self.slots.clone().try_acquire_owned() {
            return Some(Admitted(Some(p)));
        }
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.config.queue {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        let r =
            tokio::time::timeout(self.config.queue_wait, self.slots.clone().acquire_owned()).await;
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
        let first = a.admit_full().await;
        assert!(first.is_some());
        assert!(a.admit_full().await.is_none());
        drop(first);
        assert!(a.admit_full().await.is_some());
    }

    #[tokio::test]
    async fn a_queued_handshake_gets_the_next_free_slot() {
        let a = Arc::new(Admission::new(config(1, 1)));
        let first = a.admit_full().await;
        let a2 = a.clone();
        let queued = tokio::spawn(async move { a2.admit_full().await.is_some() });
        while a.waiting.load(Ordering::Acquire) == 0 {
            tokio::task::yield_now().await;
        }
        // The queue holds one; the next is refused.
        assert!(a.admit_full().await.is_none());
        drop(first);
        assert!(queued.await.unwrap());
    }

    #[tokio::test]
    async fn switched_off_admits_everything() {
        let mut c = config(0, 0);
        c.enabled = false;
        let a = Admission::new(c);
        assert!(a.admit_full().await.is_some());
    }
}
