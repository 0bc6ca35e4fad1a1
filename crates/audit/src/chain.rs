//! A record's line and its hash. A line is the record's JSON with `hash` last:
//! `{"seq":…,"at_ms":…,"node":…,"event":{…},"prev":"…","hash":"<64 hex>"}`, and `hash` is
//! SHA-256 of `prev` (its 64 hex digits) followed by the exact bytes of the line without its
//! `,"hash":"…"` part. Hashing the bytes written, not a re-serialisation of what was parsed,
//! leaves nothing to canonicalise: any byte changed in a line changes its hash.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use warden_core::audit::Event;

/// The `prev` of a log's first record.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// What a line ends with after its body: `,"hash":"` + 64 hex digits + `"}`.
const TAIL_LEN: usize = 9 + 64 + 2;

/// A record before it is sealed: the fields the hash covers, in the order they are written.
#[derive(Serialize)]
struct Unsealed<'a> {
    seq: u64,
    at_ms: u64,
    node: &'a str,
    event: &'a Event,
    prev: &'a str,
}

/// What verify needs of a line: its place in the chain.
#[derive(Debug, Deserialize)]
pub(crate) struct Links {
    pub seq: u64,
    pub node: String,
    pub prev: String,
    pub hash: String,
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

fn digest(prev: &str, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(prev.as_bytes());
    h.update(body);
    hex(&h.finalize())
}

/// The line (without its newline) and hash of record `seq`.
pub(crate) fn seal(
    seq: u64,
    at_ms: u64,
    node: &str,
    event: &Event,
    prev: &str,
) -> (String, String) {
    let unsealed = Unsealed {
        seq,
        at_ms,
        node,
        event,
        prev,
    };
    // A struct of strings, numbers and an enum of them: serialising cannot fail.
    let mut body = serde_json::to_string(&unsealed).unwrap_or_default();
    let hash = digest(prev, body.as_bytes());
    body.pop(); // the closing brace, put back after the hash
    body.push_str(",\"hash\":\"");
    body.push_str(&hash);
    body.push_str("\"}");
    (body, hash)
}

/// Whether `line`'s hash is what its `prev` and bytes make.
pub(crate) fn hash_holds(line: &str, links: &Links) -> bool {
    let Some(cut) = line.len().checked_sub(TAIL_LEN) else {
        return false;
    };
    let Some(body) = line.get(..cut) else {
        return false;
    };
    let tail = &line[cut..];
    if !tail.starts_with(",\"hash\":\"") || !tail.ends_with("\"}") {
        return false;
    }
    let mut h = Sha256::new();
    h.update(links.prev.as_bytes());
    h.update(body.as_bytes());
    h.update(b"}");
    hex(&h.finalize()) == links.hash && tail[9..9 + 64] == *links.hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_line_holds_and_any_changed_byte_breaks_it() {
        let e = Event::Gap {
            why: "test".into(),
            lost: None,
        };
        let (line, hash) = seal(1, 5, "n1", &e, GENESIS);
        let links: Links = serde_json::from_str(&line).unwrap();
        assert_eq!(links.hash, hash);
        assert!(hash_holds(&line, &links));
        let edited = line.replace("test", "tesT");
        let l2: Links = serde_json::from_str(&edited).unwrap();
        assert!(!hash_holds(&edited, &l2));
    }
}
