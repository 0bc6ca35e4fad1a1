//! Property tests of the chunked decoder: any body split anywhere, and any bytes at all.

use proptest::prelude::*;

use super::{Malformed, Scanner};

/// A chunked body of `chunks`, each with an optional extension, and `trailers`.
fn encode(chunks: &[Vec<u8>], ext: bool, trailers: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    for c in chunks.iter().filter(|c| !c.is_empty()) {
        out.extend_from_slice(format!("{:x}", c.len()).as_bytes());
        if ext {
            out.extend_from_slice(b";name=\"v\"");
        }
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(c);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n");
    for (n, v) in trailers {
        out.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// Feeds `bytes` in pieces cut at `cuts`; returns how many belong to the body and its data.
fn scan(bytes: &[u8], cuts: &[usize]) -> Result<(usize, Vec<u8>, bool), Malformed> {
    let mut s = Scanner::new();
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.push(0);
    points.push(bytes.len());
    points.sort_unstable();
    let mut taken = 0;
    let mut data = Vec::new();
    for w in points.windows(2) {
        let part = &bytes[w[0]..w[1]];
        let n = s.advance_with(part, |r| data.extend_from_slice(&part[r]))?;
        taken += n;
        if n < part.len() || s.done() {
            break;
        }
    }
    Ok((taken, data, s.done()))
}

proptest! {
    #[test]
    fn prop_chunked_finds_the_same_end_and_data_however_the_body_is_split(
        chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 0..8),
        ext in any::<bool>(),
        trailers in prop::collection::vec(("[a-z][a-z-]{0,10}", "[ -~]{0,20}"), 0..3),
        after in prop::collection::vec(any::<u8>(), 0..20),
        cuts in prop::collection::vec(any::<usize>(), 0..6),
    ) {
        let body = encode(&chunks, ext, &trailers);
        let mut wire = body.clone();
        wire.extend_from_slice(&after);
        let (taken, data, done) = scan(&wire, &cuts).expect("a well-formed body");
        prop_assert!(done);
        prop_assert_eq!(taken, body.len(), "the body ends where it ends, whatever follows");
        prop_assert_eq!(data, chunks.concat());
    }

    #[test]
    fn prop_chunked_any_bytes_never_panic_or_overrun(
        bytes in prop::collection::vec(any::<u8>(), 0..400),
        cuts in prop::collection::vec(any::<usize>(), 0..6),
    ) {
        if let Ok((taken, data, _)) = scan(&bytes, &cuts) {
            prop_assert!(taken <= bytes.len());
            prop_assert!(data.len() <= taken);
        }
    }

    #[test]
    fn prop_chunked_a_bare_lf_or_control_byte_in_framing_is_refused(
        size in 1usize..64,
        bad in prop::sample::select(vec![b'\n', b'\0', 0x7f, 0x0b]),
    ) {
        // In the size line's extension, and in a trailer line.
        let mut ext = format!("{size:x};a").into_bytes();
        ext.push(bad);
        ext.extend_from_slice(b"\r\n");
        prop_assert!(Scanner::new().advance(&ext).is_err());
        let mut trailer = b"0\r\nx-t: a".to_vec();
        trailer.push(bad);
        trailer.extend_from_slice(b"\r\n\r\n");
        prop_assert!(Scanner::new().advance(&trailer).is_err());
    }
}
