//! `warden logs` (issue 38): `-n` counts the app's lines in all, not each instance's, and the
//! gateway's request lines show as `router` lines without their query strings.

use serde_json::json;
use warden_test_support::{cli, Warden};

use crate::BIN;

fn run(w: &Warden, args: &[&str]) -> (bool, String, String) {
    let env = [
        ("WARDEN_API", w.api.as_str()),
        ("WARDEN_TOKEN", w.token.as_str()),
    ];
    cli(BIN, args, &env)
}

/// An app whose instances print eight lines each, then serve `/usr/share` over HTTP.
fn chatty(w: &Warden) {
    let script = r#"i=0; while [ $i -lt 8 ]; do echo "$WARDEN_LABEL says $i"; i=$((i+1)); done; exec python3 -u -m http.server "$PORT" --bind 127.0.0.1 --directory /usr/share"#;
    let spec =
        json!({ "name": "chatty", "driver": "process", "command": ["/bin/sh", "-c", script] });
    let r = w.api("POST", "/v1/apps", Some(spec));
    assert_eq!(r.status, 201, "{}", r.text());
}

/// Two instances (alice's and bob's labels) each print at least eight lines: `-n 5` prints
/// five in all, the newest of the instance written last.
#[test]
fn lines_are_counted_for_the_app_not_for_each_instance() {
    let w = Warden::demo(BIN);
    chatty(&w);
    for user in ["alice", "bob"] {
        let r = w.get_as(user, &w.password(user), "/apps/chatty/");
        assert_eq!(r.status, 200, "{user}: {}", r.text());
    }
    let (ok, all, err) = run(&w, &["logs", "chatty", "--source", "app", "-n", "100"]);
    assert!(ok, "{err}");
    let labels: std::collections::BTreeSet<&str> = all
        .lines()
        .filter_map(|l| l.split_once("] ")?.1.split_once(" says ").map(|(a, _)| a))
        .collect();
    assert_eq!(labels.len(), 2, "two instances at two labels print: {all}");
    let (ok, five, err) = run(&w, &["logs", "chatty", "--source", "app", "-n", "5"]);
    assert!(ok, "{err}");
    assert_eq!(five.lines().count(), 5, "five lines in all: {five}");
    assert!(five.lines().all(|l| l.starts_with('[')), "{five}");
}

/// A request's line shows its method, path and status, and never its query string.
#[test]
fn request_lines_show_method_path_and_status_but_not_the_query() {
    let w = Warden::demo(BIN);
    chatty(&w);
    let r = w.get_as("alice", &w.password("alice"), "/apps/chatty/?token=secret");
    assert_eq!(r.status, 200, "{}", r.text());
    let (ok, out, err) = run(&w, &["logs", "chatty", "--source", "router"]);
    assert!(ok, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("[router] "))
        .unwrap_or_else(|| panic!("no router line: {out} {err}"));
    assert!(line.contains(" GET / 200 "), "{line}");
    assert!(line.contains("label="), "{line}");
    assert!(!out.contains("token") && !out.contains("secret"), "{out}");
    // By default both sources show.
    let (ok, both, err) = run(&w, &["logs", "chatty"]);
    assert!(ok, "{err}");
    assert!(
        both.contains("[router] ") && both.contains(" says "),
        "{both}"
    );
}
