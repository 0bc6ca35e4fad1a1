//! Idle keep-alive connections to instances, by instance id, newest first.

use crate::hashing::FastMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Idle connections older than this are not reused (the app may have closed them).
pub(super) const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_IDLE_PER_INSTANCE: usize = 1024;
/// How often check-ins sweep out connections that can no longer be reused.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// A pooled connection.
pub(super) trait Idle {
    /// Whether it can carry another request now.
    fn reusable(&self) -> bool;
    /// Whether it is past use, judged cheaply: swept out on check-in.
    fn stale(&self) -> bool;
    /// It goes idle now.
    fn touch(&mut self);
}

struct Lists<T> {
    by_instance: FastMap<String, Vec<T>>,
    last_sweep: Option<Instant>,
    /// Instances out of routing (draining, stopped), since when: connections to them are not
    /// pooled. Entries older than the idle timeout are swept (no pooled connection outlives it).
    unrouted: FastMap<String, Instant>,
}

/// Idle connections by instance id.
pub(super) struct Pool<T> {
    idle: Mutex<Lists<T>>,
}

impl<T> Default for Pool<T> {
    fn default() -> Self {
        Self {
            idle: Mutex::new(Lists {
                by_instance: FastMap::default(),
                last_sweep: None,
                unrouted: FastMap::default(),
            }),
        }
    }
}

impl<T: Idle> Pool<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Lists<T>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The most recently used reusable connection to `instance`; those found past use are
    /// dropped.
    pub fn checkout(&self, instance: &str) -> Option<T> {
        let mut idle = self.lock();
        let list = idle.by_instance.get_mut(instance)?;
        while let Some(c) = list.pop() {
            if c.reusable() {
                return Some(c);
            }
        }
        idle.by_instance.remove(instance);
        None
    }

    /// Keeps `conn` for the next request to `instance`.
    pub fn checkin(&self, instance: &str, mut conn: T) {
        conn.touch();
        let mut idle = self.lock();
        // Connections to instances that are gone would otherwise stay open until someone asked
        // for that instance again, which for a stopped instance is never.
        idle.sweep_if_due();
        if idle.unrouted.contains_key(instance) {
            return;
        }
        if let Some(list) = idle.by_instance.get_mut(instance) {
            if list.len() < MAX_IDLE_PER_INSTANCE {
                list.push(conn);
            }
            return;
        }
        idle.by_instance.insert(instance.to_owned(), vec![conn]);
    }

    /// Forgets every idle connection to `instance` (it is gone).
    pub fn forget(&self, instance: &str) {
        self.lock().by_instance.remove(instance);
    }

    /// `instance` entered or left routing; leaving, its idle connections close and later
    /// check-ins of it are dropped.
    pub fn routing(&self, instance: &str, routed: bool) {
        let mut idle = self.lock();
        if routed {
            idle.unrouted.remove(instance);
        } else {
            idle.by_instance.remove(instance);
            idle.unrouted.insert(instance.to_owned(), Instant::now());
            idle.sweep_if_due();
        }
    }
}

impl<T: Idle> Lists<T> {
    fn sweep_if_due(&mut self) {
        if self.last_sweep.is_none_or(|t| t.elapsed() >= SWEEP_EVERY) {
            self.last_sweep = Some(Instant::now());
            self.by_instance.retain(|_, list| {
                list.retain(|c| !c.stale());
                !list.is_empty()
            });
            self.unrouted
                .retain(|_, since| since.elapsed() < IDLE_TIMEOUT);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake {
        id: u32,
        usable: bool,
        touched: bool,
    }

    impl Idle for Fake {
        fn reusable(&self) -> bool {
            self.usable
        }
        fn stale(&self) -> bool {
            !self.usable
        }
        fn touch(&mut self) {
            self.touched = true;
        }
    }

    #[test]
    fn hands_out_the_newest_reusable_connection_per_instance() {
        let pool = Pool::default();
        let fake = |id, usable| Fake {
            id,
            usable,
            touched: false,
        };
        pool.checkin("a", fake(1, true));
        pool.checkin("a", fake(2, true));
        pool.checkin("a", fake(3, false));
        pool.checkin("b", fake(4, true));
        let got = pool.checkout("a").unwrap();
        assert_eq!((got.id, got.touched), (2, true));
        assert_eq!(pool.checkout("a").map(|c| c.id), Some(1));
        assert!(pool.checkout("a").is_none());
        pool.forget("b");
        assert!(pool.checkout("b").is_none());
    }

    #[test]
    fn an_instance_out_of_routing_keeps_no_idle_connection_until_it_is_routed_again() {
        let pool = Pool::default();
        let fake = |id| Fake {
            id,
            usable: true,
            touched: false,
        };
        pool.checkin("a", fake(1));
        pool.routing("a", false);
        assert!(pool.checkout("a").is_none(), "idle ones close");
        // One that was busy when the instance began draining comes back: it is not kept.
        pool.checkin("a", fake(2));
        assert!(pool.checkout("a").is_none());
        pool.routing("a", true);
        pool.checkin("a", fake(3));
        assert_eq!(pool.checkout("a").map(|c| c.id), Some(3));
    }
}
