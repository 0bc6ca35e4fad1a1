//! Process types (issue 38): every Procfile line but `web` and `release` is a type whose
//! instances are kept by counts per label (`warden apps scale APP worker:LABEL=N`, 0 for a new
//! type), run from the release's slug like web instances, listen on nothing, and are never
//! reached through the gateway. Pushed through the CLI against the real binary.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use warden_test_support::{http, wait_until, Warden};

use crate::deploy::{push, push_ok, run};
use crate::BIN;

/// A tree with the dependency-free web server of `tests/apps/plain` and a worker that prints a
/// numbered line each 200 ms with its label and whether it got a port; `procfile` is its
/// Procfile.
fn tree(procfile: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/apps/plain/server.py");
    std::fs::copy(src, dir.path().join("server.py")).unwrap();
    std::fs::write(
        dir.path().join("worker.py"),
        "import os, time\nn = 0\nwhile True:\n    print(f\"tick {n} at {os.environ.get('WARDEN_LABEL')} port {os.environ.get('PORT', 'none')}\", flush=True)\n    n += 1\n    time.sleep(0.2)\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("Procfile"), procfile).unwrap();
    dir
}

/// The instance records of `app` (a process type's name is `APP~TYPE`).
fn instances_of(w: &Warden, app: &str) -> Vec<Value> {
    w.instances()
        .into_iter()
        .filter(|i| i["app"] == app)
        .collect()
}

/// Waits until `app` has `n` ready instances and no other.
fn wait_ready(w: &Warden, app: &str, n: usize) -> Vec<Value> {
    wait_until(
        &format!("{n} ready instances of {app}"),
        Duration::from_secs(60),
        || {
            let all = instances_of(w, app);
            (all.len() == n && all.iter().all(|i| i["state"] == "ready")).then_some(all)
        },
    )
}

#[test]
fn a_worker_runs_by_its_count_is_never_routed_to_and_drains_when_its_line_goes() {
    let w = Warden::demo(BIN);
    let both = tree("web: python3 server.py\nworker: python3 worker.py\n");
    let out = push_ok(&w, "jobs", both.path());
    assert!(
        out.contains("worker: 0 running; `warden apps scale jobs worker:LABEL=N`"),
        "the push names the new type and how to run it:\n{out}"
    );
    assert!(
        instances_of(&w, "jobs~worker").is_empty(),
        "a new type runs nothing"
    );

    let (ok, out, err) = run(&w, &["apps", "scale", "jobs", "worker:SECRET=1"]);
    assert!(ok, "{out}{err}");
    let running = wait_ready(&w, "jobs~worker", 1);
    assert_eq!(running[0]["label"], "SECRET");
    // Its lines are the app's: `warden logs jobs` shows them, with its label and no port.
    let logs = wait_until("the worker's lines", Duration::from_secs(30), || {
        let (ok, out, _) = run(&w, &["logs", "jobs"]);
        (ok && out.contains("tick 3 at SECRET port none")).then_some(out)
    });
    assert!(logs.contains(running[0]["id"].as_str().unwrap()), "{logs}");

    // The gateway never reaches it: not by path, not by Host; and it starts nothing for it.
    let alice = http::basic("alice", &w.password("alice"));
    for (host, path) in [
        (None, "/apps/jobs~worker/"),
        (None, "/apps/jobs%7Eworker/"),
        (Some("jobs~worker"), "/"),
    ] {
        let mut headers = vec![("authorization", alice.as_str())];
        if let Some(h) = host {
            headers.push(("host", h));
        }
        let r = http::request("GET", &format!("{}{path}", w.gateway), &headers, b"");
        assert_eq!(r.status, 404, "{host:?} {path}: {}", r.text());
    }
    assert_eq!(instances_of(&w, "jobs~worker").len(), 1);
    // Nor does the API take its name: it is the app's, managed through the app's routes.
    for path in ["/v1/apps/jobs~worker", "/v1/apps/jobs%7eworker/logs"] {
        assert_eq!(w.api("GET", path, None).status, 404, "{path}");
    }
    let listed = w.api("GET", "/v1/apps", None).json();
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["name"] != "jobs~worker"),
        "{listed}"
    );

    // Scaled to 0, it stops; the web instances serve on.
    let (ok, out, err) = run(&w, &["apps", "scale", "jobs", "worker:SECRET=0"]);
    assert!(ok, "{out}{err}");
    wait_ready(&w, "jobs~worker", 0);
    assert_eq!(
        crate::deploy::answer(&w, "alice", "jobs")["answer"],
        "hello from plain"
    );

    // A type the release does not have is named as such.
    let (ok, _, err) = run(&w, &["apps", "scale", "jobs", "clock:SECRET=1"]);
    assert!(!ok && err.contains("no process type \"clock\""), "{err}");

    // A push whose Procfile drops the line drains the type's instances and removes it.
    let (ok, out, err) = run(&w, &["apps", "scale", "jobs", "worker:SECRET=1"]);
    assert!(ok, "{out}{err}");
    wait_ready(&w, "jobs~worker", 1);
    let web_only = tree("web: python3 server.py\n");
    let out = push_ok(&w, "jobs", web_only.path());
    assert!(!out.contains("worker:"), "{out}");
    wait_ready(&w, "jobs~worker", 0);
    let (ok, _, err) = run(&w, &["apps", "scale", "jobs", "worker:SECRET=1"]);
    assert!(!ok && err.contains("no process type \"worker\""), "{err}");
    assert_eq!(
        crate::deploy::answer(&w, "alice", "jobs")["answer"],
        "hello from plain"
    );
}

