//! Property tests of the credentials a client sends: Basic and the session cookie.

use base64::Engine;
use proptest::prelude::*;

use super::basic;
use super::session::tokens;
use crate::hygiene::app_cookies;

/// A cookie pair: an app's (`name=value`), or the session cookie's name in any case with
/// spaces around it.
fn pair() -> impl Strategy<Value = (String, Option<String>)> {
    let value = "[A-Za-z0-9_.-]{1,20}";
    prop_oneof![
        ("[a-vx-z][a-z0-9_]{0,8}", value).prop_map(|(n, v)| (format!("{n}={v}"), None)),
        (any::<u32>(), 0usize..2, 0usize..2, value).prop_map(|(case, l, r, v)| {
            let name: String = "warden_session"
                .chars()
                .enumerate()
                .map(|(i, c)| {
                    if case >> (i % 32) & 1 == 1 {
                        c.to_ascii_uppercase()
                    } else {
                        c
                    }
                })
                .collect();
            (
                format!("{}{name}{}={v}", " ".repeat(l), " ".repeat(r)),
                Some(v),
            )
        }),
    ]
}

proptest! {
    #[test]
    fn prop_basic_round_trips_any_user_and_password(
        user in "[^:\\x00]{0,40}",
        password in "\\PC{0,60}",
        scheme in prop::sample::select(vec!["Basic", "basic", "BASIC"]),
    ) {
        let value = format!(
            "{scheme} {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        );
        let b = basic::parse(value.as_bytes()).expect("well-formed credentials parse");
        prop_assert_eq!(b.user, user);
        prop_assert_eq!(b.password, password);
    }

    #[test]
    fn prop_basic_any_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = basic::parse(&bytes);
        let mut v = b"Basic ".to_vec();
        v.extend_from_slice(&bytes);
        let _ = basic::parse(&v);
    }

    #[test]
    fn prop_every_session_cookie_is_the_gateways_and_only_the_apps_pass(
        pairs in prop::collection::vec(pair(), 0..8),
    ) {
        let header = pairs.iter().map(|(p, _)| p.as_str()).collect::<Vec<_>>().join("; ");
        let found = tokens(None, std::iter::once(header.as_bytes()));
        let sessions: Vec<&str> = pairs.iter().filter_map(|(_, s)| s.as_deref()).collect();
        prop_assert_eq!(found, sessions);
        let apps: Vec<&str> = app_cookies(&header).collect();
        let want: Vec<&str> = pairs.iter().filter(|(_, s)| s.is_none()).map(|(p, _)| p.as_str()).collect();
        prop_assert_eq!(apps, want);
    }

    #[test]
    fn prop_cookies_any_text_never_panic(text in "\\PC{0,200}", bearer in prop::option::of("\\PC{0,80}")) {
        let auth = bearer.map(|b| format!("Bearer {b}"));
        let _ = tokens(auth.as_deref().map(str::as_bytes), std::iter::once(text.as_bytes()));
        let _ = app_cookies(&text).count();
    }
}
