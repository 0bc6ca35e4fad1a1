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
