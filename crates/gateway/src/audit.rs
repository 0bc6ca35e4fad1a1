//! The gateway's audit records (issue 35): sign-ins, accesses and refusals summed per period
//! (a minute unless configured) in sharded maps of atomic counters, and taints as they happen.
//!
//! The request path pays one hash of the key's bytes, a shard's read lock and a few atomic
//! adds; it allocates only the first time a key is seen in a period, and a client's address is
//! keyed by its 4 or 16 bytes (written out as text only at the flush). The log gets one record
//! per distinct key per period, whatever the number of requests: a flood of failed sign-ins
//! writes one record a minute per (user, address, method, outcome). The sums are flushed each
//! period and once more when the gateway stops; a crash loses at most the open period, and the
//! log's start-up `gap` record ("the previous run ended without stopping") says so.
//!
//! No record holds a password, token or session id: a sign-in names the user as presented
//! (cut to [`MAX_USER`] bytes), the client's address and the method.

use std::collections::HashMap;

use crate::hashing::DigestMap;
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::watch;
use warden_core::audit::{Audit, Event, MAX_CLAIM, MAX_CLAIMS};
use warden_core::InstanceRecord;

/// The next thread's slot (see [`SLOT`]).
static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's slot: moves the shard of every key it sums, so no two threads (of up to
    /// [`SHARDS`]) sum a key in the same shard.
    static SLOT: usize = NEXT_SLOT.fetch_add(1, Ordering::Relaxed);
}

/// Shards of each tally: enough that two cores rarely meet on one lock.
const SHARDS: usize = 16;
/// Distinct keys one tally holds per period; past it, new keys are summed under one
/// [`MORE`] key, so a flood of made-up user names cannot grow memory or the log.
const MAX_KEYS: usize = 50_000;
/// The key parts of what [`MAX_KEYS`] left out.
const MORE: &str = "(more)";
/// The user or app of a record when the name given is none the gateway knows: such names may
/// be anything (a password typed in the user field), and one key for all of them keeps a
/// stranger from filling the period's tally with made-up names.
pub(crate) const UNKNOWN: &str = "(unknown)";
/// An access record's instance for the requests of per-request instances, each of which served
/// one request: their ids would make one record per request.
pub(crate) const PER_REQUEST: &str = "(per request)";
/// [`MORE`] as a key part.
const MORE_KEY: &[u8] = MORE.as_bytes();
/// The longest user name a record keeps, in bytes: a name as presented may be anything.
pub(crate) const MAX_USER: usize = 64;

/// One key's sums in a period.
struct Entry<const N: usize> {
    key: [Box<[u8]>; N],
    count: AtomicU64,
    bytes: AtomicU64,
    first_ms: AtomicU64,
    last_ms: AtomicU64,
}

/// What a tally held at a flush.
struct Sum<const N: usize> {
    key: [Box<[u8]>; N],
    count: u64,
    bytes: u64,
    first_ms: u64,
    last_ms: u64,
}

/// Entries by their key's hash, itself a SipHash under the tally's random key.
type Shard<const N: usize> = RwLock<DigestMap<u64, Vec<Entry<N>>>>;

/// Sums per key of `N` byte strings, sharded by the key's hash.
struct Tally<const N: usize> {
    hasher: std::hash::RandomState,
    shards: Vec<Shard<N>>,
    keys: AtomicUsize,
}

// === impl Entry ===

impl<const N: usize> Entry<N> {
    fn is(&self, key: &[&[u8]; N]) -> bool {
        self.key.iter().zip(key).all(|(a, b)| **a == **b)
    }

    fn add(&self, bytes: u64, now: u64) {
        // One read-modify-write per request: every request of one user hits the same entry
        // from every core, and each such write moves the cache line. The times change at most
        // once a millisecond, so they are read first and written only when they move.
        self.count.fetch_add(1, Ordering::Relaxed);
        if bytes > 0 {
            self.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        if now < self.first_ms.load(Ordering::Relaxed) {
            self.first_ms.fetch_min(now, Ordering::Relaxed);
        }
        if now > self.last_ms.load(Ordering::Relaxed) {
            self.last_ms.fetch_max(now, Ordering::Relaxed);
        }
    }
}

// === impl Tally ===

impl<const N: usize> Tally<N> {
    fn new() -> Self {
        Self {
            hasher: std::hash::RandomState::new(),
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
            keys: AtomicUsize::new(0),
        }
    }

