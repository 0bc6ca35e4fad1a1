//! The CLI against a real warden: finding the API and token, tables and --json, errors that say
//! what to do.

use warden_test_support::{cli, Warden};

use crate::BIN;

fn env_of(w: &Warden) -> [(&'static str, String); 2] {
    [
        ("WARDEN_API", w.api.clone()),
        ("WARDEN_TOKEN", w.token.clone()),
    ]
}

fn run(w: &Warden, args: &[&str]) -> (bool, String, String) {
    let env = env_of(w);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    cli(BIN, args, &env)
}

#[test]
fn apps_create_list_show_rm() {
    let w = Warden::demo(BIN);
    let (ok, out, err) = run(
        &w,
        &[
            "apps",
            "create",
            "hello",
            "--group",
            "staff",
            "--env",
            "GREETING=hi",
            "--",
            BIN,
            "demo-app",
        ],
    );
    assert!(ok, "{err}");
    assert!(out.contains("/apps/hello/"), "{out}");
    let (ok, out, _) = run(&w, &["apps", "list"]);
    assert!(ok);
    assert!(out.starts_with("NAME"), "a table for people: {out}");
    assert!(out.contains("hello") && out.contains("staff"), "{out}");
    let (ok, out, _) = run(&w, &["apps", "list", "--json"]);
    assert!(ok);
    let apps: serde_json::Value = serde_json::from_str(&out).expect("--json prints JSON");
    assert_eq!(apps.as_array().unwrap().len(), 2);
    let (ok, out, _) = run(&w, &["apps", "show", "hello", "--json"]);
    assert!(ok);
    let spec: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(spec["env"]["GREETING"], "hi");
    // The app created from the CLI serves at once.
    assert_eq!(
        w.get_as("alice", &w.password("alice"), "/apps/hello/")
            .status,
        200
    );
    assert!(run(&w, &["apps", "rm", "hello"]).0);
    warden_test_support::wait_until(
        "the removed app's instance to stop",
        std::time::Duration::from_secs(30),
        || {
            let list = w.api("GET", "/v1/instances", None).json();
            (!list.as_array().unwrap().iter().any(|i| i["app"] == "hello")).then_some(())
        },
    );
    let (ok, _, err) = run(&w, &["apps", "show", "hello"]);
    assert!(!ok);
    assert!(
        err.contains("no app named \"hello\"") && err.contains("warden apps list"),
        "{err}"
    );
    let (ok, _, err) = run(
        &w,
        &["apps", "create", "bad", "--env", "NOEQUALS", "--", "x"],
    );
    assert!(!ok && err.contains("KEY=VALUE"), "{err}");
}

#[test]
fn apps_create_takes_driver_lifetime_desired_and_limits() {
    let w = Warden::demo(BIN);
    let (ok, _, err) = run(
        &w,
        &[
            "apps",
            "create",
            "kept",
            "--driver",
            "sandbox",
            "--lifetime",
            "shared",
            "--idle-timeout-ms",
            "0",
            "--max-instances",
            "3",
            "--desired",
            "SECRET=2",
            "--memory-mb",
            "256",
            "--processes",
            "16",
            "--",
            "/bin/true",
        ],
    );
    assert!(ok, "{err}");
    let spec = w.api("GET", "/v1/apps/kept", None).json();
    assert_eq!(spec["driver"], "sandbox");
    assert_eq!(spec["desired"]["SECRET"], 2);
    assert_eq!(spec["max_instances"], 3);
    assert_eq!(spec["idle_timeout_ms"], 0);
    assert_eq!(spec["limits"]["memory_mb"], 256);
    assert_eq!(spec["limits"]["processes"], 16);
    let (ok, _, err) = run(
        &w,
        &["apps", "create", "bad", "--desired", "SECRET", "--", "x"],
    );
    assert!(!ok && err.contains("LABEL=COUNT"), "{err}");
    let (ok, _, err) = run(
        &w,
        &["apps", "create", "bad", "--lifetime", "forever", "--", "x"],
    );
    assert!(!ok && err.contains("forever"), "{err}");
}

#[test]
fn users_add_with_generated_or_piped_passwords() {
    let w = Warden::demo(BIN);
    let (ok, out, err) = run(
        &w,
        &["users", "add", "frank", "--clearance", "SECRET", "--json"],
    );
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let pw = v["password"]
        .as_str()
        .expect("a generated password is shown once");
    assert_eq!(
        w.get_as("frank", pw, "/apps/demo/").json()["label"],
        "SECRET"
    );

    let mut child = std::process::Command::new(BIN)
        .args([
            "users",
            "add",
            "gina",
            "--clearance",
            "RESTRICTED",
            "--password-stdin",
            "--api",
            &w.api,
            "--token",
            &w.token,
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"gina-secret-pass\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("gina-secret-pass"),
        "a piped password is not echoed"
    );
    assert_eq!(
        w.get_as("gina", "gina-secret-pass", "/apps/demo/").status,
        200
    );

    let (ok, out, _) = run(&w, &["users", "list"]);
    assert!(
        ok && out.contains("gina") && out.contains("RESTRICTED"),
        "{out}"
    );
    assert!(run(&w, &["users", "rm", "gina"]).0);
    let (ok, _, err) = run(&w, &["users", "add", "h", "--clearance", "NOPE"]);
    assert!(!ok && err.contains("unknown level"), "{err}");
}

#[test]
fn instances_and_status() {
    let w = Warden::demo(BIN);
    let id = w.get_as("bob", &w.password("bob"), "/apps/demo/").json()["instance"]
        .as_str()
        .unwrap()
        .to_owned();
    let (ok, out, _) = run(&w, &["instances", "list"]);
    assert!(
        ok && out.contains(&id) && out.contains("CONFIDENTIAL"),
        "{out}"
    );
    let (ok, out, _) = run(&w, &["status"]);
    assert!(
        ok && out.contains("nodes: 1") && out.contains("CONFIDENTIAL=1"),
        "{out}"
    );
    // Bob's instance was started by his request, not kept: the status says why it runs.
    assert!(
        out.contains(
            "demo CONFIDENTIAL: 1 of 1 running were started by requests, beside the 0 kept"
        ),
        "{out}"
    );
    assert!(run(&w, &["instances", "kill", &id]).0);
    let (ok, _, err) = run(&w, &["instances", "kill", &id]);
    assert!(!ok && err.contains("no instance"), "{err}");
}

#[test]
fn the_api_and_token_are_found_from_flags_config_or_data_dir() {
    let w = Warden::demo(BIN);
    // Flags.
    assert!(cli(BIN, &["status", "--api", &w.api, "--token", &w.token], &[]).0);
    // The data dir of a local `warden up`.
    assert!(cli(BIN, &["status", "--data-dir", w.dir.to_str().unwrap()], &[]).0);
    // A config file with a token file.
    let cfg = w.dir.join("cli.toml");
    let toml = format!(
        "api = \"{}\"\ntoken_file = \"{}\"\n",
        w.api,
        w.dir.join("admin-token").display()
    );
    std::fs::write(&cfg, toml).unwrap();
    assert!(cli(BIN, &["status", "--config", cfg.to_str().unwrap()], &[]).0);
    // A wrong token is refused with a hint.
    let (ok, _, err) = cli(BIN, &["status", "--api", &w.api, "--token", "nope"], &[]);
    assert!(!ok && err.contains("`warden login`"), "{err}");
    // The token never appears in what the CLI prints.
    let (_, out, err) = cli(
        BIN,
        &["apps", "list", "--api", &w.api, "--token", &w.token],
        &[],
    );
    assert!(!out.contains(&w.token) && !err.contains(&w.token));
}

#[test]
fn errors_say_what_to_do_next() {
    let empty = tempfile::tempdir().unwrap();
    let (ok, _, err) = cli(
        BIN,
        &["status", "--data-dir", empty.path().to_str().unwrap()],
        &[],
    );
    assert!(
        !ok && err.contains("--api") && err.contains("WARDEN_API"),
        "{err}"
    );
    // Nothing listens on port 9 of loopback.
    let (ok, _, err) = cli(
        BIN,
        &["status", "--api", "http://127.0.0.1:9", "--token", "t"],
        &[],
    );
    assert!(!ok && err.contains("is `warden up` running"), "{err}");
    let bad = empty.path().join("bad.toml");
    std::fs::write(&bad, "api = 1\nfoo = 2\n").unwrap();
    let (ok, _, err) = cli(BIN, &["status", "--config", bad.to_str().unwrap()], &[]);
    assert!(!ok && err.contains("bad.toml"), "{err}");
    // A value outside a closed set is refused with the values it could be, before any request.
    let (ok, _, err) = cli(
        BIN,
        &[
            "apps",
            "create",
            "x",
            "--lifetime",
            "forever",
            "--",
            "/bin/true",
        ],
        &[],
    );
    assert!(
        !ok && err.contains("possible values: shared, per_user, per_request"),
        "{err}"
    );
}

/// Client options work before the command too, as with git or kubectl.
#[test]
fn client_options_may_come_before_the_command() {
    let w = Warden::demo(BIN);
    let dir = w.dir.to_str().unwrap();
    let (ok, out, err) = cli(BIN, &["--data-dir", dir, "--json", "apps", "list"], &[]);
    assert!(ok, "{err}");
    let apps: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(apps[0]["name"], "demo");
    let (ok, out, err) = cli(BIN, &["--data-dir", dir, "status"], &[]);
    assert!(ok && out.contains("demo"), "{err}");
}

/// `warden status --json | head`: the reader goes away early, and warden stops quietly.
#[test]
fn a_reader_that_goes_away_early_is_no_crash() {
    use std::process::{Command, Stdio};
    let w = Warden::demo(BIN);
    for _ in 0..20 {
        let r = w.api(
            "POST",
            "/v1/users",
            Some(serde_json::json!({"name": format!("u{}", warden_core::id::short_id()), "password": "a-long-password-1", "clearance": "SECRET"})),
        );
        assert_eq!(r.status, 201, "{}", r.text());
    }
    // A pipe whose reader is gone before warden starts: its first write meets no reader,
    // however the machine schedules the two processes.
    let (reader, writer) = nix::unistd::pipe().unwrap();
    drop(reader);
    let child = Command::new(BIN)
        .args(["users", "list", "--json"])
        .envs(env_of(&w))
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(141), "{err}");
}

#[test]
fn a_platform_without_demo_is_set_up_from_the_cli() {
    let w = warden_test_support::Launch::new(BIN).no_demo().start();
    let (ok, _, err) = run(&w, &["users", "add", "ann", "--clearance", "LOW"]);
    assert!(
        !ok && err.contains("warden lattice set"),
        "the error says what to do first: {err}"
    );
    let (ok, out, err) = run(
        &w,
        &[
            "lattice",
            "set",
            "--levels",
            "LOW,HIGH",
            "--categories",
            "NAVY, ARMY",
        ],
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("LOW < HIGH") && out.contains("NAVY, ARMY"),
        "{out}"
    );
    let (ok, out, _) = run(
        &w,
        &[
            "users",
            "add",
            "ann",
            "--clearance",
            "HIGH:{ARMY,NAVY}",
            "--json",
        ],
    );
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["clearance"], "HIGH:{NAVY,ARMY}",
        "clearances are stored in canonical order"
    );
    let (ok, _, err) = run(&w, &["lattice", "set", "--levels", "ONLY"]);
    assert!(
        !ok && err.contains("ann"),
        "a lattice that strands users is refused: {err}"
    );
    let (ok, out, _) = run(&w, &["lattice", "show", "--json"]);
    assert!(ok && out.contains("HIGH"));
}

/// An API that answers 200 with `body` to every request, on an ephemeral loopback port: what
/// an API of another version looks like to this CLI.
fn answering(body: &'static str) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        // Bounded: the CLI makes one request per command run below.
        for stream in listener.incoming().take(4) {
            let Ok(mut s) = stream else { continue };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    format!("http://{addr}")
}

#[test]
fn an_answer_of_another_shape_is_a_clear_error_naming_the_field() {
    // An app whose name is a number: no version of this API writes that.
    let api = answering(r#"[{"name": 5}]"#);
    let (ok, out, err) = cli(BIN, &["apps", "list", "--api", &api, "--token", "t"], &[]);
    assert!(!ok, "{out}");
    assert!(
        err.contains(&format!(
            "the API at {api} answered something this CLI cannot read"
        )) && err.contains("[0].name")
            && err.contains("same version"),
        "{err}"
    );
}
