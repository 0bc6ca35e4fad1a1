//! Labelled data as a new user meets it (issue 34's end-to-end test): a Flask app with
//! SQLAlchemy and psycopg2 from PyPI, pushed with `warden push`, asking for data in its
//! `app.toml` and making its table in the Procfile's `release:` phase. It knows nothing of
//! labels, yet users at four labels (over levels and a category) each see exactly the notes
//! their clearance dominates, a declassifier writes down only once marked, `per_user`
//! instances see only their user's, a lattice change
//! re-ranks what exists, and PostgreSQL killed under it comes back by itself.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use warden_test_support::http::{basic, request};
use warden_test_support::{cli, wait_until, Launch, Warden};

use crate::data_apps::postgres_installed;
use crate::deploy::fixture;
use crate::BIN;

const PASSWORD: &str = "correct horse battery";

fn push(w: &Warden, app: &str, dir: &Path) -> String {
    let (d, data) = (dir.display().to_string(), w.dir.display().to_string());
    let (ok, out, err) = cli(BIN, &["push", app, &d, "--data-dir", &data], &[]);
    assert!(ok, "push of {app} failed:\n{out}\n{err}");
    out + &err
}

fn add_user(w: &Warden, name: &str, clearance: &str) {
    let user = json!({ "name": name, "password": PASSWORD, "clearance": clearance });
    let r = w.api("POST", "/v1/users", Some(user));
    assert_eq!(r.status, 201, "{}", r.text());
}

/// `user`'s request to the app: the notes it answers (GET) or the status it gave (POST).
fn call(w: &Warden, user: &str, method: &str, body: &str) -> Value {
    let r = request(
        method,
        &format!("{}/apps/journal/", w.gateway),
        &[("authorization", &basic(user, PASSWORD))],
        body.as_bytes(),
    );
    assert!(r.status == 200 || r.status == 201, "{user}: {}", r.text());
    r.json()
}

fn notes(w: &Warden, user: &str) -> BTreeSet<String> {
    let v = call(w, user, "GET", "");
    v["notes"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|n| n.as_str().unwrap().to_owned())
        .collect()
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// The private PostgreSQL's postmaster pid, from its lock file.
fn postmaster(data_dir: &Path) -> u32 {
    let text = std::fs::read_to_string(data_dir.join("postgres/pgdata/postmaster.pid"))
        .expect("the private PostgreSQL's postmaster.pid");
    text.lines().next().unwrap().trim().parse().unwrap()
}

#[test]
fn a_flask_app_keeps_labelled_notes_that_each_user_reads_down() {
    if !postgres_installed() {
        return;
    }
    let (_top, data_dir) = crate::data_apps::data_dir_postgres_reaches();
    let w = Launch::new(BIN)
        .no_demo()
        .with_data()
        .data_dir(&data_dir)
        .start();
    let lattice = json!({ "levels": ["U", "C", "S"], "categories": ["X"] });
    assert_eq!(w.api("PUT", "/v1/lattice", Some(lattice)).status, 200);
    for (name, clearance) in [("una", "U"), ("cal", "C"), ("sam", "S"), ("xena", "S:{X}")] {
        add_user(&w, name, clearance);
    }

    // The push makes the app with data (app.toml) and its table in the release phase.
    let src = fixture("flask-notes");
    let out = push(&w, "journal", src.path());
    assert!(out.contains("notes: tables made"), "{out}");
    assert!(out.contains("of journal serves"), "{out}");

    for user in ["una", "cal", "sam", "xena"] {
        call(&w, user, "POST", &format!("{user}-note"));
    }
    // Read down over levels and categories: S does not read S:{X}; S:{X} reads everything.
    assert_eq!(notes(&w, "una"), set(&["una-note"]));
    assert_eq!(notes(&w, "cal"), set(&["una-note", "cal-note"]));
    assert_eq!(notes(&w, "sam"), set(&["una-note", "cal-note", "sam-note"]));
    assert_eq!(
        notes(&w, "xena"),
        set(&["una-note", "cal-note", "sam-note", "xena-note"])
    );

    // A level inserted below C re-ranks the labels already in the database: R reads U's
    // note but not C's (with C's stale rank, equal to R's, it would).
    let lattice = json!({ "levels": ["U", "R", "C", "S"], "categories": ["X"] });
    assert_eq!(w.api("PUT", "/v1/lattice", Some(lattice)).status, 200);
    add_user(&w, "rita", "R");
    wait_until(
        "the lattice to reach the database",
        Duration::from_secs(30),
        || (notes(&w, "rita") == set(&["una-note"])).then_some(()),
    );
    call(&w, "rita", "POST", "rita-note");
    assert_eq!(notes(&w, "rita"), set(&["una-note", "rita-note"]));
    assert_eq!(
        notes(&w, "cal"),
        set(&["una-note", "cal-note", "rita-note"])
    );
    assert_eq!(notes(&w, "una"), set(&["una-note"]));

    // PostgreSQL killed under the app: warden starts it again, and the notes are all there.
    let pid = postmaster(&data_dir);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // A pooled connection to a backend that has not yet seen its postmaster die can still
    // answer, so a 200 alone does not say PostgreSQL was started again: its new pid does.
    wait_until(
        "the private PostgreSQL to be started again",
        Duration::from_secs(60),
        || {
            let restarted =
                std::fs::read_to_string(data_dir.join("postgres/pgdata/postmaster.pid"))
                    .ok()
                    .and_then(|t| t.lines().next()?.trim().parse::<u32>().ok())
                    .is_some_and(|now| now != pid);
            let r = request(
                "GET",
                &format!("{}/apps/journal/", w.gateway),
                &[("authorization", &basic("sam", PASSWORD))],
                b"",
            );
            (restarted && r.status == 200).then_some(())
        },
    );
    assert_ne!(postmaster(&data_dir), pid);
    assert_eq!(
        notes(&w, "sam"),
        set(&["una-note", "cal-note", "sam-note", "rita-note"])
    );

    // A declassifier: only once an admin marks the app may SECRET write a note down to U,
    // and the write is recorded.
    let publish = |user: &str, body: &str| {
        request(
            "POST",
            &format!("{}/apps/journal/public", w.gateway),
            &[("authorization", &basic(user, PASSWORD))],
            body.as_bytes(),
        )
    };
    let r = publish("sam", "too-soon");
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.text().contains("not a declassifier"), "{}", r.text());
    let r = w.api(
        "PATCH",
        "/v1/apps/journal",
        Some(json!({ "declassify_to": "U" })),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = publish("sam", "sam-public");
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(notes(&w, "una"), set(&["una-note", "sam-public"]));
    let shown = w.api("GET", "/v1/apps/journal/data", None).json();
    assert_eq!(shown["declassified_writes"], 1, "{shown}");

    // per_user: an instance per user, which sees and changes only its user's rows.
    add_user(&w, "ulla", "U");
    let r = w.api(
        "PATCH",
        "/v1/apps/journal",
        Some(json!({ "lifetime": "per_user" })),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    wait_until("per_user instances", Duration::from_secs(60), || {
        notes(&w, "una").is_empty().then_some(())
    });
    call(&w, "una", "POST", "una-own");
    call(&w, "ulla", "POST", "ulla-own");
    assert_eq!(notes(&w, "una"), set(&["una-own"]));
    assert_eq!(notes(&w, "ulla"), set(&["ulla-own"]));
}
