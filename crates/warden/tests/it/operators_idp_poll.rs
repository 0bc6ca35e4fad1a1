//! `warden login --provider`'s polling (issue 36) against a scripted API on loopback: the
//! CLI rides out a few transient failures (a 503, a connection cut without an answer, a 502)
//! within the codes' life, and stops at the first definite refusal.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::BIN;

/// One scripted answer to a poll: `None` cuts the connection without answering.
type Answer = Option<(u16, &'static str)>;

const STARTED: &str = r#"{"handle": "h", "user_code": "ABCD-EFGH", "verification_uri": "http://127.0.0.1:1/device", "interval": 1, "expires_in": 60}"#;
const DONE: &str = r#"{"status": "done", "token": {"id": "t1", "token": "secret-token", "operator": "alice", "expires_ms": 4102444800000}}"#;

/// An API that starts a device sign-in, then answers the polls with `polls` in turn (the last
/// one again once they run out); how many polls it saw. Bounded: 20 requests.
fn scripted(polls: Vec<Answer>) -> (String, Arc<AtomicUsize>) {
    scripted_from(STARTED, polls)
}

fn scripted_from(started: &'static str, polls: Vec<Answer>) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let count = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(20) {
            let Ok(mut s) = stream else { continue };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let head = String::from_utf8_lossy(&head).to_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap_or(0));
            let mut body = vec![0u8; len];
            let _ = s.read_exact(&mut body);
            let answer = if head.starts_with("post /v1/login/device/poll ") {
                let n = count.fetch_add(1, Ordering::SeqCst);
                polls[n.min(polls.len() - 1)]
            } else {
                Some((200, started))
            };
            let Some((status, body)) = answer else {
                continue; // dropped: the connection closes with no answer
            };
            let _ = write!(
                s,
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (format!("http://{addr}"), seen)
}

fn command(api: &str, home: &std::path::Path) -> std::process::Command {
    let mut c = std::process::Command::new(BIN);
    c.args(["login", "--provider", "corp"])
        .env_remove("WARDEN_TOKEN")
        .env_remove("WARDEN_CONFIG")
        .env("WARDEN_API", api)
        .env("XDG_CONFIG_HOME", home)
        .stdin(std::process::Stdio::null());
    c
}

fn login(api: &str) -> (bool, String, String) {
    let home = tempfile::tempdir().unwrap();
    let out = command(api, home.path()).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const UNAVAILABLE: Answer = Some((503, r#"{"error": "busy"}"#));
const BAD_GATEWAY: Answer = Some((502, r#"{"error": "identity provider Corp: unreachable"}"#));

#[test]
fn the_device_login_polls_through_transient_failures_and_stops_at_a_refusal() {
    let (api, polls) = scripted(vec![UNAVAILABLE, None, BAD_GATEWAY, Some((200, DONE))]);
    let (ok, out, err) = login(&api);
    assert!(
        ok && out.contains("logged in as operator alice"),
        "{out}{err}"
    );
    assert_eq!(polls.load(Ordering::SeqCst), 4, "{err}");

    let declined = r#"{"error": "the sign-in was declined at Corp"}"#;
    let (api, polls) = scripted(vec![Some((403, declined))]);
    let (ok, out, err) = login(&api);
    assert!(
        !ok && err.contains("the sign-in was declined at Corp"),
        "{out}{err}"
    );
    assert_eq!(polls.load(Ordering::SeqCst), 1, "{err}");

    // Transient failures without end: given up after a bounded number, not at the codes' end.
    let (api, polls) = scripted(vec![UNAVAILABLE]);
    let (ok, out, err) = login(&api);
    assert!(!ok && err.contains("polls in a row failed"), "{out}{err}");
    assert_eq!(polls.load(Ordering::SeqCst), 6, "{err}");
}

#[test]
fn the_device_login_never_sleeps_past_the_codes_life() {
    // An interval of 10 minutes on codes that last 2 s: the one poll comes at their end.
    let started = r#"{"handle": "h", "user_code": "ABCD-EFGH", "verification_uri": "http://127.0.0.1:1/device", "interval": 600, "expires_in": 2}"#;
    let (api, polls) = scripted_from(started, vec![Some((200, DONE))]);
    let home = tempfile::tempdir().unwrap();
    let mut child = command(&api, home.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Far from the 600 s an uncapped sleep takes; generous for a 2 s wait.
    let limit = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let done = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the login still waits after 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert!(done.success());
    assert_eq!(polls.load(Ordering::SeqCst), 1);
}
