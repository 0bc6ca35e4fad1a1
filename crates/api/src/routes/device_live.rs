//! The device sign-ins in flight, counted in memory by the network they began from, so that
//! no one network can hold every slot (`login_device::MAX_LIVE` over every address): at most
//! [`PER_NETWORK`] from one IPv4 address or IPv6 /64, and [`PER_SITE`] from one IPv6 /48 (what
//! a site is commonly given: a host with many /64s is still one). A slot is taken when a
//! sign-in starts and given back when its record goes (finished, declined, expired) or its
//! time is up. Counted per API process: on a cluster each node counts its own.

use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Sign-ins in flight from one IPv4 address or IPv6 /64.
pub(crate) const PER_NETWORK: usize = 3;
/// Sign-ins in flight from one IPv6 /48.
pub(crate) const PER_SITE: usize = 12;

/// A sign-in in flight: the /64 (or IPv4 address) it began from, its record's handle hash,
/// when it ends.
struct Slot {
    from: IpAddr,
    hash: String,
    ends: Instant,
}

/// Why a start is refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Full {
    /// From this address or /64.
    Network,
    /// From this /48.
    Site,
    /// Over every address.
    All,
}

/// The slots in flight (at most `MAX_LIVE`, so scanning them is cheap).
#[derive(Default)]
pub(crate) struct Live {
    slots: Mutex<Vec<Slot>>,
}

/// The /48 of an IPv6 network; `None` for IPv4.
fn site(addr: IpAddr) -> Option<[u16; 3]> {
    match addr {
        IpAddr::V4(_) => None,
        IpAddr::V6(a) => {
            let s = a.segments();
            Some([s[0], s[1], s[2]])
        }
    }
}

impl Live {
    /// Takes a slot for the sign-in `hash` from network `from` (an address as
    /// `throttle::network` gives it) lasting `flight`, or says which bound is reached.
    pub(crate) fn take(
        &self,
        from: IpAddr,
        hash: &str,
        flight: Duration,
        max: usize,
    ) -> Result<(), Full> {
        let now = Instant::now();
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.retain(|s| s.ends > now);
        if slots.len() >= max {
            return Err(Full::All);
        }
        if slots.iter().filter(|s| s.from == from).count() >= PER_NETWORK {
            return Err(Full::Network);
        }
        if let Some(site) = site(from) {
            if slots
                .iter()
                .filter(|s| self::site(s.from) == Some(site))
                .count()
                >= PER_SITE
            {
                return Err(Full::Site);
            }
        }
        slots.push(Slot {
            from,
            hash: hash.to_owned(),
            ends: now + flight,
        });
        Ok(())
    }

    /// Gives back the slot of sign-in `hash` (its record is gone).
    pub(crate) fn release(&self, hash: &str) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.retain(|s| s.hash != hash);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv6Addr;

    /// The /64 `2001:db8:<site>:<net>::`.
    fn net(site: u16, net: u16) -> IpAddr {
        IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, site, net, 0, 0, 0, 0))
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn one_network_and_one_site_hold_only_their_share() {
        let live = Live::default();
        for i in 0..PER_NETWORK {
            assert_eq!(live.take(net(1, 1), &format!("a{i}"), HOUR, 100), Ok(()));
        }
        assert_eq!(live.take(net(1, 1), "over", HOUR, 100), Err(Full::Network));
        // Other /64s of the same /48 fill the site's share, then no more of it.
        let mut n = PER_NETWORK;
        let mut sub = 2;
        while n < PER_SITE {
            assert_eq!(live.take(net(1, sub), &format!("b{n}"), HOUR, 100), Ok(()));
            n += 1;
            if n % PER_NETWORK == 0 {
                sub += 1;
            }
        }
        assert_eq!(live.take(net(1, 999), "over", HOUR, 100), Err(Full::Site));
        // Another site, and IPv4, are not held back; a released slot is free again.
        assert_eq!(live.take(net(2, 1), "c", HOUR, 100), Ok(()));
        let v4 = IpAddr::from([192, 0, 2, 1]);
        assert_eq!(live.take(v4, "d", HOUR, 100), Ok(()));
        live.release("a0");
        assert_eq!(live.take(net(1, 1), "again", HOUR, 100), Ok(()));
        assert_eq!(live.take(net(1, 5), "more", HOUR, 100), Err(Full::Site));
    }

    #[test]
    fn slots_end_with_their_time_and_all_of_them_are_bounded() {
        let live = Live::default();
        for i in 0..PER_NETWORK {
            assert_eq!(
                live.take(net(1, 1), &format!("a{i}"), Duration::ZERO, 100),
                Ok(())
            );
        }
        assert_eq!(live.take(net(1, 1), "later", HOUR, 100), Ok(()));
        assert_eq!(live.take(net(3, 1), "x", HOUR, 1), Err(Full::All));
    }
}
