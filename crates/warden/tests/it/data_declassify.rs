//! Declassifiers through `warden up` (issue 34, seed 002's certified code path): an admin marks
//! an app `--declassify-to LABEL`; only its instances write rows at that lower label, each
//! such write recorded in `warden.declassified`; `warden data show` reports rows per label.
//! Skipped where PostgreSQL 15 is not installed.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use warden_test_support::http::{basic, Response};
use warden_test_support::{cli, request, wait_until, Launch, Warden};

use crate::data_apps::{admin_sql, postgres_installed, MIGRATION, PASSWORD};
use crate::BIN;

const LOW: &str = "UNCLASSIFIED";
const HIGH: &str = "SECRET";

/// The stats app's script, in a directory instances' uids can read.
pub(crate) fn stats_app() -> tempfile::TempDir {
    let dir = crate::open_dir();
    let script = dir.path().join("stats.py");
    std::fs::write(&script, include_str!("data/stats.py")).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    dir
}

fn as_user(w: &Warden, user: &str, app: &str, query: &str) -> Response {
    request(
        "GET",
        &format!("{}/apps/{app}/{query}", w.gateway),
        &[("authorization", &basic(user, PASSWORD))],
        b"",
    )
}

/// The notes `user` reads in `app`.
fn notes(w: &Warden, user: &str, app: &str) -> Vec<String> {
    let r = as_user(w, user, app, "");
    assert_eq!(r.status, 200, "{}", r.text());
    serde_json::from_value(r.json()["notes"].clone()).unwrap()
}

/// `warden.declassified` of `app`'s database as `table|from|to` lines, read as the admin.
fn declassified(data_dir: &Path, app: &str) -> String {
    admin_sql(
        data_dir,
        &format!("warden_app_{app}"),
        "SELECT d.table_name, f.label, t.label FROM warden.declassified d \
         JOIN warden.labels f ON f.id = d.from_label JOIN warden.labels t ON t.id = d.to_label \
         ORDER BY d.at",
    )
}

