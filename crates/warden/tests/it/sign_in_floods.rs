//! Sign-in under a flood of new credentials, through the real binary: Argon2id runs are shared
//! between networks in turn, so one network's flood denies no other network its sign-in.

use std::time::Duration;

use warden_test_support::http::{basic, request_from};
use warden_test_support::Warden;

use crate::BIN;

/// A flood of new credentials from one network (many addresses of 127.0.0.0/24, so no
/// address's own throttle ends it) keeps the verification queue full; users signing in for the
/// first time from another network are still verified, and in their turn, not refused.
#[test]
fn a_flood_of_new_credentials_from_one_network_denies_no_other_network_its_sign_in() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let w = Warden::demo(BIN);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let stop = AtomicBool::new(false);
    let busy = AtomicUsize::new(0);
    let url = format!("{}/apps/demo/", w.gateway);
    /// Ends the flood however the test ends, a failed assertion too.
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    std::thread::scope(|s| {
        let _stop = Stop(&stop);
        for t in 0..(65 * cores + 70) {
            let (stop, busy, url) = (&stop, &busy, &url);
            s.spawn(move || {
                let from = std::net::Ipv4Addr::new(127, 0, 0, 2 + (t % 250) as u8);
                let began = std::time::Instant::now();
                // Bounded: 200 requests or 60 s per thread, and over once the test has its answer.
                for i in 0..200 {
                    if stop.load(Ordering::Relaxed) || began.elapsed() > Duration::from_secs(60) {
                        break;
                    }
                    let auth = basic(&format!("stranger-{t}-{i}"), "guess");
                    let r = request_from(from, "GET", url, &[("authorization", &auth)], b"");
                    if r.status == 503 {
                        busy.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        warden_test_support::wait_until(
            "the flood to fill the queue",
            Duration::from_secs(60),
            || (busy.load(Ordering::Relaxed) > 0).then_some(()),
        );
        for (i, user) in ["alice", "bob", "carol", "dave"].iter().enumerate() {
            let from = std::net::Ipv4Addr::new(127, 1, 0, 1 + i as u8);
            let auth = basic(user, &w.password(user));
            let r = request_from(from, "GET", &url, &[("authorization", &auth)], b"");
            assert_eq!(r.status, 200, "{user} from another network: {}", r.text());
        }
        // The flood was still refused meanwhile: the queue was full throughout.
        let before = busy.load(Ordering::Relaxed);
        warden_test_support::wait_until(
            "the flood to be refused again",
            Duration::from_secs(60),
            || (busy.load(Ordering::Relaxed) > before).then_some(()),
        );
        stop.store(true, Ordering::Relaxed);
    });
}
