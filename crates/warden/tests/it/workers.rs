//! Process types (issue 38): every Procfile line but `web` and `release` is a type whose
//! instances are kept by counts per label (`warden apps scale APP worker:LABEL=N`, 0 for a new
//! type), run from the release's slug like web instances, listen on nothing, and are never
//! reached through the gateway. Pushed through the CLI against the real binary.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use warden_test_support::{cli, http, wait_until, Launch, Warden};

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
        "import os, time\nn = 0\nwhile True:\n    print(f\"tick {n} at {os.environ.get('WARDEN_LABEL')} port {os.environ.get('PORT', 'none')} answer {os.environ.get('ANSWER')}\", flush=True)\n    n += 1\n    time.sleep(0.2)\n",
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
        (ok && out.contains("tick 3 at SECRET port none answer None")).then_some(out)
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

    // A config change reaches it: it is replaced by one with the app's new env.
    let (ok, out, err) = run(&w, &["config", "set", "jobs", "ANSWER=42"]);
    assert!(ok, "{out}{err}");
    wait_until(
        "the worker with the new config",
        Duration::from_secs(60),
        || {
            let (ok, out, _) = run(&w, &["logs", "jobs"]);
            (ok && out.contains("port none answer 42")).then_some(())
        },
    );
    let replaced = wait_ready(&w, "jobs~worker", 1);
    assert_ne!(replaced[0]["id"], running[0]["id"]);
    // So does a restart of the app.
    let (ok, out, err) = run(&w, &["apps", "restart", "jobs"]);
    assert!(ok, "{out}{err}");
    wait_until("the worker restarted", Duration::from_secs(60), || {
        let now = instances_of(&w, "jobs~worker");
        (now.len() == 1 && now[0]["state"] == "ready" && now[0]["id"] != replaced[0]["id"])
            .then_some(())
    });

    // Scaled to 0, it stops; the web instances serve on.
    let (ok, out, err) = run(&w, &["apps", "scale", "jobs", "worker:SECRET=0"]);
    assert!(ok, "{out}{err}");
    wait_ready(&w, "jobs~worker", 0);
    assert_eq!(crate::deploy::answer(&w, "alice", "jobs")["answer"], "42");

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
    assert_eq!(crate::deploy::answer(&w, "alice", "jobs")["answer"], "42");
    // A rollback brings back the earlier release's types (with no count: its old one went).
    let (ok, out, err) = run(&w, &["rollback", "jobs"]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("worker: 0 running"), "{out}");
    let (ok, out, err) = run(&w, &["apps", "scale", "jobs", "worker:SECRET=1"]);
    assert!(ok, "{out}{err}");
    wait_ready(&w, "jobs~worker", 1);
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
fn a_procfile_naming_more_than_sixteen_types_is_refused_and_sixteen_are_kept() {
    let w = Warden::demo(BIN);
    let lines = |n: usize| -> String {
        let mut p = String::from("web: python3 server.py\nrelease: true\n");
        for i in 0..n {
            p.push_str(&format!("job{i}: python3 worker.py\n"));
        }
        p
    };
    let many = tree(&lines(17));
    let (ok, out, err) = push(&w, "many", many.path(), &[]);
    assert!(!ok, "{out}");
    assert!(
        format!("{out}{err}").contains("more than 16 process types"),
        "{out}{err}"
    );
    assert_eq!(w.api("GET", "/v1/apps/many", None).status, 404);
    // Sixteen, the bound itself, is a Procfile like any other.
    let sixteen = tree(&lines(16));
    push_ok(&w, "many", sixteen.path());
    let ps = w.api("GET", "/v1/apps/many/ps", None).json();
    assert_eq!(ps.as_array().unwrap().len(), 17, "{ps}");
}