    /// The key's hash: its parts, each after its length, in one write when they fit on the
    /// stack (a user name, an address, a few words). SipHash costs mostly per write, and
    /// hashing the parts one by one made ten writes a key. A longer key is hashed part by
    /// part, the same way every time it comes.
    fn hash(&self, key: &[&[u8]; N]) -> u64 {
        const INLINE: usize = 192;
        if key.iter().map(|p| p.len() + 2).sum::<usize>() > INLINE {
            return self.hasher.hash_one(key);
        }
        let mut buf = [0u8; INLINE];
        let mut at = 0;
        for part in key {
            // Each part is under INLINE bytes, so its length fits two bytes.
            buf[at..at + 2].copy_from_slice(&(part.len() as u16).to_le_bytes());
            buf[at + 2..at + 2 + part.len()].copy_from_slice(part);
            at += 2 + part.len();
        }
        let mut h = self.hasher.build_hasher();
        h.write(&buf[..at]);
        h.finish()
    }

    fn add(&self, key: [&[u8]; N], bytes: u64, now: u64) {
        let h = self.hash(&key);
        // Each thread sums a key in a shard of its own (the hash moved by the thread's slot),
        // so threads serving the same user never write the same counters or lock: `take`
        // merges them.
        let slot = SLOT.with(|s| *s);
        let shard = &self.shards[(h as usize).wrapping_add(slot) % SHARDS];
        {
            let map = shard.read().unwrap_or_else(|p| p.into_inner());
            if let Some(e) = map.get(&h).and_then(|v| v.iter().find(|e| e.is(&key))) {
                e.add(bytes, now);
                return;
            }
        }
        if self.keys.load(Ordering::Relaxed) >= MAX_KEYS && key != [MORE_KEY; N] {
            return self.add([MORE_KEY; N], bytes, now);
        }
        let mut map = shard.write().unwrap_or_else(|p| p.into_inner());
        let v = map.entry(h).or_default();
        match v.iter().find(|e| e.is(&key)) {
            Some(e) => e.add(bytes, now),
            None => {
                self.keys.fetch_add(1, Ordering::Relaxed);
                v.push(Entry {
                    key: key.map(Box::from),
                    count: AtomicU64::new(1),
                    bytes: AtomicU64::new(bytes),
                    first_ms: AtomicU64::new(now),
                    last_ms: AtomicU64::new(now),
                });
            }
        }
    }

