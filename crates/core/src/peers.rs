//! Which other nodes of the cluster answer this one now: [`Peers`].
//!
//! A node's record lives until its lease ends (seconds), and a frozen node (a stalled disk, a
//! pause, a lost switch port) keeps its lease for that long while answering nothing. The
//! cluster crate pings every other node over an established, mutually authenticated connection
//! and says here which ones went silent; the gateway routes around them at once and stops
//! waiting for requests in flight there. Only this node's own pings decide: a stranger cannot
//! make a live node silent by anything it sends, and silence changes no record in the store,
//! only where this node sends requests.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::RwLock;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// The nodes this node found silent, shared by the pinger (which writes) and the request path
/// (which reads: a relaxed load while every node answers).
#[derive(Debug)]
pub struct Peers {
    /// Silent nodes, and since when they have been.
    silent: RwLock<HashMap<String, Instant>>,
    /// Whether `silent` has anyone: the request path's only cost while all is calm.
    any: AtomicBool,
    /// Bumped whenever a node goes silent, so that waiters look again.
    changed: watch::Sender<u64>,
    /// Times a node went silent, for metrics.
    silences: AtomicU64,
}

impl Default for Peers {
    fn default() -> Self {
        Self {
            silent: RwLock::default(),
            any: AtomicBool::new(false),
            changed: watch::channel(0).0,
            silences: AtomicU64::new(0),
        }
    }
}

impl Peers {
    /// Whether `node` has gone silent.
    pub fn silent(&self, node: &str) -> bool {
        self.any.load(Ordering::Relaxed) && self.silent_since(node).is_some()
    }

    /// Since when `node` has been silent.
    pub fn silent_since(&self, node: &str) -> Option<Instant> {
        self.silent
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(node)
            .copied()
    }

    /// The pinger's verdict on `node`: it answered (`true`) or it did not in time. Whether
    /// that changed what this node thinks of it.
    pub fn heard(&self, node: &str, answered: bool) -> bool {
        let mut silent = self.silent.write().unwrap_or_else(|p| p.into_inner());
        let changed = if answered {
            silent.remove(node).is_some()
        } else if silent.contains_key(node) {
            false
        } else {
            silent.insert(node.to_owned(), Instant::now());
            self.silences.fetch_add(1, Ordering::Relaxed);
            true
        };
        self.any.store(!silent.is_empty(), Ordering::Relaxed);
        drop(silent);
        if changed {
            self.changed.send_modify(|n| *n += 1);
        }
        changed
    }

    /// Nodes silent now, and the times any went silent.
    pub fn counts(&self) -> (usize, u64) {
        let now = self.silent.read().unwrap_or_else(|p| p.into_inner()).len();
        (now, self.silences.load(Ordering::Relaxed))
    }

    /// Forgets `node` (it left the cluster).
    pub fn forget(&self, node: &str) {
        let _ = self.heard(node, true);
    }

    /// Resolves once `node` has been silent for `grace` (at once if it has been for longer).
    pub async fn silenced(&self, node: &str, grace: Duration) {
        let mut rx = self.changed.subscribe();
        loop {
            if let Some(since) = self.silent_since(node) {
                // Woken by a change (it answered again) before the grace ended: look again.
                tokio::select! {
                    () = tokio::time::sleep_until(since + grace) => {
                        if self.silent_since(node) == Some(since) {
                            return;
                        }
                        continue;
                    }
                    r = rx.changed() => if r.is_err() { std::future::pending::<()>().await },
                }
                continue;
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_node_counts_as_silenced_only_after_its_grace_and_only_while_it_stays_silent() {
        let peers = std::sync::Arc::new(Peers::default());
        assert!(!peers.silent("b"));
        let waiter = {
            let p = peers.clone();
            tokio::spawn(async move { p.silenced("b", Duration::from_secs(2)).await })
        };
        let _ = peers.heard("b", false);
        assert!(peers.silent("b") && !peers.silent("c"));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiter.is_finished());
        // It answers again before its grace ends, then goes silent anew: the grace restarts.
        let _ = peers.heard("b", true);
        assert!(!peers.silent("b"));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let _ = peers.heard("b", false);
        tokio::time::sleep(Duration::from_millis(1900)).await;
        assert!(!waiter.is_finished());
        tokio::time::sleep(Duration::from_millis(200)).await;
        waiter.await.unwrap();
    }
}
