//! Failure throttling per user and per client address.
//!
//! Counts failed sign-ins in fixed windows. Once a user or an address reaches its limit, new
//! attempts that would need Argon2id are answered 429 with Retry-After until the window ends,
//! without hashing anything. Credentials already verified (cached) are not throttled, so an
//! attacker guessing a user's password cannot lock out that user's running sessions.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Hash, PartialEq, Eq)]
enum Key {
    User(String),
    Addr(IpAddr),
}

struct Window {
    start: Instant,
    failures: u32,
}

pub(crate) struct Throttle {
    window: Duration,
    per_user: u32,
    per_addr: u32,
    map: Mutex<HashMap<Key, Window>>,
}

/// Entries kept before expired windows are swept.
const SWEEP_AT: usize = 100_000;

impl Throttle {
    pub fn new(window: Duration, per_user: u32, per_addr: u32) -> Self {
        Self {
            window,
            per_user,
            per_addr,
            map: Mutex::new(HashMap::new()),
        }
    }

    /// `Err(retry_after)` when the user or address is over its limit.
    pub fn check(&self, user: &str, addr: IpAddr) -> Result<(), Duration> {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let mut wait = Duration::ZERO;
        for (key, limit) in [
            (Key::User(user.to_owned()), self.per_user),
            (Key::Addr(addr), self.per_addr),
        ] {
            if let Some(w) = map.get(&key) {
                let age = w.start.elapsed();
                if age < self.window && w.failures >= limit {
                    wait = wait.max(self.window - age);
                }
            }
        }
        if wait.is_zero() {
            Ok(())
        } else {
            Err(wait)
        }
    }

    /// Counts a failed attempt.
    pub fn fail(&self, user: &str, addr: IpAddr) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= SWEEP_AT {
            let window = self.window;
            map.retain(|_, w| w.start.elapsed() < window);
        }
        for key in [Key::User(user.to_owned()), Key::Addr(addr)] {
            let w = map.entry(key).or_insert(Window {
                start: Instant::now(),
                failures: 0,
            });
            if w.start.elapsed() >= self.window {
                *w = Window {
                    start: Instant::now(),
                    failures: 0,
                };
            }
            w.failures = w.failures.saturating_add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_users_and_addresses_separately() {
        let t = Throttle::new(Duration::from_secs(60), 2, 3);
        let a: IpAddr = [127, 0, 0, 1].into();
        let b: IpAddr = [127, 0, 0, 2].into();
        t.fail("alice", a);
        assert!(t.check("alice", a).is_ok());
        t.fail("alice", b);
        assert!(
            t.check("alice", b).is_err(),
            "alice reached her limit from two addresses"
        );
        assert!(t.check("bob", b).is_ok());
        t.fail("bob", a);
        assert!(
            t.check("carol", a).is_ok(),
            "two failures from a, limit three"
        );
        t.fail("dave", a);
        let wait = t
            .check("carol", a)
            .expect_err("address a reached its limit");
        assert!(wait <= Duration::from_secs(60));
    }
}