#[test]
fn only_a_marked_app_writes_down_and_each_write_is_recorded() {
    if !postgres_installed() {
        return;
    }
    let app_dir = stats_app();
    let (_top, data_dir) = crate::data_apps::data_dir_postgres_reaches();
    let w = Launch::new(BIN)
        .no_demo()
        .with_data()
        .data_dir(&data_dir)
        .start();
    let env = [
        ("WARDEN_API", w.api.as_str()),
        ("WARDEN_TOKEN", w.token.as_str()),
    ];
    let lattice = json!({ "levels": [LOW, HIGH] });
    assert_eq!(w.api("PUT", "/v1/lattice", Some(lattice)).status, 200);
    for (name, clearance) in [("ursula", LOW), ("sam", HIGH)] {
        let user = json!({ "name": name, "password": PASSWORD, "clearance": clearance });
        let r = w.api("POST", "/v1/users", Some(user));
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let script = app_dir.path().join("stats.py").display().to_string();
    let dir = app_dir.path().display().to_string();
    // `stats` is marked at create (the CLI), `plain` is the same code without the mark.
    for (app, mark) in [("stats", Some(LOW)), ("plain", None)] {
        let mut args = vec!["apps", "create", app, "--data", "--driver", "process"];
        args.extend(["--workdir", &dir, "--start-timeout-ms", "30000"]);
        if let Some(label) = mark {
            args.extend(["--declassify-to", label]);
        }
        args.extend(["--", "python3", &script]);
        let (ok, out, err) = cli(BIN, &args, &env);
        assert!(ok, "{out}{err}");
        admin_sql(&data_dir, &format!("warden_app_{app}"), MIGRATION);
    }
    let spec = w.api("GET", "/v1/apps/stats", None).json();
    assert_eq!(spec["declassify_to"], LOW, "{spec}");

    // The declassifier's SECRET instance writes one row at its own label and one below it,
    // which an UNCLASSIFIED user's instance of the same app then reads; the write is recorded.
    for q in ["?add=raw-salaries", "?down=mean-salary"] {
        let r = as_user(&w, "sam", "stats", q);
        assert_eq!(r.status, 200, "{q}: {}", r.text());
    }
    assert_eq!(notes(&w, "ursula", "stats"), ["mean-salary"]);
    assert_eq!(notes(&w, "sam", "stats"), ["raw-salaries", "mean-salary"]);
    assert_eq!(
        declassified(&data_dir, "stats").trim(),
        format!("notes|{HIGH}|{LOW}")
    );

    // The same write from the app without the mark is refused, and nothing reaches UNCLASSIFIED.
    let r = as_user(&w, "sam", "plain", "?down=leak");
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(r.text().contains("not a declassifier"), "{}", r.text());
    assert_eq!(as_user(&w, "sam", "plain", "?add=kept-high").status, 200);
    assert_eq!(notes(&w, "ursula", "plain"), Vec::<String>::new());
    assert_eq!(declassified(&data_dir, "plain").trim(), "");

    non_admins_cannot_mark(&w, &env);
    data_show(&w, &env);
    the_mark_comes_and_goes_with_the_spec(&w, &env, &data_dir);
    the_mark_is_checked(&w, &env);
    an_unreachable_data_server_is_a_503(&w, &env, &data_dir);
}

/// No credential but the admin token sets the mark: a user's session token, a user's
/// password, nothing at all; the CLI with a user's token fails too.
fn non_admins_cannot_mark(w: &Warden, env: &[(&str, &str); 2]) {
    let login = request(
        "POST",
        &format!("{}/login", w.gateway),
        &[("authorization", &basic("sam", PASSWORD))],
        b"",
    );
    assert_eq!(login.status, 200, "{}", login.text());
    let token = login.json()["token"].as_str().unwrap().to_owned();
    let patch = serde_json::to_vec(&json!({ "declassify_to": LOW })).unwrap();
    let bearer = format!("Bearer {token}");
    let sam = basic("sam", PASSWORD);
    for auth in [Some(bearer.as_str()), Some(sam.as_str()), None] {
        let mut headers = vec![("content-type", "application/json")];
        headers.extend(auth.map(|a| ("authorization", a)));
        let r = request(
            "PATCH",
            &format!("{}/v1/apps/plain", w.api),
            &headers,
            &patch,
        );
        assert_eq!(r.status, 401, "{auth:?}: {}", r.text());
    }
    let user_env = [env[0], ("WARDEN_TOKEN", token.as_str())];
    let (ok, _, err) = cli(
        BIN,
        &["apps", "update", "plain", "--declassify-to", LOW],
        &user_env,
    );
    assert!(!ok && err.contains("`warden login`"), "{err}");
    let spec = w.api("GET", "/v1/apps/plain", None).json();
    assert_eq!(spec["declassify_to"], Value::Null, "{spec}");
    let r = as_user(w, "sam", "plain", "?down=leak-again");
    assert_eq!(r.status, 500, "{}", r.text());
}

/// `warden data show` and its route: size, rows per label, the mark, the writes down.
fn data_show(w: &Warden, env: &[(&str, &str); 2]) {
    let shown = w.api("GET", "/v1/apps/stats/data", None);
    assert_eq!(shown.status, 200, "{}", shown.text());
    let shown = shown.json();
    assert!(shown["size_bytes"].as_i64().unwrap() > 0, "{shown}");
    assert_eq!(
        shown["tables"],
        json!([{ "name": "notes", "rows_per_label": { HIGH: 1, LOW: 1 } }])
    );
    assert_eq!(shown["declassify_to"], LOW);
    assert_eq!(shown["declassified_writes"], 1);
    let plain = w.api("GET", "/v1/apps/plain/data", None).json();
    assert_eq!(plain["tables"][0]["rows_per_label"], json!({ HIGH: 1 }));
    assert_eq!(plain["declassified_writes"], 0);
    assert_eq!(plain["declassify_to"], Value::Null);

    let (ok, out, err) = cli(BIN, &["data", "show", "stats"], env);
    assert!(ok, "{err}");
    let lines: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    for row in [["notes", HIGH, "1"], ["notes", LOW, "1"]] {
        assert!(lines.iter().any(|l| l[..] == row[..]), "{row:?} in\n{out}");
    }
    assert!(
        out.contains(&format!("declassifier to {LOW}: 1 rows written down")),
        "{out}"
    );
    let (ok, out, err) = cli(BIN, &["apps", "show", "stats"], env);
    assert!(
        ok && out.contains(&format!("a declassifier to {LOW}")),
        "{out}{err}"
    );
    let (ok, out, err) = cli(BIN, &["data", "show", "stats", "--json"], env);
    assert!(ok, "{err}");
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap(), shown);

    // No such app, and an app without data, say so.
    assert_eq!(w.api("GET", "/v1/apps/nope/data", None).status, 404);
    let r = w.api(
        "POST",
        "/v1/apps",
        Some(json!({ "name": "nodata", "command": ["python3"] })),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let r = w.api("GET", "/v1/apps/nodata/data", None);
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.text().contains("has no data"), "{}", r.text());
    let (ok, out, _) = cli(BIN, &["status"], env);
    assert!(
        ok && out.contains("data lives in: private PostgreSQL under"),
        "{out}"
    );
}

