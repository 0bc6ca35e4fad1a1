//! `warden run APP -- CMD…` (issue 38): a command run once in a fresh process of the app's
//! current release, attached to the CLI: stdin in, stdout and stderr out, the command's exit
//! status as the CLI's; Ctrl-C to the CLI reaches the command, and the command dies with the
//! client. Refusals (a viewer, an app without a release) say why.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use warden_test_support::{cli, request, Warden};

use crate::BIN;

/// `warden` with `args` against `w`, its environment cleared as `cli` clears it.
fn warden(w: &Warden, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .env_remove("WARDEN_API")
        .env_remove("WARDEN_TOKEN")
        .env_remove("WARDEN_CONFIG")
        // Not a flag: everything after `--` is the command's.
        .env("WARDEN_DATA_DIR", &w.dir)
        .env("XDG_CONFIG_HOME", "/nonexistent-warden-test");
    cmd
}

/// A warden with app `plain` (a Python server, no dependencies) pushed.
fn with_plain() -> Warden {
    let w = Warden::demo(BIN);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/apps/plain");
    let data = w.dir.display().to_string();
    let (ok, out, err) = cli(
        BIN,
        &[
            "push",
            "plain",
            &src.display().to_string(),
            "--data-dir",
            &data,
        ],
        &[],
    );
    assert!(ok, "the push failed:\n{out}\n{err}");
    w
}

