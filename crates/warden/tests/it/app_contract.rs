//! What an app can count on when warden runs it, as a new user's first apps found it: `$PORT`
//! in its arguments, an absolute `WARDEN_DATA_DIR` and a `HOME`, and a clear word when its
//! program does not exist.

use serde_json::json;
use warden_test_support::Warden;

use crate::BIN;

/// A real third-party server (Python's) told its port on the command line, as `gunicorn -b
/// 127.0.0.1:$PORT` would be: no shell runs the command, so warden expands `$PORT` itself.
#[test]
fn port_in_the_arguments_is_the_instances_port_under_both_drivers() {
    let w = Warden::demo(BIN);
    for driver in ["process", "sandbox"] {
        let name = format!("py-{driver}");
        let r = w.api(
            "POST",
            "/v1/apps",
            Some(json!({
                "name": name,
                "driver": driver,
                "command": ["python3", "-m", "http.server", "${PORT}", "--bind", "127.0.0.1",
                            "--directory", "/usr/share"],
            })),
        );
        assert_eq!(r.status, 201, "{}", r.text());
        let r = w.get_as("alice", &w.password("alice"), &format!("/apps/{name}/"));
        assert_eq!(r.status, 200, "{driver}: {}", r.text());
        assert!(r.text().contains("Directory listing"), "{}", r.text());
    }
}

/// `WARDEN_DATA_DIR` is absolute and `HOME` is the same private directory: an app that changes
/// directory still finds it.
#[test]
fn an_app_that_changes_directory_still_finds_its_data_dir_and_home() {
    let w = Warden::demo(BIN);
    let script = r#"cd / && printf '%s|%s' "$WARDEN_DATA_DIR" "$HOME" > "$WARDEN_DATA_DIR/env.txt" && exec python3 -m http.server "$PORT" --bind 127.0.0.1 --directory "$HOME""#;
    let r = w.api(
        "POST",
        "/v1/apps",
        Some(json!({ "name": "mover", "driver": "process", "command": ["/bin/sh", "-c", script] })),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let r = w.get_as("alice", &w.password("alice"), "/apps/mover/env.txt");
    assert_eq!(r.status, 200, "{}", r.text());
    let (data, home) = r
        .text()
        .split_once('|')
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .unwrap();
    assert!(data.starts_with('/'), "absolute: {data}");
    assert_eq!(data, home);
}

/// Requests `app` as alice until its status reports a crash loop (each request after a backoff
/// tries a start again); the report. Every answer must be `status`.
fn crash_loop_by_requests(w: &Warden, app: &str, status: Option<u16>) -> serde_json::Value {
    let pw = w.password("alice");
    warden_test_support::wait_until(
        &format!("a crash loop of {app}"),
        std::time::Duration::from_secs(60),
        || {
            let r = w.get_as("alice", &pw, &format!("/apps/{app}/"));
            if let Some(s) = status {
                assert_eq!(r.status, s, "{}", r.text());
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
            let all = w.api("GET", "/v1/status", None).json();
            let a = all["apps"]
                .as_array()?
                .iter()
                .find(|a| a["name"] == app)?
                .clone();
            let c = a["crash_loops"].as_array()?.first()?.clone();
            (c["crash_loop"] == true).then_some(c)
        },
    )
}

/// A program that does not exist: the request fails at once, the app's status names the
/// program, and no attempt leaves an empty log behind.
#[test]
fn a_program_that_does_not_exist_is_named_and_leaves_no_empty_logs() {
    let w = Warden::demo(BIN);
    let r = w.api(
        "POST",
        "/v1/apps",
        Some(json!({ "name": "ghost", "driver": "process", "command": ["/no/such/server", "--port", "$PORT"] })),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let pw = w.password("alice");
    let r = w.get_as("alice", &pw, "/apps/ghost/");
    assert_eq!(r.status, 503, "{}", r.text());
    // Users are told it failed, never why: that is for the operator (the status, below).
    assert!(!r.text().contains("/no/such/server"), "{}", r.text());
    // Each request after a backoff tries again, until three in a row make a crash loop.
    let report = crash_loop_by_requests(&w, "ghost", Some(503));
    assert!(
        report["last_exit"]
            .as_str()
            .unwrap()
            .contains("/no/such/server"),
        "{report}"
    );
    let logs = std::fs::read_dir(w.dir.join("logs")).unwrap();
    let empty: Vec<String> = logs
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("ghost-"))
        .filter(|e| e.metadata().map(|m| m.len() == 0).unwrap_or(false))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(empty.is_empty(), "empty logs left behind: {empty:?}");
}

/// A script whose interpreter lives outside what the sandbox shows (a virtualenv made with a
/// Python under $HOME, say) fails with the interpreter named, not a bare "no such file" about
/// the script.
#[test]
fn a_script_whose_interpreter_the_sandbox_cannot_see_says_so() {
    let w = Warden::demo(BIN);
    let base = w.dir.parent().unwrap().to_owned();
    let (app, interp) = (base.join("app"), base.join("interp"));
    std::fs::create_dir_all(&app).unwrap();
    std::fs::create_dir_all(&interp).unwrap();
    std::os::unix::fs::symlink("/bin/sh", interp.join("sh")).unwrap();
    let script = app.join("run.sh");
    std::fs::write(
        &script,
        format!(
            "#!{}\nexec python3 -m http.server \"$PORT\"\n",
            interp.join("sh").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    for (name, driver) in [("vsb", "sandbox"), ("vproc", "process")] {
        let r = w.api(
            "POST",
            "/v1/apps",
            Some(
                json!({ "name": name, "driver": driver, "workdir": app.display().to_string(),
                         "command": [script.display().to_string()] }),
            ),
        );
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let pw = w.password("alice");
    // The host sees the interpreter: the process driver runs it.
    assert_eq!(w.get_as("alice", &pw, "/apps/vproc/").status, 200);
    let report = crash_loop_by_requests(&w, "vsb", None);
    let lines = report["last_lines"].as_str().unwrap();
    assert!(
        lines.contains("names the interpreter")
            && lines.contains(&interp.join("sh").display().to_string()),
        "{report}"
    );
}

/// An app that never listens is no cheaper to retry than one that crashes: a start that is
/// not ready in time counts as a crash too, so requests back off instead of each starting
/// another instance and waiting the whole start timeout.
#[test]
fn an_app_that_never_listens_backs_off_like_a_crash() {
    let w = Warden::demo(BIN);
    let r = w.api(
        "POST",
        "/v1/apps",
        Some(
            json!({ "name": "mute", "driver": "process", "start_timeout_ms": 300,
                     "command": ["/bin/sh", "-c", "exec sleep 60"] }),
        ),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let report = crash_loop_by_requests(&w, "mute", None);
    assert!(
        report["last_exit"]
            .as_str()
            .unwrap()
            .contains("did not become ready"),
        "{report}"
    );
    // Backing off: a request now is refused at once, starting nothing.
    let before = w.instances().len();
    let r = w.get_as("alice", &w.password("alice"), "/apps/mute/");
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.header("retry-after").is_some(), "{:?}", r.headers);
    assert_eq!(w.instances().len(), before);
}
