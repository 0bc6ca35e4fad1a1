//! `warden up`'s settings through the real binary: a config file and the flags over it, roles,
//! clear errors for bad values, and the demo's TLS port beside its gateway.

use std::process::Command;

use serde_json::json;
use warden_test_support::http::basic;
use warden_test_support::{request, Launch};

use crate::BIN;

/// Runs `warden up` with `args` in a fresh data dir; it must exit. Returns (success, stderr).
fn up_fails(args: &[&str]) -> (bool, String) {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args([
            "up",
            "--listen",
            "127.0.0.1:0",
            "--api-listen",
            "127.0.0.1:0",
        ])
        .arg("--data-dir")
        .arg(tmp.path().join("data"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_config_file_sets_what_flags_do_and_flags_win() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("warden.toml");
    std::fs::write(&file, "max_header_bytes = 1000\nsession_ttl = \"2h\"\n").unwrap();
    let big = "x".repeat(1500);
    let head = |w: &warden_test_support::Warden| {
        request(
            "GET",
            &format!("{}/apps/demo/", w.gateway),
            &[
                ("authorization", &basic("alice", &w.password("alice"))),
                ("x-big", &big),
            ],
            b"",
        )
    };
    let w = Launch::new(BIN)
        .arg("--config")
        .arg(file.to_str().unwrap())
        .start();
    let r = head(&w);
    assert_eq!(r.status, 431, "{}", r.text());
    assert!(r.text().contains("larger than 1000 bytes"), "{}", r.text());
    drop(w);
    let w = Launch::new(BIN)
        .arg("--config")
        .arg(file.to_str().unwrap())
        .arg("--max-header-bytes")
        .arg("4000")
        .start();
    assert_eq!(head(&w).status, 200);
}

#[test]
fn bad_settings_stop_warden_with_the_key_named() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("warden.toml");
    std::fs::write(&file, "upstream_timeout = \"soon\"\n").unwrap();
    let (ok, err) = up_fails(&["--config", file.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("upstream_timeout"), "{err}");
    assert!(err.contains(file.to_str().unwrap()), "{err}");
    let (ok, err) = up_fails(&["--header-timeout", "0s"]);
    assert!(!ok);
    assert!(err.contains("--header-timeout"), "{err}");
    let (ok, err) = up_fails(&["--roles", "gateway,checker"]);
    assert!(!ok);
    assert!(err.contains("roles") && err.contains("checker"), "{err}");
}

#[test]
fn without_the_agent_role_requests_for_new_instances_get_a_clear_503() {
    let w = Launch::new(BIN).arg("--roles").arg("gateway,api").start();
    assert!(w.stdout().contains("roles gateway,api"), "{}", w.stdout());
    let r = w.get_as("alice", &w.password("alice"), "/apps/demo/");
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.text().contains("no agent runs"), "{}", r.text());
    assert!(r.header("retry-after").is_some());
    let r = w.api(
        "POST",
        "/v1/instances",
        Some(json!({ "app": "demo", "label": "SECRET" })),
    );
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.text().contains("agent role"), "{}", r.text());
    assert!(w.instances().is_empty());
}

#[test]
fn two_demos_on_one_machine_serve_tls_beside_their_own_gateways() {
    let a = Launch::new(BIN).no_demo().arg("--demo").start();
    let b = Launch::new(BIN).no_demo().arg("--demo").start();
    let (ta, tb) = (a.tls.clone().unwrap(), b.tls.clone().unwrap());
    assert_ne!(ta, tb);
    for (w, tls) in [(&a, ta), (&b, tb)] {
        assert!(
            w.stdout()
                .contains(&format!("gateway TLS  {tls}/apps/<app>/")),
            "{}",
            w.stdout()
        );
    }
}
