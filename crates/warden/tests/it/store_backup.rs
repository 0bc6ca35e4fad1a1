//! Backups prove themselves: a damaged or edited backup is refused before anything is written,
//! unless the operator forces it (loudly), and even then every record must decode and match its
//! key; a backup restores into another data dir given its key.

use base64::Engine;
use warden_store::backup::Backup;
use warden_test_support::{cli, Launch};

use crate::BIN;

/// A demo warden's data dir, stopped, and a backup of it taken while it ran.
fn backed_up() -> (tempfile::TempDir, std::path::PathBuf, Backup) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let file = dir.path().join("warden.backup");
    let mut w = Launch::new(BIN).data_dir(&data).start();
    let env = [
        ("WARDEN_API", w.api.as_str()),
        ("WARDEN_TOKEN", w.token.as_str()),
    ];
    let (ok, _, err) = cli(BIN, &["store", "backup", file.to_str().unwrap()], &env);
    assert!(ok, "{err}");
    assert!(w.stop().success());
    let backup: Backup = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    (dir, data, backup)
}

fn value(b: &Backup, key: &str) -> String {
    let r = b.records.iter().find(|r| r.key == key).unwrap();
    String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(&r.value)
            .unwrap(),
    )
    .unwrap()
}

fn set_value(b: &mut Backup, key: &str, v: &str) {
    let r = b.records.iter_mut().find(|r| r.key == key).unwrap();
    r.value = base64::engine::general_purpose::STANDARD.encode(v);
}

/// Restores `b` into `data` with `extra` arguments; (success, stdout, stderr).
fn restore(
    dir: &std::path::Path,
    data: &std::path::Path,
    b: &Backup,
    extra: &[&str],
) -> (bool, String, String) {
    let file = dir.join("edited.backup");
    std::fs::write(&file, serde_json::to_vec(b).unwrap()).unwrap();
    let mut args = vec![
        "store",
        "restore",
        file.to_str().unwrap(),
        "--data-dir",
        data.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    cli(BIN, &args, &[])
}

#[test]
fn a_damaged_or_edited_backup_is_refused_and_writes_nothing() {
    let (dir, data, backup) = backed_up();
    let store = std::fs::read(data.join("store.redb")).unwrap();
    let refused = |b: &Backup, extra: &[&str], says: &str, case: &str| {
        let (ok, out, err) = restore(dir.path(), &data, b, extra);
        assert!(!ok, "{case}: restored: {out}");
        assert!(err.contains(says), "{case}: {err}");
        assert!(
            std::fs::read(data.join("store.redb")).unwrap() == store,
            "{case}: the store was changed"
        );
    };
    // One changed character: alice's record no longer decodes.
    let mut b = backup.clone();
    let alice = value(&b, "users/alice");
    set_value(
        &mut b,
        "users/alice",
        &alice.replacen("\"name\"", "\"nbme\"", 1),
    );
    refused(&b, &[], "do not match its digest", "a changed character");
    // Forced, it still does not decode: never restored.
    refused(
        &b,
        &["--force"],
        "users/alice",
        "a forced undecodable record",
    );

    // A clearance raised, the digest made again: only the key's MAC tells.
    let mut b = backup.clone();
    let carol = value(&b, "users/carol");
    assert!(alice.contains("\"SECRET\""), "{alice}");
    set_value(
        &mut b,
        "users/alice",
        &alice.replace("\"SECRET\"", "\"TOP SECRET\""),
    );
    b.digest = Some(b.compute_digest());
    refused(&b, &[], "MAC does not match", "a raised clearance");

    // Half the records dropped.
    let mut b = backup.clone();
    b.records.truncate(b.records.len() / 2);
    refused(
        &b,
        &[],
        "do not match its digest",
        "half the records dropped",
    );

    // A record under another's key, even forced.
    let mut b = backup.clone();
    set_value(&mut b, "users/bob", &carol);
    refused(&b, &["--force"], "users/bob", "a record under another key");

    // No seal at all.
    let mut b = backup.clone();
    b.digest = None;
    b.mac = None;
    refused(&b, &[], "no digest", "an unsealed backup");

    // Forcing is possible, and never silent.
    let mut b = backup.clone();
    b.records.retain(|r| r.key != "users/dave");
    let (ok, _, err) = restore(dir.path(), &data, &b, &["--force"]);
    assert!(ok, "{err}");
    assert!(err.contains("WARNING") && err.contains("digest"), "{err}");

    // The backup as taken restores.
    let (ok, out, err) = restore(dir.path(), &data, &backup, &[]);
    assert!(ok, "{err}");
    assert!(out.contains("restored"), "{out}");
}

#[test]
fn a_backup_restores_into_another_data_dir_given_its_key() {
    let (dir, data, backup) = backed_up();
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let (ok, _, err) = restore(dir.path(), &other, &backup, &[]);
    assert!(!ok && err.contains("--key"), "{err}");
    let key = data.join("backup-key");
    let (ok, _, err) = restore(
        dir.path(),
        &other,
        &backup,
        &["--key", key.to_str().unwrap()],
    );
    assert!(ok, "{err}");
    assert_eq!(
        std::fs::read(other.join("backup-key")).unwrap(),
        std::fs::read(&key).unwrap(),
        "the restored warden seals its backups under the same key"
    );
    let w = Launch::new(BIN).data_dir(&other).no_demo().start();
    let users: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data.join("demo-users.json")).unwrap())
            .unwrap();
    let alice = users
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == "alice")
        .unwrap()["password"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = w.get_as("alice", &alice, "/apps/demo/");
    assert_eq!(r.status, 200, "alice is back: {}", r.text());
}

#[test]
fn a_restore_into_a_data_dir_that_does_not_exist_is_refused_and_creates_nothing() {
    let (dir, data, backup) = backed_up();
    let typo = dir.path().join("dta");
    let key = data.join("backup-key");
    let (ok, out, err) = restore(
        dir.path(),
        &typo,
        &backup,
        &["--key", key.to_str().unwrap()],
    );
    assert!(!ok, "restored into a data dir that did not exist: {out}");
    assert!(
        err.contains("does not exist") && err.contains("mkdir"),
        "{err}"
    );
    assert!(!typo.exists(), "the mistyped data dir was created");
}
