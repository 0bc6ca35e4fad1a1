//! The release phase through `warden up` (issue 34): a push's Procfile `release:` command runs
//! once before its trial, as the app's owner role for an app with data, and the tables it
//! makes are labelled or the release fails naming the table. The app is the stdlib notes app
//! of `data_apps.rs` with psql as its migration tool: nothing is fetched from a registry.
//! Skipped (but the last test) where PostgreSQL 15 is not installed.

use std::path::Path;

use serde_json::{json, Value};
use warden_test_support::http::basic;
use warden_test_support::{cli, request, Launch, Warden};

use crate::data_apps::{admin_sql, postgres_installed};
use crate::BIN;

const PASSWORD: &str = "correct horse battery";

/// The release command: the migration in `migrate.sql`, as the owner, through the socket
/// `DATABASE_URL` names.
const RELEASE: &str =
    "/usr/lib/postgresql/15/bin/psql \"$DATABASE_URL\" -X -q -v ON_ERROR_STOP=1 -f migrate.sql";

/// The notes table as a migration makes it (again: migrations must be idempotent).
const NOTES: &str =
    "CREATE TABLE IF NOT EXISTS notes (id serial PRIMARY KEY, body text NOT NULL);\n";

/// A tree of the notes app whose release command runs `migration`, with `extra` files.
fn tree(migration: &str, release: &str, extra: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let files = [
        ("notes.py", include_str!("data/notes.py")),
        ("migrate.sql", migration),
    ];
    for (name, body) in files.iter().chain(extra) {
        std::fs::write(dir.path().join(name), body).unwrap();
    }
    // A data app's instances (its trial's too) start only with their database named.
    let web = match extra
        .iter()
        .any(|(name, body)| *name == "app.toml" && body.contains("true"))
    {
        true => "test -n \"$DATABASE_URL\" && exec python3 notes.py",
        false => "python3 notes.py",
    };
    let procfile = format!("web: {web}\nrelease: {release}\n");
    std::fs::write(dir.path().join("Procfile"), procfile).unwrap();
    dir
}

/// `warden push APP DIR` through the CLI: whether it succeeded, and everything it printed.
fn push(w: &Warden, app: &str, dir: &Path) -> (bool, String) {
    let env = [
        ("WARDEN_API", w.api.as_str()),
        ("WARDEN_TOKEN", w.token.as_str()),
    ];
    let (ok, out, err) = cli(BIN, &["push", app, &dir.display().to_string()], &env);
    (ok, format!("{out}\n{err}"))
}

/// Whether `text` has `line` as a whole line: what a command printed, not the
/// `-----> release phase: <command>` header that names it before it runs.
fn printed(text: &str, line: &str) -> bool {
    text.lines().any(|l| l.trim_end() == line)
}

fn users(w: &Warden) {
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
}

pub(crate) fn notes_as(w: &Warden, user: &str, query: &str) -> Vec<String> {
    let r = request(
        "GET",
        &format!("{}/apps/notes/{query}", w.gateway),
        &[("authorization", &basic(user, PASSWORD))],
        b"",
    );
    assert_eq!(r.status, 200, "{user} {query}: {}", r.text());
    let v: Value = r.json();
    v["notes"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|n| n.as_str().unwrap().to_owned())
        .collect()
}

fn last_release(w: &Warden, app: &str) -> Value {
    let all = w
        .api("GET", &format!("/v1/apps/{app}/releases"), None)
        .json();
    all.as_array().unwrap().last().unwrap().clone()
}

pub(crate) fn data_warden() -> Warden {
    let w = Launch::new(BIN).no_demo().with_data().start();
    users(&w);
    w
}

/// A data app made by its first push, whose app.toml asks for data: what the push's release
/// command makes is labelled, so each label reads down through it.
pub(crate) fn pushed_notes(w: &Warden) {
    let src = tree(NOTES, RELEASE, &[("app.toml", "data = true\n")]);
    let (ok, out) = push(w, "notes", src.path());
    assert!(ok, "the push failed:\n{out}");
    assert!(out.contains("labelled tables: notes"), "{out}");
    let app = w.api("GET", "/v1/apps/notes", None).json();
    assert_eq!(app["data"], true, "{app}");
}

