//! Failure throttling that slows guessing down without locking the real user out.
//!
//! Failed sign-ins are counted in fixed windows under three keys: the client's address (an
//! IPv6 address by its /64, which one client usually holds whole), the address and the user
//! name together, and the user name alone. An attempt that would need Argon2id is answered 429
//! with Retry-After, without hashing anything, when
//! - its address has failed too often, with any names; or
//! - its address has failed too often for this name; or
//! - this name has failed too often from everywhere together, and its address has failed for
//!   this name at least once.
//!
//! So an attacker guessing one user's password from one address is slowed to the per-address
//! limits, and one spread over many addresses gets a single guess per address once the user's
//! limit is reached, while the user, from an address that has not failed, still has their
//! correct password verified (the scheme of OWASP's authentication cheat sheet, which warns that
//! account lockout lets anyone deny a user). Credentials already verified (cached) are never
//! throttled.
//!
//! Memory is bounded: names are kept as keyed 64-bit hashes, and the table holds at most
//! [`CAPACITY`] entries; when it is full of live windows, new keys are not counted (the
//! address limits, whose keys are few, still hold).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Most entries the table holds.
pub(crate) const CAPACITY: usize = 100_000;

/// Failure limits per window.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Failures of one address, any names.
    pub per_addr: u32,
    /// Failures of one address for one name.
    pub per_addr_user: u32,
    /// Failures for one name from everywhere, beyond which addresses that failed for it wait.
    pub per_user: u32,
}

/// An address as throttling sees it: IPv4 whole, IPv6 by its /64.
#[derive(Hash, PartialEq, Eq, Clone, Copy)]
enum Addr {
    V4(u32),
    V6(u64),
}

impl From<IpAddr> for Addr {
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(a) => Self::V4(u32::from(a)),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => Self::V4(u32::from(v4)),
                None => Self::V6((u128::from(a) >> 64) as u64),
            },
        }
    }
}

#[derive(Hash, PartialEq, Eq, Clone, Copy)]
enum Key {
    Addr(Addr),
    AddrUser(Addr, u64),
    User(u64),
}

struct Window {
    start: Instant,
    failures: u32,
}

/// How often a full table is swept of ended windows.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

struct Table {
    map: HashMap<Key, Window>,
    last_sweep: Option<Instant>,
}

pub(crate) struct Throttle {
    window: Duration,
    limits: Limits,
    /// Keyed, so nobody can choose names that collide.
    names: std::collections::hash_map::RandomState,
    table: Mutex<Table>,
}

impl Throttle {
    pub fn new(window: Duration, limits: Limits) -> Self {
        Self {
            window,
            limits,
            names: std::collections::hash_map::RandomState::new(),
            table: Mutex::new(Table {
                map: HashMap::new(),
                last_sweep: None,
            }),
        }
    }

