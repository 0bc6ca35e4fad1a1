//! A crash-looping app starts once per backoff window, however many clients ask at once: the
//! clients that come while the window's start is under way get its answer, not starts of
//! their own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use warden_test_support::{wait_until, Warden};

use crate::{open_dir, BIN};

const CLIENTS: usize = 4;
const STARTS: usize = 6;

#[test]
fn a_crashing_per_request_app_starts_once_per_window_whatever_the_number_of_clients() {
    let w = Arc::new(Warden::demo(BIN));
    let dir = open_dir();
    let d = dir.path().display();
    // Each instance (each its own uid: a file of its own) notes its start and whether another
    // instance ran meanwhile, lives a moment and exits with an error before it listens.
    let script = format!(
        "mktemp {d}/start.XXXXXX; if mkdir {d}/running 2>/dev/null; then sleep 0.3; rmdir {d}/running; else mktemp {d}/overlap.XXXXXX; sleep 0.3; fi; exit 3"
    );
    let r = w.api(
        "POST",
        "/v1/apps",
        Some(json!({
            "name": "crashy",
            "command": ["/bin/sh", "-c", script],
            "driver": "process",
            "lifetime": "per_request",
        })),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let count = |prefix: &str| {
        std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.file_name().to_string_lossy().starts_with(prefix))
            })
            .count()
    };
    let password = w.password("alice");
    // One crash alone starts the run; its window opens at once.
    let first = w.get_as("alice", &password, "/apps/crashy/");
    assert!(first.status >= 500, "{}", first.text());

    let done = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (w, done, password) = (w.clone(), done.clone(), password.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    let r = w.get_as("alice", &password, "/apps/crashy/");
                    assert!(r.status >= 500, "{}", r.text());
                }
            })
        })
        .collect();
    wait_until(
        &format!("{STARTS} starts of the crashing app"),
        Duration::from_secs(60),
        || (count("start.") >= STARTS).then_some(()),
    );
    done.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    assert_eq!(
        count("overlap."),
        0,
        "{CLIENTS} clients started instances of a crash-looping app at the same time ({} starts)",
        count("start.")
    );
}