    /// Everything summed since the last take; each shard is swapped under its write lock, so
    /// no add falls between two periods.
    fn take(&self) -> Vec<Sum<N>> {
        // One sum per key, however many threads' shards held it.
        let mut merged: HashMap<[Box<[u8]>; N], Sum<N>> = HashMap::new();
        for shard in &self.shards {
            let map = std::mem::take(&mut *shard.write().unwrap_or_else(|p| p.into_inner()));
            for e in map.into_values().flatten() {
                let (count, bytes) = (e.count.into_inner(), e.bytes.into_inner());
                let (first_ms, last_ms) = (e.first_ms.into_inner(), e.last_ms.into_inner());
                match merged.entry(e.key) {
                    std::collections::hash_map::Entry::Occupied(mut o) => {
                        let s = o.get_mut();
                        s.count += count;
                        s.bytes += bytes;
                        s.first_ms = s.first_ms.min(first_ms);
                        s.last_ms = s.last_ms.max(last_ms);
                    }
                    std::collections::hash_map::Entry::Vacant(v) => {
                        let key = v.key().clone();
                        v.insert(Sum {
                            key,
                            count,
                            bytes,
                            first_ms,
                            last_ms,
                        });
                    }
                }
            }
        }
        self.keys.store(0, Ordering::Relaxed);
        merged.into_values().collect()
    }
}

/// A client's address as a key part: its 4 or 16 bytes, on the stack.
struct AddrKey {
    buf: [u8; 16],
    len: usize,
}

impl AddrKey {
    fn new(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => {
                let mut buf = [0; 16];
                buf[..4].copy_from_slice(&v4.octets());
                Self { buf, len: 4 }
            }
            IpAddr::V6(v6) => Self {
                buf: v6.octets(),
                len: 16,
            },
        }
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// A key part made by [`AddrKey`] as the record writes it: the address's text, empty for none.
fn addr_text(part: &[u8]) -> String {
    if let Ok(v4) = <[u8; 4]>::try_from(part) {
        return Ipv4Addr::from(v4).to_string();
    }
    if let Ok(v6) = <[u8; 16]>::try_from(part) {
        return Ipv6Addr::from(v6).to_string();
    }
    text(part)
}

/// A key part that was a string (or [`MORE`]) as text again.
fn text(part: &[u8]) -> String {
    String::from_utf8_lossy(part).into_owned()
}

/// `name` cut to [`MAX_USER`] bytes at a character boundary.
fn bounded(name: &str) -> &str {
    cut(name, MAX_USER)
}

/// `s` cut to `max` bytes at a character boundary.
fn cut(name: &str, max: usize) -> &str {
    if name.len() <= max {
        return name;
    }
    let mut end = max;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// Deciding claims as a key part: a JSON array (one part that splits back unambiguously
/// whatever the values hold) of at most [`MAX_CLAIMS`], each cut to [`MAX_CLAIM`] bytes; empty
/// for none.
fn claims_part(claims: &[String]) -> String {
    let claims: Vec<&str> = claims
        .iter()
        .take(MAX_CLAIMS)
        .map(|c| cut(c, MAX_CLAIM))
        .collect();
    match claims.is_empty() {
        true => String::new(),
        false => serde_json::to_string(&claims).unwrap_or_default(),
    }
}

/// What the gateway records, and the sums waiting for the next flush.
pub(crate) struct Recorder {
    audit: Arc<dyn Audit>,
    /// False when the node keeps no log: then nothing is summed at all.
    on: bool,
    /// (user, addr, method, outcome, deciding claims as a JSON array or empty).
    sign_ins: Tally<5>,
    /// (user, app, label, instance, node).
    accesses: Tally<5>,
    /// (status, user, addr, app); user or addr is empty, and so is an unknown app.
    refusals: Tally<4>,
}

// === impl Recorder ===

impl Recorder {
    pub(crate) fn new(audit: Arc<dyn Audit>) -> Self {
        Self {
            on: audit.kept(),
            audit,
            sign_ins: Tally::new(),
            accesses: Tally::new(),
            refusals: Tally::new(),
        }
    }

    /// An authentication attempt: `method` is `basic`, `session` or `form`; `outcome` `ok`,
    /// `failed` or `throttled`.
    pub(crate) fn sign_in(&self, user: &str, peer: IpAddr, method: &str, outcome: &str) {
        self.sign_in_by(user, peer, method, outcome, &[]);
    }

    /// A provider sign-in or refresh, with the claim values that matched its rules
    /// (`claim=value`): at most [`MAX_CLAIMS`] of them, each cut to [`MAX_CLAIM`] bytes, so a
    /// provider's claims cannot grow a record without bound.
    pub(crate) fn sign_in_by(
        &self,
        user: &str,
        peer: IpAddr,
        method: &str,
        outcome: &str,
        claims: &[String],
    ) {
        if !self.on {
            return;
        }
        let addr = AddrKey::new(peer);
        let claims = claims_part(claims);
        let key = [
            bounded(user).as_bytes(),
            addr.bytes(),
            method.as_bytes(),
            outcome.as_bytes(),
            claims.as_bytes(),
        ];
        self.sign_ins.add(key, 0, warden_core::model::now_ms());
    }

    /// A request `instance` answered for `user`; `bytes` as the gateway counted them.
    pub(crate) fn access(&self, user: &str, instance: &InstanceRecord, label: &str, bytes: u64) {
        self.sum_access(user, instance, label, &instance.id, bytes);
    }

    /// A request a per-request instance answered (it serves that one request and dies): summed
    /// under [`PER_REQUEST`] in place of its id, so such an app's accesses are one record per
    /// (user, app, label, node) a period like every other app's, not one per request.
    pub(crate) fn access_once(
        &self,
        user: &str,
        instance: &InstanceRecord,
        label: &str,
        bytes: u64,
    ) {
        self.sum_access(user, instance, label, PER_REQUEST, bytes);
    }

    /// Sums a request of `instance` under the instance name `id`.
    fn sum_access(&self, user: &str, instance: &InstanceRecord, label: &str, id: &str, bytes: u64) {
        if !self.on {
            return;
        }
        let key = [
            user.as_bytes(),
            instance.app.as_bytes(),
            label.as_bytes(),
            id.as_bytes(),
            instance.node.as_bytes(),
        ];
        self.accesses.add(key, bytes, warden_core::model::now_ms());
    }

    /// A 401, 403 or 404 the gateway answered (other statuses are not refusals and are not
    /// recorded): by user when one is known, else by address.
    pub(crate) fn refusal(&self, status: u16, user: Option<&str>, peer: IpAddr, app: Option<&str>) {
        let status = match status {
            401 => "401",
            403 => "403",
            404 => "404",
            _ => return,
        };
        if !self.on {
            return;
        }
        let addr = AddrKey::new(peer);
        let (user, addr) = match user {
            Some(u) => (bounded(u).as_bytes(), &[][..]),
            None => (&[][..], addr.bytes()),
        };
        let key = [
            status.as_bytes(),
            user,
            addr,
            app.map_or("", bounded).as_bytes(),
        ];
        self.refusals.add(key, 0, warden_core::model::now_ms());
    }

    /// An instance relabelled by its taint: recorded at once (it is rare, and it matters).
    pub(crate) fn taint(&self, instance: &InstanceRecord, to: &str) {
        self.audit.record(Event::Taint {
            app: instance.app.clone(),
            instance: instance.id.clone(),
            from: instance.label.clone(),
            to: to.to_owned(),
        });
    }

    /// Writes what was summed since the last flush, one record per key.
    pub(crate) fn flush(&self) {
        if !self.on {
            return;
        }
        for s in self.sign_ins.take() {
            let [user, addr, method, outcome, claims] = s.key;
            self.audit.record(Event::SignIn {
                user: text(&user),
                addr: addr_text(&addr),
                method: text(&method),
                outcome: text(&outcome),
                claims: serde_json::from_slice(&claims).unwrap_or_default(),
                count: Some(s.count),
                first_ms: Some(s.first_ms),
                last_ms: Some(s.last_ms),
            });
        }
        for s in self.accesses.take() {
            let [user, app, label, instance, node] = s.key.map(|k| text(&k));
            self.audit.record(Event::Access {
                user,
                app,
                label,
                instance,
                node,
                count: s.count,
                bytes: s.bytes,
                first_ms: s.first_ms,
                last_ms: s.last_ms,
            });
        }
        for s in self.refusals.take() {
            let [status, user, addr, app] = s.key;
            let some = |s: String| (!s.is_empty()).then_some(s);
            self.audit.record(Event::Refusal {
                status: text(&status).parse().unwrap_or(0),
                user: some(text(&user)),
                addr: some(addr_text(&addr)),
                app: some(text(&app)),
                route: None,
                count: s.count,
                first_ms: s.first_ms,
                last_ms: s.last_ms,
            });
        }
    }

    /// Flushes every `period` until `shutdown` turns true, then once more.
    pub(crate) async fn run(self: Arc<Self>, period: Duration, shutdown: watch::Receiver<bool>) {
        warden_core::audit::flush_every(period, shutdown, || self.flush()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_summed_once_per_period_and_a_take_starts_afresh() {
        let t: Tally<2> = Tally::new();
        t.add([b"a", b"b"], 10, 5);
        t.add([b"a", b"b"], 1, 3);
        t.add([b"a", b"c"], 0, 4);
        let mut got = t.take();
        got.sort_by(|x, y| x.key.cmp(&y.key));
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].count, got[0].bytes), (2, 11));
        assert_eq!((got[0].first_ms, got[0].last_ms), (3, 5));
        assert_eq!(got[1].count, 1);
        assert!(t.take().is_empty());
    }

    #[test]
    fn a_key_summed_on_several_threads_is_one_sum() {
        let t: Tally<1> = Tally::new();
        std::thread::scope(|s| {
            for i in 0..4u64 {
                let t = &t;
                s.spawn(move || {
                    for _ in 0..100 {
                        t.add([b"ann"], 1, 10 + i);
                    }
                });
            }
        });
        let got = t.take();
        assert_eq!(got.len(), 1, "one sum per key");
        assert_eq!((got[0].count, got[0].bytes), (400, 400));
        assert_eq!((got[0].first_ms, got[0].last_ms), (10, 13));
    }

    #[test]
    fn names_are_cut_at_a_character_boundary() {
        let long = "é".repeat(MAX_USER);
        let cut = bounded(&long);
        assert!(cut.len() <= MAX_USER && long.starts_with(cut));
        for a in ["::1", "127.0.0.1", "fe80::1:2"] {
            assert_eq!(addr_text(AddrKey::new(a.parse().unwrap()).bytes()), a);
        }
        assert_eq!(addr_text(b""), "");
        assert_eq!(claims_part(&[]), "");
        let many: Vec<String> = (0..40)
            .map(|i| format!("groups={i}{}", "é".repeat(200)))
            .collect();
        let back: Vec<String> = serde_json::from_str(&claims_part(&many)).unwrap();
        assert_eq!(back.len(), MAX_CLAIMS);
        assert!(back
            .iter()
            .all(|c| c.len() <= MAX_CLAIM && c.starts_with("groups=")));
        assert_eq!(addr_text(MORE_KEY), MORE);
    }
}