#[test]
fn a_procfile_naming_a_type_twice_is_refused_before_anything_runs() {
    let w = Warden::demo(BIN);
    let twice = tree("web: python3 server.py\nworker: a\nworker: b\n");
    let (ok, out, err) = push(&w, "twice", twice.path(), &[]);
    assert!(!ok, "{out}");
    assert!(
        format!("{out}{err}").contains("process type \"worker\" is named twice"),
        "{out}{err}"
    );
}

#[test]
fn ps_shows_every_type_and_apps_rm_takes_the_types_with_the_app() {
    let w = Warden::demo(BIN);
    let both = tree("web: python3 server.py\nworker: python3 worker.py\n");
    push_ok(&w, "queue", both.path());
    let (ok, out, err) = run(
        &w,
        &[
            "apps",
            "scale",
            "queue",
            "SECRET=1",
            "worker:SECRET=2",
            "worker:CONFIDENTIAL=1",
        ],
    );
    assert!(ok, "{out}{err}");
    wait_until("the kept instances", Duration::from_secs(60), || {
        let ready = |app: &str, label: &str| {
            instances_of(&w, app)
                .iter()
                .filter(|i| i["label"] == label && i["state"] == "ready")
                .count()
        };
        (ready("queue~worker", "SECRET") == 2
            && ready("queue~worker", "CONFIDENTIAL") == 1
            && ready("queue", "SECRET") >= 1)
            .then_some(())
    });
    let (ok, out, err) = run(&w, &["ps", "queue"]);
    assert!(ok, "{err}");
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().take(4).collect())
        .collect();
    for want in [
        ["web", "SECRET", "1", "1"],
        ["worker", "CONFIDENTIAL", "1", "1"],
        ["worker", "SECRET", "2", "2"],
    ] {
        assert!(
            rows.iter().any(|r| r[..] == want[..]),
            "{want:?} in:\n{out}"
        );
    }

    // Removing the app removes its types: their instances stop, and an app pushed later
    // under the name keeps none of the old counts.
    let (ok, out, err) = run(&w, &["apps", "rm", "queue"]);
    assert!(ok, "{out}{err}");
    wait_ready(&w, "queue~worker", 0);
    push_ok(&w, "queue", both.path());
    let ps = w.api("GET", "/v1/apps/queue/ps", None).json();
    assert_eq!(ps[1]["kind"], "worker", "{ps}");
    assert_eq!(ps[1]["labels"], serde_json::json!([]), "{ps}");
}