/// An operator `name` with `roles` made through the API, and a session token of theirs.
fn operator_token(w: &Warden, name: &str, roles: serde_json::Value) -> String {
    let password = format!("{name}-password-1");
    let r = w.api(
        "POST",
        "/v1/operators",
        Some(json!({"name": name, "password": password, "roles": roles})),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let login = request(
        "POST",
        &format!("{}/v1/login", w.api),
        &[("content-type", "application/json")],
        json!({"name": name, "password": password})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(login.status, 200, "{}", login.text());
    login.json()["token"].as_str().unwrap().to_owned()
}

/// Runs `cmd` with no input: its exit code and what it wrote to stderr.
fn ran(cmd: &mut Command) -> (Option<i32>, String) {
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Whether a process whose command line holds `marker` runs on this host.
fn running(marker: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        std::fs::read(e.path().join("cmdline"))
            .map(|c| {
                let line = String::from_utf8_lossy(&c).replace('\0', " ");
                // Not the CLI itself, whose own arguments name it too.
                line.contains(marker) && !line.contains(" run plain ")
            })
            .unwrap_or(false)
    })
}

/// Waits (at most a minute) until `want` holds.
fn until(what: &str, want: impl Fn() -> bool) {
    let start = Instant::now();
    while !want() {
        assert!(start.elapsed() < Duration::from_secs(60), "{what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Reads the first line the CLI's command printed, which must be `ready`; the rest of its
/// output follows in what this returns.
fn said_ready(child: &mut Child) -> std::io::BufReader<std::process::ChildStdout> {
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert_eq!(line, "ready\n", "the command's first line");
    stdout
}

/// The CLI's exit code, waiting at most a minute (then killing it).
fn exit_code(child: &mut Child) -> Option<i32> {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s.code();
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("the CLI did not end within a minute");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_command_reads_stdin_and_its_output_and_exit_status_are_the_clis() {
    let w = with_plain();
    let script = "import sys, os; line = sys.stdin.readline().strip(); \
                  print('got', line, os.environ['WARDEN_LABEL']); \
                  print('to stderr', file=sys.stderr); sys.exit(3)";
    let mut child = warden(&w, &["run", "plain", "--", "python3", "-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"a line from the terminal\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(3), "{stdout}\n{stderr}");
    // The demo lattice's lowest level: the label when none is named.
    assert_eq!(
        stdout, "got a line from the terminal UNCLASSIFIED\n",
        "{stderr}"
    );
    assert!(stderr.contains("to stderr"), "{stderr}");
    assert!(!stdout.contains("to stderr"), "{stdout}");
    // Recorded, with the label the command ran at in the route.
    let (ok, out, err) = cli(
        BIN,
        &[
            "run",
            "plain",
            "--label",
            "SECRET",
            "--data-dir",
            &w.dir.display().to_string(),
            "--",
            "sh",
            "-c",
            "echo $WARDEN_LABEL",
        ],
        &[],
    );
    assert!(ok, "{out}\n{err}");
    assert_eq!(out, "SECRET\n", "{err}");
    let audit = w.api("GET", "/v1/audit?kind=change", None).json();
    let routes: Vec<String> = audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["event"]["target"] == "plain")
        .filter_map(|r| r["event"]["route"].as_str().map(str::to_owned))
        .collect();
    assert!(
        routes
            .iter()
            .any(|r| r == "/v1/apps/{name}/run?label=SECRET"),
        "{routes:?}"
    );
}

/// A command that writes a lot before it reads (while the client is still sending) gets all
/// of both: neither direction waits on the other.
#[test]
fn a_command_that_writes_before_it_reads_gets_all_its_input() {
    let w = with_plain();
    let script = "head -c 10000000 /dev/zero; wc -c";
    let mut child = warden(&w, &["run", "plain", "--", "sh", "-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let feeder = std::thread::spawn(move || {
        let chunk = vec![b'x'; 1 << 20];
        for _ in 0..20 {
            if stdin.write_all(&chunk).is_err() {
                return;
            }
        }
    });
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut all).unwrap();
        all
    });
    assert_eq!(exit_code(&mut child), Some(0));
    feeder.join().unwrap();
    let out = reader.join().unwrap();
    assert_eq!(out.len(), 10_000_000 + "20971520\n".len());
    assert!(
        out.ends_with(b"20971520\n"),
        "{:?}",
        String::from_utf8_lossy(&out[out.len().saturating_sub(20)..])
    );
}

#[test]
fn ctrl_c_reaches_the_command_and_a_client_gone_kills_it() {
    let w = with_plain();
    // Ctrl-C: the command dies of it, and so the CLI exits 130.
    // Signalled only once it says it is ready: a Python still starting (importing `site`)
    // turns the KeyboardInterrupt into exit status 1.
    let marker = "warden-run-test-sleeper-1";
    let sleeper = format!("import time; print('ready', flush=True); time.sleep(600) # {marker}");
    let mut child = warden(&w, &["run", "plain", "--", "python3", "-c", &sleeper])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let _out = said_ready(&mut child);
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    assert_eq!(exit_code(&mut child), Some(130));
    until("the command is gone", || !running(marker));
    // A command that catches it decides its own exit status.
    let catcher =
        "trap 'echo caught; exit 7' INT; echo ready; sleep 600 & wait # warden-run-test-catcher";
    let mut child = warden(&w, &["run", "plain", "--", "sh", "-c", catcher])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = said_ready(&mut child);
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    assert_eq!(exit_code(&mut child), Some(7));
    let mut out = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut out).unwrap();
    assert_eq!(out, "caught\n");
    // The client killed outright: the command goes with its connection.
    let marker = "warden-run-test-sleeper-2";
    let sleeper = format!("import time; time.sleep(600) # {marker}");
    let mut child = warden(&w, &["run", "plain", "--", "python3", "-c", &sleeper])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    until("the second command runs", || running(marker));
    child.kill().unwrap();
    let _ = child.wait();
    until("the second command is gone", || !running(marker));
}

#[test]
fn a_viewer_and_an_app_without_a_release_are_refused_with_a_reason() {
    let w = with_plain();
    let token = operator_token(&w, "view", json!([{"role": "viewer"}]));
    let out = warden(
        &w,
        &["run", "plain", "--", "touch", "/tmp/warden-run-viewer"],
    )
    .env("WARDEN_TOKEN", &token)
    .stdin(Stdio::null())
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("HTTP 403"), "{stderr}");
    assert!(stderr.contains("deployer role"), "{stderr}");
    // An app registered with a command but never pushed has no slug to run in.
    let (ok, out, err) = cli(
        BIN,
        &[
            "apps",
            "create",
            "bare",
            "--data-dir",
            &w.dir.display().to_string(),
            "--",
            "/bin/true",
        ],
        &[],
    );
    assert!(ok, "{out}\n{err}");
    let out = warden(&w, &["run", "bare", "--", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("has no release yet"), "{stderr}");
    assert!(stderr.contains("warden push bare"), "{stderr}");
    // A label the lattice lacks.
    let (_, stderr) = ran(&mut warden(
        &w,
        &["run", "plain", "--label", "NOPE", "--", "true"],
    ));
    assert!(
        stderr.contains("HTTP 400") && stderr.contains("NOPE"),
        "{stderr}"
    );
}

#[test]
fn a_data_apps_command_reads_its_labels_rows_as_that_labels_role() {
    if !crate::data_apps::postgres_installed() {
        return;
    }
    let w = crate::data_release::data_warden();
    crate::data_release::pushed_notes(&w);
    assert!(crate::data_release::notes_as(&w, "ursula", "?add=low").is_empty());
    assert!(crate::data_release::notes_as(&w, "sam", "?add=high").is_empty());
    let psql = "/usr/lib/postgresql/15/bin/psql \"$DATABASE_URL\" -X -A -t -c \"SELECT current_user; SELECT body FROM notes ORDER BY id\"";
    let run = |how: &[&str]| {
        let mut args = vec!["run", "notes"];
        args.extend_from_slice(how);
        args.extend_from_slice(&["--", "sh", "-c", psql]);
        let out = warden(&w, &args).stdin(Stdio::null()).output().unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        assert!(out.status.success(), "{how:?}: {stdout}\n{stderr}");
        let mut lines = stdout.lines().map(str::to_owned);
        let role = lines.next().unwrap_or_default();
        // A label's role, never the owner's (`wo_…`), which only the release phase gets.
        assert!(role.starts_with("wl_"), "{how:?}: {stdout}");
        lines.collect::<Vec<_>>()
    };
    assert_eq!(run(&["--label", "U"]), ["low"]);
    assert_eq!(run(&["--label", "S"]), ["low", "high"]);
    // A user's clearance is the label.
    assert_eq!(run(&["--user", "ursula"]), ["low"]);
    assert_eq!(run(&["--user", "sam", "--label", "S"]), ["low", "high"]);
    // Disagreeing, they are refused.
    let out = warden(
        &w,
        &[
            "run", "notes", "--user", "ursula", "--label", "S", "--", "true",
        ],
    )
    .stdin(Stdio::null())
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("HTTP 400") && stderr.contains("clearance"),
        "{stderr}"
    );
}

