//! What client connections cost the gateway, and what a client meets at the limits: one
//! descriptor per connection, a connection limit that fits the open-file limit, and a fast 503
//! beyond it, never a hang.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use warden_test_support::{wait_until, Launch, Warden};

use crate::BIN;

fn descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

fn open_idle(host: &str, n: usize) -> Vec<TcpStream> {
    (0..n)
        .map(|_| TcpStream::connect(host).expect("connect"))
        .collect()
}

#[test]
fn an_idle_connection_costs_one_descriptor() {
    let w = Warden::demo(BIN);
    let host = w.gateway.trim_start_matches("http://").to_owned();
    let before = descriptors(w.pid());
    let n = 200;
    let conns = open_idle(&host, n);
    let grown = wait_until("warden to accept them all", Duration::from_secs(30), || {
        let d = descriptors(w.pid()).saturating_sub(before);
        (d >= n).then_some(d)
    });
    // Settled: what was grown after the last accept is all there is.
    std::thread::sleep(Duration::from_millis(200));
    let grown = grown.max(descriptors(w.pid()).saturating_sub(before));
    assert!(
        grown < n + n / 4,
        "{n} idle connections hold {grown} descriptors"
    );
    drop(conns);
}

/// Sends a request on a new connection and reads the answer, within `limit`.
fn ask(host: &str, limit: Duration) -> String {
    let mut s = TcpStream::connect(host).expect("connect");
    s.set_read_timeout(Some(limit)).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn the_connection_limit_fits_the_open_file_limit_and_beyond_it_clients_get_503_at_once() {
    // 1024 descriptors for a warden asked to hold the default 10,000 connections.
    let w = Launch::new(BIN)
        .wrapped(&["prlimit", "--nofile=1024:1024", "--"])
        .start();
    let lowered = wait_until("the warning", Duration::from_secs(10), || {
        let err = w.stderr();
        err.contains("does not fit the open-file limit")
            .then_some(err)
    });
    assert!(lowered.contains("lowered_to=768"), "{lowered}");
    let host = w.gateway.trim_start_matches("http://").to_owned();
    let _held = open_idle(&host, 800);
    // The limit is reached: a new client is told so at once, however long it would wait.
    let answer = ask(&host, Duration::from_secs(20));
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
    assert!(answer.contains("retry-after"), "{answer:?}");
}