/// An admin marks `plain` with `apps update` and its writes go down; `none` takes it away.
fn the_mark_comes_and_goes_with_the_spec(w: &Warden, env: &[(&str, &str); 2], data_dir: &Path) {
    let set = |to: &str| {
        let (ok, out, err) = cli(
            BIN,
            &["apps", "update", "plain", "--declassify-to", to],
            env,
        );
        assert!(ok, "{out}{err}");
    };
    set(LOW);
    assert_eq!(
        w.api("GET", "/v1/apps/plain", None).json()["declassify_to"],
        LOW
    );
    let r = as_user(w, "sam", "plain", "?down=now-allowed");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(notes(w, "ursula", "plain"), ["now-allowed"]);
    assert_eq!(
        declassified(data_dir, "plain").trim(),
        format!("notes|{HIGH}|{LOW}")
    );
    set("none");
    assert_eq!(
        w.api("GET", "/v1/apps/plain", None).json()["declassify_to"],
        Value::Null
    );
    let r = as_user(w, "sam", "plain", "?down=again");
    assert_eq!(r.status, 500, "{}", r.text());
    assert_eq!(notes(w, "ursula", "plain"), ["now-allowed"]);
}

/// The mark names a label of the lattice, on an app with data.
fn the_mark_is_checked(w: &Warden, env: &[(&str, &str); 2]) {
    let (ok, _, err) = cli(
        BIN,
        &["apps", "update", "plain", "--declassify-to", "TOP SECRET"],
        env,
    );
    assert!(!ok && err.contains("declassify_to"), "{err}");
    let r = w.api(
        "PATCH",
        "/v1/apps/nodata",
        Some(json!({ "declassify_to": LOW })),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("only an app with data"), "{}", r.text());
    let r = w.api(
        "POST",
        "/v1/apps",
        Some(json!({ "name": "nodata2", "command": ["python3"], "declassify_to": LOW })),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(w.api("GET", "/v1/apps/nodata2", None).status, 404);
    assert_eq!(
        w.api("GET", "/v1/apps/plain", None).json()["declassify_to"],
        Value::Null
    );
}

/// With PostgreSQL down, `data show` answers 503 saying what to check. warden starts its
/// private server again after a backoff (at least a second), so each try kills the
/// postmaster and asks at once, inside that window; the backoff grows while it keeps dying.
fn an_unreachable_data_server_is_a_503(w: &Warden, env: &[(&str, &str); 2], data_dir: &Path) {
    let pid_file = data_dir.join("postgres/pgdata/postmaster.pid");
    let postmaster = || -> Option<u32> {
        let pid = std::fs::read_to_string(&pid_file)
            .ok()?
            .lines()
            .next()?
            .parse()
            .ok()?;
        warden_test_support::process_alive(pid).then_some(pid)
    };
    for _ in 0..10 {
        let pid = wait_until("PostgreSQL to run", Duration::from_secs(60), postmaster);
        assert!(std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap()
            .success());
        wait_until("PostgreSQL to die", Duration::from_secs(30), || {
            (!warden_test_support::process_alive(pid)).then_some(())
        });
        let r = w.api("GET", "/v1/apps/stats/data", None);
        let (ok, _, err) = cli(BIN, &["data", "show", "stats"], env);
        if r.status == 200 {
            continue; // started again before the request: try again
        }
        assert_eq!(r.status, 503, "{}", r.text());
        assert!(r.text().contains("data server is up"), "{}", r.text());
        if ok {
            continue;
        }
        assert!(err.contains("cannot read app"), "{err}");
        return;
    }
    panic!("data show never met the data server down in ten tries");
}
