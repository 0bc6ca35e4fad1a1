//! Property test of the request side: whatever headers a client sends, in whatever spelling,
//! the app gets a well-formed request whose identity and forwarding headers are the gateway's
//! alone and which carries none of the client's credentials.

use proptest::prelude::*;

use super::*;

/// Names a client might use to reach past the gateway, before their spelling is varied.
const TRICKY: &[&str] = &[
    "x-warden-user",
    "x-warden-label",
    "x-warden-signature",
    "x-warden-taint",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-forwarded-prefix",
    "forwarded",
    "x-real-ip",
    "authorization",
    "proxy-authorization",
    "cookie",
    "connection",
    "keep-alive",
    "te",
    "upgrade",
    "transfer-encoding",
    "proxy",
];

/// A header name: an ordinary token, or one of [`TRICKY`] in any case, with `_` for `-`.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        "[A-Za-z0-9!#$%&'*+.^_`|~-]{1,20}",
        (prop::sample::select(TRICKY), any::<u64>(), any::<bool>()).prop_map(
            |(n, case, underscore)| {
                n.chars()
                    .enumerate()
                    .map(|(i, c)| match c {
                        '-' if underscore => '_',
                        c if case >> (i % 64) & 1 == 1 => c.to_ascii_uppercase(),
                        c => c,
                    })
                    .collect()
            }
        ),
    ]
}

/// A value: visible ASCII and spaces, sometimes naming the session cookie or a header.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ -~]{0,30}",
        Just("a=1; warden_session=tok; b=2".to_owned()),
        Just("WARDEN_SESSION=tok".to_owned()),
        Just("x-app, close".to_owned()),
        Just("Basic YWxpY2U6cA==".to_owned()),
    ]
}

proptest! {
    #[test]
    fn prop_the_app_gets_only_the_gateways_identity_whatever_the_client_sends(
        headers in prop::collection::vec((name(), value()), 0..20),
        https in any::<bool>(),
        body in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut sent: Vec<(&[u8], &[u8])> = vec![(b"Host", b"a")];
        sent.extend(headers.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())));
        let mut out = Vec::new();
        let signed = write_request(
            &mut out,
            b"POST",
            b"/p",
            sent.iter().copied(),
            Some(body.len()),
            &Identity { user: "alice", label: "SECRET", client: "127.0.0.1", https, host: "a", prefix: "/apps/demo" },
            &body,
        );
        let mut raw = [httparse::EMPTY_HEADER; 128];
        let mut req = httparse::Request::new(&mut raw);
        let len = match req.parse(&out) {
            Ok(httparse::Status::Complete(len)) => len,
            other => return Err(TestCaseError::fail(format!("not a request: {other:?}"))),
        };
        prop_assert_eq!(&out[len..], &body[..]);
        prop_assert_eq!(&out[signed.at..signed.at + 3], b"v1=");
        let proto = if https { "https" } else { "http" };
        let mut seen: Vec<String> = Vec::new();
        for h in req.headers.iter() {
            let folded: String = folded(h.name.as_bytes()).map(char::from).collect();
            let v = std::str::from_utf8(h.value).unwrap_or("");
            prop_assert!(
                !["authorization", "proxy-authorization", "proxy", "transfer-encoding", "te", "upgrade", "keep-alive"].contains(&folded.as_str()),
                "{} passed", h.name
            );
            prop_assert!(!folded.starts_with("x-warden-") || h.name == folded, "a client's {}", h.name);
            if folded == "cookie" {
                prop_assert!(!v.to_ascii_lowercase().contains("warden_session"), "{}", v);
            }
            let expected = match folded.as_str() {
                "x-warden-user" => Some("alice"),
                "x-warden-label" => Some("SECRET"),
                "x-forwarded-for" => Some("127.0.0.1"),
                "x-forwarded-proto" => Some(proto),
                "x-forwarded-host" => Some("a"),
                "x-forwarded-prefix" => Some("/apps/demo"),
                "x-real-ip" | "x-warden-taint" => return Err(TestCaseError::fail(format!("{} passed", h.name))),
                _ => None,
            };
            if let Some(e) = expected {
                prop_assert_eq!(v, e, "{}", h.name);
            }
            if folded.starts_with("x-warden-") || folded.starts_with("x-forwarded-") || folded == "forwarded" {
                prop_assert!(!seen.contains(&folded), "{} twice", h.name);
                seen.push(folded);
            }
        }
        for must in ["x-warden-user", "x-warden-label", "x-warden-signature", "forwarded", "x-forwarded-for"] {
            prop_assert!(seen.iter().any(|s| s == must), "{} missing", must);
        }
    }
}