#[test]
fn a_pushed_migration_makes_a_table_every_label_reads_down_through() {
    if !postgres_installed() {
        return;
    }
    let w = data_warden();
    pushed_notes(&w);
    assert_eq!(notes_as(&w, "ursula", "?add=low"), Vec::<String>::new());
    assert_eq!(notes_as(&w, "sam", "?add=high"), Vec::<String>::new());
    assert_eq!(notes_as(&w, "ursula", ""), ["low"]);
    assert_eq!(notes_as(&w, "sam", ""), ["low", "high"]);
}

#[test]
fn a_migration_that_makes_an_unlabellable_table_fails_naming_it_and_the_app_serves_on() {
    if !postgres_installed() {
        return;
    }
    let w = data_warden();
    pushed_notes(&w);
    assert_eq!(notes_as(&w, "ursula", "?add=low"), Vec::<String>::new());
    // A unique key not scoped by label would let a low writer probe for higher rows.
    let bad = format!("{NOTES}CREATE TABLE accounts (id serial PRIMARY KEY, email text UNIQUE);\n");
    let src = tree(&bad, RELEASE, &[("app.toml", "data = true\n")]);
    let (ok, out) = push(&w, "notes", src.path());
    assert!(!ok, "the push succeeded:\n{out}");
    assert!(out.contains("\"accounts\""), "{out}");
    let failed = last_release(&w, "notes");
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["reason"], "release_failed", "{failed}");
    assert!(
        failed["error"].as_str().unwrap().contains("accounts"),
        "{failed}"
    );
    // Release 1 still serves, to the instance that ran and to one started after the failure
    // (sam's: the unlabelled table does not stop an instance, which cannot reach it).
    let app = w.api("GET", "/v1/apps/notes", None).json();
    assert_eq!(app["release"]["number"], 1, "{app}");
    assert_eq!(notes_as(&w, "ursula", ""), ["low"]);
    assert_eq!(notes_as(&w, "sam", ""), ["low"]);
}

/// A first push's database is made before anything is built; if its release fails, no app
/// owns the database (not even `apps rm` would drop it), so it goes with the release.
#[test]
fn a_first_push_whose_release_fails_leaves_its_app_and_removing_it_leaves_no_database_or_role() {
    if !postgres_installed() {
        return;
    }
    let w = data_warden();
    let broken = format!("{RELEASE} && echo the-migration-broke && exit 1");
    let src = tree(NOTES, &broken, &[("app.toml", "data = true\n")]);
    let (ok, out) = push(&w, "notes", src.path());
    assert!(!ok && printed(&out, "the-migration-broke"), "{out}");
    // The app exists, awaiting a release that works, with the database its push made; it is
    // removed like any app, its database and roles with it.
    let spec = w.api("GET", "/v1/apps/notes", None);
    assert_eq!(spec.status, 200, "{}", spec.text());
    assert_eq!(spec.json()["data"], true, "{}", spec.text());
    assert_eq!(w.api("DELETE", "/v1/apps/notes", None).status, 204);
    let left = admin_sql(
        &w.dir,
        "postgres",
        "SELECT datname FROM pg_database WHERE datname LIKE 'warden\\_app\\_%' \
         UNION ALL SELECT rolname FROM pg_roles WHERE rolname ~ '^w[lo]_'",
    );
    assert_eq!(left, "", "left behind");
    // The name is free for a push that works: its app has a database of its own.
    pushed_notes(&w);
    assert_eq!(notes_as(&w, "sam", "?add=high"), Vec::<String>::new());
    assert_eq!(notes_as(&w, "sam", ""), ["high"]);
}

