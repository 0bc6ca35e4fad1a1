//! What one instance may do to its label's role, through `warden up`: a role may change its
//! own password (PostgreSQL lets every role), and no other instance of its label is locked
//! out by it: the data socket sets warden's password again when PostgreSQL refuses it.
//! Skipped where PostgreSQL 15 is not installed. See `data_attacks.rs` for the [`Vault`].

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::json;
use warden_test_support::wait_until;

use crate::data_apps::{admin_sql, PSQL};
use crate::data_attacks::Vault;

/// psql through the data socket in `dir`, as the instance's own process would reach it (the
/// socket decides the role and database): its output, or its error.
fn psql(dir: &Path, sql: &str) -> Result<String, String> {
    let out = Command::new(PSQL)
        .args(["-X", "-At", "-v", "ON_ERROR_STOP=1", "-h"])
        .arg(dir)
        .args(["-d", "warden_app_vault", "-c", sql])
        .output()
        .unwrap();
    match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

#[test]
fn an_instance_that_changes_its_roles_password_locks_out_no_other_instance_of_its_label() {
    let Some(v) = Vault::start("process") else {
        return;
    };
    let r = v.w.api(
        "PATCH",
        "/v1/apps/vault",
        Some(json!({ "desired": { "U": 2 } })),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let ids = wait_until("two vault instances at U", Duration::from_secs(60), || {
        let ids: Vec<String> =
            v.w.instances()
                .iter()
                .filter(|i| i["app"] == "vault" && i["label"] == "U" && i["state"] == "ready")
                .map(|i| i["id"].as_str().unwrap().to_owned())
                .collect();
        (ids.len() == 2).then_some(ids)
    });
    let socket = |id: &str| v.data_dir.join("instances").join(id).join("pg");
    psql(&socket(&ids[0]), "ALTER ROLE CURRENT_USER PASSWORD 'mine'")
        .unwrap_or_else(|e| panic!("PostgreSQL lets a role change its own password: {e}"));
    // No pooled connection left to reuse: the next client logs in afresh.
    let ended = admin_sql(
        &v.data_dir,
        "postgres",
        "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity \
         WHERE usename LIKE 'wl\\_%'",
    );
    assert!(ended.lines().any(|l| l == "t"), "{ended}");
    let seen = psql(&socket(&ids[1]), "SELECT count(*) FROM notes")
        .unwrap_or_else(|e| panic!("the other instance at U can no longer log in: {e}"));
    assert_eq!(seen, "0\n");
    // And the one that changed it logs in with warden's password too.
    assert_eq!(
        psql(&socket(&ids[0]), "SELECT count(*) FROM notes").as_deref(),
        Ok("0\n")
    );
}
