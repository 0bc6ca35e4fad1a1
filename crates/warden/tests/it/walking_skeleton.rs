//! The walking skeleton, end to end through the real binary: `warden up --demo`, a user's first
//! request starts an instance at their clearance, the next reuses it, and bad input is refused.

use std::os::unix::fs::PermissionsExt;

use warden_test_support::{http, process_alive, request, wait_until, Warden};

use crate::BIN;

#[test]
fn up_prints_where_everything_is() {
    let w = Warden::demo(BIN);
    let out = w.stdout();
    let gw = w.gateway.trim_start_matches("http://");
    assert!(
        out.contains(&format!("http://{gw}/apps/")),
        "gateway URL in:\n{out}"
    );
    assert!(out.contains(&w.api), "api URL in:\n{out}");
    assert!(
        out.contains(&w.dir.join("admin-token").display().to_string()),
        "token path in:\n{out}"
    );
    let curl = format!(
        "curl -u alice:{} http://{gw}/apps/demo/",
        w.password("alice")
    );
    assert!(
        out.contains(&curl),
        "ready-to-paste curl line {curl:?} in:\n{out}"
    );
    // The line really works.
    assert_eq!(
        w.get_as("alice", &w.password("alice"), "/apps/demo/")
            .status,
        200
    );
}

#[test]
fn first_request_starts_an_instance_at_the_users_clearance_and_the_second_reuses_it() {
    let w = Warden::demo(BIN);
    let alice = w.password("alice");
    let first = w.get_as("alice", &alice, "/apps/demo/hello?x=1");
    assert_eq!(first.status, 200, "{}", first.text());
    let a1 = first.json();
    assert_eq!(a1["label"], "SECRET");
    assert_eq!(a1["path"], "/hello", "the /apps/demo prefix is stripped");
    assert_eq!(a1["user"], "alice");
    assert_eq!(
        a1["saw_authorization"], false,
        "credentials never reach the app"
    );
    let a2 = w.get_as("alice", &alice, "/apps/demo/").json();
    assert_eq!(
        a2["instance"], a1["instance"],
        "second request reuses the instance"
    );

    let bob = w.get_as("bob", &w.password("bob"), "/apps/demo/").json();
    assert_eq!(bob["label"], "CONFIDENTIAL");
    assert_ne!(
        bob["instance"], a1["instance"],
        "another clearance gets another instance"
    );

    let listed = w.api("GET", "/v1/instances", None).json();
    let labels: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels.len(), 2, "{listed}");
    assert!(labels.contains(&"SECRET") && labels.contains(&"CONFIDENTIAL"));
}

#[test]
fn wrong_credentials_get_401_with_a_challenge() {
    let w = Warden::demo(BIN);
    for (user, pass) in [
        ("alice", "wrong-password"),
        ("mallory", "whatever-password"),
        ("alice", ""),
    ] {
        let r = w.get_as(user, pass, "/apps/demo/");
        assert_eq!(r.status, 401, "{user}");
        assert!(
            r.header("www-authenticate")
                .unwrap_or("")
                .starts_with("Basic realm="),
            "{:?}",
            r.headers
        );
        assert!(!r.text().contains(pass) || pass.is_empty());
    }
    let anonymous = request("GET", &format!("{}/apps/demo/", w.gateway), &[], b"");
    assert_eq!(anonymous.status, 401);
    let junk = request(
        "GET",
        &format!("{}/apps/demo/", w.gateway),
        &[("authorization", "Basic %%%")],
        b"",
    );
    assert_eq!(junk.status, 401);
    // No instance was started for anyone who failed.
    assert_eq!(w.instances().len(), 0);
    assert!(
        !w.stderr().contains("wrong-password"),
        "passwords never reach the logs"
    );
}

#[test]
fn unknown_apps_and_paths_get_404() {
    let w = Warden::demo(BIN);
    let alice = w.password("alice");
    let r = w.get_as("alice", &alice, "/apps/nope/");
    assert_eq!(r.status, 404);
    assert!(r.json()["error"].as_str().unwrap().contains("nope"));
    assert_eq!(w.get_as("alice", &alice, "/elsewhere").status, 404);
    let redirect = w.get_as("alice", &alice, "/apps/demo");
    assert_eq!(redirect.status, 308);
    assert_eq!(redirect.header("location"), Some("/apps/demo/"));
}

