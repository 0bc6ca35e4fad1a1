//! Declassifiers' writes in the audit trail (issue 35), through the real binary: a
//! declassifier's SECRET instance writes three rows down to UNCLASSIFIED, and `warden audit
//! --kind declassified --json` says so with the app and the label names, summing to 3 however
//! many periods they fell in, and never counting a row twice: not in later periods, not after
//! a restart. The app's database is first taken back to before the trail read it (its
//! `warden.declassified` without the columns the trail adds), as one made by an older warden.
//! Skipped where PostgreSQL 15 is not installed.

use std::time::Duration;

use serde_json::{json, Value};
use warden_test_support::http::basic;
use warden_test_support::{cli, request, wait_until, Launch, Warden};

use crate::data_apps::{admin_sql, postgres_installed, MIGRATION, PASSWORD};
use crate::BIN;

const LOW: &str = "UNCLASSIFIED";
const HIGH: &str = "SECRET";

/// The rows `stats` wrote down from SECRET to UNCLASSIFIED, as the log's records sum them.
fn recorded(w: &Warden) -> u64 {
    let env = [
        ("WARDEN_API", w.api.as_str()),
        ("WARDEN_TOKEN", w.token.as_str()),
    ];
    let (ok, out, err) = cli(BIN, &["audit", "--kind", "declassified", "--json"], &env);
    assert!(ok, "{err}");
    let records: Vec<Value> = serde_json::from_str(&out).unwrap();
    records
        .iter()
        .map(|r| &r["event"])
        .inspect(|e| assert_eq!((&e["from"], &e["to"]), (&json!(HIGH), &json!(LOW)), "{e}"))
        .filter(|e| e["app"] == "stats")
        .map(|e| e["count"].as_u64().unwrap())
        .sum()
}

fn as_sam(w: &Warden, query: &str) {
    let r = request(
        "GET",
        &format!("{}/apps/stats/{query}", w.gateway),
        &[("authorization", &basic("sam", PASSWORD))],
        b"",
    );
    assert_eq!(r.status, 200, "{query}: {}", r.text());
}

#[test]
fn a_declassifiers_writes_down_are_recorded_once_with_their_labels() {
    if !postgres_installed() {
        return;
    }
    let app_dir = crate::data_declassify::stats_app();
    let (_top, data_dir) = crate::data_apps::data_dir_postgres_reaches();
    let launch = || {
        Launch::new(BIN)
            .no_demo()
            .with_data()
            .data_dir(&data_dir)
            .arg("--audit-flush-ms")
            .arg("300")
            .start()
    };
    let mut w = launch();
    let env = [
        ("WARDEN_API", w.api.as_str()),
        ("WARDEN_TOKEN", w.token.as_str()),
    ];
    let lattice = json!({ "levels": [LOW, HIGH] });
    assert_eq!(w.api("PUT", "/v1/lattice", Some(lattice)).status, 200);
    let sam = json!({ "name": "sam", "password": PASSWORD, "clearance": HIGH });
    assert_eq!(w.api("POST", "/v1/users", Some(sam)).status, 201);
    let script = app_dir.path().join("stats.py").display().to_string();
    let dir = app_dir.path().display().to_string();
    let args = [
        "apps",
        "create",
        "stats",
        "--data",
        "--driver",
        "process",
        "--workdir",
        &dir,
        "--start-timeout-ms",
        "30000",
        "--declassify-to",
        LOW,
        "--",
        "python3",
        &script,
    ];
    let (ok, out, err) = cli(BIN, &args, &env);
    assert!(ok, "{out}{err}");
    let db = "warden_app_stats";
    admin_sql(&data_dir, db, MIGRATION);
    // As an older warden left it: the trail adds these columns before its first read.
    admin_sql(
        &data_dir,
        db,
        "ALTER TABLE warden.declassified DROP COLUMN audited, DROP COLUMN id",
    );

    as_sam(&w, "?add=raw-salaries");
    for body in ["mean", "median", "max"] {
        as_sam(&w, &format!("?down={body}"));
    }
    wait_until(
        "3 declassified rows recorded",
        Duration::from_secs(30),
        || (recorded(&w) >= 3).then_some(()),
    );
    // A few more periods: nothing is recorded twice.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(recorded(&w), 3);

    // Marked recorded in the database, so a restart does not record them again.
    w.stop();
    let w = launch();
    as_sam(&w, "?down=min");
    wait_until("the 4th declassified row", Duration::from_secs(30), || {
        (recorded(&w) >= 4).then_some(())
    });
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(recorded(&w), 4);
}
