//! The audit trail through the binary (issue 35): a change through the API is recorded with its
//! actor, route and target before it is acted on, `warden audit verify` passes on the untouched
//! log, and after a line of the log is edited on disk (warden stopped, then started) it fails
//! naming that file and line. A full disk is an alarm in `/readyz` and `warden status` while
//! warden serves on, and the records it cost are a gap once space is back.

use std::path::Path;

use warden_test_support::{cli, Launch, Warden};

use sha2::Digest as _;

use crate::BIN;

fn run(w: &Warden, args: &[&str]) -> (bool, String, String) {
    let env = [
        ("WARDEN_API", w.api.as_str()),
        ("WARDEN_TOKEN", w.token.as_str()),
    ];
    cli(BIN, args, &env)
}

/// The change records of the log, through `warden audit --kind change --json`.
fn changes(w: &Warden) -> Vec<serde_json::Value> {
    let (ok, out, err) = run(w, &["audit", "--kind", "change", "--json"]);
    assert!(ok, "{err}");
    serde_json::from_str(&out).expect("--json prints JSON")
}

fn create_app(w: &Warden, name: &str) {
    let (ok, _, err) = run(w, &["apps", "create", name, "--", BIN, "demo-app"]);
    assert!(ok, "{err}");
}

/// The only segment of the log in `dir`.
fn segment(dir: &Path) -> std::path::PathBuf {
    let mut segs: Vec<_> = std::fs::read_dir(dir.join("audit"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    assert_eq!(segs.len(), 1, "{segs:?}");
    segs.pop().unwrap()
}

#[test]
fn an_api_change_is_recorded_with_its_actor_route_and_target_and_the_log_verifies() {
    let w = Launch::new(BIN).no_demo().start();
    create_app(&w, "audited");
    let found: Vec<_> = changes(&w)
        .into_iter()
        .filter(|r| r["event"]["target"] == "audited")
        .collect();
    let outcomes: Vec<&str> = found
        .iter()
        .map(|r| r["event"]["outcome"].as_str().unwrap_or(""))
        .collect();
    // Recorded before the handler acted, then with its status.
    assert_eq!(outcomes, ["pending", "201"], "{found:#?}");
    for r in &found {
        let e = &r["event"];
        assert_eq!(e["actor"], "admin token", "{r}");
        assert_eq!(
            (e["method"].as_str(), e["route"].as_str()),
            (Some("POST"), Some("/v1/apps"))
        );
        // The body as a digest, never as itself.
        assert_eq!(e["after"].as_str().map(str::len), Some(64), "{r}");
    }
    // Keyed: a body of known shape (a new user's password, a config value) cannot be guessed
    // offline against a plain SHA-256 of it.
    let body = serde_json::json!({"name": "keyed", "command": ["/bin/true"]});
    assert_eq!(w.api("POST", "/v1/apps", Some(body.clone())).status, 201);
    let plain = sha2::Sha256::digest(body.to_string().as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>();
    let keyed = changes(&w)
        .into_iter()
        .find(|r| r["event"]["target"] == "keyed")
        .expect("the change is recorded");
    let after = keyed["event"]["after"].as_str().unwrap_or("");
    assert_eq!(after.len(), 64, "{keyed}");
    assert_ne!(
        after, plain,
        "the body's digest is a plain SHA-256: {keyed}"
    );
    let log = std::fs::read_to_string(segment(&w.dir)).unwrap();
    assert!(
        !log.contains("demo-app"),
        "a request body reached the log:\n{log}"
    );
    let (ok, out, err) = run(&w, &["audit", "verify"]);
    assert!(ok, "verify fails on an untouched log: {out}{err}");
    assert!(out.contains("is whole"), "{out}");
    let (ok, out, _) = run(&w, &["status"]);
    assert!(ok && out.contains("audit log: ok"), "{out}");
}

#[test]
fn a_line_edited_on_disk_while_warden_is_stopped_fails_verify_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Launch::new(BIN).data_dir(dir.path()).no_demo().start();
    create_app(&w, "audited");
    let (ok, _, err) = run(&w, &["audit", "verify"]);
    assert!(ok, "{err}");
    w.stop();
    let data_dir = dir.path().to_string_lossy().into_owned();
    let (ok, out, err) = cli(
        BIN,
        &["audit", "verify", "--stopped", "--data-dir", &data_dir],
        &[],
    );
    assert!(ok && out.contains("is whole"), "{out}{err}");
    let seg = segment(dir.path());
    let text = std::fs::read_to_string(&seg).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let at = lines
        .iter()
        .position(|l| l.contains("\"outcome\":\"201\"") && l.contains("\"audited\""))
        .expect("the change's outcome is in the log");
    // Someone hides who changed what: the record stays, its words change.
    lines[at] = lines[at].replace("\"audited\"", "\"innocent\"");
    std::fs::write(&seg, lines.join("\n") + "\n").unwrap();
    let file = seg.file_name().unwrap().to_string_lossy().into_owned();
    let spot = format!("edited at {file} line {}", at + 1);
    // Read from the stopped warden's data dir: its files and its store.
    let data_dir = dir.path().to_string_lossy().into_owned();
    let (ok, out, err) = cli(
        BIN,
        &["audit", "verify", "--stopped", "--data-dir", &data_dir],
        &[],
    );
    assert!(!ok, "verify --stopped passes on an edited log: {out}");
    assert!(
        err.contains(&spot),
        "verify --stopped must name {spot:?}: {err}"
    );

    let w = Launch::new(BIN).data_dir(dir.path()).no_demo().start();
    let (ok, out, err) = run(&w, &["audit", "verify"]);
    assert!(!ok, "verify passes on an edited log: {out}");
    assert!(err.contains(&spot), "verify must name {spot:?}: {err}");
    let all = w.api("GET", "/v1/audit/verify", None).json();
    let v = &all[0];
    assert_eq!(v["ok"], false, "{all}");
    assert_eq!(v["problem"]["line"], at as u64 + 1, "{all}");
}

#[test]
fn a_full_disk_is_an_alarm_and_what_it_cost_is_a_gap_once_space_is_back() {
    let Some(disk) = crate::store_durability::SmallDisk::mount(16) else {
        eprintln!(
            "needs root to mount a small tmpfs; the audit log on a full disk is not exercised"
        );
        return;
    };
    let w = Launch::new(BIN)
        .data_dir(disk.path().join("data"))
        .no_demo()
        .start();
    create_app(&w, "before");
    let filler = disk.fill();
    let big = |name: &str| serde_json::json!({"name": name, "command": ["/bin/true"], "env": {"PAD": "x".repeat(16 * 1024)}});
    // Until the store is full too: the audit log's writes failed before.
    for i in 0..2000 {
        if w.api("POST", "/v1/apps", Some(big(&format!("during{i}"))))
            .status
            != 201
        {
            break;
        }
    }
    // Each refused request is still recorded (pending, then its status): the log's last page
    // fills, then its writes fail too.
    let mut ready = serde_json::Value::Null;
    for i in 0..200 {
        ready = w.api("GET", "/readyz", None).json();
        if ready.get("audit").is_some() {
            break;
        }
        w.api("POST", "/v1/apps", Some(big(&format!("refused{i}"))));
    }
    let alarm = ready["audit"].as_str().unwrap_or_default().to_owned();
    assert!(
        alarm.contains("cannot write"),
        "no audit alarm in /readyz: {ready}"
    );
    let metrics =
        warden_test_support::request("GET", &format!("{}/metrics", w.api), &[], b"").text();
    assert!(metrics.contains("warden_audit_writing 0"), "{metrics}");
    let (_, out, _) = run(&w, &["status"]);
    assert!(
        out.contains("audit log: the audit log cannot write")
            || out.contains("audit log: cannot write"),
        "{out}"
    );

    std::fs::remove_file(filler).unwrap();
    warden_test_support::wait_until(
        "the store to take writes again",
        std::time::Duration::from_secs(60),
        || {
            (w.api(
                "POST",
                "/v1/apps",
                Some(serde_json::json!({"name": "after", "command": ["/bin/true"]})),
            )
            .status
                == 201)
                .then_some(())
        },
    );
    let (ok, out, err) = run(&w, &["audit", "--kind", "gap", "--json"]);
    assert!(ok, "{err}");
    let gaps: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    assert!(
        gaps.iter().any(|g| g["event"]["why"]
            .as_str()
            .unwrap_or("")
            .contains("cannot write")
            && g["event"]["lost"].as_u64().unwrap_or(0) > 0),
        "no gap counts what the full disk cost: {gaps:#?}"
    );
    assert!(
        w.api("GET", "/readyz", None).json().get("audit").is_none(),
        "the alarm stays"
    );
    // Failed writes were cut back: the chain is whole.
    let (ok, out, err) = run(&w, &["audit", "verify"]);
    assert!(ok, "{out}{err}");
}