#[test]
fn a_release_command_that_fails_fails_its_release_with_its_output_and_runs_on_pushes_only() {
    // No data: the release phase is the Procfile's, whatever the app keeps. It has the build
    // time limit.
    let w = Launch::new(BIN)
        .no_demo()
        .arg("--data")
        .arg("none")
        .arg("--build-timeout")
        .arg("3")
        .start();
    users(&w);
    let ran = "echo release-phase-ran";
    let src = tree("", ran, &[]);
    let (ok, out) = push(&w, "plain", src.path());
    assert!(ok && printed(&out, "release-phase-ran"), "{out}");
    // A config change reuses the slug and does not run its release command again.
    let env = [
        ("WARDEN_API", w.api.as_str()),
        ("WARDEN_TOKEN", w.token.as_str()),
    ];
    let (ok, out, err) = cli(BIN, &["config", "set", "plain", "K=v"], &env);
    assert!(ok, "{out}\n{err}");
    assert!(
        !format!("{out}{err}").contains("release-phase-ran"),
        "{out}\n{err}"
    );
    let config = last_release(&w, "plain");
    assert_eq!(config["number"], 2, "{config}");
    assert_eq!(config["release_command"][2], "exec echo release-phase-ran");

    let src = tree("", "echo the-migration-broke; exit 1", &[("v2", "")]);
    let (ok, out) = push(&w, "plain", src.path());
    assert!(!ok, "the push succeeded:\n{out}");
    assert!(printed(&out, "the-migration-broke"), "{out}");
    let failed = last_release(&w, "plain");
    assert_eq!(failed["reason"], "release_failed", "{failed}");
    let error = failed["error"].as_str().unwrap();
    assert!(
        error.contains("exited 1") && error.contains("the-migration-broke"),
        "{failed}"
    );
    let app = w.api("GET", "/v1/apps/plain", None).json();
    assert_eq!(app["release"]["number"], 2, "{app}");

    let src = tree("", "echo waiting-forever; exec sleep 600", &[("v3", "")]);
    let (ok, out) = push(&w, "plain", src.path());
    assert!(!ok && out.contains("waiting-forever"), "{out}");
    let failed = last_release(&w, "plain");
    assert_eq!(failed["reason"], "release_failed", "{failed}");
    let error = failed["error"].as_str().unwrap();
    assert!(error.contains("ran out of its 3 s"), "{failed}");
}

#[test]
fn an_app_toml_that_asks_for_what_cannot_be_is_refused_before_anything_is_built() {
    let w = Launch::new(BIN).no_demo().arg("--data").arg("none").start();
    users(&w);
    let refused = |app: &str, app_toml: &str, want: &str| {
        let src = tree("", "echo release-phase-ran", &[("app.toml", app_toml)]);
        let (ok, out) = push(&w, app, src.path());
        assert!(!ok, "{app_toml:?}: the push succeeded:\n{out}");
        assert!(
            out.contains(want) && out.contains("(HTTP 400)"),
            "{app_toml:?}: {out}"
        );
        assert!(!out.contains("release-phase-ran"), "{out}");
    };
    refused(
        "notes",
        "data = true\ndatabase = \"big\"\n",
        "app.toml: unknown key `database`",
    );
    refused("notes", "data = 1\n", "key `data` must be true or false");
    // No data server: said as `apps create --data` says it, and no app is made.
    refused("notes", "data = true\n", "apt-get install postgresql");
    assert_eq!(w.api("GET", "/v1/apps/notes", None).status, 404);
    // An existing app's data is fixed when it is made.
    let src = tree("", "true", &[("app.toml", "data = false\n")]);
    let (ok, out) = push(&w, "plain", src.path());
    assert!(ok, "{out}");
    refused(
        "plain",
        "data = true\n",
        "an app's data is fixed when it is made",
    );
    assert_eq!(w.api("GET", "/v1/apps/plain", None).json()["data"], false);
}

#[test]
fn a_release_killed_in_its_release_phase_runs_the_phase_again_when_warden_starts_again() {
    use nix::sys::signal::Signal;
    use std::time::Duration;
    use warden_test_support::wait_until;

    let tmp = tempfile::tempdir().unwrap();
    let dir = crate::interrupted::data_dir(&tmp);
    let w = Launch::new(BIN)
        .data_dir(&dir)
        .arg("--data")
        .arg("none")
        .start();
    let src = tree("", "echo phase-ran; sleep 4", &[]);
    let pushing = crate::interrupted::push_in_background(&w, "slow", src.path());
    let log = |w: &Warden| w.api("GET", "/v1/apps/slow/releases/1/log", None).text();
    wait_until("the release phase to run", Duration::from_secs(60), || {
        printed(&log(&w), "phase-ran").then_some(())
    });
    let mut w = w;
    w.signal_and_wait(Signal::SIGKILL);
    let _ = pushing.join();
    let w = Launch::new(BIN)
        .data_dir(&dir)
        .arg("--data")
        .arg("none")
        .start();
    let done = wait_until(
        "the resumed release to finish",
        Duration::from_secs(120),
        || {
            let r = last_release(&w, "slow");
            ["released", "failed"]
                .contains(&r["status"].as_str()?)
                .then_some(r)
        },
    );
    assert_eq!(done["status"], "released", "{done}");
    let text = log(&w);
    assert_eq!(
        text.matches("running the release command").count(),
        2,
        "{text}"
    );
    assert!(
        text.contains("running its release command, if any"),
        "{text}"
    );
}
