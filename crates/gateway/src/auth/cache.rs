//! Verified-credential cache: Argon2id runs once per credential, not once per request.
//!
//! Entries are keyed by HMAC-SHA256 of the credential under a key drawn at start and never
//! stored, so the cache holds nothing that could be replayed or cracked offline. Each entry
//! remembers the fingerprint of the password hash it was verified against: a changed password
//! (or a removed user) misses at once. Wrong credentials are remembered for a short while too,
//! so repeating a failure costs the same as repeating a success.

use crate::hashing::DigestMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

/// A MAC of a credential.
pub(crate) type CredKey = [u8; 32];
/// SHA-256 of a user's PHC hash ([0; 32] for no user).
pub(crate) type Fingerprint = [u8; 32];

struct Entry {
    ok: bool,
    fingerprint: Fingerprint,
    at: Instant,
}

pub(crate) struct CredentialCache {
    /// HMAC-SHA256 keyed once: each credential's MAC starts from a clone of its state, which
    /// saves hashing the key's two pad blocks per request.
    mac: Hmac<Sha256>,
    map: RwLock<DigestMap<CredKey, Entry>>,
    ttl_ok: Duration,
    ttl_bad: Duration,
    capacity: usize,
}

impl CredentialCache {
    pub fn new(ttl_ok: Duration, ttl_bad: Duration, capacity: usize) -> Self {
        let mut key = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut key);
        // HMAC takes a key of any length, so a 32-byte key is never refused.
        let mac = Hmac::<Sha256>::new_from_slice(&key).expect("HMAC takes any key length");
        Self {
            mac,
            map: RwLock::new(DigestMap::default()),
            ttl_ok,
            ttl_bad,
            capacity,
        }
    }

    /// The cache key of a credential. Lengths are prefixed so `("ab", "c")` and `("a", "bc")`
    /// differ.
    pub fn key(&self, user: &str, password: &str) -> CredKey {
        let mut mac = self.mac.clone();
        mac.update(&(user.len() as u64).to_le_bytes());
        mac.update(user.as_bytes());
        mac.update(password.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// `Some(true)`: verified recently against this fingerprint; `Some(false)`: recently
    /// refused; `None`: must be verified.
    pub fn lookup(&self, key: &CredKey, fingerprint: &Fingerprint) -> Option<bool> {
        let map = self.map.read().unwrap_or_else(|p| p.into_inner());
        let e = map.get(key)?;
        let ttl = if e.ok { self.ttl_ok } else { self.ttl_bad };
        (e.fingerprint == *fingerprint && e.at.elapsed() < ttl).then_some(e.ok)
    }

    pub fn insert(&self, key: CredKey, ok: bool, fingerprint: Fingerprint) {
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        if map.len() >= self.capacity {
            let (ttl_ok, ttl_bad) = (self.ttl_ok, self.ttl_bad);
            map.retain(|_, e| e.at.elapsed() < if e.ok { ttl_ok } else { ttl_bad });
            if map.len() >= self.capacity {
                // Full of live entries, most likely refused guesses of a flood: those go first,
                // so the users verified already keep being served from memory.
                map.retain(|_, e| e.ok);
            }
            if map.len() >= self.capacity {
                // Still full: start over rather than grow without bound.
                map.clear();
            }
        }
        map.insert(
            key,
            Entry {
                ok,
                fingerprint,
                at: Instant::now(),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_only_for_the_same_credential_and_hash() {
        let c = CredentialCache::new(Duration::from_secs(60), Duration::from_secs(60), 2);
        let k = c.key("alice", "pw");
        assert_ne!(k, c.key("alic", "epw"));
        assert_eq!(c.lookup(&k, &[1; 32]), None);
        c.insert(k, true, [1; 32]);
        assert_eq!(c.lookup(&k, &[1; 32]), Some(true));
        assert_eq!(
            c.lookup(&k, &[2; 32]),
            None,
            "a changed password hash misses"
        );
        let bad = c.key("alice", "nope");
        c.insert(bad, false, [1; 32]);
        assert_eq!(c.lookup(&bad, &[1; 32]), Some(false));
        c.insert(c.key("x", "y"), true, [0; 32]);
        assert!(c.map.read().expect("lock").len() <= 2, "bounded");
    }

    #[test]
    fn a_flood_of_refused_guesses_does_not_evict_the_verified() {
        let c = CredentialCache::new(Duration::from_secs(60), Duration::from_secs(60), 100);
        let alice = c.key("alice", "pw");
        c.insert(alice, true, [1; 32]);
        for i in 0..1000 {
            c.insert(c.key("alice", &format!("guess {i}")), false, [1; 32]);
        }
        assert_eq!(c.lookup(&alice, &[1; 32]), Some(true));
        assert!(c.map.read().expect("lock").len() <= 100, "bounded");
    }

    #[test]
    fn entries_expire() {
        let c = CredentialCache::new(Duration::ZERO, Duration::ZERO, 10);
        let k = c.key("a", "b");
        c.insert(k, true, [0; 32]);
        assert_eq!(c.lookup(&k, &[0; 32]), None);
    }
}
