//! Hashers for the maps a forwarded request looks into. std's default (SipHash-1-3 under a
//! random key) cost about 3,800 instructions per forwarded request over eight lookups and the
//! audit's two sums (callgrind, `bench/lane-instructions.sh`), a tenth of the gateway's work.
//!
//! - [`FastMap`]: foldhash under a per-process random seed, for maps whose keys only the store
//!   or the operator adds (apps, hosts, users, sessions by token hash, instances, pooled
//!   connections, request rings). A client's bytes only look keys up in them, so a client
//!   cannot fill one with keys that collide; foldhash's weaker resistance to a studied seed does
//!   not reach them. (A provider's sign-in adds a user named as the provider says, one per
//!   person: aiming collisions there takes an account at the provider per key.)
//! - [`DigestMap`]: keys that are already keyed digests (a credential's HMAC under a key drawn
//!   at start, a SipHash under a random key): their first eight bytes are as unpredictable as
//!   the whole, so they are the hash. A client that fills such a map (wrong passwords are
//!   remembered; the audit sums made-up user names) cannot aim at a bucket without the key.
//!
//! Maps a client fills with keys of its choosing hash with std's SipHash.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A map keyed by values only the store or the operator adds (see the module's doc).
pub(crate) type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// A map keyed by a keyed digest (see the module's doc).
pub(crate) type DigestMap<K, V> = HashMap<K, V, BuildHasherDefault<DigestHasher>>;

/// Takes a digest's first eight bytes as its hash; a `u64` key is its own hash.
#[derive(Default)]
pub(crate) struct DigestHasher {
    hash: u64,
    taken: bool,
}

impl Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.hash
    }

    fn write(&mut self, bytes: &[u8]) {
        // An array key arrives as its length first (`write_usize`), then its bytes in one call.
        if !self.taken {
            let mut first = [0u8; 8];
            let n = bytes.len().min(8);
            first[..n].copy_from_slice(&bytes[..n]);
            self.hash = u64::from_le_bytes(first);
            self.taken = true;
        }
    }

    fn write_u64(&mut self, v: u64) {
        self.hash = v;
        self.taken = true;
    }

    fn write_usize(&mut self, _len: usize) {
        // A slice's length prefix: the same for every digest of a map.
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn a_digest_hashes_to_its_first_eight_bytes_and_a_u64_to_itself() {
        let b = BuildHasherDefault::<DigestHasher>::default();
        let mut digest = [0u8; 32];
        digest[..8].copy_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes());
        digest[31] = 9;
        assert_eq!(b.hash_one(digest), 0x0102_0304_0506_0708);
        assert_eq!(b.hash_one(0xdead_beefu64), 0xdead_beef);
        // Two digests that differ past their first eight bytes share a bucket, nothing more:
        // the map still tells them apart by equality.
        let mut m: DigestMap<[u8; 32], u8> = DigestMap::default();
        let mut other = digest;
        other[31] = 10;
        m.insert(digest, 1);
        m.insert(other, 2);
        assert_eq!((m[&digest], m[&other]), (1, 2));
    }
}
