//! Every store record proves itself on every read: bytes changed on disk behind warden's back
//! (a flip that still leaves valid JSON) are never served, `warden store check` names them, and
//! `warden up` proves a file by the same code before it writes to it.

use serde_json::json;
use warden_test_support::{cli, Launch};

use crate::BIN;

/// Replaces every occurrence of `from` in `file` with `to` (same length); how many there were.
fn rewrite_bytes(file: &std::path::Path, from: &[u8], to: &[u8]) -> usize {
    assert_eq!(from.len(), to.len());
    let mut bytes = std::fs::read(file).unwrap();
    let mut n = 0;
    let mut at = 0;
    while let Some(i) = bytes[at..].windows(from.len()).position(|w| w == from) {
        bytes[at + i..at + i + to.len()].copy_from_slice(to);
        at += i + to.len();
        n += 1;
    }
    std::fs::write(file, bytes).unwrap();
    n
}

fn store_check(dir: &std::path::Path) -> (bool, String, String) {
    cli(
        BIN,
        &["store", "check", "--data-dir", dir.to_str().unwrap()],
        &[],
    )
}

#[test]
fn a_record_changed_on_disk_is_never_served_and_store_check_names_it() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut w = Launch::new(BIN).data_dir(dir.path()).no_demo().start();
        let spec = json!({"name": "rot", "command": ["/bin/true"],
            "static_prefix": "/static-rot/", "env": {"MODE": "keep-me"}});
        assert_eq!(w.api("POST", "/v1/apps", Some(spec)).status, 201);
        let spec = json!({"name": "fine", "command": ["/bin/true"]});
        assert_eq!(w.api("POST", "/v1/apps", Some(spec)).status, 201);
        assert!(w.stop().success());
    }
    let (ok, out, err) = store_check(dir.path());
    assert!(ok && out.contains("every checksum matches"), "{out}{err}");
    // One changed byte that leaves valid JSON, as a bit flip on disk would.
    let file = dir.path().join("store.redb");
    assert!(rewrite_bytes(&file, b"/static-rot/", b"/stptic-rot/") > 0);

    let (ok, _, err) = store_check(dir.path());
    assert!(!ok, "store check passed a changed record");
    assert!(err.contains("damaged record apps/rot/spec"), "{err}");
    assert!(err.contains("restore"), "says what to do: {err}");

    let w = Launch::new(BIN).data_dir(dir.path()).no_demo().start();
    let app = w.api("GET", "/v1/apps/rot", None);
    assert!(
        !app.text().contains("stptic"),
        "the changed record was served: {}",
        app.text()
    );
    assert_ne!(app.status, 200, "{}", app.text());
    let apps = w.api("GET", "/v1/apps", None).text();
    assert!(apps.contains("fine") && !apps.contains("stptic"), "{apps}");
    let status = w.api("GET", "/v1/status", None).json();
    let damaged: Vec<&str> = status["damaged"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["key"].as_str().unwrap())
        .collect();
    assert_eq!(damaged, ["apps/rot/spec"], "{status}");
}

/// Writes `value` at `key` of the u64 table `table` of a stopped warden's store, past warden.
fn poke_u64_table(file: &std::path::Path, table: &str, key: u64, value: u64) {
    let db = redb::Database::create(file).unwrap();
    let txn = db.begin_write().unwrap();
    txn.open_table(redb::TableDefinition::<u64, u64>::new(table))
        .unwrap()
        .insert(key, value)
        .unwrap();
    txn.commit().unwrap();
}

#[test]
fn up_refuses_before_writing_a_file_that_store_check_refuses() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut w = Launch::new(BIN).data_dir(dir.path()).no_demo().start();
        let spec = json!({"name": "kept", "command": ["/bin/true"]});
        assert_eq!(w.api("POST", "/v1/apps", Some(spec)).status, 201);
        assert!(w.stop().success());
    }
    let file = dir.path().join("store.redb");
    // Damage only opening the file for writing meets: a lease no clock can hold.
    poke_u64_table(&file, "leases", 77, u64::MAX);
    let (ok, _, check) = store_check(dir.path());
    assert!(!ok, "store check passed a file warden cannot run on");
    assert!(
        check.contains("damaged") && check.contains("lease"),
        "{check}"
    );
    let before = std::fs::read(&file).unwrap();
    let err = crate::store_durability::up_fails_with(dir.path());
    assert!(
        err.contains("store.redb") && err.contains("damaged") && err.contains("restore"),
        "{err}"
    );
    assert!(
        std::fs::read(&file).unwrap() == before,
        "warden up wrote to a store file it then refused"
    );
}

/// Runs warden with `args` as a user the store file does not let in: `nobody` when the tests
/// run as root (root passes every permission), else this user after `chmod 000` of the file.
fn run_locked_out(args: &[&str]) -> (bool, String) {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new(BIN);
    cmd.args(args)
        .env("XDG_CONFIG_HOME", "/nonexistent-warden-test")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    if nix::unistd::geteuid().is_root() {
        cmd.uid(65534).gid(65534);
    }
    let mut child = cmd.spawn().unwrap();
    // A start that gets past the store would serve: bounded, so that is a failure, not a hang.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("warden {args:?} neither failed nor ended");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_store_file_warden_may_not_open_is_reported_as_such_never_as_damage() {
    use std::os::unix::fs::PermissionsExt;
    let top = tempfile::tempdir().unwrap();
    std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let data = top.path().join("data");
    {
        let mut w = Launch::new(BIN).data_dir(&data).no_demo().start();
        assert!(w.stop().success());
    }
    let file = data.join("store.redb");
    if nix::unistd::geteuid().is_root() {
        // The data dir is the service user's; the store file was left root's by a start as
        // root, as `sudo warden up` would.
        let nobody = Some(nix::unistd::Uid::from_raw(65534));
        nix::unistd::chown(&data, nobody, Some(nix::unistd::Gid::from_raw(65534))).unwrap();
    } else {
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o000)).unwrap();
    }
    let before = std::fs::read(&file).unwrap();
    let data_arg = data.to_str().unwrap();
    for args in [
        vec!["store", "check", "--data-dir", data_arg],
        vec![
            "up",
            "--listen",
            "127.0.0.1:0",
            "--api-listen",
            "127.0.0.1:0",
            "--data-dir",
            data_arg,
        ],
    ] {
        let (ok, err) = run_locked_out(&args);
        assert!(!ok, "{args:?} succeeded");
        assert!(
            err.contains("store.redb") && err.contains("may not"),
            "{args:?} does not say access was refused: {err}"
        );
        assert!(
            !err.contains("damaged") && !err.contains("Restore a backup"),
            "{args:?} calls a sound file damaged: {err}"
        );
    }
    assert!(
        std::fs::read(&file).unwrap() == before,
        "the file was changed"
    );
}
