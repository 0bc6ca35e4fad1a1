//! The API's port has the gateway's kind of limits (builds and `process` instances can reach
//! it): a connection cap answered with a 503 at once, a time limit on request heads, and a
//! limit on clients that stall a request body. Half-sent requests cannot use up warden's
//! descriptors, starve the API for longer than the head timeout, or touch the gateway.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use warden_test_support::{request, wait_until, Launch, Warden};

use crate::BIN;

const CAP: usize = 64;

fn descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

fn limited() -> Warden {
    Launch::new(BIN)
        .arg("--api-max-connections")
        .arg(&CAP.to_string())
        .arg("--api-header-timeout")
        .arg("2s")
        .arg("--api-idle-timeout")
        .arg("2s")
        .start()
}

/// A connection that sent the start of a request head and nothing more.
fn half_sent(host: &str) -> TcpStream {
    let mut s = TcpStream::connect(host).expect("connect");
    let _ = s.write_all(b"POST /v1/apps HTTP/1.1\r\nHost: a\r\n");
    s
}

/// What the server sends on `s` until it closes it, waiting at most `limit`; `None` if it is
/// still open then.
fn until_closed(s: &mut TcpStream, limit: Duration) -> Option<String> {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut out = Vec::new();
    match s.read_to_end(&mut out) {
        Ok(_) => Some(String::from_utf8_lossy(&out).into_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
            Some(String::from_utf8_lossy(&out).into_owned())
        }
        Err(_) => None,
    }
}

#[test]
fn half_sent_requests_neither_exhaust_the_api_nor_starve_it_or_the_gateway() {
    let w = limited();
    let host = w.api.trim_start_matches("http://").to_owned();
    let before = descriptors(w.pid());

    // The cap's worth of half-sent heads, all accepted and held.
    let mut held: Vec<TcpStream> = (0..CAP).map(|_| half_sent(&host)).collect();
    wait_until("warden to accept them", Duration::from_secs(20), || {
        (descriptors(w.pid()) >= before + CAP).then_some(())
    });
    // Beyond the cap, each further one is answered 503 at once and closed, costing nothing.
    for _ in 0..200 {
        let mut s = half_sent(&host);
        let answer = until_closed(&mut s, Duration::from_secs(20)).expect("closed at once");
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
        assert!(answer.contains("retry"), "{answer:?}");
    }
    let grown = descriptors(w.pid()).saturating_sub(before);
    assert!(grown < CAP + 16, "{grown} descriptors for a cap of {CAP}");
    // The gateway is untouched.
    assert_eq!(
        request("GET", &format!("{}/healthz", w.gateway), &[], b"").status,
        200
    );

    // The held ones are closed once their head is late, and the API serves again.
    for s in held.iter_mut().take(4) {
        let gone = until_closed(s, Duration::from_secs(20));
        assert!(
            gone.is_some(),
            "a half-sent head is still open after the header timeout"
        );
    }
    wait_until("the API to serve again", Duration::from_secs(20), || {
        (w.api("GET", "/v1/apps", None).status == 200).then_some(())
    });
}

#[test]
fn a_stalled_request_body_is_cut_off_after_the_idle_timeout() {
    let w = limited();
    let host = w.api.trim_start_matches("http://").to_owned();
    let mut s = TcpStream::connect(&host).expect("connect");
    let head = format!(
        "POST /v1/apps HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"name\":",
        w.token
    );
    s.write_all(head.as_bytes()).unwrap();
    let answer = until_closed(&mut s, Duration::from_secs(20));
    assert!(
        answer.is_some(),
        "a request whose body stalls still holds its connection"
    );
    assert_eq!(w.api("GET", "/v1/apps", None).status, 200);
}
