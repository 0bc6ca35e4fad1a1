//! The gateway as the single secure entry point, through the real binary: sessions, the
//! credential cache and throttling, HTTP/2, taint, retries, limits and metrics.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::json;
use warden_test_support::http::{basic, h2c_get, pipeline, raw};
use warden_test_support::{request, Launch, Warden};

use crate::{metric, BIN};

fn host(w: &Warden) -> String {
    w.gateway.trim_start_matches("http://").to_owned()
}

#[test]
fn login_gives_a_cookie_and_a_bearer_token_and_logout_revokes_it() {
    // Debug logs everywhere: secrets stay out of them even there.
    let w = Launch::new(BIN).log("debug").start();
    let pw = w.password("bob");
    let r = request(
        "POST",
        &format!("{}/login", w.gateway),
        &[("authorization", &basic("bob", &pw))],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let token = r.json()["token"].as_str().unwrap().to_owned();
    assert!(token.len() >= 32);
    let cookie = r.header("set-cookie").unwrap().to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Lax"),
        "{cookie}"
    );
    assert!(cookie.starts_with(&format!("warden_session={token}")));

    let by_bearer = request(
        "GET",
        &format!("{}/apps/demo/", w.gateway),
        &[("authorization", &format!("Bearer {token}"))],
        b"",
    );
    assert_eq!(
        (by_bearer.status, by_bearer.json()["user"].as_str()),
        (200, Some("bob"))
    );
    let by_cookie = request(
        "GET",
        &format!("{}/apps/demo/", w.gateway),
        &[("cookie", &format!("theme=dark; warden_session={token}"))],
        b"",
    );
    assert_eq!(by_cookie.status, 200);

    // A JSON body works too, and a wrong password gets no session.
    let j = request(
        "POST",
        &format!("{}/login", w.gateway),
        &[("content-type", "application/json")],
        json!({"name": "bob", "password": pw})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(j.status, 200);
    let other = j.json()["token"].as_str().unwrap().to_owned();
    let bad = request(
        "POST",
        &format!("{}/login", w.gateway),
        &[("content-type", "Application/JSON; charset=utf-8")],
        json!({"name": "bob", "password": "nope-nope"})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(bad.status, 401);
    // A JSON body without its type is what a page of another site can send: refused.
    let untyped = request(
        "POST",
        &format!("{}/login", w.gateway),
        &[],
        json!({"name": "bob", "password": pw})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(untyped.status, 400, "{}", untyped.text());
    assert_eq!(
        request("PUT", &format!("{}/login", w.gateway), &[], b"").status,
        405
    );

    let out = request(
        "POST",
        &format!("{}/logout", w.gateway),
        &[("authorization", &format!("Bearer {token}"))],
        b"",
    );
    assert_eq!(out.status, 200);
    assert!(out.header("set-cookie").unwrap().contains("Max-Age=0"));
    let after = request(
        "GET",
        &format!("{}/apps/demo/", w.gateway),
        &[("authorization", &format!("Bearer {token}"))],
        b"",
    );
    assert_eq!(after.status, 401, "a revoked token is refused");

    // Logging out with the cookie alone revokes that session, and only that one.
    let cookie_of = |t: &str| format!("warden_session={t}");
    let alive = |t: &str| {
        request(
            "GET",
            &format!("{}/apps/demo/", w.gateway),
            &[("cookie", &cookie_of(t))],
            b"",
        )
        .status
    };
    assert_eq!(alive(&other), 200);
    let out = request(
        "POST",
        &format!("{}/logout", w.gateway),
        &[("cookie", &cookie_of(&other))],
        b"",
    );
    assert_eq!(out.status, 200, "{}", out.text());
    assert_eq!(alive(&other), 401, "the cookie's session is revoked");

    let store = std::fs::read(w.dir.join("store.redb")).unwrap();
    let logs = w.stderr();
    for secret in [&token, &other, &pw, &basic("bob", &pw)] {
        assert!(
            !store.windows(secret.len()).any(|x| x == secret.as_bytes()),
            "secrets are never stored in clear"
        );
        assert!(!logs.contains(secret.as_str()), "a secret in the logs");
    }
}

#[test]
fn sessions_expire() {
    let w = Launch::new(BIN).arg("--session-ttl").arg("1s").start();
    let pw = w.password("dave");
    let token = request(
        "POST",
        &format!("{}/login", w.gateway),
        &[("authorization", &basic("dave", &pw))],
        b"",
    )
    .json()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    warden_test_support::wait_until("the session to expire", Duration::from_secs(30), || {
        let r = request(
            "GET",
            &format!("{}/apps/demo/", w.gateway),
            &[("authorization", &format!("Bearer {token}"))],
            b"",
        );
        (r.status == 401).then_some(())
    });
}

#[test]
fn argon2_runs_once_per_credential_and_failures_are_throttled() {
    let w = Warden::demo(BIN);
    let pw = w.password("alice");
    // Arriving together, before any verification finished: still one Argon2id run, which the
    // others wait for rather than each starting their own.
    let statuses: Vec<u16> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..16)
            .map(|_| s.spawn(|| w.get_as("alice", &pw, "/apps/demo/").status))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(
        metric(&w, "warden_gateway_credential_cache_total{result=\"miss\"}"),
        16.0 - metric(&w, "warden_gateway_credential_cache_total{result=\"hit\"}"),
        "requests that found no cached verdict"
    );
    let runs = metric(&w, "warden_gateway_phase_seconds_count{phase=\"queue\"}");
    assert_eq!(runs, 1.0, "one Argon2id run");

    // Guessing: 401 until the per-user limit, then 429 with Retry-After, without hashing.
    let mut statuses = Vec::new();
    for i in 0..14 {
        let r = w.get_as("bob", &format!("guess-{i}"), "/apps/demo/");
        if r.status == 429 {
            assert!(r.header("retry-after").unwrap().parse::<u64>().unwrap() >= 1);
        }
        statuses.push(r.status);
    }
    assert_eq!(
        statuses.iter().filter(|s| **s == 401).count(),
        10,
        "{statuses:?}"
    );
    assert!(statuses[10..].iter().all(|s| *s == 429), "{statuses:?}");
    assert!(metric(&w, "warden_gateway_throttled_total") >= 4.0);
    // Bob's right password is throttled too while the window lasts...
    assert_eq!(
        w.get_as("bob", &w.password("bob"), "/apps/demo/").status,
        429
    );
    // ...but alice, verified before, is not slowed down by anyone's failures.
    assert_eq!(w.get_as("alice", &pw, "/apps/demo/").status, 200);
}

#[test]
fn guessing_across_many_names_from_one_address_is_throttled_too() {
    let w = Warden::demo(BIN);
    let alice = w.password("alice");
    assert_eq!(w.get_as("alice", &alice, "/apps/demo/").status, 200);
    // 50 failures from one address, 5 per name, under the per-user limit of 10...
    let mut statuses = Vec::new();
    for i in 0..50 {
        let name = format!("nobody-{}", i % 10);
        statuses.push(w.get_as(&name, &format!("g-{i}"), "/apps/demo/").status);
    }
    assert!(statuses.iter().all(|s| *s == 401), "{statuses:?}");
    // ...and every new attempt from it is 429, dave's right password included...
    let dave = w.get_as("dave", &w.password("dave"), "/apps/demo/");
    assert_eq!(dave.status, 429, "{}", dave.text());
    assert!(dave.header("retry-after").is_some());
    // ...while a credential verified before is served.
    assert_eq!(w.get_as("alice", &alice, "/apps/demo/").status, 200);
}

#[test]
fn a_flood_of_new_credentials_beyond_the_verification_queue_gets_503_at_once() {
    let w = Warden::demo(BIN);
    let carol = w.password("carol");
    assert_eq!(w.get_as("carol", &carol, "/apps/demo/").status, 200);
    // Credentials no one has sent before, all at once: one Argon2id run per core at a time, 64
    // per core may wait, and 70 more are refused before any hashing.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let statuses: Vec<(u16, Option<String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..65 * cores + 70)
            .map(|i| {
                let w = &w;
                s.spawn(move || {
                    let r = w.get_as(&format!("stranger-{i}"), "guess", "/apps/demo/");
                    (r.status, r.header("retry-after").map(str::to_owned))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let busy: Vec<_> = statuses.iter().filter(|(s, _)| *s == 503).collect();
    assert!(!busy.is_empty(), "{statuses:?}");
    assert!(busy.iter().all(|(_, retry)| retry.is_some()), "{busy:?}");
    assert!(
        statuses.iter().all(|(s, _)| [401, 429, 503].contains(s)),
        "{statuses:?}"
    );
    // Those verified before are served throughout.
    assert_eq!(w.get_as("carol", &carol, "/apps/demo/").status, 200);
}

#[test]
fn http2_cleartext_is_served_on_the_same_port_and_strips_taint_there_too() {
    let w = Warden::demo(BIN);
    let (version, r) = h2c_get(
        &format!("{}/apps/demo/h2", w.gateway),
        &[("authorization", &basic("carol", &w.password("carol")))],
    );
    assert_eq!(
        (version, r.status),
        (warden_test_support::http::Version::HTTP_2, 200)
    );
    let v = r.json();
    assert_eq!(
        (v["label"].as_str(), v["path"].as_str()),
        (Some("TOP SECRET"), Some("/h2"))
    );
    // A head past the limit is refused over HTTP/2 as over HTTP/1.1.
    let big = "x".repeat(20 * 1024);
    let (_, r) = h2c_get(&format!("{}/apps/demo/", w.gateway), &[("x-big", &big)]);
    assert_eq!(r.status, 431, "{}", r.text());
    // hyper's path keeps the taint header from the client and relabels, as the lane does.
    let (_, r) = h2c_get(
        &format!("{}/apps/demo/?taint=TOP%20SECRET", w.gateway),
        &[("authorization", &basic("alice", &w.password("alice")))],
    );
    assert_eq!(r.status, 200);
    assert!(r.header("x-warden-taint").is_none(), "{:?}", r.headers);
    let tainted = r.json()["instance"].as_str().unwrap().to_owned();
    warden_test_support::wait_until("the relabel", Duration::from_secs(30), || {
        w.instances()
            .iter()
            .any(|i| i["id"] == tainted.as_str() && i["label"] == "TOP SECRET")
            .then_some(())
    });
}

#[test]
fn over_http2_answers_of_every_framing_arrive_whole_and_identity_is_the_gateways() {
    let w = Warden::demo(BIN);
    let auth = basic("alice", &w.password("alice"));
    // Small and read whole, chunked (decoded, then framed anew), large and streamed, empty.
    for (query, n) in [
        ("n=100", 100),
        ("n=300000&chunked=1", 300_000),
        ("n=700000", 700_000),
        ("n=0&chunked=1", 0),
    ] {
        let (version, r) = h2c_get(
            &format!("{}/apps/demo/_bytes?{query}", w.gateway),
            &[("authorization", &auth)],
        );
        assert_eq!(
            (version, r.status),
            (warden_test_support::http::Version::HTTP_2, 200),
            "{query}"
        );
        assert_eq!(r.body.len(), n, "{query}");
        assert!(r.body.iter().all(|&b| b == b'x'), "{query}");
        assert!(r.header("transfer-encoding").is_none(), "{query}");
    }
    let (_, r) = h2c_get(
        &format!("{}/apps/demo/", w.gateway),
        &[
            ("authorization", &auth),
            ("x-warden-user", "mallory"),
            ("x_warden_user", "mallory"),
        ],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["user"], "alice");
    assert_eq!(v["saw_authorization"], false);
}

#[test]
fn keep_alive_serves_many_requests_on_one_connection() {
    let w = Warden::demo(BIN);
    let auth = basic("alice", &w.password("alice"));
    let mut s = TcpStream::connect(host(&w)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    for i in 0..3 {
        write!(
            s,
            "GET /apps/demo/{i} HTTP/1.1\r\nhost: x\r\nauthorization: {auth}\r\n\r\n"
        )
        .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&got).contains(&format!("\"/{i}\"")) {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "connection closed after {i} requests");
            got.extend_from_slice(&buf[..n]);
        }
        assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    }
}

#[test]
fn taint_raises_the_label_and_the_instance_stops_serving_the_lower_one() {
    let w = Warden::demo(BIN);
    let (alice, carol) = (w.password("alice"), w.password("carol"));
    let first = w.get_as("alice", &alice, "/apps/demo/?taint=TOP%20SECRET");
    assert_eq!(first.status, 200);
    assert!(
        first.header("x-warden-taint").is_none(),
        "the taint header never reaches the client"
    );
    let tainted = first.json()["instance"].as_str().unwrap().to_owned();
    warden_test_support::wait_until(
        "the record to show the new label",
        Duration::from_secs(30),
        || {
            w.instances()
                .iter()
                .any(|i| i["id"] == tainted.as_str() && i["label"] == "TOP SECRET")
                .then_some(())
        },
    );
    let next = w.get_as("alice", &alice, "/apps/demo/").json();
    assert_ne!(
        next["instance"],
        tainted.as_str(),
        "alice never reaches the tainted instance again"
    );
    assert_eq!(next["label"], "SECRET");
    let top = w.get_as("carol", &carol, "/apps/demo/").json();
    assert_eq!(
        (top["instance"].as_str(), top["label"].as_str()),
        (Some(tainted.as_str()), Some("SECRET")),
        "carol is served by it; its env still says where it started"
    );
    // A taint the lattice does not know stops the instance.
    let odd = w.get_as("carol", &carol, "/apps/demo/?taint=COSMIC").json();
    warden_test_support::wait_until(
        "the instance with an unknown taint to stop",
        Duration::from_secs(30),
        || (!w.instances().iter().any(|i| i["id"] == odd["instance"])).then_some(()),
    );
}

/// Two TOP SECRET instances: carol's own, then alice's after a TOP SECRET taint.
fn two_instances(w: &Warden) -> (String, String) {
    let b = w
        .get_as("carol", &w.password("carol"), "/apps/demo/")
        .json()["instance"]
        .as_str()
        .unwrap()
        .to_owned();
    let a = w
        .get_as(
            "alice",
            &w.password("alice"),
            "/apps/demo/?taint=TOP%20SECRET",
        )
        .json()["instance"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(a, b);
    warden_test_support::wait_until("the relabel", Duration::from_secs(30), || {
        w.instances()
            .iter()
            .any(|i| i["id"] == a.as_str() && i["label"] == "TOP SECRET")
            .then_some(())
    });
    // The API lists the agent's own record at once; the gateway routes by the store's, which
    // is written behind the taint. Round robin reaches `a` once the gateway has it.
    let carol = w.password("carol");
    warden_test_support::wait_until(
        "the gateway to route TOP SECRET to the relabelled instance",
        Duration::from_secs(30),
        || {
            let r = w.get_as("carol", &carol, "/apps/demo/");
            (r.status == 200 && r.json()["instance"] == a.as_str()).then_some(())
        },
    );
    (a, b)
}

#[test]
fn a_refused_connection_moves_on_so_users_see_no_error_while_one_instance_lives() {
    let w = Warden::demo(BIN);
    let (a, b) = two_instances(&w);
    let carol = w.password("carol");
    let closed = loop {
        // Close whichever instance answers; it keeps running, so only refusals tell.
        let r = w.get_as("carol", &carol, "/apps/demo/_close");
        if r.status == 200 {
            break r.json()["instance"].as_str().unwrap().to_owned();
        }
    };
    let open = if closed == a { &b } else { &a };
    for _ in 0..8 {
        let r = w.get_as("carol", &carol, "/apps/demo/");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["instance"], open.as_str());
    }
}

#[test]
fn only_idempotent_requests_are_retried_after_they_may_have_reached_the_app() {
    let w = Warden::demo(BIN);
    let (a, b) = two_instances(&w);
    let carol = basic("carol", &w.password("carol"));
    for _ in 0..6 {
        let r = request(
            "GET",
            &format!("{}/apps/demo/_drop?instance={a}", w.gateway),
            &[("authorization", &carol)],
            b"",
        );
        assert_eq!(
            (r.status, r.json()["instance"].as_str()),
            (200, Some(b.as_str())),
            "a GET is retried on the other instance"
        );
    }
    let mut posts = Vec::new();
    for _ in 0..6 {
        let r = request(
            "POST",
            &format!("{}/apps/demo/_drop?instance={a}", w.gateway),
            &[("authorization", &carol)],
            b"x",
        );
        if r.status == 200 {
            assert_eq!(r.json()["instance"], b.as_str());
        }
        posts.push(r.status);
    }
    assert!(
        posts.contains(&502),
        "a POST that reached the dropping instance is not repeated: {posts:?}"
    );
}

#[test]
fn an_instance_that_never_answers_gets_504_and_keeps_serving_others() {
    let w = Launch::new(BIN).arg("--upstream-timeout").arg("1s").start();
    let alice = basic("alice", &w.password("alice"));
    let r = request(
        "GET",
        &format!("{}/apps/demo/_hang", w.gateway),
        &[("authorization", &alice)],
        b"",
    );
    assert_eq!(r.status, 504, "{}", r.text());
    assert!(
        r.text().contains("did not answer within 1000 ms"),
        "{}",
        r.text()
    );
    // The wedged request's connection is dropped, not pooled: the next request is answered.
    let r = request(
        "GET",
        &format!("{}/apps/demo/", w.gateway),
        &[("authorization", &alice)],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn limits_answer_clearly() {
    let w = Launch::new(BIN)
        .arg("--header-timeout")
        .arg("300ms")
        .arg("--max-connections")
        .arg("4")
        .start();
    let h = host(&w);
    let auth = basic("alice", &w.password("alice"));
    // 431: a head past 16 KiB.
    let big = "x".repeat(20 * 1024);
    let r = raw(
        &h,
        format!("GET /apps/demo/ HTTP/1.1\r\nhost: x\r\nx-big: {big}\r\n\r\n").as_bytes(),
    );
    assert_eq!(r.status, 431);
    // 413: a body past the limit, refused from its declared length without reading it.
    let r = raw(&h, format!("POST /apps/demo/ HTTP/1.1\r\nhost: x\r\nauthorization: {auth}\r\ncontent-length: 20000000\r\nconnection: close\r\n\r\n").as_bytes());
    assert_eq!(r.status, 413);
    // 413 too for a chunked body that grows past the limit (10 MiB) as it arrives.
    let mut s = TcpStream::connect(&h).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(s, "POST /apps/demo/_echo HTTP/1.1\r\nhost: x\r\nauthorization: {auth}\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n").unwrap();
    let chunk = format!("10000\r\n{}\r\n", "y".repeat(0x10000));
    // The gateway may answer and close before the last chunks: stop writing then.
    for _ in 0..(11 << 4) {
        if s.write_all(chunk.as_bytes()).is_err() {
            break;
        }
    }
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 413"), "{got:?}");
    // 400: malformed requests never reach an app (none was started for one).
    let r = raw(&h, b"GET /apps/demo/ HTTP/1.1\r\nhost x\r\n\r\n");
    assert_eq!(r.status, 400);
    // A length that is not plain digits could be read two ways: 400.
    let r = raw(&h, format!("POST /apps/demo/_echo HTTP/1.1\r\nhost: x\r\nauthorization: {auth}\r\ncontent-length: +5\r\n\r\nhello").as_bytes());
    assert_eq!(r.status, 400);
    assert!(w.instances().is_empty(), "{:?}", w.instances());
    // 408: a head that does not arrive in time.
    let mut slow = TcpStream::connect(&h).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    slow.write_all(b"GET /apps/demo/ HTTP/1.1\r\nhost: x\r\n")
        .unwrap();
    let mut got = String::new();
    slow.read_to_string(&mut got).unwrap();
    assert!(got.starts_with("HTTP/1.1 408"), "{got:?}");
    // 503 past the connection limit, while the others are held open.
    let held: Vec<TcpStream> = (0..4).map(|_| TcpStream::connect(&h).unwrap()).collect();
    let refused =
        warden_test_support::wait_until("a refused connection", Duration::from_secs(30), || {
            let r = raw(&h, b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n");
            (r.status == 503).then_some(r)
        });
    assert_eq!(refused.header("retry-after"), Some("1"));
    drop(held);
    assert!(metric(&w, "warden_gateway_refused_connections_total") >= 1.0);
}

#[test]
fn metrics_count_requests_and_time_phases() {
    let w = Warden::demo(BIN);
    w.get_as("dave", &w.password("dave"), "/apps/demo/");
    w.get_as("dave", "wrong-password", "/apps/demo/");
    let r = request("GET", &format!("{}/metrics", w.api), &[], b"");
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    assert_eq!(
        metric(
            &w,
            "warden_gateway_requests_total{app=\"demo\",status=\"200\"}"
        ),
        1.0
    );
    assert_eq!(
        metric(
            &w,
            "warden_gateway_requests_total{app=\"demo\",status=\"401\"}"
        ),
        1.0
    );
    for phase in ["auth", "start", "upstream", "queue"] {
        assert!(
            metric(
                &w,
                &format!("warden_gateway_phase_seconds_count{{phase=\"{phase}\"}}")
            ) >= 1.0,
            "{phase}"
        );
    }
    assert!(!r.text().contains(&w.password("dave")));
}

/// The fast lane serves keep-alive connections itself and hands a connection to hyper at the
/// first request it does not take; every framing an app may answer with comes through intact.
#[test]
fn pipelined_requests_and_every_response_framing_come_through_one_connection() {
    let w = Warden::demo(BIN);
    let h = host(&w);
    let auth = basic("alice", &w.password("alice"));
    let login = request(
        "POST",
        &format!("{}/login", w.gateway),
        &[("authorization", &auth)],
        b"",
    );
    let token = login.json()["token"].as_str().unwrap().to_owned();
    let get = |path: &str, extra: &str| {
        format!("GET /apps/demo{path} HTTP/1.1\r\nhost: x\r\nauthorization: {auth}\r\n{extra}\r\n")
    };
    // Pipelined: keep-alive requests, a HEAD, a chunked and a large answer, a request body with
    // the client's own cookies and a forged identity header, a request the lane leaves to hyper
    // (the gateway's own /healthz), and after it one more for the app.
    let mut wire = String::new();
    wire += &get("/a", "");
    wire += &format!("HEAD /apps/demo/b HTTP/1.1\r\nhost: x\r\nauthorization: {auth}\r\n\r\n");
    wire += &get("/_bytes?n=300000&chunked=1", "");
    wire += &get("/_bytes?n=700000", "");
    wire += &format!(
        "POST /apps/demo/_echo HTTP/1.1\r\nhost: x\r\ncookie: a=1; warden_session={token}; b=2\r\ncontent-length: 5\r\n\r\nhello"
    );
    wire += &get("/c", "x-warden-user: mallory\r\n");
    wire += "GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n";
    wire += &get("/d", "connection: close\r\n");
    let heads = [false, true, false, false, false, false, false, false];
    let r = pipeline(&h, wire.as_bytes(), &heads);
    let statuses: Vec<u16> = r.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200; 8]);
    let field =
        |r: &warden_test_support::http::Response, k: &str| r.json()[k].as_str().map(str::to_owned);
    assert_eq!(field(&r[0], "path").as_deref(), Some("/a"));
    assert!(r[1].body.is_empty() && r[1].header("content-length").is_some());
    assert_eq!(r[2].header("transfer-encoding"), Some("chunked"));
    assert_eq!(r[2].body, vec![b'x'; 300_000]);
    assert_eq!(r[3].header("content-length"), Some("700000"));
    assert_eq!(r[3].body, vec![b'x'; 700_000]);
    // The app gets the body and its own cookies, never the session cookie.
    assert_eq!(r[4].body, b"hello");
    assert_eq!(r[4].header("x-echo-cookie"), Some("a=1; b=2"));
    // A client cannot claim to be someone else.
    assert_eq!(field(&r[5], "user").as_deref(), Some("alice"));
    assert_eq!(field(&r[5], "path").as_deref(), Some("/c"));
    assert_eq!(r[6].json()["status"], "ok");
    assert_eq!(field(&r[7], "path").as_deref(), Some("/d"));
    assert!(r
        .iter()
        .all(|r| !String::from_utf8_lossy(&r.body).contains("saw_authorization\":true")));
    // Forged identity headers, also spelled with '_' (which CGI-style servers read as '-'),
    // never reach the app, on the lane or on hyper's path (a Connection option sends the
    // request there).
    for route in [
        "connection: close\r\n",
        "connection: close, x-opt\r\nx-opt: 1\r\n",
    ] {
        let wire = format!(
            "POST /apps/demo/_echo HTTP/1.1\r\nhost: x\r\nauthorization: {auth}\r\n{route}x_warden_user: mallory\r\nX-Warden-Label: TOP SECRET\r\nx_forwarded_for: 10.0.0.1\r\ncontent-length: 2\r\n\r\nhi"
        );
        let r = raw(&h, wire.as_bytes());
        assert_eq!(r.status, 200);
        let names = r.header("x-echo-headers").unwrap().to_ascii_lowercase();
        let names: Vec<&str> = names.split(',').collect();
        for forged in ["x_warden_user", "x_forwarded_for", "x-opt"] {
            assert!(
                !names.contains(&forged),
                "{forged} in {names:?} via {route:?}"
            );
        }
        let count = |n: &str| names.iter().filter(|x| **x == n).count();
        assert_eq!(
            (count("x-warden-user"), count("x-warden-label")),
            (1, 1),
            "{route:?}"
        );
    }
    // Refusals on the lane keep the connection: a wrong password, then a good request.
    let bad = basic("alice", "wrong-password");
    let wire = format!(
        "GET /apps/demo/ HTTP/1.1\r\nhost: x\r\nauthorization: {bad}\r\n\r\n{}",
        get("/e", "connection: close\r\n")
    );
    let r = pipeline(&h, wire.as_bytes(), &[]);
    assert_eq!(r.iter().map(|r| r.status).collect::<Vec<_>>(), [401, 200]);
    assert!(r[0].header("www-authenticate").is_some());
    // Dated like every response hyper writes (RFC 9110 §6.6.1).
    let date = r[0]
        .header("date")
        .expect("a Date header on the lane's refusal");
    assert!(httpdate::parse_http_date(date).is_ok(), "{date}");
    assert_eq!(r[1].header("connection"), Some("close"));
}

#[test]
fn an_idle_keep_alive_connection_on_hypers_path_closes_without_a_word() {
    let w = Launch::new(BIN)
        .arg("--header-timeout")
        .arg("500ms")
        .start();
    let mut s = TcpStream::connect(host(&w)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    // The gateway's own endpoints are served by hyper.
    s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") || !got.ends_with(b"}\n") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed early: {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    // Idle past the header timeout: the connection ends, with nothing more written.
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "{}", String::from_utf8_lossy(&rest));
    // On the same path, a request that begins and stalls still gets its 408.
    let mut s = TcpStream::connect(host(&w)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    let mut got = Vec::new();
    while !got.ends_with(b"}\n") {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0);
        got.extend_from_slice(&buf[..n]);
    }
    s.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n")
        .unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(
        rest.starts_with(b"HTTP/1.1 408"),
        "{}",
        String::from_utf8_lossy(&rest)
    );
}

/// An HTTP/2 connection (cleartext, prior knowledge) to `w`'s gateway.
async fn h2_connect(
    w: &Warden,
) -> hyper::client::conn::http2::SendRequest<http_body_util::Full<bytes::Bytes>> {
    let addr = w.gateway.trim_start_matches("http://").to_owned();
    let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    send
}

/// Sends `req` on an HTTP/2 connection and reads the whole answer: status, headers, body.
async fn h2_exchange(
    mut send: hyper::client::conn::http2::SendRequest<http_body_util::Full<bytes::Bytes>>,
    req: http::Request<http_body_util::Full<bytes::Bytes>>,
) -> (u16, http::HeaderMap, Vec<u8>) {
    use http_body_util::BodyExt;
    send.ready().await.unwrap();
    let resp = send.send_request(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes().to_vec();
    (parts.status.as_u16(), parts.headers, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_users_streams_on_one_http2_connection_keep_their_labels_and_bodies() {
    use http_body_util::Full;
    let w = Warden::demo(BIN);
    let users = [
        ("alice", "SECRET"),
        ("bob", "CONFIDENTIAL"),
        ("carol", "TOP SECRET"),
        ("dave", "UNCLASSIFIED"),
    ];
    let auths: Vec<String> = users
        .iter()
        .map(|(u, _)| basic(u, &w.password(u)))
        .collect();
    let send = h2_connect(&w).await;

    // A stream the client gives up on (RST_STREAM) leaves the connection serving.
    let slow = http::Request::get(format!("{}/apps/demo/_slow?ms=3000", w.gateway))
        .header("authorization", &auths[0])
        .body(Full::new(bytes::Bytes::new()))
        .unwrap();
    let abandoned = tokio::spawn(h2_exchange(send.clone(), slow));
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    abandoned.abort();

    // 48 streams at once, four users in turn: half ask who they are, half send 200 KiB
    // bodies of their own to the echo, which answers them back with the label it was told.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..48usize {
        let (user, label) = users[i % 4];
        let auth = auths[i % 4].clone();
        let send = send.clone();
        let url = format!(
            "{}/apps/demo/{}",
            w.gateway,
            if i % 2 == 0 { "" } else { "_echo" }
        );
        let body: Vec<u8> = if i % 2 == 0 {
            Vec::new()
        } else {
            (0..200 * 1024).map(|j| (i * 7 + j % 251) as u8).collect()
        };
        let req = http::Request::builder()
            .method(if i % 2 == 0 { "GET" } else { "POST" })
            .uri(url)
            .header("authorization", auth)
            .body(Full::new(bytes::Bytes::from(body.clone())))
            .unwrap();
        tasks.spawn(async move {
            let (status, headers, got) = h2_exchange(send, req).await;
            (i, user, label, body, status, headers, got)
        });
    }
    let mut seen = 0;
    while let Some(r) = tasks.join_next().await {
        let (i, user, label, sent, status, headers, got) = r.unwrap();
        assert_eq!(status, 200, "stream {i} of {user}");
        if i % 2 == 0 {
            let v: serde_json::Value = serde_json::from_slice(&got).unwrap();
            assert_eq!(
                (v["label"].as_str(), v["verified"].as_bool()),
                (Some(label), Some(true)),
                "stream {i} of {user}: {v}"
            );
        } else {
            assert_eq!(got.len(), sent.len(), "stream {i} of {user}");
            assert!(
                got == sent,
                "stream {i} of {user}: another stream's body came back"
            );
            let told = headers
                .get("x-echo-h-x-warden-label")
                .and_then(|v| v.to_str().ok());
            assert_eq!(told, Some(label), "stream {i} of {user}");
            let who = headers
                .get("x-echo-h-x-warden-user")
                .and_then(|v| v.to_str().ok());
            assert_eq!(who, Some(user), "stream {i}");
        }
        seen += 1;
    }
    assert_eq!(seen, 48);
}

/// A connection's HTTP/2 streams are served side by side: one waiting on a slow app holds up
/// none of the others on the same connection, and still gets its own answer in the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_stream_holds_up_no_other_stream_on_its_http2_connection() {
    use http_body_util::Full;
    let w = Warden::demo(BIN);
    let auth = basic("alice", &w.password("alice"));
    let send = h2_connect(&w).await;
    let get = |path: &str| {
        http::Request::get(format!("{}/apps/demo/{path}", w.gateway))
            .header("authorization", &auth)
            .body(Full::new(bytes::Bytes::new()))
            .unwrap()
    };
    // The instance is up before the slow request goes out.
    assert_eq!(h2_exchange(send.clone(), get("")).await.0, 200);
    let slow = tokio::spawn(h2_exchange(send.clone(), get("_slow?ms=8000")));
    for i in 0..5 {
        // A bound on waiting, not a measure of speed: a stream queued behind the slow one
        // would wait the slow one's 8 s.
        let (status, _, body) =
            tokio::time::timeout(Duration::from_secs(30), h2_exchange(send.clone(), get("")))
                .await
                .unwrap_or_else(|_| panic!("stream {i} never got its answer"));
        assert_eq!(status, 200, "stream {i}");
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["user"], "alice", "stream {i}: {v}");
    }
    assert!(
        !slow.is_finished(),
        "the other streams waited for the slow one"
    );
    let (status, _, body) = slow.await.unwrap();
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["path"], "/_slow", "{v}");
}
