//! The instance image, `warden-instance` beside `warden`: what every instance's own processes
//! run (the sandbox's init, the demo app), so that they carry none of the big binary's
//! relocated pages; a warden without it refuses to start instead of failing each instance.

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::json;
use warden_test_support::{Launch, Warden};

use crate::{BIN, INSTANCE_BIN};

/// The file name `pid` runs, from /proc/<pid>/exe.
fn image_of(pid: u64) -> String {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    exe.file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn warden_up_without_the_instance_image_beside_it_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let alone = dir.path().join("warden");
    if std::fs::hard_link(BIN, &alone).is_err() {
        std::fs::copy(BIN, &alone).unwrap();
    }
    // Without the demo, whose seeding names the image too: the agent's start must check it.
    let data = dir.path().join("data");
    let mut up = std::process::Command::new(&alone)
        .args([
            "up",
            "--listen",
            "127.0.0.1:0",
            "--api-listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(&data)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A warden that starts anyway runs until stopped: stop it rather than wait for ever.
    let deadline = Instant::now() + Duration::from_secs(60);
    while up.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let refused = up.try_wait().unwrap();
    let _ = up.kill();
    let out = up.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        refused.is_some_and(|s| !s.success()),
        "warden up started without its instance image: {err}"
    );
    let expected = dir.path().join("warden-instance");
    assert!(
        err.contains(&expected.display().to_string())
            && err.contains("same directory as the warden binary"),
        "names the missing file and what to do: {err}"
    );
}

#[test]
fn the_demo_app_and_every_sandboxs_init_run_the_instance_image() {
    let w = Warden::demo(BIN);
    let beside = std::fs::canonicalize(INSTANCE_BIN).unwrap();

    let spec = w.api("GET", "/v1/apps/demo", None).json();
    assert_eq!(
        spec["command"],
        json!([beside.display().to_string(), "demo-app"]),
        "the demo app is the instance image's: {spec}"
    );
    let r = w.get_as("alice", &w.password("alice"), "/apps/demo/");
    assert_eq!(r.status, 200, "the demo app serves: {}", r.text());

    // An app that is the big binary, sandboxed: the sandbox's own processes are not.
    let r = w.api(
        "POST",
        "/v1/apps",
        Some(json!({ "name": "boxed", "command": [BIN, "demo-app"], "driver": "sandbox" })),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let r = w.get_as("alice", &w.password("alice"), "/apps/boxed/");
    assert_eq!(r.status, 200, "{}", r.text());
    let outermost = w
        .instances()
        .iter()
        .find(|i| i["app"] == "boxed")
        .and_then(|i| i["pid"].as_u64())
        .expect("an instance of boxed with a pid");
    assert_eq!(
        image_of(outermost),
        "warden-instance",
        "the sandbox's outermost process (its init) runs the instance image"
    );
}

#[test]
fn a_demo_seeded_by_an_earlier_version_runs_the_instance_image_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = Launch::new(BIN).data_dir(dir.path()).start();
    // What earlier versions registered: the demo app as a command of `warden` itself.
    let earlier = json!({ "command": [BIN, "demo-app"] });
    let r = first.api("PATCH", "/v1/apps/demo", Some(earlier));
    assert!(r.status < 300, "{}", r.text());
    assert!(first.stop().success());

    let second = Launch::new(BIN).data_dir(dir.path()).start();
    let beside = std::fs::canonicalize(INSTANCE_BIN).unwrap();
    assert_eq!(
        second.api("GET", "/v1/apps/demo", None).json()["command"],
        json!([beside.display().to_string(), "demo-app"]),
        "the restart points the demo app at the instance image"
    );
    let r = second.get_as("alice", &second.password("alice"), "/apps/demo/");
    assert_eq!(r.status, 200, "{}", r.text());
}
