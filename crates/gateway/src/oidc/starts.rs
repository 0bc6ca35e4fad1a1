//! A bound on provider sign-ins started per client address: each start writes a flow record
//! under a lease in the store (kept ten minutes), so without one a single client could fill
//! the store, or etcd's lease table, faster than records expire.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Starts one address may make per window.
const PER_WINDOW: u32 = 30;
/// The window.
const WINDOW: Duration = Duration::from_secs(60);
/// Addresses remembered at most; past it, the oldest windows are forgotten first.
const CAPACITY: usize = 50_000;

/// Starts per address (IPv6 by its /64) in the current window.
#[derive(Debug, Default)]
pub struct Starts {
    windows: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

impl Starts {
    /// Counts a start from `addr`, or says how long to wait when it is over the bound.
    pub(crate) fn admit(&self, addr: IpAddr) -> Result<(), Duration> {
        let addr = network(addr);
        let now = Instant::now();
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        if windows.len() >= CAPACITY && !windows.contains_key(&addr) {
            windows.retain(|_, (start, _)| now.duration_since(*start) < WINDOW);
            if windows.len() >= CAPACITY {
                // Every window is live: the one begun longest ago gives way.
                let oldest = windows.iter().min_by_key(|(_, (s, _))| *s).map(|(a, _)| *a);
                if let Some(a) = oldest {
                    windows.remove(&a);
                }
            }
        }
        let w = windows.entry(addr).or_insert((now, 0));
        if now.duration_since(w.0) >= WINDOW {
            *w = (now, 0);
        }
        if w.1 >= PER_WINDOW {
            return Err(WINDOW.saturating_sub(now.duration_since(w.0)));
        }
        w.1 += 1;
        Ok(())
    }
}

/// An IPv4 address as it is; an IPv6 one by its /64, the least a network hands one host.
fn network(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V4(_) => addr,
        IpAddr::V6(a) => {
            let s = a.segments();
            IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_gets_its_starts_and_then_waits_and_others_do_not() {
        let s = Starts::default();
        let a: IpAddr = "2001:db8::1".parse().unwrap();
        let same_host: IpAddr = "2001:db8::2".parse().unwrap();
        let other: IpAddr = "127.0.0.9".parse().unwrap();
        for _ in 0..PER_WINDOW {
            assert!(s.admit(a).is_ok());
        }
        assert!(s.admit(same_host).is_err());
        assert!(s.admit(other).is_ok());
    }
}
