//! Byte layouts of the embedded store's tables, and the checksums that prove them on every read.
//!
//! Format 2 (written since checksums came; the `meta` table's `format` says which a file holds):
//! - `kv` values: create revision, mod revision, lease (0 = none), SHA-256 of the value, the
//!   value, then a SHA-256 seal over the key and the 56-byte header. Integers little-endian.
//!   A read checks the seal (so a changed revision, lease or key shows) and the value's hash (so
//!   a changed value shows): a record that fails either is [`StoreError::Corrupt`], never served.
//! - `log` values: kind (1 put, 2 delete), key length (u32), key, value, then a SHA-256 seal
//!   over the revision and all of that.
//!
//! Format 1 (files written before) is the same without the seals: [`decode_v1_record`] reads
//! it, checking the value's hash, for the migration that rewrites a file in format 2 on open.

use sha2::{Digest, Sha256};

use crate::{content_hash, Entry, Event, EventKind, Hash, LeaseId, Revision, StoreError};

/// The record layout this code writes.
pub(super) const FORMAT: u64 = 2;
const HEADER: usize = 8 + 8 + 8 + 32;
const SEAL: usize = 32;
const PUT: u8 = 1;
const DELETE: u8 = 2;

/// The metadata of a stored record, without its value.
#[derive(Debug, Clone, Copy)]
pub(super) struct Meta {
    pub create_revision: Revision,
    pub mod_revision: Revision,
    pub lease: Option<LeaseId>,
    pub hash: Hash,
}

fn record_seal(key: &str, header: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update(b"warden-store-record/2\0");
    h.update((key.len() as u64).to_le_bytes());
    h.update(key.as_bytes());
    h.update(header);
    h.finalize().into()
}

fn event_seal(revision: Revision, body: &[u8]) -> Hash {
    let mut h = Sha256::new();
    h.update(b"warden-store-log/2\0");
    h.update(revision.to_le_bytes());
    h.update(body);
    h.finalize().into()
}

pub(super) fn encode_record(
    key: &str,
    create_revision: Revision,
    mod_revision: Revision,
    lease: Option<LeaseId>,
    value: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + value.len() + SEAL);
    out.extend_from_slice(&create_revision.to_le_bytes());
    out.extend_from_slice(&mod_revision.to_le_bytes());
    out.extend_from_slice(&lease.unwrap_or(0).to_le_bytes());
    out.extend_from_slice(&content_hash(value));
    let seal = record_seal(key, &out);
    out.extend_from_slice(value);
    out.extend_from_slice(&seal);
    out
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(b)
}

fn corrupt(key: &str, reason: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        key: key.to_owned(),
        reason: reason.into(),
    }
}

fn meta_of(header: &[u8]) -> Meta {
    let lease = u64_at(header, 16);
    let mut hash = [0u8; 32];
    hash.copy_from_slice(&header[24..HEADER]);
    Meta {
        create_revision: u64_at(header, 0),
        mod_revision: u64_at(header, 8),
        lease: (lease != 0).then_some(lease),
        hash,
    }
}

/// The header and value of a format-2 record whose seal holds (the value's hash is not checked).
fn open_record<'b>(key: &str, bytes: &'b [u8]) -> Result<(Meta, &'b [u8]), StoreError> {
    if bytes.len() < HEADER + SEAL {
        return Err(corrupt(
            key,
            format!(
                "record is {} bytes, shorter than its header and checksum ({} bytes)",
                bytes.len(),
                HEADER + SEAL
            ),
        ));
    }
    let (header, rest) = bytes.split_at(HEADER);
    let (value, seal) = rest.split_at(rest.len() - SEAL);
    if record_seal(key, header)[..] != seal[..] {
        return Err(corrupt(
            key,
            "its checksum does not match (its revisions, lease or key changed on disk)",
        ));
    }
    Ok((meta_of(header), value))
}

/// The metadata of a record, its seal checked. (Its value is not read: the value's own hash is
/// checked wherever the value is.)
pub(super) fn decode_meta(key: &str, bytes: &[u8]) -> Result<Meta, StoreError> {
    open_record(key, bytes).map(|(m, _)| m)
}

/// A record, its seal and its value's hash checked.
pub(super) fn decode_entry(key: &str, bytes: &[u8]) -> Result<Entry, StoreError> {
    let (meta, value) = open_record(key, bytes)?;
    entry(key, meta, value)
}

fn entry(key: &str, meta: Meta, value: &[u8]) -> Result<Entry, StoreError> {
    if content_hash(value) != meta.hash {
        return Err(corrupt(
            key,
            "its value does not match its checksum (the value changed on disk)",
        ));
    }
    Ok(Entry {
        key: key.to_owned(),
        value: value.to_vec(),
        hash: meta.hash,
        create_revision: meta.create_revision,
        mod_revision: meta.mod_revision,
        lease: meta.lease,
    })
}

/// A record of a format-1 file (no seal), its value's hash checked.
pub(super) fn decode_v1_record(key: &str, bytes: &[u8]) -> Result<Entry, StoreError> {
    if bytes.len() < HEADER {
        return Err(corrupt(
            key,
            format!(
                "record is {} bytes, shorter than its {HEADER}-byte header",
                bytes.len()
            ),
        ));
    }
    let (header, value) = bytes.split_at(HEADER);
    entry(key, meta_of(header), value)
}

