//! The holes an outside attack found, each tried again through the real binary: planted session
//! cookies, two users in one request, sessions that outlive their account, lockout by guessing,
//! metric series grown by strangers, forged forwarding headers, hosts that are missing or
//! doubled.

use std::net::Ipv4Addr;
use std::time::Duration;

use serde_json::json;
use warden_test_support::http::{basic, h2c_get, raw, request_from};
use warden_test_support::{cli, request, wait_until, Launch, Warden};

use crate::BIN;

/// A session token of `user`, from `POST /login` with Basic credentials.
fn login(w: &Warden, user: &str, password: &str) -> String {
    let r = request(
        "POST",
        &format!("{}/login", w.gateway),
        &[("authorization", &basic(user, password))],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["token"].as_str().unwrap().to_owned()
}

fn get(w: &Warden, path: &str, headers: &[(&str, &str)]) -> warden_test_support::Response {
    request("GET", &format!("{}{path}", w.gateway), headers, b"")
}

fn host(w: &Warden) -> String {
    w.gateway.trim_start_matches("http://").to_owned()
}

#[test]
fn an_app_cannot_plant_or_clear_the_gateways_session_cookie() {
    let w = Warden::demo(BIN);
    let dave = login(&w, "dave", &w.password("dave"));
    let carol = basic("carol", &w.password("carol"));
    let h = host(&w);
    // What reaches the client of what the app set: its cookies and any Clear-Site-Data.
    let seen = |r: &warden_test_support::Response| -> Vec<String> {
        r.headers
            .iter()
            .filter(|(n, _)| {
                n.eq_ignore_ascii_case("set-cookie") || n.eq_ignore_ascii_case("clear-site-data")
            })
            .map(|(n, v)| format!("{}: {v}", n.to_ascii_lowercase()))
            .collect()
    };
    let theme = vec!["set-cookie: theme=dark".to_owned()];
    for (planted, extra) in [
        (format!("warden_session={dave}; Path=/"), None),
        (format!("WARDEN_SESSION={dave}; Path=/; HttpOnly"), None),
        (format!(" Warden_Session ={dave}"), None),
        ("warden_session=; Max-Age=0".to_owned(), None),
        // Nameless: a browser (RFC 6265bis) sends these back as `warden_session=<dave's>`.
        (format!("=warden_session={dave}; Path=/"), None),
        (format!(" = WARDEN_SESSION={dave}"), None),
        // Clearing every cookie of the origin ends the user's session.
        ("a=1; Max-Age=0".to_owned(), Some("\"cookies\"")),
        ("a=1; Max-Age=0".to_owned(), Some("\"*\"")),
    ] {
        let mut path = format!("/apps/demo/_set-cookie?c={}", percent_encode(&planted));
        if let Some(v) = extra {
            path += &format!("&h=clear-site-data&v={}", percent_encode(v));
        }
        let kept = |r: &warden_test_support::Response| {
            let mut s = seen(r);
            s.retain(|c| !c.starts_with("set-cookie: a=1"));
            s
        };
        let r = get(&w, &path, &[("authorization", &carol)]);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(kept(&r), theme, "{planted:?} {extra:?} over HTTP/1.1");
        let r = raw(
            &h,
            format!("GET {path} HTTP/1.0\r\nauthorization: {carol}\r\n\r\n").as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(kept(&r), theme, "{planted:?} {extra:?} over HTTP/1.0");
        let (_, r) = h2c_get(
            &format!("{}{path}", w.gateway),
            &[("authorization", &carol)],
        );
        assert_eq!(kept(&r), theme, "{planted:?} {extra:?} over HTTP/2");
    }
    // The app's own cookies still pass, nameless ones too.
    let r = get(
        &w,
        &format!("/apps/demo/_set-cookie?c={}", percent_encode("=lang=en")),
        &[("authorization", &carol)],
    );
    assert_eq!(
        seen(&r),
        vec!["set-cookie: =lang=en".to_owned(), theme[0].clone()]
    );
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn a_request_that_names_two_users_is_refused_never_served_as_one() {
    let w = Warden::demo(BIN);
    let dave = login(&w, "dave", &w.password("dave"));
    let carol_pw = w.password("carol");
    let carol = login(&w, "carol", &carol_pw);
    let dave_cookie = format!("warden_session={dave}");
    // carol's own Basic credentials with dave's planted cookie: two users.
    let r = get(
        &w,
        "/apps/demo/",
        &[
            ("authorization", &basic("carol", &carol_pw)),
            ("cookie", &dave_cookie),
        ],
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("more than one user"), "{}", r.text());
    // Over HTTP/2 as over HTTP/1.1.
    let (_, r) = h2c_get(
        &format!("{}/apps/demo/", w.gateway),
        &[
            ("authorization", &basic("carol", &carol_pw)),
            ("cookie", &dave_cookie),
        ],
    );
    assert_eq!(r.status, 400, "{}", r.text());
    // A bearer token of one user and a cookie of another, and two cookies of two users.
    let r = get(
        &w,
        "/apps/demo/",
        &[
            ("authorization", &format!("Bearer {carol}")),
            ("cookie", &dave_cookie),
        ],
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let two = format!("warden_session={carol}; warden_session={dave}");
    assert_eq!(get(&w, "/apps/demo/", &[("cookie", &two)]).status, 400);
    // Two Authorization headers.
    let wire = format!(
        "GET /apps/demo/ HTTP/1.1\r\nhost: x\r\nauthorization: {}\r\nauthorization: Bearer {dave}\r\nconnection: close\r\n\r\n",
        basic("carol", &carol_pw)
    );
    assert_eq!(raw(&host(&w), wire.as_bytes()).status, 400);
    // One user, however many ways: served as that user.
    let r = get(
        &w,
        "/apps/demo/",
        &[
            ("authorization", &basic("dave", &w.password("dave"))),
            ("cookie", &dave_cookie),
        ],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["user"], "dave");
    // A dead session does not count: the Basic credentials beside it are used.
    let r = get(
        &w,
        "/apps/demo/",
        &[
            ("authorization", &basic("carol", &carol_pw)),
            ("cookie", "warden_session=not-a-session"),
        ],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["user"], "carol");
}

#[test]
fn sessions_end_with_their_account_and_never_pass_to_a_new_one() {
    let w = Warden::demo(BIN);
    let pw = "a long enough password";
    let create = |clearance: &str| {
        let r = w.api(
            "POST",
            "/v1/users",
            Some(json!({ "name": "erin", "password": pw, "clearance": clearance })),
        );
        assert_eq!(r.status, 201, "{}", r.text());
    };
    create("TOP SECRET");
    let token = login(&w, "erin", pw);
    let bearer = format!("Bearer {token}");
    let me = |h: &str| get(&w, "/apps/demo/", &[("authorization", h)]);
    assert_eq!(me(&bearer).json()["label"], "TOP SECRET");
    assert_eq!(w.api("DELETE", "/v1/users/erin", None).status, 204);
    assert_eq!(
        me(&bearer).status,
        401,
        "the session ended with the account"
    );
    // A new account of the same name starts with no session, and a lower clearance.
    create("UNCLASSIFIED");
    assert_eq!(
        me(&bearer).status,
        401,
        "a re-created account inherits nothing"
    );
    let token = login(&w, "erin", pw);
    let bearer = format!("Bearer {token}");
    assert_eq!(me(&bearer).json()["label"], "UNCLASSIFIED");
    let pw_basic = basic("erin", pw);
    assert_eq!(me(&pw_basic).status, 200, "the password is cached now");

    // A new clearance ends the sessions; the password goes on working, at the new label.
    let r = w.api(
        "PATCH",
        "/v1/users/erin",
        Some(json!({ "clearance": "RESTRICTED" })),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(me(&bearer).status, 401);
    assert_eq!(me(&pw_basic).json()["label"], "RESTRICTED");
    // A new password: the old one stops working at once, though it was cached.
    let token = login(&w, "erin", pw);
    let r = w.api(
        "PATCH",
        "/v1/users/erin",
        Some(json!({ "password": "another long password" })),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(me(&pw_basic).status, 401);
    assert_eq!(me(&format!("Bearer {token}")).status, 401);
    assert_eq!(
        me(&basic("erin", "another long password")).json()["user"],
        "erin"
    );
    // The CLI offers the same; a change of groups ends sessions too.
    let token = login(&w, "erin", "another long password");
    let env = [
        ("WARDEN_API", w.api.as_str()),
        ("WARDEN_TOKEN", w.token.as_str()),
    ];
    let (ok, out, err) = cli(BIN, &["users", "set", "erin", "--group", "staff"], &env);
    assert!(ok, "{out}{err}");
    assert!(out.contains("sessions ended"), "{out}");
    assert_eq!(me(&format!("Bearer {token}")).status, 401);
    let (ok, _, err) = cli(BIN, &["users", "set", "erin"], &env);
    assert!(!ok);
    assert!(err.contains("say what changes"), "{err}");
    assert_eq!(
        w.api(
            "PATCH",
            "/v1/users/nobody",
            Some(json!({ "clearance": "SECRET" }))
        )
        .status,
        404
    );
}

#[test]
fn guessing_a_password_slows_the_guesser_and_never_locks_the_user_out() {
    let w = Launch::new(BIN).arg("--auth-window").arg("3s").start();
    let pw = w.password("alice");
    let url = format!("{}/apps/demo/", w.gateway);
    let attacker = Ipv4Addr::new(127, 0, 0, 2);
    let user = Ipv4Addr::new(127, 0, 0, 3);
    let try_from = |src, password: &str| {
        request_from(
            src,
            "GET",
            &url,
            &[("authorization", &basic("alice", password))],
            b"",
        )
    };
    let mut throttled = false;
    for i in 0..12 {
        let r = try_from(attacker, &format!("guess number {i}"));
        assert!(matches!(r.status, 401 | 429), "{}", r.status);
        throttled |= r.status == 429;
    }
    assert!(
        throttled,
        "twelve wrong guesses from one address are slowed down"
    );
    assert_eq!(try_from(attacker, &pw).status, 429, "the guesser waits");
    // The user, from an address that has not failed, is let in, at the gateway and at /login.
    assert_eq!(try_from(user, &pw).status, 200);
    let r = request_from(
        user,
        "POST",
        &format!("{}/login", w.gateway),
        &[("authorization", &basic("alice", &pw))],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // The window ends: a guesser's address may try again. (carol's password was never
    // verified, so no cached verification lets it through early.)
    let carol = |password: &str| {
        request_from(
            attacker,
            "GET",
            &url,
            &[("authorization", &basic("carol", password))],
            b"",
        )
    };
    let mut throttled = false;
    for i in 0..12 {
        throttled |= carol(&format!("guess number {i}")).status == 429;
    }
    assert!(throttled);
    assert_eq!(carol(&w.password("carol")).status, 429);
    let begun = std::time::Instant::now();
    wait_until("the failure window to end", Duration::from_secs(30), || {
        (carol(&w.password("carol")).status == 200).then_some(())
    });
    assert!(
        begun.elapsed() >= Duration::from_secs(1),
        "it ended with its window, not at once"
    );
}

#[test]
fn strangers_cannot_grow_the_metrics() {
    let w = Warden::demo(BIN);
    for i in 0..300 {
        let r = get(
            &w,
            &format!("/apps/no-such-app-{i}-{}/", "x".repeat(100)),
            &[],
        );
        assert_eq!(r.status, 401);
    }
    let pw = basic("alice", &w.password("alice"));
    assert_eq!(
        get(&w, "/apps/not-an-app/", &[("authorization", &pw)]).status,
        404
    );
    let metrics = request("GET", &format!("{}/metrics", w.api), &[], b"").text();
    assert!(!metrics.contains("no-such-app"), "a series per stranger");
    assert!(!metrics.contains("not-an-app"));
    assert!(metrics.contains("app=\"unknown\""), "{metrics}");
}

#[test]
fn the_gateway_owns_every_forwarding_header_the_app_gets() {
    let w = Warden::demo(BIN);
    let auth = basic("alice", &w.password("alice"));
    // Every header the gateway owns, in the spellings app servers read, and every kin of the
    // client-address headers proxies and CDNs coin: each forged value carries FORGED.
    let forged = [
        "x-warden-user",
        "X_Warden_User",
        "x-warden-label",
        "x-warden_label",
        "x-warden-signature",
        "x-warden-taint",
        "forwarded",
        "x-forwarded-for",
        "X_Forwarded_For",
        "x-forwarded-host",
        "x-forwarded-prefix",
        "x-forwarded-port",
        "x-forwarded-proto",
        "x-original-forwarded-for",
        "x-real-ip",
        "true-client-ip",
        "cf-connecting-ip",
        "x-client-ip",
        "x-cluster-client-ip",
        "fastly-client-ip",
        "x-remote-addr",
        "x-host",
        "x-url-scheme",
        "front-end-https",
        "proxy",
        "proxy_authorization",
    ];
    let h = host(&w);
    let head: String = forged.iter().map(|n| format!("{n}: FORGED\r\n")).collect();
    // The same request by every way in: the HTTP/1.1 lane, hyper's HTTP/1.1 (a `Connection`
    // option the lane leaves to hyper), HTTP/1.0 and HTTP/2.
    let lane = raw(
        &h,
        format!("GET /apps/demo/_echo HTTP/1.1\r\nhost: {h}\r\nauthorization: {auth}\r\n{head}connection: close\r\n\r\n").as_bytes(),
    );
    let hyper11 = raw(
        &h,
        format!("GET /apps/demo/_echo HTTP/1.1\r\nhost: {h}\r\nauthorization: {auth}\r\n{head}connection: close, x-hop\r\nx-hop: 1\r\n\r\n").as_bytes(),
    );
    let http10 = raw(
        &h,
        format!(
            "GET /apps/demo/_echo HTTP/1.0\r\nhost: {h}\r\nauthorization: {auth}\r\n{head}\r\n"
        )
        .as_bytes(),
    );
    let mut headers: Vec<(&str, &str)> = forged.iter().map(|n| (*n, "FORGED")).collect();
    headers.push(("authorization", &auth));
    let (_, http2) = h2c_get(&format!("{}/apps/demo/_echo", w.gateway), &headers);
    let echo = |r: &warden_test_support::Response, name: &str| -> Vec<String> {
        r.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(&format!("x-echo-h-{name}")))
            .map(|(_, v)| v.clone())
            .collect()
    };
    for (way, r) in [
        ("the lane", &lane),
        ("hyper's HTTP/1.1", &hyper11),
        ("HTTP/1.0", &http10),
        ("HTTP/2", &http2),
    ] {
        assert_eq!(r.status, 200, "{way}: {}", r.text());
        let reached: Vec<&(String, String)> = r
            .headers
            .iter()
            .filter(|(n, v)| {
                n.to_ascii_lowercase().starts_with("x-echo-h-") && v.contains("FORGED")
            })
            .collect();
        assert!(
            reached.is_empty(),
            "{way}: forged headers reached the app: {reached:?}"
        );
        assert_eq!(echo(r, "x-warden-user"), vec!["alice"], "{way}");
        assert_eq!(echo(r, "x-warden-label"), vec!["SECRET"], "{way}");
        assert_eq!(echo(r, "x-warden-signature").len(), 1, "{way}");
        assert_eq!(
            echo(r, "forwarded"),
            vec![format!("for=127.0.0.1;host=\"{h}\";proto=http")],
            "{way}"
        );
        assert_eq!(echo(r, "x-forwarded-host"), vec![h.clone()], "{way}");
        assert_eq!(echo(r, "x-forwarded-prefix"), vec!["/apps/demo"], "{way}");
        assert_eq!(echo(r, "x-forwarded-for"), vec!["127.0.0.1"], "{way}");
        assert_eq!(echo(r, "x-forwarded-proto"), vec!["http"], "{way}");
        assert!(echo(r, "x-hop").is_empty(), "{way}");
    }
    // By host name, nothing was taken off the path: no prefix.
    let r = get(
        &w,
        "/_echo",
        &[("authorization", &auth), ("host", "demo.localhost")],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(echo(&r, "x-forwarded-prefix").is_empty());
    assert_eq!(
        echo(&r, "x-forwarded-host"),
        vec!["demo.localhost".to_owned()]
    );
}

#[test]
fn an_http11_request_needs_exactly_one_host() {
    let w = Warden::demo(BIN);
    let auth = basic("alice", &w.password("alice"));
    let h = host(&w);
    for head in [
        format!("GET /apps/demo/ HTTP/1.1\r\nauthorization: {auth}\r\nconnection: close\r\n\r\n"),
        format!("GET /apps/demo/ HTTP/1.1\r\nhost: a\r\nhost: b\r\nauthorization: {auth}\r\nconnection: close\r\n\r\n"),
        "GET /healthz HTTP/1.1\r\nconnection: close\r\n\r\n".to_owned(),
    ] {
        let r = raw(&h, head.as_bytes());
        assert_eq!(r.status, 400, "{head:?}: {}", r.text());
    }
    // HTTP/1.0 may leave it out.
    let r = raw(
        &h,
        format!("GET /apps/demo/ HTTP/1.0\r\nauthorization: {auth}\r\n\r\n").as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn a_tainted_instance_serves_no_lower_request_even_the_very_next_one() {
    let w = Warden::demo(BIN);
    let auth = basic("alice", &w.password("alice"));
    // The taint report and the next request of the same (lower) label, in one write on one
    // connection: the second is routed microseconds after the first is answered, long before
    // the relabelled record could come back from the store.
    let one = |path: &str, close: bool| {
        format!(
            "GET /apps/demo/{path} HTTP/1.1\r\nHost: {}\r\nAuthorization: {auth}\r\n{}\r\n",
            host(&w),
            if close { "Connection: close\r\n" } else { "" }
        )
    };
    for round in 0..5 {
        let wire = one("?taint=TOP%20SECRET", false) + &one("", true);
        let answers =
            warden_test_support::http::pipeline(&host(&w), wire.as_bytes(), &[false, false]);
        assert_eq!(answers.len(), 2, "round {round}");
        let (tainted, next) = (answers[0].json(), answers[1].json());
        assert_eq!(
            answers[1].status,
            200,
            "round {round}: {}",
            answers[1].text()
        );
        assert_ne!(
            next["instance"], tainted["instance"],
            "round {round}: alice's next request reached the instance that just read TOP SECRET"
        );
    }
}
