//! `warden up --demo` on a node with data (issue 34): the demo app gets a database, seeded
//! once with a note at UNCLASSIFIED and one at SECRET, and its page lists the notes the
//! user's clearance reads. Skipped where PostgreSQL 15 is not installed.

use serde_json::Value;
use warden_test_support::{Launch, Warden};

use crate::data_apps::postgres_installed;
use crate::BIN;

const WELCOME: &str = "Welcome to the demo: every clearance reads this note.";
const SECRET: &str = "The launch is at dawn: only SECRET and TOP SECRET read this note.";

/// The notes on `user`'s demo page (at `path`, such as `?note=TEXT`), newest first.
fn notes(w: &Warden, user: &str, path: &str) -> Vec<String> {
    let r = w.get_as(user, &w.password(user), &format!("/apps/demo/{path}"));
    assert_eq!(r.status, 200, "{}", r.text());
    let page: Value = r.json();
    page["notes"]
        .as_array()
        .unwrap_or_else(|| panic!("no notes on {user}'s page: {page}"))
        .iter()
        .map(|n| n.as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn the_demo_app_lists_the_notes_each_clearance_reads_seeded_once() {
    if !postgres_installed() {
        return;
    }
    let (_top, data_dir) = crate::data_apps::data_dir_postgres_reaches();
    let mut w = Launch::new(BIN).with_data().data_dir(&data_dir).start();
    assert_eq!(w.api("GET", "/v1/apps/demo", None).json()["data"], true);

    assert_eq!(notes(&w, "alice", ""), vec![SECRET, WELCOME]);
    assert_eq!(notes(&w, "carol", ""), vec![SECRET, WELCOME]);
    assert_eq!(notes(&w, "dave", ""), vec![WELCOME]);
    // A note is written at the writer's label: read up the lattice, never down it.
    assert_eq!(
        notes(&w, "dave", "?note=hello+from+dave"),
        vec!["hello from dave", WELCOME]
    );
    assert_eq!(
        notes(&w, "bob", "?note=bob%27s+note"),
        vec!["bob's note", "hello from dave", WELCOME]
    );
    assert_eq!(notes(&w, "dave", ""), vec!["hello from dave", WELCOME]);
    assert_eq!(
        notes(&w, "alice", ""),
        vec!["bob's note", "hello from dave", SECRET, WELCOME]
    );

    // Seeded once: a second start on the data dir keeps the notes and adds none.
    w.stop();
    let w = Launch::new(BIN).with_data().data_dir(&data_dir).start();
    assert_eq!(
        notes(&w, "alice", ""),
        vec!["bob's note", "hello from dave", SECRET, WELCOME]
    );
}