#[test]
fn an_api_without_the_agent_refuses_saying_where_to_run_it() {
    let w = warden_test_support::Launch::new(BIN)
        .no_demo()
        .arg("--roles")
        .arg("gateway,api")
        .start();
    let out = warden(&w, &["run", "plain", "--", "true"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("HTTP 503"), "{stderr}");
    assert!(stderr.contains("a node that runs the agent"), "{stderr}");
}

#[test]
fn one_offs_are_bounded_per_app_and_a_deployer_cannot_read_a_users_clearance() {
    let w = with_plain();
    // Four held open: the fifth of the app is refused, saying why; one ended, a place frees.
    let mut held: Vec<Child> = (0..4)
        .map(|i| {
            let marker = format!("warden-run-test-held-{i}");
            let sleeper = format!("import time; time.sleep(600) # {marker}");
            let child = warden(&w, &["run", "plain", "--", "python3", "-c", &sleeper])
                .stdin(Stdio::null())
                .spawn()
                .unwrap();
            until("a held command runs", || running(&marker));
            child
        })
        .collect();
    let (code, stderr) = ran(&mut warden(&w, &["run", "plain", "--", "true"]));
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("HTTP 429") && stderr.contains("at most 4 of an app"),
        "{stderr}"
    );
    let mut first = held.remove(0);
    first.kill().unwrap();
    let _ = first.wait();
    until("the first held command is gone", || {
        !running("warden-run-test-held-0")
    });
    let start = Instant::now();
    loop {
        let out = warden(&w, &["run", "plain", "--", "true"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        if out.status.code() == Some(0) {
            break;
        }
        // The place is given back once the API sees the connection end.
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for mut c in held {
        let _ = c.kill();
        let _ = c.wait();
    }
    // A deployer of the app may run it, but naming a user would read that user's clearance.
    let token = operator_token(&w, "dep", json!([{"role": "deployer", "apps": ["plain"]}]));
    let (_, stderr) = ran(
        warden(&w, &["run", "plain", "--user", "alice", "--", "true"]).env("WARDEN_TOKEN", &token),
    );
    assert!(
        stderr.contains("HTTP 403") && stderr.contains("--label instead"),
        "{stderr}"
    );
    let (code, stderr) =
        ran(warden(&w, &["run", "plain", "--", "true"]).env("WARDEN_TOKEN", &token));
    assert_eq!(code, Some(0), "{stderr}");
    // A label too long for the audit record is refused before anything is recorded.
    let long = "L".repeat(600);
    let (_, stderr) = ran(&mut warden(
        &w,
        &["run", "plain", "--label", &long, "--", "true"],
    ));
    assert!(
        stderr.contains("HTTP 414") && stderr.contains("512 bytes"),
        "{stderr}"
    );
}