    fn name(&self, user: &str) -> u64 {
        self.names.hash_one(user)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `Err(retry_after)` when an attempt for `user` from `addr` must wait.
    pub fn check(&self, user: &str, addr: IpAddr) -> Result<(), Duration> {
        let (addr, name) = (Addr::from(addr), self.name(user));
        let table = self.lock();
        let map = &table.map;
        let live = |key: &Key| {
            map.get(key)
                .map(|w| (w.failures, w.start.elapsed()))
                .filter(|(_, age)| *age < self.window)
        };
        let mut wait = Duration::ZERO;
        let mut over = |failures: u32, age: Duration, limit: u32| {
            if failures >= limit {
                wait = wait.max(self.window - age);
            }
        };
        if let Some((f, age)) = live(&Key::Addr(addr)) {
            over(f, age, self.limits.per_addr);
        }
        let own = live(&Key::AddrUser(addr, name));
        if let Some((f, age)) = own {
            over(f, age, self.limits.per_addr_user);
            // The user-wide limit holds only for addresses that have failed for this name.
            if let Some((f, age)) = live(&Key::User(name)) {
                over(f, age, self.limits.per_user);
            }
        }
        if wait.is_zero() {
            Ok(())
        } else {
            Err(wait)
        }
    }

    /// Counts a failed attempt for `user` from `addr`.
    pub fn fail(&self, user: &str, addr: IpAddr) {
        let (addr, name) = (Addr::from(addr), self.name(user));
        let mut table = self.lock();
        let Table { map, last_sweep } = &mut *table;
        if map.len() >= CAPACITY && last_sweep.is_none_or(|t| t.elapsed() >= SWEEP_EVERY) {
            *last_sweep = Some(Instant::now());
            let window = self.window;
            map.retain(|_, w| w.start.elapsed() < window);
        }
        for key in [Key::Addr(addr), Key::AddrUser(addr, name), Key::User(name)] {
            if map.len() >= CAPACITY && !map.contains_key(&key) {
                continue;
            }
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

    /// Entries held now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        per_addr: 5,
        per_addr_user: 2,
        per_user: 3,
    };

    fn ip(last: u8) -> IpAddr {
        [127, 0, 0, last].into()
    }

    #[test]
    fn an_address_that_has_not_failed_is_never_held_back_by_the_users_limit() {
        let t = Throttle::new(Duration::from_secs(60), LIMITS);
        t.fail("alice", ip(1));
        assert!(t.check("alice", ip(1)).is_ok());
        t.fail("alice", ip(1));
        assert!(t.check("alice", ip(1)).is_err(), "two for alice from .1");
        assert!(t.check("bob", ip(1)).is_ok(), "other names from .1 go on");
        t.fail("alice", ip(2));
        // alice has three failures now: addresses that failed for her wait...
        assert!(t.check("alice", ip(2)).is_err());
        // ...but one that never failed gets her password checked.
        assert!(t.check("alice", ip(3)).is_ok());
    }

    #[test]
    fn an_address_failing_with_many_names_is_held_back() {
        let t = Throttle::new(Duration::from_secs(60), LIMITS);
        for name in ["a", "b", "c", "d", "e"] {
            assert!(t.check(name, ip(1)).is_ok());
            t.fail(name, ip(1));
        }
        let wait = t.check("f", ip(1)).expect_err("five failures from .1");
        assert!(wait <= Duration::from_secs(60));
        assert!(t.check("f", ip(2)).is_ok());
        // An IPv6 client is one address across its /64.
        let v6 = |s: &str| -> IpAddr { s.parse().unwrap() };
        for name in ["a", "b", "c", "d", "e"] {
            t.fail(
                name,
                v6(&format!(
                    "2001:db8::{}",
                    name.len() + name.as_bytes()[0] as usize
                )),
            );
        }
        assert!(t.check("z", v6("2001:db8::ffff")).is_err());
        assert!(t.check("z", v6("2001:db8:0:1::1")).is_ok());
    }

    #[test]
    fn windows_end() {
        let t = Throttle::new(Duration::from_millis(50), LIMITS);
        t.fail("alice", ip(1));
        t.fail("alice", ip(1));
        assert!(t.check("alice", ip(1)).is_err());
        std::thread::sleep(Duration::from_millis(60));
        assert!(t.check("alice", ip(1)).is_ok());
        // A new window counts afresh: the same failures throttle again, under every key.
        t.fail("alice", ip(1));
        assert!(
            t.check("alice", ip(1)).is_ok(),
            "one failure of the new window"
        );
        t.fail("alice", ip(1));
        assert!(
            t.check("alice", ip(1)).is_err(),
            "throttled again after a window ended"
        );
        std::thread::sleep(Duration::from_millis(60));
        for name in ["a", "b", "c", "d", "e"] {
            t.fail(name, ip(2));
        }
        assert!(
            t.check("f", ip(2)).is_err(),
            "the address limit, in a later window"
        );
    }

    #[test]
    fn the_table_stays_bounded_under_a_flood_of_names() {
        let t = Throttle::new(Duration::from_secs(60), LIMITS);
        for i in 0..(CAPACITY + 5_000) {
            t.fail(&format!("user-{i}"), ip(1));
        }
        assert!(t.len() <= CAPACITY, "{}", t.len());
        assert!(
            t.check("anyone", ip(1)).is_err(),
            "the address limit still holds"
        );
    }
}
