//! Byte layouts of the embedded store's tables.
//!
//! `kv` values: create revision, mod revision, lease (0 = none), SHA-256, then the value; all
//! integers little-endian. `log` values: kind (1 put, 2 delete), key length (u32), key, value.

use crate::{content_hash, Entry, Event, EventKind, Hash, LeaseId, Revision, StoreError};

const HEADER: usize = 8 + 8 + 8 + 32;
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

pub(super) fn encode_record(
    create_revision: Revision,
    mod_revision: Revision,
    lease: Option<LeaseId>,
    value: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + value.len());
    out.extend_from_slice(&create_revision.to_le_bytes());
    out.extend_from_slice(&mod_revision.to_le_bytes());
    out.extend_from_slice(&lease.unwrap_or(0).to_le_bytes());
    out.extend_from_slice(&content_hash(value));
    out.extend_from_slice(value);
    out
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(b)
}

pub(super) fn decode_meta(key: &str, bytes: &[u8]) -> Result<Meta, StoreError> {
    if bytes.len() < HEADER {
        return Err(StoreError::Corrupt {
            key: key.to_owned(),
            reason: format!(
                "record is {} bytes, shorter than its {HEADER}-byte header",
                bytes.len()
            ),
        });
    }
    let lease = u64_at(bytes, 16);
    let mut hash = [0u8; 32];
    hash.copy_from_slice(&bytes[24..HEADER]);
    Ok(Meta {
        create_revision: u64_at(bytes, 0),
        mod_revision: u64_at(bytes, 8),
        lease: (lease != 0).then_some(lease),
        hash,
    })
}

pub(super) fn decode_entry(key: &str, bytes: &[u8]) -> Result<Entry, StoreError> {
    let meta = decode_meta(key, bytes)?;
    Ok(Entry {
        key: key.to_owned(),
        value: bytes[HEADER..].to_vec(),
        hash: meta.hash,
        create_revision: meta.create_revision,
        mod_revision: meta.mod_revision,
        lease: meta.lease,
    })
}

pub(super) fn encode_event(key: &str, kind: &EventKind) -> Vec<u8> {
    let value: &[u8] = match kind {
        EventKind::Put(v) => v,
        EventKind::Delete => &[],
    };
    let mut out = Vec::with_capacity(5 + key.len() + value.len());
    out.push(if matches!(kind, EventKind::Put(_)) {
        PUT
    } else {
        DELETE
    });
    out.extend_from_slice(&(key.len() as u32).to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(value);
    out
}

pub(super) fn decode_event(revision: Revision, bytes: &[u8]) -> Result<Event, StoreError> {
    let corrupt = |reason: &str| StoreError::Corrupt {
        key: format!("log@{revision}"),
        reason: reason.to_owned(),
    };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_events_round_trip() {
        let rec = encode_record(3, 7, Some(9), b"hello");
        let e = decode_entry("k", &rec).expect("decodes");
        assert_eq!(
            (e.create_revision, e.mod_revision, e.lease),
            (3, 7, Some(9))
        );
        assert_eq!(e.value, b"hello");
        assert_eq!(e.hash, content_hash(b"hello"));
        assert!(decode_meta("k", &rec[..10]).is_err());

        let put = encode_event("a/b", &EventKind::Put(b"v".to_vec()));
        assert_eq!(
            decode_event(5, &put).expect("decodes"),
            Event {
                revision: 5,
                key: "a/b".into(),
                kind: EventKind::Put(b"v".to_vec())
            }
        );
        let del = encode_event("a/b", &EventKind::Delete);
        assert_eq!(
            decode_event(6, &del).expect("decodes").kind,
            EventKind::Delete
        );
        assert!(decode_event(6, &del[..6]).is_err());
    }
}