#[test]
fn apps_are_reachable_by_host_name() {
    let w = Warden::demo(BIN);
    let r = request(
        "GET",
        &format!("{}/by-host", w.gateway),
        &[
            ("host", "demo.localhost"),
            ("authorization", &http::basic("carol", &w.password("carol"))),
        ],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        (r.json()["label"].as_str(), r.json()["path"].as_str()),
        (Some("TOP SECRET"), Some("/by-host"))
    );
}

#[test]
fn demo_secrets_are_private_and_generated_per_data_dir() {
    let a = Warden::demo(BIN);
    let b = Warden::demo(BIN);
    for w in [&a, &b] {
        for f in ["admin-token", "demo-users.json"] {
            let mode = std::fs::metadata(w.dir.join(f))
                .unwrap()
                .permissions()
                .mode()
                & 0o777;
            assert_eq!(mode, 0o600, "{f}");
        }
    }
    assert_ne!(a.password("alice"), b.password("alice"));
    assert_ne!(a.token, b.token);
    let store = std::fs::read(a.dir.join("store.redb")).unwrap();
    let pw = a.password("alice");
    assert!(
        !store.windows(pw.len()).any(|w| w == pw.as_bytes()),
        "no password in clear in the store"
    );
    assert!(
        !store
            .windows(a.token.len())
            .any(|w| w == a.token.as_bytes()),
        "no admin token in the store"
    );
}

#[test]
fn restart_keeps_demo_passwords() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = warden_test_support::Launch::new(BIN)
        .data_dir(dir.path())
        .start();
    let pw = first.password("alice");
    assert!(first.stop().success());
    let second = warden_test_support::Launch::new(BIN)
        .data_dir(dir.path())
        .start();
    assert_eq!(second.password("alice"), pw);
    assert_eq!(second.get_as("alice", &pw, "/apps/demo/").status, 200);
}

#[test]
fn the_demo_is_seeded_once_and_an_operators_changes_stay() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = warden_test_support::Launch::new(BIN)
        .data_dir(dir.path())
        .start();
    assert_eq!(first.api("DELETE", "/v1/users/dave", None).status, 204);
    assert_eq!(first.api("DELETE", "/v1/apps/demo", None).status, 204);
    let r = first.api(
        "PATCH",
        "/v1/users/alice",
        Some(serde_json::json!({"password": "the operator's own password"})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(first.stop().success());
    let second = warden_test_support::Launch::new(BIN)
        .data_dir(dir.path())
        .start();
    assert_eq!(second.api("GET", "/v1/users/dave", None).status, 404);
    assert_eq!(second.api("GET", "/v1/apps/demo", None).status, 404);
    assert_eq!(
        second
            .get_as("alice", "the operator's own password", "/apps/none/")
            .status,
        404,
        "alice's new password still works (and the app is gone)"
    );
    let out = second.stdout();
    assert!(out.contains("alice") && !out.contains("dave "), "{out}");
    assert!(
        second.stderr().contains("seeded before"),
        "{}",
        second.stderr()
    );
}

fn instance_pids(w: &Warden) -> Vec<u32> {
    w.api("GET", "/v1/instances", None)
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["pid"].as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn sigterm_stops_every_instance() {
    let mut w = Warden::demo(BIN);
    assert_eq!(
        w.get_as("alice", &w.password("alice"), "/apps/demo/")
            .status,
        200
    );
    assert_eq!(
        w.get_as("dave", &w.password("dave"), "/apps/demo/").status,
        200
    );
    let pids = instance_pids(&w);
    assert_eq!(pids.len(), 2);
    assert!(pids.iter().all(|p| process_alive(*p)));
    assert!(w.stop().success(), "warden exits cleanly on SIGTERM");
    for p in pids {
        assert!(!process_alive(p), "instance {p} outlived warden");
    }
}

#[test]
fn sigkill_of_warden_leaves_no_orphans() {
    let mut w = Warden::demo(BIN);
    assert_eq!(
        w.get_as("bob", &w.password("bob"), "/apps/demo/").status,
        200
    );
    let pids = instance_pids(&w);
    assert_eq!(pids.len(), 1);
    w.signal_and_wait(nix::sys::signal::Signal::SIGKILL);
    for p in pids {
        wait_until(
            "the orphaned instance to die",
            std::time::Duration::from_secs(30),
            || (!process_alive(p)).then_some(()),
        );
    }
}
