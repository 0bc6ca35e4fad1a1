//! Releases whose node is killed (`kill -9`) in the middle of their delivery: each phase is in
//! the release's record, so the node started again on the same data dir resumes the release
//! from there and it ends `released`, serving what was pushed, never stuck in a phase, with no
//! upload left behind.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;
use warden_test_support::{cli, wait_until, Launch, Warden};

use crate::BIN;

/// A data dir that `process` instances under uids of their own can pass through, in `tmp`.
pub(crate) fn data_dir(tmp: &tempfile::TempDir) -> PathBuf {
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o711),
    )
    .unwrap();
    tmp.path().join("data")
}

/// A dependency-free app that answers `answer`, started by the Procfile's `web: {web}`.
fn tree(answer: &str, web: &str) -> tempfile::TempDir {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/apps/plain/server.py");
    let server = std::fs::read_to_string(src).unwrap().replace(
        r#"os.environ.get("ANSWER", "hello from plain")"#,
        &format!("{answer:?}"),
    );
    assert!(server.contains(answer), "the fixture changed");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("server.py"), server).unwrap();
    std::fs::write(dir.path().join("Procfile"), format!("web: {web}\n")).unwrap();
    dir
}

/// Pushes `src` as `app` and waits for the push to end well.
fn push(w: &Warden, app: &str, src: &Path) {
    let data = w.dir.display().to_string();
    let src = src.display().to_string();
    let (ok, out, err) = cli(BIN, &["push", app, &src, "--data-dir", &data], &[]);
    assert!(ok, "{out}{err}");
}

/// Pushes `src` as `app` in a thread of its own: the push's connection dies with warden.
pub(crate) fn push_in_background(w: &Warden, app: &str, src: &Path) -> std::thread::JoinHandle<()> {
    let (app, src, data) = (
        app.to_owned(),
        src.display().to_string(),
        w.dir.display().to_string(),
    );
    std::thread::spawn(move || {
        let _ = cli(BIN, &["push", &app, &src, "--data-dir", &data], &[]);
    })
}

/// Release `number` of `app`, if it is recorded.
fn release(w: &Warden, app: &str, number: u64) -> Option<Value> {
    let r = w.api("GET", &format!("/v1/apps/{app}/releases"), None);
    let all = r.json();
    all.as_array()?
        .iter()
        .find(|r| r["number"] == number)
        .cloned()
}

/// Waits until release `number` of `app` is in phase `status` and its log says `line`, then
/// kills warden with SIGKILL and starts it again on the same data dir.
fn kill_in(w: Warden, app: &str, number: u64, status: &str, line: &str) -> Warden {
    let dir = kill_9_in(w, app, number, status, line);
    Launch::new(BIN).data_dir(&dir).start()
}

/// Waits until release `number` of `app` is in phase `status` and its log says `line`, then
/// kills warden with SIGKILL; its data dir.
fn kill_9_in(mut w: Warden, app: &str, number: u64, status: &str, line: &str) -> PathBuf {
    wait_until(
        &format!("release {number} of {app} to be {status} with {line:?} in its log"),
        Duration::from_secs(180),
        || {
            let r = release(&w, app, number)?;
            assert!(
                !["released", "failed"].contains(&r["status"].as_str()?),
                "the release ended before warden could be killed in phase {status}: {r}"
            );
            let log = w
                .api(
                    "GET",
                    &format!("/v1/apps/{app}/releases/{number}/log"),
                    None,
                )
                .text();
            (r["status"] == status && log.contains(line)).then_some(())
        },
    );
    w.signal_and_wait(Signal::SIGKILL);
    // The test's temporary directory outlives this warden: `w` only borrowed its data dir.
    w.dir.clone()
}

/// Waits until release `number` of `app` has finished; the release.
fn finished(w: &Warden, app: &str, number: u64) -> Value {
    wait_until(
        &format!("release {number} of {app} to finish after the restart"),
        Duration::from_secs(120),
        || {
            let r = release(w, app, number)?;
            ["released", "failed"]
                .contains(&r["status"].as_str()?)
                .then_some(r)
        },
    )
}

/// What `app` answers alice.
fn answer(w: &Warden, app: &str) -> Value {
    let got = w.get_as("alice", &w.password("alice"), &format!("/apps/{app}/"));
    assert_eq!(got.status, 200, "{}", got.text());
    got.json()["answer"].clone()
}

