//! Changing an app while it serves: `warden apps update` (PATCH /v1/apps/NAME) rolls a changed
//! command or environment out with no failed request, and a change whose instances do not start
//! leaves the old ones serving.

use std::time::Duration;

use serde_json::json;
use warden_test_support::{cli, wait_until, Warden};

use crate::BIN;

fn update(w: &Warden, args: &[&str]) -> (bool, String, String) {
    let dir = w.dir.display().to_string();
    let mut all = vec!["apps", "update", "--data-dir", &dir];
    all.extend_from_slice(args);
    cli(BIN, &all, &[])
}

/// Waits until `n` instances of `app` are ready.
fn wait_ready(w: &Warden, app: &str, n: usize) {
    wait_until(
        &format!("{n} ready instances of {app}"),
        Duration::from_secs(30),
        || (instances(w, app).iter().filter(|i| i.2 == "ready").count() == n).then_some(()),
    );
}

/// Instance ids of `app` and the generations they run.
fn instances(w: &Warden, app: &str) -> Vec<(String, String, String)> {
    w.instances()
        .into_iter()
        .filter(|i| i["app"] == app)
        .map(|i| {
            (
                i["id"].as_str().unwrap().to_owned(),
                i["generation"].as_str().unwrap_or("").to_owned(),
                i["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn a_changed_environment_rolls_out_with_no_failed_request() {
    let w = Warden::demo(BIN);
    w.create_demo_app(BIN, "web", json!({ "desired": {"SECRET": 2} }));
    let pw = w.password("alice");
    let bob = w.password("bob");
    wait_ready(&w, "web", 2);
    // bob's label has an instance nobody keeps, started by his request.
    assert_eq!(w.get_as("bob", &bob, "/apps/web/").status, 200);
    let before = instances(&w, "web");
    assert_eq!(before.len(), 3);

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (s, gw, pw2) = (stop.clone(), w.gateway.clone(), pw.clone());
    let load = std::thread::spawn(move || {
        let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
        let auth = warden_test_support::http::basic("alice", &pw2);
        for _ in 0..20_000 {
            if s.load(std::sync::atomic::Ordering::Relaxed) {
                break;
            }
            // A POST: the gateway never sends one twice, so a failure would show.
            let r = warden_test_support::http::request(
                "POST",
                &format!("{gw}/apps/web/_slow?ms=20"),
                &[("authorization", &auth)],
                b"x",
            );
            *statuses.entry(r.status).or_default() += 1;
        }
        statuses
    });

    let (ok, out, err) = update(&w, &["web", "--env", "GREETING=hello"]);
    assert!(ok && out.contains("updated"), "{err}");
    let spec = w.api("GET", "/v1/apps/web", None).json();
    assert_eq!(spec["env"]["GREETING"], "hello");
    let after = wait_until("every instance replaced", Duration::from_secs(60), || {
        let now = instances(&w, "web");
        let gone = before
            .iter()
            .all(|(id, _, _)| now.iter().all(|n| &n.0 != id));
        let ready = now.iter().filter(|i| i.2 == "ready").count();
        (gone && ready == 3).then_some(now)
    });
    let generations: std::collections::BTreeSet<&String> = after.iter().map(|i| &i.1).collect();
    assert_eq!(generations.len(), 1, "{after:?}");
    assert_ne!(*generations.iter().next().unwrap(), &before[0].1);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let statuses = load.join().unwrap();
    assert!(
        statuses.keys().all(|s| *s == 200) && statuses[&200] > 10,
        "every request served: {statuses:?}"
    );
    assert_eq!(w.get_as("bob", &bob, "/apps/web/").status, 200);
    let status = w.api("GET", "/v1/status", None).json();
    let web = status["apps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "web")
        .unwrap();
    assert_eq!(web["outdated"], 0);
}

#[test]
fn a_change_whose_instances_do_not_start_leaves_the_old_ones_serving() {
    let w = Warden::demo(BIN);
    w.create_demo_app(BIN, "web", json!({ "desired": {"SECRET": 1} }));
    let pw = w.password("alice");
    wait_ready(&w, "web", 1);
    let before = instances(&w, "web");
    let (ok, _, err) = update(&w, &["web", "--", "/no/such/server"]);
    assert!(ok, "{err}");
    let report = w.wait_crash_loop("web");
    assert!(
        report["last_exit"]
            .as_str()
            .unwrap()
            .contains("/no/such/server"),
        "{report}"
    );
    // The old instance still serves every request, and the status says a rollout is stuck.
    for _ in 0..10 {
        let r = w.get_as("alice", &pw, "/apps/web/");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["instance"], before[0].0.as_str());
    }
    let (ok, out, _) = cli(BIN, &["status", "--data-dir", w.dir.to_str().unwrap()], &[]);
    assert!(
        ok && out.contains("rolling out, 1 instance(s) of the old spec"),
        "{out}"
    );

    // Putting the command back ends it: nothing is replaced any more.
    let (ok, _, err) = update(&w, &["web", "--", BIN, "demo-app"]);
    assert!(ok, "{err}");
    let status = w.api("GET", "/v1/status", None).json();
    let web = status["apps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "web")
        .unwrap();
    assert_eq!(web["outdated"], 0, "{web}");
}

#[test]
fn updates_are_checked_like_creations() {
    let w = Warden::demo(BIN);
    for (patch, says) in [
        (json!({"name": "other"}), "cannot be renamed"),
        (json!({"lifetime": "forever"}), "lifetime"),
        (
            json!({"static_dir": w.dir.display().to_string()}),
            "data directory",
        ),
        (json!({"desired": {"NO SUCH LEVEL": 1}}), "NO SUCH LEVEL"),
        (json!(["not", "an", "object"]), "JSON object"),
    ] {
        let r = w.api("PATCH", "/v1/apps/demo", Some(patch.clone()));
        assert_eq!(r.status, 400, "{patch}: {}", r.text());
        assert!(r.text().contains(says), "{patch}: {}", r.text());
    }
    assert_eq!(
        w.api("PATCH", "/v1/apps/nope", Some(json!({"env": {}})))
            .status,
        404
    );
    // Many small patches cannot grow a spec past what one message between nodes carries.
    let big = "x".repeat(200 * 1024);
    let r = w.api("PATCH", "/v1/apps/demo", Some(json!({"env": {"A": big}})));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = w.api("PATCH", "/v1/apps/demo", Some(json!({"env": {"B": big}})));
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("bytes"), "{}", r.text());
    let r = w.api("PATCH", "/v1/apps/demo", Some(json!({"env": {"A": null}})));
    assert_eq!(r.status, 200, "{}", r.text());
    // Counts merge label by label; null stops keeping one.
    let both = json!({"desired": {"SECRET": 1, "CONFIDENTIAL": 1}});
    let r = w.api("PATCH", "/v1/apps/demo", Some(both.clone()));
    assert_eq!(r.json()["desired"], both["desired"], "{}", r.text());
    let r = w.api(
        "PATCH",
        "/v1/apps/demo",
        Some(json!({"desired": {"SECRET": null}})),
    );
    assert_eq!(
        r.json()["desired"],
        json!({"CONFIDENTIAL": 1}),
        "{}",
        r.text()
    );
    // Hosts and groups change at once, with no instance replaced.
    let r = w.api(
        "PATCH",
        "/v1/apps/demo",
        Some(json!({"hosts": ["new.localhost"], "env": {"A": "1"}})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = w.api("PATCH", "/v1/apps/demo", Some(json!({"env": {"A": null}})));
    assert_eq!(r.json()["env"], json!({}));
    assert_eq!(r.json()["hosts"], json!(["new.localhost"]));
    let (ok, _, err) = update(&w, &["demo"]);
    assert!(!ok && err.contains("nothing to change"), "{err}");
}

/// With no room for one more instance, the old one makes room first: the rollout finishes.
#[test]
fn a_rollout_at_capacity_replaces_the_old_instance_after_all() {
    let w = Warden::demo(BIN);
    w.create_demo_app(
        BIN,
        "tight",
        json!({ "desired": {"SECRET": 1}, "max_instances": 1 }),
    );
    wait_ready(&w, "tight", 1);
    let before = instances(&w, "tight");
    let (ok, _, err) = update(&w, &["tight", "--env", "V=2"]);
    assert!(ok, "{err}");
    let after = wait_until("the instance replaced", Duration::from_secs(60), || {
        let now = instances(&w, "tight");
        (now.len() == 1 && now[0].0 != before[0].0 && now[0].2 == "ready").then_some(now)
    });
    assert_ne!(after[0].1, before[0].1, "of the new spec");
    let status = w.api("GET", "/v1/status", None).json();
    let app = status["apps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "tight")
        .unwrap();
    assert_eq!(
        app["crash_loops"],
        json!([]),
        "a full app is no crash: {app}"
    );
}
