//! Labelled data through `warden up` (issue 34): an app with `--data` gets a database on the
//! private PostgreSQL, each instance reaches it through a socket logged in as its label's role,
//! and rows are read down, never across or up. Skipped where PostgreSQL 15 is not installed.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use std::time::Duration;
use warden_test_support::http::basic;

use warden_test_support::{request, wait_until, Launch, Warden};

use crate::BIN;

pub(crate) const PSQL: &str = "/usr/lib/postgresql/15/bin/psql";
pub(crate) const PASSWORD: &str = "correct horse battery";

pub(crate) fn postgres_installed() -> bool {
    let there =
        Path::new("/usr/lib/postgresql/15/bin/postgres").exists() && Path::new(PSQL).exists();
    if !there {
        eprintln!("skipped: PostgreSQL 15's server programs are not installed");
    }
    there
}

/// A scratch directory the `postgres` user can enter (0711: warden runs the private server as
/// that user, which must traverse every parent of the data dir), and the data dir under it.
/// Keep the directory for as long as the warden runs.
pub(crate) fn data_dir_postgres_reaches() -> (tempfile::TempDir, PathBuf) {
    let top = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        top.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o711),
    )
    .unwrap();
    let data_dir = top.path().join("data");
    (top, data_dir)
}

/// The notes app's script, in a directory instances' uids can read.
pub(crate) fn notes_app() -> tempfile::TempDir {
    let dir = crate::open_dir();
    let script = dir.path().join("notes.py");
    std::fs::write(&script, include_str!("data/notes.py")).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    dir
}

