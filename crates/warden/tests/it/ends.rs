//! Where what a request proved ends, tried by every way in (the HTTP/1.1 lane, hyper's
//! HTTP/1.1, HTTP/1.0 and HTTP/2): a session past its end, and an instance that reported taint.

use std::time::Duration;

use serde_json::Value;
use warden_test_support::http::{basic, h2c_get, raw, request_from};
use warden_test_support::{request, wait_until, Launch, Warden};

use crate::BIN;

/// One GET of `path` with `headers`, by `way`: (status, JSON body or Null).
fn by(w: &Warden, way: &str, path: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let host = w.gateway.trim_start_matches("http://");
    let head: String = headers
        .iter()
        .map(|(n, v)| format!("{n}: {v}\r\n"))
        .collect();
    let r = match way {
        "lane" => raw(
            host,
            format!("GET {path} HTTP/1.1\r\nhost: {host}\r\n{head}connection: close\r\n\r\n")
                .as_bytes(),
        ),
        "hyper" => raw(
            host,
            format!("GET {path} HTTP/1.1\r\nhost: {host}\r\n{head}connection: close, x-hop\r\nx-hop: 1\r\n\r\n")
                .as_bytes(),
        ),
        "http/1.0" => raw(
            host,
            format!("GET {path} HTTP/1.0\r\nhost: {host}\r\n{head}\r\n").as_bytes(),
        ),
        "http/2" => h2c_get(&format!("{}{path}", w.gateway), headers).1,
        _ => unreachable!("{way}"),
    };
    let body = serde_json::from_str(&r.text()).unwrap_or(Value::Null);
    (r.status, body)
}

const WAYS: [&str; 4] = ["lane", "hyper", "http/1.0", "http/2"];

#[test]
fn a_session_past_its_end_is_refused_on_every_way_in_and_never_stands_for_anyone() {
    let w = Launch::new(BIN).arg("--session-ttl").arg("2s").start();
    let dave = w.password("dave");
    let login = request(
        "POST",
        &format!("{}/login", w.gateway),
        &[("authorization", &basic("dave", &dave))],
        b"",
    );
    let token = login.json()["token"].as_str().unwrap().to_owned();
    let (bearer, cookie) = (format!("Bearer {token}"), format!("warden_session={token}"));
    for way in WAYS {
        for h in [
            ("authorization", bearer.as_str()),
            ("cookie", cookie.as_str()),
        ] {
            let (status, body) = by(&w, way, "/apps/demo/", &[h]);
            assert_eq!(
                (status, body["user"].as_str()),
                (200, Some("dave")),
                "{way} {h:?}"
            );
        }
    }
    // The gateway's own clock ends it: its record outlives it by a minute in the store.
    wait_until("the session to end", Duration::from_secs(30), || {
        (by(&w, "lane", "/apps/demo/", &[("authorization", &bearer)]).0 == 401).then_some(())
    });
    for way in WAYS {
        for h in [
            ("authorization", bearer.as_str()),
            ("cookie", cookie.as_str()),
        ] {
            assert_eq!(by(&w, way, "/apps/demo/", &[h]).0, 401, "{way} {h:?}");
        }
        // Beside another user's Basic credentials it counts for nothing: no "two users".
        let carol = basic("carol", &w.password("carol"));
        let (status, body) = by(
            &w,
            way,
            "/apps/demo/",
            &[("authorization", &carol), ("cookie", &cookie)],
        );
        assert_eq!(
            (status, body["user"].as_str()),
            (200, Some("carol")),
            "{way}"
        );
    }
    // And it signs no one out or in through a new login's cookie either.
    let r = request_from(
        std::net::Ipv4Addr::new(127, 0, 0, 9),
        "GET",
        &format!("{}/apps/demo/", w.gateway),
        &[("cookie", &cookie)],
        b"",
    );
    assert_eq!(r.status, 401);
}

#[test]
fn an_instance_that_reports_taint_serves_no_lower_request_on_any_way_in() {
    let w = Warden::demo(BIN);
    let alice = basic("alice", &w.password("alice"));
    let bob = basic("bob", &w.password("bob"));
    for way in WAYS {
        let (status, tainted) = by(
            &w,
            way,
            "/apps/demo/?taint=TOP%20SECRET",
            &[("authorization", &alice)],
        );
        assert_eq!(status, 200, "{way}");
        let id = tainted["instance"].as_str().unwrap().to_owned();
        // At once, by every way: neither alice (SECRET) nor bob (CONFIDENTIAL) reaches it.
        for next in WAYS {
            for (who, auth) in [("alice", &alice), ("bob", &bob)] {
                let (status, body) = by(&w, next, "/apps/demo/", &[("authorization", auth)]);
                assert_eq!(status, 200, "{way} then {next} as {who}");
                assert_ne!(
                    body["instance"].as_str(),
                    Some(id.as_str()),
                    "taint reported over {way}: {who}'s request over {next} reached the instance"
                );
            }
        }
        // Its node relabels it: from then on it serves TOP SECRET.
        wait_until(
            &format!("the relabel after {way}"),
            Duration::from_secs(30),
            || {
                w.instances()
                    .iter()
                    .any(|i| i["id"] == id.as_str() && i["label"] == "TOP SECRET")
                    .then_some(())
            },
        );
    }
}