/// A record of a file in `format`, checked as that format allows.
pub(super) fn decode_in(format: u64, key: &str, bytes: &[u8]) -> Result<Entry, StoreError> {
    match format {
        1 => decode_v1_record(key, bytes),
        _ => decode_entry(key, bytes),
    }
}

pub(super) fn encode_event(revision: Revision, key: &str, kind: &EventKind) -> Vec<u8> {
    let value: &[u8] = match kind {
        EventKind::Put(v) => v,
        EventKind::Delete => &[],
    };
    let mut out = Vec::with_capacity(5 + key.len() + value.len() + SEAL);
    out.push(if matches!(kind, EventKind::Put(_)) {
        PUT
    } else {
        DELETE
    });
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(value);
    let seal = event_seal(revision, &out);
    out.extend_from_slice(&seal);
    out
}

/// A log entry, its seal checked.
pub(super) fn decode_event(revision: Revision, bytes: &[u8]) -> Result<Event, StoreError> {
    let key = format!("log@{revision}");
    if bytes.len() < 5 + SEAL {
        return Err(corrupt(&key, "log entry shorter than its header"));
    }
    let (body, seal) = bytes.split_at(bytes.len() - SEAL);
    if event_seal(revision, body)[..] != seal[..] {
        return Err(corrupt(
            &key,
            "its checksum does not match (the entry changed on disk)",
        ));
    }
    decode_v1_event(revision, body)
}

/// A log entry of a format-1 file (no seal).
pub(super) fn decode_v1_event(revision: Revision, bytes: &[u8]) -> Result<Event, StoreError> {
    let corrupt = |reason: &str| corrupt(&format!("log@{revision}"), reason);
    if bytes.len() < 5 {
        return Err(corrupt("log entry shorter than its header"));
    }
    let mut len = [0u8; 4];
    len.copy_from_slice(&bytes[1..5]);
    let key_end = 5 + u32::from_le_bytes(len) as usize;
    let key = bytes
        .get(5..key_end)
        .and_then(|k| std::str::from_utf8(k).ok())
        .ok_or_else(|| corrupt("log entry key is truncated or not UTF-8"))?;
    let kind = match bytes[0] {
        PUT => EventKind::Put(bytes[key_end..].to_vec()),
        DELETE => EventKind::Delete,
        _ => return Err(corrupt("unknown log entry kind")),
    };
    Ok(Event {
        revision,
        key: key.to_owned(),
        kind,
    })
}

/// A log entry of a file in `format`.
pub(super) fn decode_event_in(
    format: u64,
    revision: Revision,
    bytes: &[u8],
) -> Result<Event, StoreError> {
    match format {
        1 => decode_v1_event(revision, bytes),
        _ => decode_event(revision, bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_events_round_trip() {
        let rec = encode_record("k", 3, 7, Some(9), b"hello");
        let e = decode_entry("k", &rec).expect("decodes");
        assert_eq!(
            (e.create_revision, e.mod_revision, e.lease),
            (3, 7, Some(9))
        );
        assert_eq!(e.value, b"hello");
        assert_eq!(e.hash, content_hash(b"hello"));
        assert!(decode_meta("k", &rec[..10]).is_err());

        let put = encode_event(5, "a/b", &EventKind::Put(b"v".to_vec()));
        assert_eq!(
            decode_event(5, &put).expect("decodes"),
            Event {
                revision: 5,
                key: "a/b".into(),
                kind: EventKind::Put(b"v".to_vec())
            }
        );
        let del = encode_event(6, "a/b", &EventKind::Delete);
        assert_eq!(
            decode_event(6, &del).expect("decodes").kind,
            EventKind::Delete
        );
        assert!(decode_event(6, &del[..6]).is_err());
    }

    #[test]
    fn every_changed_byte_of_a_record_or_log_entry_is_refused() {
        let rec = encode_record(
            "apps/a/spec",
            3,
            7,
            None,
            br#"{"static_prefix":"/static/"}"#,
        );
        for at in 0..rec.len() {
            let mut bad = rec.clone();
            bad[at] ^= 0x04;
            assert!(
                decode_entry("apps/a/spec", &bad).is_err(),
                "a flip at byte {at} was served"
            );
        }
        assert!(
            decode_entry("apps/b/spec", &rec).is_err(),
            "a record moved to another key"
        );
        let ev = encode_event(9, "apps/a/spec", &EventKind::Put(b"{}".to_vec()));
        for at in 0..ev.len() {
            let mut bad = ev.clone();
            bad[at] ^= 0x04;
            assert!(
                decode_event(9, &bad).is_err(),
                "a flip at byte {at} was served"
            );
        }
        assert!(
            decode_event(10, &ev).is_err(),
            "an entry moved to another revision"
        );
    }

    #[test]
    fn format_1_records_read_with_their_value_hash_checked() {
        let value = b"old";
        let mut v1 = Vec::new();
        for n in [4u64, 5, 0] {
            v1.extend_from_slice(&n.to_le_bytes());
        }
        v1.extend_from_slice(&content_hash(value));
        v1.extend_from_slice(value);
        let e = decode_in(1, "k", &v1).expect("a sound format-1 record reads");
        assert_eq!((e.value.as_slice(), e.mod_revision), (&value[..], 5));
        let last = v1.len() - 1;
        v1[last] ^= 1;
        assert!(decode_in(1, "k", &v1).is_err(), "its value hash is checked");
        assert!(decode_in(2, "k", &v1).is_err(), "format 2 wants a seal");
    }
}
