//! The request lines the gateway keeps per app (issue 38), for `warden logs --source router`:
//! a ring of the last [`PER_APP`] answers of each of at most [`MAX_APPS`] apps, in memory only.
//!
//! The request path pays what `audit.rs` pays: a read lock of the apps' map, one atomic add
//! (the ring's next sequence number) and the lock of that one slot, which no other request
//! holds unless [`PER_APP`] requests of the app finished in between; each slot's buffers are
//! overwritten in place, so after a ring's first lap a push allocates nothing.
//!
//! A line never holds a query string, header, cookie or user name: the path is cut at its `?`.

use crate::hashing::FastMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use warden_core::requests::{RequestLine, RequestLines, RequestLog};

/// Lines kept per app.
pub(crate) const PER_APP: usize = 1_000;
/// Apps whose lines are kept; the apps of this node past it get none, and a read says so.
pub(crate) const MAX_APPS: usize = 256;
/// The longest method kept, in bytes.
const MAX_METHOD: usize = 16;
/// The longest path kept, in bytes.
pub(crate) const MAX_PATH: usize = 200;

/// One slot of a ring; `seq` 0: never written.
#[derive(Default)]
struct Slot {
    seq: u64,
    at_ms: u64,
    status: u16,
    duration_ms: u64,
    method: String,
    path: String,
    instance: String,
    label: String,
}

/// One app's last lines.
struct Ring {
    next: AtomicU64,
    slots: Box<[Mutex<Slot>]>,
}

/// What one request was, as the dispatch knows it.
pub(crate) struct Served<'a> {
    pub method: &'a [u8],
    pub target: &'a [u8],
    pub status: u16,
    pub duration_ms: u64,
    pub instance: &'a str,
    pub label: &'a str,
}

/// Every app's ring.
#[derive(Default)]
pub struct Requests {
    apps: RwLock<FastMap<Arc<str>, Arc<Ring>>>,
}

// === impl Requests ===

impl Requests {
    /// Keeps a line of `app`'s request; nothing if [`MAX_APPS`] other apps have rings.
    pub(crate) fn push(&self, app: &str, s: &Served<'_>) {
        let ring = {
            let apps = self.apps.read().unwrap_or_else(|p| p.into_inner());
            apps.get(app).cloned()
        };
        let Some(ring) = ring.or_else(|| self.ring(app)) else {
            return;
        };
        let seq = ring.next.fetch_add(1, Ordering::Relaxed) + 1;
        let mut slot = ring.slots[(seq % PER_APP as u64) as usize]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // A slower push of an older lap must not overwrite a newer line.
        if slot.seq > seq {
            return;
        }
        slot.seq = seq;
        slot.at_ms = warden_core::model::now_ms();
        slot.status = s.status;
        slot.duration_ms = s.duration_ms;
        clean_into(&mut slot.method, s.method, MAX_METHOD);
        let path = s.target.split(|&b| b == b'?').next().unwrap_or_default();
        clean_into(&mut slot.path, path, MAX_PATH);
        slot.instance.clear();
        slot.instance.push_str(s.instance);
        slot.label.clear();
        slot.label.push_str(s.label);
    }

    /// `app`'s ring, made now if fewer than [`MAX_APPS`] exist.
    fn ring(&self, app: &str) -> Option<Arc<Ring>> {
        let mut apps = self.apps.write().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = apps.get(app) {
            return Some(r.clone());
        }
        if apps.len() >= MAX_APPS {
            return None;
        }
        let ring = Arc::new(Ring {
            next: AtomicU64::new(0),
            slots: (0..PER_APP).map(|_| Mutex::default()).collect(),
        });
        apps.insert(app.into(), ring.clone());
        Some(ring)
    }
}

impl RequestLog for Requests {
    fn recent(&self, app: &str, n: usize) -> RequestLines {
        let (ring, full) = {
            let apps = self.apps.read().unwrap_or_else(|p| p.into_inner());
            (apps.get(app).cloned(), apps.len() >= MAX_APPS)
        };
        let note = (ring.is_none() && full).then(|| {
            format!("this node's gateway keeps request lines of {MAX_APPS} apps and {app:?} is not one of them; they are not kept")
        });
        let Some(ring) = ring else {
            return RequestLines {
                lines: Vec::new(),
                note,
            };
        };
        let mut lines: Vec<(u64, RequestLine)> = ring
            .slots
            .iter()
            .filter_map(|s| {
                let s = s.lock().unwrap_or_else(|p| p.into_inner());
                (s.seq > 0).then(|| {
                    let line = RequestLine {
                        at_ms: s.at_ms,
                        method: s.method.clone(),
                        path: s.path.clone(),
                        status: s.status,
                        duration_ms: s.duration_ms,
                        instance: s.instance.clone(),
                        label: s.label.clone(),
                    };
                    (s.seq, line)
                })
            })
            .collect();
        lines.sort_unstable_by_key(|(seq, _)| *seq);
        let skip = lines.len().saturating_sub(n);
        RequestLines {
            lines: lines.into_iter().skip(skip).map(|(_, l)| l).collect(),
            note,
        }
    }
}

/// `raw` into `out` (cleared first), bytes that are not printable ASCII written as `?`, cut
/// to `max` bytes: a path or method is whatever a client sent.
fn clean_into(out: &mut String, raw: &[u8], max: usize) {
    out.clear();
    out.extend(
        raw.iter()
            .take(max)
            .map(|&b| if b.is_ascii_graphic() { b as char } else { '?' }),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn served<'a>(target: &'a [u8], instance: &'a str) -> Served<'a> {
        Served {
            method: b"GET",
            target,
            status: 200,
            duration_ms: 1,
            instance,
            label: "public",
        }
    }

    #[test]
    fn a_ring_keeps_the_newest_lines_without_query_or_control_characters() {
        let r = Requests::default();
        for i in 0..PER_APP + 5 {
            r.push("a", &served(format!("/p{i}?token=secret").as_bytes(), "i1"));
        }
        r.push("a", &served(b"/x\x1b[31m\n", "i2"));
        let got = r.recent("a", 3).lines;
        let paths: Vec<_> = got.iter().map(|l| l.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                format!("/p{}", PER_APP + 3),
                format!("/p{}", PER_APP + 4),
                "/x?[31m?".into()
            ]
        );
        assert_eq!(r.recent("a", usize::MAX).lines.len(), PER_APP);
        assert!(r.recent("b", 5).lines.is_empty());
    }

    #[test]
    fn apps_past_the_bound_are_not_kept_and_a_read_says_so() {
        let r = Requests::default();
        for i in 0..=MAX_APPS {
            r.push(&format!("app{i}"), &served(b"/", "i"));
        }
        let past = r.recent(&format!("app{MAX_APPS}"), 5);
        assert!(past.lines.is_empty());
        assert!(past.note.is_some_and(|n| n.contains("not kept")));
        let path = "/".repeat(MAX_PATH * 2);
        r.push("app0", &served(path.as_bytes(), "i"));
        assert_eq!(r.recent("app0", 1).lines[0].path.len(), MAX_PATH);
    }
}
