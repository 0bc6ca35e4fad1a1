//! An app before its first release (issue 38): its config can be set before anything is pushed
//! (the app is made, awaiting the push), and a first push that fails leaves an app that exists,
//! lists its failed release, takes config and can be removed.

use crate::deploy::{answer, fixture, push, push_ok, releases, run};
use warden_test_support::Warden;

const BIN: &str = env!("CARGO_BIN_EXE_warden");

#[test]
fn config_is_set_before_the_first_push_and_the_first_push_runs_with_it() {
    let w = Warden::demo(BIN);
    let (ok, out, err) = run(&w, &["config", "set", "later", "ANSWER=set before"]);
    assert!(
        ok && out.contains("made app later") && out.contains("kept for its first push"),
        "{out}{err}"
    );
    // It exists, awaiting its release: the gateway says so, and no instance starts.
    let spec = w.api("GET", "/v1/apps/later", None);
    assert_eq!(spec.status, 200, "{}", spec.text());
    assert_eq!(spec.json()["env"]["ANSWER"], "set before");
    let r = w.get_as("alice", &w.password("alice"), "/apps/later/");
    assert!(
        r.status == 503 && r.text().contains("has no release yet"),
        "{} {}",
        r.status,
        r.text()
    );
    assert!(w.instances().iter().all(|i| i["app"] != "later"));
    assert!(releases(&w, "later").is_empty());

    // A second change before the push keeps both; the push runs with them.
    let (ok, _, err) = run(&w, &["config", "set", "later", "MODE=x"]);
    assert!(ok, "{err}");
    push_ok(&w, "later", fixture("plain").path());
    assert_eq!(answer(&w, "alice", "later")["answer"], "set before");
    let spec = w.api("GET", "/v1/apps/later", None).json();
    assert_eq!(spec["env"]["MODE"], "x");
    // Once it runs a release, a config change is a release again.
    let (ok, out, _) = run(&w, &["config", "set", "later", "ANSWER=after"]);
    assert!(ok && !out.contains("kept for its first push"), "{out}");
    assert_eq!(answer(&w, "alice", "later")["answer"], "after");
}

#[test]
fn a_failed_first_push_leaves_an_app_to_fix_or_remove() {
    let w = Warden::demo(BIN);
    let (ok, _, _) = push(&w, "shaky", fixture("broken").path(), &[]);
    assert!(!ok, "the broken app's first push must fail");
    assert_eq!(w.api("GET", "/v1/apps/shaky", None).status, 200);
    let listed = releases(&w, "shaky");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["status"], "failed");
    let r = w.get_as("bob", &w.password("bob"), "/apps/shaky/");
    assert_eq!(r.status, 503, "{}", r.text());
    // Fixed with config, then a push that works.
    let (ok, out, err) = run(&w, &["config", "set", "shaky", "ANSWER=fixed"]);
    assert!(ok && out.contains("kept for its first push"), "{out}{err}");
    push_ok(&w, "shaky", fixture("plain").path());
    assert_eq!(answer(&w, "bob", "shaky")["answer"], "fixed");

    // Another failed first push, removed.
    let (ok, _, _) = push(&w, "gone", fixture("broken").path(), &[]);
    assert!(!ok);
    let (ok, out, err) = run(&w, &["apps", "rm", "gone"]);
    assert!(ok, "{out}{err}");
    assert_eq!(w.api("GET", "/v1/apps/gone", None).status, 404);
}

#[test]
fn push_group_limits_who_reaches_the_app_and_the_push_says_who_can() {
    let w = Warden::demo(BIN);
    // Open to every signed-in user, and the push says so.
    let out = push_ok(&w, "open", fixture("plain").path());
    assert!(out.contains("reachable by every signed-in user"), "{out}");
    assert_eq!(answer(&w, "dave", "open")["answer"], "hello from plain");

    // carol is in `admin`, alice only in `staff`: --group admin keeps alice out.
    let (ok, out, err) = push(&w, "closed", fixture("plain").path(), &["--group", "admin"]);
    assert!(
        ok && out.contains("reachable by users in group admin"),
        "{out}{err}"
    );
    assert_eq!(answer(&w, "carol", "closed")["answer"], "hello from plain");
    let r = w.get_as("alice", &w.password("alice"), "/apps/closed/");
    assert_eq!(r.status, 403, "{}", r.text());
    // An existing app's groups change with the push that names them.
    let (ok, out, err) = push(&w, "open", fixture("plain").path(), &["--group", "staff"]);
    assert!(ok && out.contains("group staff"), "{out}{err}");
    assert_eq!(
        w.get_as("dave", &w.password("dave"), "/apps/open/").status,
        403
    );
    // A bad group name is refused before anything is uploaded or released.
    let (ok, _, err) = push(&w, "open", fixture("plain").path(), &["--group", "no such"]);
    assert!(!ok && err.contains("group"), "{err}");
    assert_eq!(releases(&w, "open").len(), 2);
}
