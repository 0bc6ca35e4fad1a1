//! What the gateway answers when starting an instance goes wrong, and group authorisation.

use std::time::Duration;

use serde_json::json;
use warden_test_support::{wait_until, Warden};

use crate::BIN;

#[test]
fn an_app_that_never_listens_gets_503_with_retry_after_its_start_timeout() {
    let w = Warden::demo(BIN);
    let spec = json!({"name": "mute", "command": ["/bin/sh", "-c", "echo starting but never listening; exec sleep 60"], "start_timeout_ms": 500});
    assert_eq!(w.api("POST", "/v1/apps", Some(spec)).status, 201);
    let r = w.get_as("alice", &w.password("alice"), "/apps/mute/");
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(r.json()["error"].as_str().unwrap().contains("500 ms"));
    // The half-started instance is not left running.
    assert_eq!(w.instances().len(), 0);
}

#[test]
fn an_app_that_crashes_on_start_gets_503_and_its_output_is_kept() {
    let w = Warden::demo(BIN);
    let spec = json!({"name": "crash", "command": ["/bin/sh", "-c", "echo boom: missing config >&2; exit 3"]});
    assert_eq!(w.api("POST", "/v1/apps", Some(spec)).status, 201);
    let r = w.get_as("alice", &w.password("alice"), "/apps/crash/");
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(
        !r.text().contains("boom"),
        "app output is for operators, not users"
    );
    let started = w.api(
        "POST",
        "/v1/instances",
        Some(json!({"app": "crash", "label": "SECRET"})),
    );
    assert_eq!(started.status, 502);
    let msg = started.json()["error"].as_str().unwrap().to_owned();
    assert!(
        msg.contains("boom: missing config") && msg.contains("exit status: 3"),
        "{msg}"
    );
}

#[test]
fn a_missing_program_gets_503_and_a_clear_error_for_the_operator() {
    let w = Warden::demo(BIN);
    let spec = json!({"name": "ghost", "command": ["/nonexistent/program"]});
    assert_eq!(w.api("POST", "/v1/apps", Some(spec)).status, 201);
    assert_eq!(
        w.get_as("alice", &w.password("alice"), "/apps/ghost/")
            .status,
        503
    );
    let r = w.api(
        "POST",
        "/v1/instances",
        Some(json!({"app": "ghost", "label": "SECRET"})),
    );
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .contains("cannot start app"),
        "{}",
        r.text()
    );
}

#[test]
fn apps_limited_to_groups_answer_403_to_others() {
    let w = Warden::demo(BIN);
    let spec = json!({"name": "admin-only", "command": [BIN, "demo-app"], "groups": ["admin"]});
    assert_eq!(w.api("POST", "/v1/apps", Some(spec)).status, 201);
    let carol = w.get_as("carol", &w.password("carol"), "/apps/admin-only/");
    assert_eq!(carol.status, 200);
    let alice = w.get_as("alice", &w.password("alice"), "/apps/admin-only/");
    assert_eq!(alice.status, 403);
    assert!(alice.json()["error"]
        .as_str()
        .unwrap()
        .contains("not in a group"));
}

#[test]
fn instance_env_does_not_leak_warden_secrets() {
    let w = Warden::demo(BIN);
    // A plain process (the driver that starts from the agent's own environment), writing where
    // any uid may.
    let out = crate::open_dir();
    let dump_file = out.path().join("env-dump");
    let spec = json!({"name": "envdump", "driver": "process", "command": ["/bin/sh", "-c", "env > \"$DUMP\"; exec sleep 60"], "env": {"DUMP": dump_file.display().to_string()}, "start_timeout_ms": 300});
    assert_eq!(w.api("POST", "/v1/apps", Some(spec)).status, 201);
    let _ = w.get_as("alice", &w.password("alice"), "/apps/envdump/");
    let dump = warden_test_support::wait_until(
        "the instance to dump its env",
        std::time::Duration::from_secs(30),
        || {
            std::fs::read_to_string(&dump_file)
                .ok()
                .filter(|d| d.contains("WARDEN_INSTANCE="))
        },
    );
    assert!(
        dump.contains("WARDEN_LABEL=SECRET") && dump.contains("PORT="),
        "{dump}"
    );
    assert!(
        !dump.contains(&w.token) && !dump.contains("WARDEN_LOG"),
        "agent env leaked: {dump}"
    );
}

/// How many instances of `app` were ever started: each gets a log file of its own.
fn starts_of(w: &Warden, app: &str) -> usize {
    std::fs::read_dir(w.dir.join("logs"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(&format!("{app}-"))
        })
        .count()
}

#[test]
fn an_app_that_keeps_crashing_is_backed_off_for_requests_too_and_shows_in_status() {
    let w = Warden::demo(BIN);
    let spec =
        json!({"name": "crashy", "command": ["/bin/sh", "-c", "echo cannot-start-today; exit 1"]});
    assert_eq!(w.api("POST", "/v1/apps", Some(spec)).status, 201);
    let alice = w.password("alice");
    // A burst of requests: the first crash is retried at once, then every request during the
    // backoff is answered without starting anything.
    let mut backed_off = 0;
    for _ in 0..30 {
        let r = w.get_as("alice", &alice, "/apps/crashy/");
        assert_eq!(r.status, 503, "{}", r.text());
        if r.text().contains("keeps crashing") {
            backed_off += 1;
            let wait: u64 = r.header("retry-after").unwrap().parse().unwrap();
            assert!((1..=30).contains(&wait), "Retry-After {wait}");
        }
    }
    assert!(
        backed_off >= 20,
        "{backed_off} of 30 requests were backed off"
    );
    assert!(
        starts_of(&w, "crashy") <= 3,
        "{} starts for 30 requests",
        starts_of(&w, "crashy")
    );
    // A crash loop of an app with no desired count shows in the status, with its output.
    let report = wait_until(
        "a crash loop in the status",
        Duration::from_secs(30),
        || {
            // Requests keep coming; each after a backoff starts the app once more.
            let _ = w.get_as("alice", &alice, "/apps/crashy/");
            let status = w.api("GET", "/v1/status", None).json();
            status["apps"]
                .as_array()?
                .iter()
                .find(|a| a["name"] == "crashy")?["crash_loops"]
                .as_array()?
                .first()
                .filter(|c| c["crash_loop"] == true)
                .cloned()
        },
    );
    assert!(
        report["last_lines"]
            .as_str()
            .unwrap()
            .contains("cannot-start-today"),
        "{report}"
    );
    // Other users' apps are untouched.
    assert_eq!(w.get_as("alice", &alice, "/apps/demo/").status, 200);
}