#[test]
fn a_process_types_spec_cannot_be_written_by_hand_under_another_app() {
    let w = Warden::demo(BIN);
    let both = tree("web: python3 server.py\nworker: python3 worker.py\n");
    push_ok(&w, "victim", both.path());
    let forged = json!({
        "name": "victim~miner",
        "command": ["python3", "-c", "print('not the victim code')"],
        "process": {"app": "victim", "kind": "miner"},
    });
    let r = w.api("POST", "/v1/apps", Some(forged));
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("Procfile"), "{}", r.text());
    // Nor through `scale`, by a type name that would be another key.
    let r = w.api(
        "POST",
        "/v1/apps/victim/scale",
        Some(json!({"process": "worker/../../x", "desired": {"SECRET": 1}})),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let r = w.api(
        "PATCH",
        "/v1/apps/victim",
        Some(json!({"process": {"app": "victim", "kind": "worker"}})),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    // The victim's types are the Procfile's, nothing more.
    let ps = w.api("GET", "/v1/apps/victim/ps", None).json();
    let kinds: Vec<&str> = ps
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["kind"].as_str())
        .collect();
    assert_eq!(kinds, ["web", "worker"], "{ps}");
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

/// Writes into the stopped warden's store at `dir` a process type of app `app` left without
/// it, as a crash between `apps rm`'s two deletes leaves it: with counts and code of its own.
fn leave_orphan(dir: &Path, app: &str) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let s = warden_store::EmbeddedStore::open(&dir.join("store.redb")).unwrap();
        use warden_store::Store;
        let leftover = json!({
            "name": format!("{app}~worker"),
            "command": ["/bin/sh", "-c", "echo old code; sleep 1000"],
            "desired": {"SECRET": 2},
            "idle_timeout_ms": 0,
            "process": {"app": app, "kind": "worker"},
        });
        s.put(
            &format!("apps/{app}~worker/spec"),
            serde_json::to_vec(&leftover).unwrap(),
            None,
        )
        .await
        .unwrap();
    });
}

/// Whether the stopped warden's store at `dir` holds `key`.
fn stored(dir: &Path, key: &str) -> bool {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let s = warden_store::EmbeddedStore::open(&dir.join("store.redb")).unwrap();
        use warden_store::Store;
        s.get(key).await.unwrap().is_some()
    })
}

#[test]
fn a_process_type_left_without_its_app_is_swept_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Launch::new(BIN).data_dir(dir.path()).start();
    assert!(w.stop().success());
    leave_orphan(dir.path(), "ghost");
    assert!(stored(dir.path(), "apps/ghost~worker/spec"));
    let mut w = Launch::new(BIN).data_dir(dir.path()).start();
    assert_eq!(w.api("GET", "/v1/apps/demo", None).status, 200);
    assert!(w.stop().success());
    assert!(
        !stored(dir.path(), "apps/ghost~worker/spec"),
        "the leftover is gone after a start"
    );
    assert!(stored(dir.path(), "apps/demo/spec"), "the apps stay");
}

#[test]
fn an_app_made_under_a_removed_apps_name_adopts_none_of_its_leftover_types() {
    let dir = tempfile::tempdir().unwrap();
    leave_orphan(dir.path(), "ghost");
    let w = Launch::new(BIN).data_dir(dir.path()).start();
    let both = tree("web: python3 server.py\nworker: python3 worker.py\n");
    push_ok(&w, "ghost", both.path());
    let ps = w.api("GET", "/v1/apps/ghost/ps", None).json();
    assert_eq!(ps[1]["kind"], "worker", "{ps}");
    assert_eq!(ps[1]["labels"], json!([]), "the old counts are gone: {ps}");
    assert!(
        instances_of(&w, "ghost~worker").is_empty(),
        "nothing runs the old code"
    );
}

const PASSWORD: &str = "correct horse battery";

/// A data app of jobs: its web instances add a job (`GET /?add=TEXT`) and list the jobs their
/// label reads (`body:done`); its worker marks every job its label may change done, each
/// 200 ms. The stdlib notes app of `data_apps.rs` over the table its release phase makes.
fn jobs_tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let web = include_str!("data/notes.py").replace(
        "SELECT body FROM notes ORDER BY id;",
        "SELECT body || ':' || done FROM notes ORDER BY id;",
    );
    assert!(web.contains("|| done"), "the fixture changed");
    let worker = "import os, subprocess, time\nwhile True:\n    p = subprocess.run([\"/usr/lib/postgresql/15/bin/psql\", os.environ[\"DATABASE_URL\"], \"-X\", \"-At\", \"-v\", \"ON_ERROR_STOP=1\", \"-c\", \"UPDATE notes SET done = true WHERE NOT done RETURNING body\"], capture_output=True, text=True, timeout=30)\n    print(f\"rc {p.returncode} {p.stdout.split()} {p.stderr.strip()}\", flush=True)\n    time.sleep(0.2)\n";
    for (name, body) in [
        ("notes.py", web.as_str()),
        ("worker.py", worker),
        ("app.toml", "data = true\n"),
        (
            "migrate.sql",
            "CREATE TABLE IF NOT EXISTS notes (id serial PRIMARY KEY, body text NOT NULL, done boolean NOT NULL DEFAULT false);\n",
        ),
        (
            "Procfile",
            "web: test -n \"$DATABASE_URL\" && exec python3 notes.py\nworker: exec python3 worker.py\nrelease: /usr/lib/postgresql/15/bin/psql \"$DATABASE_URL\" -X -q -v ON_ERROR_STOP=1 -f migrate.sql\n",
        ),
    ] {
        std::fs::write(dir.path().join(name), body).unwrap();
    }
    dir
}

