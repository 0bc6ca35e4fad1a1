//! Failed `POST /v1/login`s, throttled like the gateway's sign-ins (crates/gateway/src/auth/
//! throttle.rs) in a smaller equivalent: failures counted in fixed windows per address, per
//! address and name, and per name; an attempt is answered 429 without hashing anything when its
//! address failed too often, or too often for this name, or the name failed too often from
//! everywhere and this address failed for it at least once (so a guesser spread over many
//! addresses cannot lock the operator out of an address that never failed).
//!
//! The table holds at most [`CAPACITY`] keys; when full of live windows, new keys are not
//! counted (the per-address limits, whose keys are few, still hold).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const CAPACITY: usize = 10_000;
/// The window failures are counted in.
const WINDOW: Duration = Duration::from_secs(60);
const PER_ADDR: u32 = 20;
const PER_ADDR_NAME: u32 = 5;
const PER_NAME: u32 = 10;

#[derive(Hash, PartialEq, Eq, Clone)]
enum Key {
    Addr(IpAddr),
    AddrName(IpAddr, String),
    Name(String),
}

/// The address a client's failures are counted under: an IPv4 address as it is, an IPv6
/// address by its /64 (the least a network hands one host, so a host cannot get a fresh
/// count from each of its addresses).
pub(crate) fn network(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V4(_) => addr,
        IpAddr::V6(a) => {
            let s = a.segments();
            IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
    }
}

/// Failed logins per window.
#[derive(Default)]
pub(crate) struct Throttle {
    table: Mutex<HashMap<Key, (Instant, u32)>>,
}

impl Throttle {
    /// `Err(wait)` when `name` from `addr` must wait before its password is tried.
    pub(crate) fn check(&self, name: &str, addr: IpAddr) -> Result<(), Duration> {
        let now = Instant::now();
        let table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let live = |k: &Key| {
            table
                .get(k)
                .filter(|(start, _)| now.duration_since(*start) < WINDOW)
                .map(|(start, n)| (WINDOW - now.duration_since(*start), *n))
        };
        let addr_name = live(&Key::AddrName(addr, name.to_owned()));
        let over = |w: Option<(Duration, u32)>, limit: u32| w.filter(|(_, n)| *n >= limit);
        if let Some((wait, _)) = over(live(&Key::Addr(addr)), PER_ADDR)
            .or(over(addr_name, PER_ADDR_NAME))
            .or(over(live(&Key::Name(name.to_owned())), PER_NAME).filter(|_| addr_name.is_some()))
        {
            return Err(wait);
        }
        Ok(())
    }

    /// Counts a failure of `name` from `addr`.
    pub(crate) fn fail(&self, name: &str, addr: IpAddr) {
        let now = Instant::now();
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if table.len() >= CAPACITY {
            table.retain(|_, (start, _)| now.duration_since(*start) < WINDOW);
        }
        for key in [
            Key::Addr(addr),
            Key::AddrName(addr, name.to_owned()),
            Key::Name(name.to_owned()),
        ] {
            if table.len() >= CAPACITY && !table.contains_key(&key) {
                continue;
            }
            let w = table.entry(key).or_insert((now, 0));
            if now.duration_since(w.0) >= WINDOW {
                *w = (now, 0);
            }
            w.1 += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_failing_for_a_name_waits_and_another_address_does_not() {
        let t = Throttle::default();
        let (a, b): (IpAddr, IpAddr) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
        for _ in 0..PER_ADDR_NAME {
            assert!(t.check("ann", a).is_ok());
            t.fail("ann", a);
        }
        assert!(t.check("ann", a).is_err());
        assert!(t.check("ann", b).is_ok());
        assert!(t.check("bob", a).is_ok());
    }

    #[test]
    fn an_ipv6_host_is_counted_by_its_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::7".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(network(a), network(b));
        assert_ne!(network(a), network(c));
        let v4: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(network(v4), v4);
    }
}
