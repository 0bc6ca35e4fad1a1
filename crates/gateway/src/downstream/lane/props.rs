//! Property tests of the lane's request-head parser: any bytes, and any head cut anywhere.

use proptest::prelude::*;

use super::{parse, Parse};

/// A well-formed HTTP/1.1 head: method, target, header fields.
fn head() -> impl Strategy<Value = (String, String, Vec<(String, String)>)> {
    (
        prop::sample::select(vec!["GET", "POST", "PUT", "DELETE", "HEAD", "PATCH"]),
        "/[A-Za-z0-9/._~%?=&-]{0,40}",
        prop::collection::vec(
            (
                "[A-Za-z0-9!#$%&'*+.^_`|~-]{1,16}",
                "[!-~]([ -~]{0,30}[!-~])?",
            ),
            0..12,
        ),
    )
        .prop_map(|(m, t, h)| (m.to_owned(), t, h))
}

fn wire(method: &str, target: &str, fields: &[(String, String)]) -> Vec<u8> {
    let mut w = format!("{method} {target} HTTP/1.1\r\n");
    for (n, v) in fields {
        w.push_str(&format!("{n}: {v}\r\n"));
    }
    w.push_str("\r\n");
    w.into_bytes()
}

proptest! {
    #[test]
    fn prop_head_any_bytes_never_panic_and_ranges_stay_inside(
        bytes in prop::collection::vec(any::<u8>(), 0..600),
    ) {
        let mut fields = Vec::new();
        if let Parse::Head(h) = parse(&bytes, &mut fields) {
            prop_assert!(h.len <= bytes.len());
            for r in [&h.method, &h.target].into_iter().chain(fields.iter().flat_map(|f| [&f.name, &f.value])) {
                prop_assert!(r.start <= r.end && r.end <= h.len);
            }
        }
    }

    #[test]
    fn prop_head_cut_anywhere_waits_for_the_rest_and_then_reads_it_exactly(
        (method, target, sent) in head(),
        after in prop::collection::vec(any::<u8>(), 0..16),
    ) {
        let head = wire(&method, &target, &sent);
        let mut fields = Vec::new();
        for cut in 0..head.len() {
            prop_assert!(
                matches!(parse(&head[..cut], &mut fields), Parse::Partial),
                "a head cut at {} is not complete", cut
            );
        }
        let mut buf = head.clone();
        buf.extend_from_slice(&after);
        let Parse::Head(h) = parse(&buf, &mut fields) else {
            return Err(TestCaseError::fail("a whole head"));
        };
        prop_assert_eq!(h.len, head.len());
        prop_assert_eq!(&buf[h.method], method.as_bytes());
        prop_assert_eq!(&buf[h.target], target.as_bytes());
        prop_assert_eq!(fields.len(), sent.len());
        for (f, (n, v)) in fields.iter().zip(&sent) {
            prop_assert_eq!(&buf[f.name.clone()], n.as_bytes());
            prop_assert_eq!(&buf[f.value.clone()], v.as_bytes());
        }
    }
}