/// The jobs `user` reads through the web instances of their label, as `body:done`.
fn jobs_as(w: &Warden, user: &str, query: &str) -> Vec<String> {
    let r = http::request(
        "GET",
        &format!("{}/apps/jobs/{query}", w.gateway),
        &[("authorization", &http::basic(user, PASSWORD))],
        b"",
    );
    assert_eq!(r.status, 200, "{user} {query}: {}", r.text());
    let v = r.json();
    v["notes"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|n| n.as_str().unwrap().to_owned())
        .collect()
}

fn wait_jobs(w: &Warden, user: &str, want: &[&str]) {
    wait_until(
        &format!("{user} to read {want:?}"),
        Duration::from_secs(60),
        || (jobs_as(w, user, "") == want).then_some(()),
    );
}

#[test]
fn a_worker_consumes_the_jobs_web_instances_of_its_label_add_and_no_higher_ones() {
    if !crate::data_apps::postgres_installed() {
        return;
    }
    let w = Launch::new(BIN).no_demo().with_data().start();
    let lattice = json!({ "levels": ["U", "S"] });
    assert_eq!(w.api("PUT", "/v1/lattice", Some(lattice)).status, 200);
    for (name, clearance) in [("ursula", "U"), ("sam", "S")] {
        let user = json!({ "name": name, "password": PASSWORD, "clearance": clearance });
        let r = w.api("POST", "/v1/users", Some(user));
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let env = [
        ("WARDEN_API", w.api.as_str()),
        ("WARDEN_TOKEN", w.token.as_str()),
    ];
    let src = jobs_tree();
    let (ok, out, err) = cli(
        BIN,
        &["push", "jobs", &src.path().display().to_string()],
        &env,
    );
    assert!(ok && out.contains("worker: 0 running"), "{out}\n{err}");
    let scale = |counts: &str| {
        let (ok, out, err) = cli(BIN, &["apps", "scale", "jobs", counts], &env);
        assert!(ok, "{out}\n{err}");
    };

    // A worker at U consumes what a web instance at U adds.
    scale("worker:U=1");
    assert_eq!(jobs_as(&w, "ursula", "?add=low"), Vec::<String>::new());
    wait_jobs(&w, "ursula", &["low:true"]);
    // A job at S is not the U worker's: it consumes a U job added after it and leaves the
    // S one (each of its rounds marks every job it may change).
    assert_eq!(jobs_as(&w, "sam", "?add=high"), Vec::<String>::new());
    assert_eq!(jobs_as(&w, "ursula", "?add=low2"), Vec::<String>::new());
    wait_jobs(&w, "ursula", &["low:true", "low2:true"]);
    assert_eq!(
        jobs_as(&w, "sam", ""),
        ["low:true", "high:false", "low2:true"]
    );
    // A worker at S, scaled beside it, consumes it.
    scale("worker:S=1");
    wait_jobs(&w, "sam", &["low:true", "high:true", "low2:true"]);
    // ursula never reads the S job, done or not.
    assert_eq!(jobs_as(&w, "ursula", ""), ["low:true", "low2:true"]);
}

#[test]
fn draining_a_node_moves_its_workers_to_another_node() {
    let cluster = warden_test_support::etcd::EtcdCluster::start(1);
    let load = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        load.path(),
        r#"{"memory_used": 0.1, "cpu_busy": 0.1, "load_per_core": 0.1}"#,
    )
    .unwrap();
    let alpha = Launch::new(BIN)
        .args(&["--store", &cluster.url(), "--node-name", "alpha"])
        .args(&["--roles", "gateway,api,agent", "--advertise", "127.0.0.1:0"])
        .args(&["--load-file", &load.path().display().to_string()])
        .start();
    let _beta = crate::healing::agent(&cluster, &alpha, "beta", "127.0.0.2:0", &[]);
    let both = tree("web: python3 server.py\nworker: python3 worker.py\n");
    push_ok(&alpha, "jobs", both.path());
    let (ok, out, err) = run(&alpha, &["apps", "scale", "jobs", "worker:SECRET=2"]);
    assert!(ok, "{out}{err}");
    let on_nodes = |want: &[&str]| {
        wait_until(
            &format!("the workers ready on {want:?}"),
            Duration::from_secs(60),
            || {
                let mut on: Vec<String> = instances_of(&alpha, "jobs~worker")
                    .iter()
                    .filter(|i| i["state"] == "ready")
                    .map(|i| i["node"].as_str().unwrap().to_owned())
                    .collect();
                on.sort();
                (on == want).then_some(())
            },
        )
    };
    // Spread as web instances are: one on each node.
    on_nodes(&["alpha", "beta"]);
    let (ok, out, err) = run(&alpha, &["nodes", "drain", "beta", "--wait", "60"]);
    assert!(ok && out.contains("drained"), "{out}{err}");
    on_nodes(&["alpha", "alpha"]);
    // The drained ones end (a record may outlive the drain's answer by a moment).
    wait_until("nothing left on beta", Duration::from_secs(30), || {
        instances_of(&alpha, "jobs~worker")
            .iter()
            .all(|i| i["node"] == "alpha")
            .then_some(())
    });
}