/// The files under the data dir's `uploads/`.
fn uploads(w: &Warden) -> Vec<std::ffi::OsString> {
    std::fs::read_dir(w.dir.join("uploads"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default()
}

/// Waits until release `number` of `app` has finished and asserts it `released`, `app` serving
/// `answer` and no upload left behind.
fn assert_resumed(w: &Warden, app: &str, number: u64, want: &str) {
    let r = finished(w, app, number);
    assert_eq!(r["status"], "released", "{r}");
    let log = w
        .api(
            "GET",
            &format!("/v1/apps/{app}/releases/{number}/log"),
            None,
        )
        .text();
    assert!(log.contains("warden started again"), "{log}");
    assert_eq!(answer(w, app), want);
    let spec = w.api("GET", &format!("/v1/apps/{app}"), None).json();
    assert_eq!(spec["release"]["number"], number, "{spec}");
    assert!(
        uploads(w).is_empty(),
        "uploads left behind: {:?}",
        uploads(w)
    );
}

/// Pushes release `number` of `app`, a Python app that answers `answer`, kills warden while
/// it is built, starts warden again and asserts the release resumed: built, serving, no upload
/// left. Without dependencies, its build still makes a virtual environment, which takes
/// seconds, long enough to be killed in.
fn killed_in_its_build_then_resumed(w: Warden, app: &str, number: u64, answer: &str) {
    let src = tree(answer, "exec python3 server.py");
    std::fs::write(
        src.path().join("requirements.txt"),
        "# nothing to install\n",
    )
    .unwrap();
    let pushing = push_in_background(&w, app, src.path());
    let w = kill_in(w, app, number, "received", "building a python app");
    let _ = pushing.join();
    assert_resumed(&w, app, number, answer);
}

#[test]
fn a_release_killed_during_its_build_is_built_again_from_its_kept_upload() {
    let tmp = tempfile::tempdir().unwrap();
    let w = Launch::new(BIN).data_dir(data_dir(&tmp)).start();
    killed_in_its_build_then_resumed(w, "held", 1, "built after a kill");
}

#[test]
fn the_first_release_of_an_app_resumed_after_a_failed_one_serves() {
    let tmp = tempfile::tempdir().unwrap();
    let w = Launch::new(BIN).data_dir(data_dir(&tmp)).start();
    // Release 1 fails its trial: the app exists, awaiting a release that serves.
    let failing = tree("never serves", "exit 1");
    let data = w.dir.display().to_string();
    let src = failing.path().display().to_string();
    let (ok, _, _) = cli(BIN, &["push", "fresh", &src, "--data-dir", &data], &[]);
    assert!(!ok, "release 1 fails its trial");
    let spec = w.api("GET", "/v1/apps/fresh", None);
    assert_eq!(spec.status, 200, "{}", spec.text());
    assert!(spec.json()["release"].is_null(), "{}", spec.text());
    // Release 2 is the one that gives it a release: killed in its build, it must still do so
    // after the restart, not fail as if the app had been removed meanwhile.
    killed_in_its_build_then_resumed(w, "fresh", 2, "made after a kill");
}

#[test]
fn a_release_killed_during_its_trial_is_tried_again() {
    let tmp = tempfile::tempdir().unwrap();
    let w = Launch::new(BIN).data_dir(data_dir(&tmp)).start();
    // The trial instance takes seconds to be ready.
    let src = tree("tried after a kill", "sleep 5; exec python3 server.py");
    let pushing = push_in_background(&w, "held", src.path());
    let w = kill_in(w, "held", 1, "built", "trying release 1");
    let _ = pushing.join();
    assert_resumed(&w, "held", 1, "tried after a kill");
}

#[test]
fn a_release_killed_during_its_rollout_is_rolled_out() {
    let tmp = tempfile::tempdir().unwrap();
    let w = Launch::new(BIN).data_dir(data_dir(&tmp)).start();
    let first = tree("the first", "exec python3 server.py");
    push(&w, "held", first.path());
    let r = w.get_as("alice", &w.password("alice"), "/apps/held/");
    assert_eq!(r.json()["answer"], "the first");
    // Its instances take seconds to be ready: the one instance of the first release hands
    // over to the second's only once one of those is.
    let second = tree("rolled out after a kill", "sleep 5; exec python3 server.py");
    let pushing = push_in_background(&w, "held", second.path());
    let w = kill_in(w, "held", 2, "switched", "rolling out");
    let _ = pushing.join();
    assert_resumed(&w, "held", 2, "rolled out after a kill");
}

#[test]
fn a_release_that_cannot_resume_fails_as_interrupted_and_the_app_keeps_serving() {
    let tmp = tempfile::tempdir().unwrap();
    let w = Launch::new(BIN).data_dir(data_dir(&tmp)).start();
    let first = tree("the first", "exec python3 server.py");
    push(&w, "held", first.path());
    let second = tree("never built", "exec python3 server.py");
    std::fs::write(second.path().join("requirements.txt"), "# nothing\n").unwrap();
    let pushing = push_in_background(&w, "held", second.path());
    let dir = kill_9_in(w, "held", 2, "received", "building a python app");
    let _ = pushing.join();
    // While the node is down its kept upload is lost: the release has nothing to build from.
    let kept: Vec<_> = std::fs::read_dir(dir.join("uploads"))
        .unwrap()
        .flatten()
        .collect();
    assert_eq!(kept.len(), 1, "the upload of release 2 is kept: {kept:?}");
    std::fs::remove_file(kept[0].path()).unwrap();
    let w = Launch::new(BIN).data_dir(&dir).start();
    let data = w.dir.display().to_string();
    let r = finished(&w, "held", 2);
    assert_eq!(
        (r["status"].as_str(), r["reason"].as_str()),
        (Some("failed"), Some("interrupted")),
        "{r}"
    );
    assert!(r["error"].as_str().unwrap().contains("push again"), "{r}");
    let (_, list, _) = cli(BIN, &["releases", "held", "--data-dir", &data], &[]);
    assert!(list.contains("failed (interrupted)"), "{list}");
    assert_eq!(answer(&w, "held"), "the first");
    let spec = w.api("GET", "/v1/apps/held", None).json();
    assert_eq!(spec["release"]["number"], 1, "{spec}");
}

#[test]
fn a_node_that_builds_nothing_refuses_a_push_and_keeps_no_upload() {
    let tmp = tempfile::tempdir().unwrap();
    let data = data_dir(&tmp);
    // An upload an earlier run with the agent left behind.
    std::fs::create_dir_all(data.join("uploads")).unwrap();
    std::fs::write(data.join("uploads/left.tar.gz"), b"old").unwrap();
    let w = Launch::new(BIN)
        .data_dir(&data)
        .no_demo()
        .arg("--roles")
        .arg("api")
        .start();
    let r = warden_test_support::http::request(
        "POST",
        &format!("{}/v1/apps/app/releases", w.api),
        &[("authorization", &format!("Bearer {}", w.token))],
        b"not even an archive",
    );
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.text().contains("nothing here can build"), "{}", r.text());
    assert!(uploads(&w).is_empty(), "uploads left: {:?}", uploads(&w));
}

#[test]
fn a_resumed_release_never_replaces_a_newer_one_that_serves() {
    let tmp = tempfile::tempdir().unwrap();
    let w = Launch::new(BIN).data_dir(data_dir(&tmp)).start();
    push(
        &w,
        "held",
        tree("the first", "exec python3 server.py").path(),
    );
    // Room for a slow start: the second release's instance takes 15 s to be ready.
    let patch = serde_json::json!({ "start_timeout_ms": 60_000 });
    assert_eq!(w.api("PATCH", "/v1/apps/held", Some(patch)).status, 200);
    let second = tree("the second", "sleep 15; exec python3 server.py");
    let pushing = push_in_background(&w, "held", second.path());
    let dir = kill_9_in(w, "held", 2, "built", "trying release 2");
    let _ = pushing.join();
    let w = Launch::new(BIN).data_dir(&dir).start();
    // While release 2 is tried again, release 3 is pushed and serves.
    push(
        &w,
        "held",
        tree("the third", "exec python3 server.py").path(),
    );
    let r = finished(&w, "held", 2);
    assert_eq!(
        (r["status"].as_str(), r["reason"].as_str()),
        (Some("failed"), Some("superseded")),
        "{r}"
    );
    assert_eq!(answer(&w, "held"), "the third");
    let spec = w.api("GET", "/v1/apps/held", None).json();
    assert_eq!(spec["release"]["number"], 3, "{spec}");
}
