//! Property tests of the ClientHello classifier: any hello the grammar allows, cut anywhere,
//! and any bytes at all.

use proptest::prelude::*;

use super::{classify, First, EXT_PRE_SHARED_KEY, EXT_SESSION_TICKET};

/// A TLS record holding a ClientHello with `session_id` and `extensions` (kind, data).
fn record(session_id: &[u8], suites: u16, extensions: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7; 32]);
    body.push(session_id.len() as u8);
    body.extend_from_slice(session_id);
    body.extend_from_slice(&(suites * 2).to_be_bytes());
    body.extend(std::iter::repeat_n(0x13, usize::from(suites * 2)));
    body.extend_from_slice(&[1, 0]);
    let mut ext = Vec::new();
    for (kind, data) in extensions {
        ext.extend_from_slice(&kind.to_be_bytes());
        ext.extend_from_slice(&(data.len() as u16).to_be_bytes());
        ext.extend_from_slice(data);
    }
    body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
    body.extend_from_slice(&ext);
    let mut hs = vec![1];
    hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&body);
    let mut rec = vec![0x16, 3, 1];
    rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    rec.extend_from_slice(&hs);
    rec
}

/// This server "issued" session ids that start with an even byte.
fn known(id: &[u8]) -> bool {
    id.first().is_some_and(|b| b % 2 == 0)
}

fn extension() -> impl Strategy<Value = (u16, Vec<u8>)> {
    (
        prop_oneof![
            Just(EXT_PRE_SHARED_KEY as u16),
            Just(EXT_SESSION_TICKET as u16),
            any::<u16>()
        ],
        prop::collection::vec(any::<u8>(), 0..24),
    )
}

proptest! {
    #[test]
    fn prop_hello_resumption_is_found_exactly_and_a_cut_hello_is_a_full_handshake(
        session_id in prop::collection::vec(any::<u8>(), 0..=32),
        suites in 1u16..40,
        extensions in prop::collection::vec(extension(), 0..8),
    ) {
        let rec = record(&session_id, suites, &extensions);
        let resumption = extensions.iter().any(|(k, d)| {
            usize::from(*k) == EXT_PRE_SHARED_KEY || (usize::from(*k) == EXT_SESSION_TICKET && !d.is_empty())
        }) || (!session_id.is_empty() && known(&session_id));
        prop_assert_eq!(classify(&rec, known), First::Tls { resumption });
        for cut in 1..rec.len() {
            prop_assert_eq!(classify(&rec[..cut], known), First::Tls { resumption: false }, "cut at {}", cut);
        }
    }

    #[test]
    fn prop_hello_any_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        let _ = classify(&bytes, known);
        let mut rec = vec![0x16, 3, 1];
        rec.extend_from_slice(&bytes);
        let tls = matches!(classify(&rec, known), First::Tls { .. });
        prop_assert!(tls);
    }
}