#[test]
fn a_worker_that_exits_is_started_again_by_its_count() {
    let w = Warden::demo(BIN);
    // Runs a second, then exits 1: a crash its count makes up for.
    let src = tree("web: python3 server.py\nworker: python3 -c 'import time; print(\"up\", flush=True); time.sleep(1); raise SystemExit(1)'\n");
    push_ok(&w, "flaky", src.path());
    let (ok, out, err) = run(&w, &["apps", "scale", "flaky", "worker:SECRET=1"]);
    assert!(ok, "{out}{err}");
    let first = wait_ready(&w, "flaky~worker", 1)[0]["id"].clone();
    wait_until(
        "a second worker after the first exits",
        Duration::from_secs(60),
        || {
            let now = instances_of(&w, "flaky~worker");
            now.iter()
                .any(|i| i["id"] != first && i["state"] == "ready")
                .then_some(())
        },
    );
}

#[test]
fn a_worker_that_exits_every_few_seconds_is_a_crash_loop_and_waits_between_starts() {
    let w = Warden::demo(BIN);
    // Up 2.5 s, past the 2 s after which a web instance's exit is a first crash again.
    let src = tree("web: python3 server.py\nworker: python3 -c 'import time; time.sleep(2.5); raise SystemExit(1)'\n");
    push_ok(&w, "cron", src.path());
    let (ok, out, err) = run(&w, &["apps", "scale", "cron", "worker:SECRET=1"]);
    assert!(ok, "{out}{err}");
    let mut seen = std::collections::BTreeSet::new();
    let looped = wait_until("the worker's crash loop", Duration::from_secs(90), || {
        for i in instances_of(&w, "cron~worker") {
            seen.insert(i["id"].as_str().unwrap_or_default().to_owned());
        }
        std::thread::sleep(Duration::from_millis(200));
        let all = w.api("GET", "/v1/status", None).json();
        let app = all["apps"]
            .as_array()?
            .iter()
            .find(|a| a["name"] == "cron")?
            .clone();
        app["crash_loops"]
            .as_array()?
            .iter()
            .any(|c| c["crash_loop"] == true && c["label"] == "worker:SECRET")
            .then_some(app)
    });
    // Three crashes make a loop; with at least a second between starts, far fewer than the
    // starts a worker restarted at once would make in the same time.
    assert!(seen.len() <= 6, "{} starts: {seen:?} {looped}", seen.len());
}