/// Runs `sql` in database `db` as warden's admin (peer authentication: warden's own OS
/// user, which the test is), as an operator with psql would.
pub(crate) fn admin_sql(data_dir: &Path, db: &str, sql: &str) -> String {
    let socket: PathBuf = data_dir.join("postgres").join("run");
    let out = Command::new(PSQL)
        .args(["-X", "-At", "-v", "ON_ERROR_STOP=1", "-h"])
        .arg(&socket)
        .args(["-U", "warden_admin", "-d", db, "-c", sql])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The app's `notes` table, owned by its owner role, as a release migration would make it.
pub(crate) const MIGRATION: &str = "DO $$ DECLARE o text; BEGIN \
    SELECT rolname INTO o FROM pg_roles WHERE rolname LIKE 'wo\\_%' \
      AND has_database_privilege(rolname, current_database(), 'CONNECT'); \
    CREATE TABLE IF NOT EXISTS public.notes (id serial PRIMARY KEY, body text NOT NULL); \
    EXECUTE format('ALTER TABLE public.notes OWNER TO %I', o); END $$;";

fn as_user(w: &Warden, user: &str, path: &str) -> Value {
    let r = request(
        "GET",
        &format!("{}/apps/notes/{path}", w.gateway),
        &[("authorization", &basic(user, PASSWORD))],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn setup(w: &Warden, app_dir: &Path, driver: &str) {
    let lattice = json!({ "levels": ["U", "S"] });
    assert_eq!(w.api("PUT", "/v1/lattice", Some(lattice)).status, 200);
    for (name, clearance) in [("ursula", "U"), ("sam", "S")] {
        let r = w.api(
            "POST",
            "/v1/users",
            Some(json!({ "name": name, "password": PASSWORD, "clearance": clearance })),
        );
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let spec = json!({
        "name": "notes",
        "command": ["python3", app_dir.join("notes.py")],
        "workdir": app_dir,
        "driver": driver,
        "data": true,
        "start_timeout_ms": 30000,
    });
    let r = w.api("POST", "/v1/apps", Some(spec));
    assert_eq!(r.status, 201, "{}", r.text());
}

/// `pid` and its descendants.
fn tree(pid: u32) -> Vec<u32> {
    let parent_of = |p: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        // The fields after the command name, which is in parentheses and may hold spaces.
        let rest = &stat[stat.rfind(')')? + 2..];
        rest.split(' ').nth(1)?.parse().ok()
    };
    let all: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    let mut found = vec![pid];
    loop {
        let more: Vec<u32> = all
            .iter()
            .copied()
            .filter(|p| !found.contains(p) && parent_of(*p).is_some_and(|pp| found.contains(&pp)))
            .collect();
        if more.is_empty() {
            return found;
        }
        found.extend(more);
    }
}

pub(crate) fn notes(v: &Value) -> Vec<String> {
    v["notes"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|n| n.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn a_data_app_reads_down_and_keeps_its_rows_across_restarts() {
    notes_through("process");
}

#[test]
fn a_sandboxed_data_app_reads_down_and_keeps_its_rows_across_restarts() {
    notes_through("sandbox");
}

fn notes_through(driver: &str) {
    if !postgres_installed() {
        return;
    }
    let app_dir = notes_app();
    let (_top, data_dir) = data_dir_postgres_reaches();
    let mut w = Launch::new(BIN)
        .no_demo()
        .with_data()
        .data_dir(&data_dir)
        .start();
    assert!(
        w.stdout().contains("data lives in private PostgreSQL"),
        "{}",
        w.stdout()
    );
    let status = w.api("GET", "/v1/status", None).json();
    let data = status["data"]
        .as_str()
        .unwrap_or_else(|| panic!("{status}"));
    assert!(data.starts_with("private PostgreSQL under "), "{data}");
    setup(&w, app_dir.path(), driver);
    admin_sql(&data_dir, "warden_app_notes", MIGRATION);
    // A patch neither takes the data away nor starts its instances ahead of their label.
    for patch in [
        json!({ "data": false }),
        json!({ "start": "warm", "warm": { "U": 1 } }),
    ] {
        let r = w.api("PATCH", "/v1/apps/notes", Some(patch.clone()));
        assert_eq!(r.status, 400, "{patch}: {}", r.text());
    }

    assert_eq!(
        notes(&as_user(&w, "ursula", "?add=low-note")),
        Vec::<String>::new()
    );
    assert_eq!(
        notes(&as_user(&w, "sam", "?add=high-note")),
        Vec::<String>::new()
    );
    assert_eq!(notes(&as_user(&w, "ursula", "")), vec!["low-note"]);
    assert_eq!(
        notes(&as_user(&w, "sam", "")),
        vec!["low-note", "high-note"]
    );

    // The instance holds no password: the socket is its credential.
    let env = as_user(&w, "sam", "env");
    let url = env["DATABASE_URL"].as_str().unwrap();
    assert!(
        url.starts_with("postgresql:///warden_app_notes?host=/"),
        "{url}"
    );
    assert!(!url.contains('@') && !url.contains("password"), "{url}");
    // A sandbox sees its private directory at /data, the socket's directory inside it.
    assert_eq!(
        driver == "sandbox",
        url.ends_with("?host=/data/.pg"),
        "{url}"
    );
    assert_eq!(env["PGPASSWORD"], Value::Null);
    let key = std::fs::read_to_string(data_dir.join("data-key")).unwrap();
    for i in w.instances() {
        // The instance's process and everything under it (a sandbox's init runs the app).
        let environs: Vec<String> = tree(i["pid"].as_u64().unwrap() as u32)
            .into_iter()
            .map(|pid| std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default())
            .map(|e| String::from_utf8_lossy(&e).into_owned())
            .collect();
        assert!(
            environs.iter().any(|e| e.contains("DATABASE_URL=")),
            "{environs:?}"
        );
        for e in &environs {
            assert!(!e.contains("PGPASSWORD") && !e.contains(key.trim()), "{e}");
        }
    }

    // A lattice change re-ranks the labels in the database: with C between U and S, S (now
    // rank 2) still reads a C row, and C no longer reads S's rows (both were rank 1 before).
    let lattice = json!({ "levels": ["U", "C", "S"] });
    assert_eq!(w.api("PUT", "/v1/lattice", Some(lattice)).status, 200);
    let r = w.api(
        "POST",
        "/v1/users",
        Some(json!({ "name": "cora", "password": PASSWORD, "clearance": "C" })),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    wait_until(
        "the lattice to reach the database",
        Duration::from_secs(30),
        || (notes(&as_user(&w, "cora", "")) == vec!["low-note"]).then_some(()),
    );
    as_user(&w, "cora", "?add=mid-note");
    assert_eq!(
        notes(&as_user(&w, "sam", "")),
        vec!["low-note", "high-note", "mid-note"]
    );
    assert_eq!(notes(&as_user(&w, "ursula", "")), vec!["low-note"]);

    // A taint would raise ursula's instance to S while its connections stay logged in at U
    // (they could write down): the instance is stopped instead, and her next request gets a
    // new one at U.
    let ids_at = |w: &Warden, label: &str| -> Vec<String> {
        w.instances()
            .iter()
            .filter(|i| i["app"] == "notes" && i["label"] == label)
            .map(|i| i["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let before = ids_at(&w, "U");
    assert_eq!(before.len(), 1, "{before:?}");
    as_user(&w, "ursula", "taint");
    wait_until(
        "the tainted data instance to stop",
        Duration::from_secs(30),
        || {
            let all: Vec<Value> = w.instances();
            (!all.iter().any(|i| i["id"] == before[0].as_str())).then_some(())
        },
    );
    assert_eq!(notes(&as_user(&w, "ursula", "")), vec!["low-note"]);
    assert!(!ids_at(&w, "U").contains(&before[0]));

    // A second `warden up` on the data dir brings the private PostgreSQL back, rows and all.
    w.stop();
    let w = Launch::new(BIN)
        .no_demo()
        .with_data()
        .data_dir(&data_dir)
        .start();
    assert_eq!(
        notes(&as_user(&w, "sam", "")),
        vec!["low-note", "high-note", "mid-note"]
    );
    assert_eq!(notes(&as_user(&w, "ursula", "")), vec!["low-note"]);

    // `apps rm` drops the database: a later app of the name starts empty.
    assert_eq!(w.api("DELETE", "/v1/apps/notes", None).status, 204);
    let dbs = admin_sql(&data_dir, "postgres", "SELECT datname FROM pg_database");
    assert!(
        dbs.contains("template1") && !dbs.contains("warden_app_notes"),
        "{dbs}"
    );
}

#[test]
fn an_app_asking_for_data_without_a_data_server_is_refused_with_the_way_to_get_one() {
    // `--data none`: no data server, as on a node without PostgreSQL.
    let w = Launch::new(BIN).no_demo().arg("--data").arg("none").start();
    assert!(w.stdout().contains("data lives in none"), "{}", w.stdout());
    let r = w.api(
        "POST",
        "/v1/apps",
        Some(json!({ "name": "notes", "command": ["python3"], "data": true })),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let text = r.text();
    assert!(
        text.contains("apt-get install postgresql") && text.contains("--data"),
        "{text}"
    );
    assert_eq!(w.api("GET", "/v1/apps/notes", None).status, 404);
    assert_eq!(w.api("GET", "/v1/status", None).json()["data"], Value::Null);
    // Nor can a patch give an existing app data it has no database for.
    let r = w.api(
        "POST",
        "/v1/apps",
        Some(json!({ "name": "plain", "command": ["python3"] })),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let r = w.api("PATCH", "/v1/apps/plain", Some(json!({ "data": true })));
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text().contains("chosen when it is created"),
        "{}",
        r.text()
    );
    assert_eq!(w.api("GET", "/v1/apps/plain", None).json()["data"], false);
    // The CLI says the same.
    let env = [
        ("WARDEN_API", w.api.as_str()),
        ("WARDEN_TOKEN", w.token.as_str()),
    ];
    let (ok, _, err) = warden_test_support::cli(
        BIN,
        &["apps", "create", "notes", "--data", "--", "python3"],
        &env,
    );
    assert!(!ok && err.contains("apt-get install postgresql"), "{err}");
}
