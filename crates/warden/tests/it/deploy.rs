//! Deploying apps from their source (`warden push`, `releases`, `config`, `rollback`), with
//! real third-party code: Flask under gunicorn and Express from their registries, a static
//! site, and dependency-free apps for the failure paths. Each push is built in a sandbox,
//! tried, and only then serves.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use warden_test_support::{cli, http, wait_until, Launch, Warden};

use crate::BIN;

/// A copy of the test app `name` (under tests/apps) in a scratch directory, to change freely.
pub(crate) fn fixture(name: &str) -> tempfile::TempDir {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            let name = e.file_name();
            if name == "node_modules" || name == ".venv" || name == "__pycache__" {
                continue;
            }
            if e.file_type().unwrap().is_dir() {
                copy(&e.path(), &to.join(&name));
            } else {
                std::fs::copy(e.path(), to.join(&name)).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/apps")
        .join(name);
    copy(&src, dir.path());
    dir
}

/// Runs a deploy command of the CLI against `w`.
pub(crate) fn run(w: &Warden, args: &[&str]) -> (bool, String, String) {
    let dir = w.dir.display().to_string();
    let mut all = args.to_vec();
    // Before a `--`, after which the app's own command starts.
    let at = all.iter().position(|a| *a == "--").unwrap_or(all.len());
    all.splice(at..at, ["--data-dir", &dir]);
    cli(BIN, &all, &[])
}

pub(crate) fn push(w: &Warden, app: &str, dir: &Path, extra: &[&str]) -> (bool, String, String) {
    let d = dir.display().to_string();
    let mut args = vec!["push", app, &d];
    args.extend_from_slice(extra);
    run(w, &args)
}

/// Pushes and expects the release to serve; returns the CLI's output.
pub(crate) fn push_ok(w: &Warden, app: &str, dir: &Path) -> String {
    let (ok, out, err) = push(w, app, dir, &[]);
    assert!(ok, "push of {app} failed:\n{out}\n{err}");
    assert!(out.contains(&format!("of {app} serves")), "{out}");
    out
}

/// What `app` answers `user`.
pub(crate) fn answer(w: &Warden, user: &str, app: &str) -> Value {
    let r = w.get_as(user, &w.password(user), &format!("/apps/{app}/"));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

pub(crate) fn releases(w: &Warden, app: &str) -> Vec<Value> {
    w.api("GET", &format!("/v1/apps/{app}/releases"), None)
        .json()
        .as_array()
        .unwrap()
        .clone()
}

/// Sends POSTs as alice to `app` until `stop`; the statuses seen. A POST is never retried by
/// the gateway, so a request an old instance dropped would show.
fn load(
    w: &Warden,
    app: &str,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<std::collections::BTreeMap<u16, usize>> {
    let (gw, auth) = (
        w.gateway.clone(),
        http::basic("alice", &w.password("alice")),
    );
    let url = format!("{gw}/apps/{app}/");
    std::thread::spawn(move || {
        let mut statuses = std::collections::BTreeMap::new();
        for _ in 0..50_000 {
            if stop.load(std::sync::atomic::Ordering::Relaxed) {
                break;
            }
            let r = http::request("POST", &url, &[("authorization", &auth)], b"x");
            *statuses.entry(r.status).or_default() += 1;
        }
        statuses
    })
}

#[test]
fn a_flask_app_is_built_served_rolled_out_and_rolled_back() {
    let w = Warden::demo(BIN);
    let src = fixture("flask");
    let out = push_ok(&w, "shop", src.path());
    assert!(
        out.contains("Successfully installed") && out.contains("gunicorn"),
        "{out}"
    );
    // The sandbox runs it, with each user's clearance.
    let a = answer(&w, "alice", "shop");
    assert_eq!(
        (
            a["answer"].as_str(),
            a["label"].as_str(),
            a["user"].as_str()
        ),
        (Some("hello from flask"), Some("SECRET"), Some("alice"))
    );
    assert_eq!(answer(&w, "dave", "shop")["label"], "UNCLASSIFIED");
    let inst = w
        .instances()
        .into_iter()
        .find(|i| i["app"] == "shop")
        .unwrap();
    assert!(
        inst["addr"].as_str().unwrap().starts_with("fd+unix:"),
        "a sandbox instance: {inst}"
    );

    // The same tree again builds nothing.
    let again = push_ok(&w, "shop", src.path());
    assert!(
        again.contains("built before") && !again.contains("Successfully installed"),
        "{again}"
    );

    // A changed answer rolls out under requests, with none failed.
    std::fs::write(src.path().join("answer.txt"), "hello again").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let loader = load(&w, "shop", stop.clone());
    std::thread::sleep(Duration::from_millis(300));
    let rolled = push_ok(&w, "shop", src.path());
    // The push followed the app's instances until the old one handed over.
    assert!(
        rolled.contains("rolled out: every ready instance runs this release"),
        "{rolled}"
    );
    assert_eq!(answer(&w, "alice", "shop")["answer"], "hello again");
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let statuses = loader.join().unwrap();
    assert_eq!(
        statuses.keys().copied().collect::<Vec<_>>(),
        [200],
        "{statuses:?}"
    );

    // Back to the first release's code, without a build.
    let (ok, out, err) = run(&w, &["rollback", "shop", "1"]);
    assert!(
        ok && out.contains("release 4 of shop serves") && !out.contains("pip"),
        "{out}{err}"
    );
    assert_eq!(answer(&w, "alice", "shop")["answer"], "hello from flask");
    let all = releases(&w, "shop");
    let kinds: Vec<_> = all
        .iter()
        .map(|r| {
            (
                r["number"].as_u64().unwrap(),
                r["source"]["type"].as_str().unwrap().to_owned(),
                r["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            (1, "push".into(), "released".into()),
            (2, "push".into(), "released".into()),
            (3, "push".into(), "released".into()),
            (4, "rollback".into(), "released".into())
        ]
    );
    assert_eq!(
        all[0]["slug"], all[1]["slug"],
        "the same tree, the same slug"
    );
    assert_ne!(all[0]["slug"], all[2]["slug"]);
    // The build's output is kept with its release.
    let log = w.api("GET", "/v1/apps/shop/releases/1/log", None).text();
    assert!(log.contains("Successfully installed"), "{log}");
    // Logs name the instance, label and release; a release's own come first.
    let (ok, logs, err) = run(&w, &["logs", "shop", "--release", "4", "-n", "50"]);
    assert!(ok, "{err}");
    assert!(
        logs.contains("[build r4] -----> trying release 4"),
        "{logs}"
    );
    assert!(
        logs.lines()
            .any(|l| l.contains(" SECRET r4] ") && l.contains("Booting worker")),
        "{logs}"
    );
    let (_, none, _) = run(&w, &["logs", "shop", "--release", "2"]);
    assert!(
        !none.contains("Booting worker"),
        "release 2 runs nowhere now: {none}"
    );
    let (_, show, _) = run(&w, &["apps", "show", "shop"]);
    assert!(
        show.contains("release   4 (python, rollback to 1)"),
        "{show}"
    );
}

#[test]
fn an_express_app_and_a_static_site_serve() {
    let w = Warden::demo(BIN);
    let express = fixture("express");
    let out = push_ok(&w, "api", express.path());
    assert!(out.contains("building a node app"), "{out}");
    let a = answer(&w, "bob", "api");
    assert_eq!(
        (a["answer"].as_str(), a["label"].as_str()),
        (Some("hello from express"), Some("CONFIDENTIAL"))
    );

    let site = fixture("site");
    push_ok(&w, "docs", site.path());
    let r = w.get_as("alice", &w.password("alice"), "/apps/docs/");
    assert!(
        r.text().contains("hello from a static site"),
        "{}",
        r.text()
    );
    let css = w.get_as("alice", &w.password("alice"), "/apps/docs/css/site.css");
    assert_eq!(
        (css.status, css.header("content-type")),
        (200, Some("text/css"))
    );
    assert_eq!(
        w.get_as("alice", &w.password("alice"), "/apps/docs/nope.html")
            .status,
        404
    );
    // The gateway serves it: no instance ever starts, and strangers are still refused.
    assert!(w.instances().iter().all(|i| i["app"] != "docs"));
    assert_eq!(
        http::request("GET", &format!("{}/apps/docs/", w.gateway), &[], b"").status,
        401
    );

    // A tree that would run (a Procfile) is served as files when the pusher says so.
    let both = fixture("plain");
    std::fs::write(both.path().join("index.html"), "<p>as files</p>").unwrap();
    let (ok, out, err) = push(&w, "both", both.path(), &["--kind", "static"]);
    assert!(
        ok && out.contains("a static app: nothing to build"),
        "{out}{err}"
    );
    let r = w.get_as("alice", &w.password("alice"), "/apps/both/");
    assert!(r.text().contains("as files"), "{}", r.text());
    let (ok, _, err) = push(&w, "both", both.path(), &["--kind", "cobol"]);
    assert!(!ok && err.contains("possible values"), "{err}");
}

#[test]
fn config_changes_are_releases_and_rollback_restores_them() {
    let w = Warden::demo(BIN);
    let src = fixture("plain");
    push_ok(&w, "plain", src.path());
    assert_eq!(answer(&w, "alice", "plain")["answer"], "hello from plain");
    let (ok, out, err) = run(
        &w,
        &["config", "set", "plain", "ANSWER=forty two", "MODE=x"],
    );
    assert!(
        ok && out.contains("release 2 of plain serves"),
        "{out}{err}"
    );
    assert_eq!(answer(&w, "alice", "plain")["answer"], "forty two");
    let (_, shown, _) = run(&w, &["config", "show", "plain"]);
    assert_eq!(shown, "ANSWER=forty two\nMODE=x\n");
    let (ok, _, err) = run(&w, &["config", "unset", "plain", "ANSWER"]);
    assert!(ok, "{err}");
    assert_eq!(answer(&w, "alice", "plain")["answer"], "hello from plain");
    // Rolling back to release 2 brings its config back.
    let (ok, _, err) = run(&w, &["rollback", "plain", "2"]);
    assert!(ok, "{err}");
    assert_eq!(answer(&w, "alice", "plain")["answer"], "forty two");
    // Without a number: the last release that served before the current one (3: ANSWER unset).
    let (ok, out, err) = run(&w, &["rollback", "plain"]);
    assert!(
        ok && out.contains("release 5 of plain serves"),
        "{out}{err}"
    );
    assert_eq!(answer(&w, "alice", "plain")["answer"], "hello from plain");
    let (_, list, _) = run(&w, &["releases", "plain"]);
    assert!(
        list.contains("config ANSWER,MODE")
            && list.contains("rollback to 2")
            && list.contains("rollback to 3")
            && list.contains("serving"),
        "{list}"
    );
    // Bad names are refused before anything runs.
    let (ok, _, err) = run(&w, &["config", "set", "plain", "1BAD=x"]);
    assert!(!ok && err.contains("not a usable name"), "{err}");
    assert_eq!(releases(&w, "plain").len(), 5);
    // Removing the app removes its releases: a new app of the name starts afresh.
    let (ok, _, err) = run(&w, &["apps", "rm", "plain"]);
    assert!(ok, "{err}");
    assert!(releases(&w, "plain").is_empty());
    push_ok(&w, "plain", src.path());
    assert_eq!(releases(&w, "plain")[0]["number"], 1);
    assert_eq!(answer(&w, "alice", "plain")["answer"], "hello from plain");
}

#[test]
fn a_failing_start_or_build_leaves_the_serving_release() {
    let w = Warden::demo(BIN);
    let good = fixture("plain");
    push_ok(&w, "app", good.path());

    // Its instance exits at start: the pusher sees why, and nothing changes for users.
    let broken = fixture("broken");
    let (ok, _, err) = push(&w, "app", broken.path(), &[]);
    assert!(!ok, "a release that does not start must fail the push");
    assert!(
        err.contains("exited before it was ready")
            && err.contains("boom: no DATABASE_URL")
            && err.contains("keeps serving"),
        "{err}"
    );
    assert_eq!(answer(&w, "alice", "app")["answer"], "hello from plain");

    // A build that fails shows its last lines.
    let bad = fixture("plain");
    std::fs::write(
        bad.path().join("requirements.txt"),
        "-e /nonexistent-warden-package\n",
    )
    .unwrap();
    let (ok, out, err) = push(&w, "app", bad.path(), &[]);
    assert!(
        !ok && err.contains("the build failed") && out.contains("nonexistent-warden-package"),
        "{out}{err}"
    );
    // Its output streamed above the error; the error does not print it again.
    assert!(
        !err.contains("nonexistent-warden-package") && err.contains("last lines are above"),
        "{err}"
    );
    assert_eq!(answer(&w, "alice", "app")["answer"], "hello from plain");
    let statuses: Vec<_> = releases(&w, "app")
        .iter()
        .map(|r| r["status"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(statuses, ["released", "failed", "failed"]);
    let spec = w.api("GET", "/v1/apps/app", None).json();
    assert_eq!(spec["release"]["number"], 1);

    let (_, show, _) = run(&w, &["apps", "show", "app"]);
    assert!(
        show.contains("last deploy  release 3 failed: the build failed"),
        "{show}"
    );

    // An app that crashes at start shows in `instances list --all`, with how it ended.
    let (ok, _, err) = run(
        &w,
        &[
            "apps",
            "create",
            "crashy",
            "--",
            "/bin/sh",
            "-c",
            "echo dying; exit 4",
        ],
    );
    assert!(ok, "{err}");
    assert_ne!(
        w.get_as("alice", &w.password("alice"), "/apps/crashy/")
            .status,
        200
    );
    // The node writes its health record within a moment.
    let list = wait_until("the crash listed", Duration::from_secs(20), || {
        let (ok, list, _) = run(&w, &["instances", "list", "--all"]);
        (ok && list.contains("crashy")).then_some(list)
    });
    assert!(
        list.contains("crashy") && list.contains("exit status: 4") && list.contains("  dying"),
        "{list}"
    );
    let (_, plain, _) = run(&w, &["instances", "list"]);
    assert!(!plain.contains("crashy"), "{plain}");

    // Rolling back to a failed release is refused.
    let (ok, _, err) = run(&w, &["rollback", "app", "2"]);
    assert!(!ok && err.contains("never served"), "{err}");
}

#[test]
fn a_build_that_runs_too_long_is_stopped() {
    let w = Launch::new(BIN).arg("--build-timeout").arg("2").start();
    let dir = tempfile::tempdir().unwrap();
    // npm runs the package's own install scripts: a build step that never ends.
    let pkg = r#"{"name":"slow","version":"1.0.0","scripts":{"preinstall":"sleep 600","start":"node x.js"}}"#;
    std::fs::write(dir.path().join("package.json"), pkg).unwrap();
    let started = std::time::Instant::now();
    let (ok, _, err) = push(&w, "slow", dir.path(), &[]);
    assert!(!ok && err.contains("ran out of its 2 s"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(120));
}

#[test]
fn bad_uploads_get_a_clear_4xx() {
    let w = Launch::new(BIN).arg("--max-upload-mb").arg("1").start();
    let post = |query: &str, body: &[u8]| {
        http::request(
            "POST",
            &format!("{}/v1/apps/x/releases{query}", w.api),
            &[("authorization", &format!("Bearer {}", w.token))],
            body,
        )
    };
    let r = post("", b"this is not an archive");
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text().contains("not a readable gzip'd tar") || r.text().contains("not a gzip'd tar"),
        "{}",
        r.text()
    );
    let r = post("", b"");
    assert_eq!(r.status, 400);
    let r = post("?kind=cobol", b"x");
    assert!(
        r.status == 400 && r.text().contains("python, node, static, procfile"),
        "{}",
        r.text()
    );
    let r = post("", &traversal_archive());
    assert!(
        // warden's own check's wording: the tar crate refuses `..` too, in other words.
        r.status == 400 && r.text().contains("climbs out of the archive"),
        "{}",
        r.text()
    );
    let r = http::request(
        "POST",
        &format!("{}/v1/apps/x/releases", w.api),
        &[("authorization", "Bearer wrong")],
        b"x",
    );
    assert_eq!(r.status, 401);

    // More than the limit, through the CLI: 413, and the CLI says what to do.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("index.html"), "hi").unwrap();
    // Noise gzip cannot shrink: xorshift bytes.
    let mut x = 0x2545_f491_4f6c_dd1d_u64;
    let noise: Vec<u8> = (0..3_000_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(dir.path().join("blob.bin"), noise).unwrap();
    let (ok, _, err) = push(&w, "x", dir.path(), &[]);
    assert!(!ok && err.contains("larger than this API takes"), "{err}");
    // A client that sends it anyway gets 413 before its body is read.
    let host = w.api.trim_start_matches("http://");
    let wire = format!(
        "POST /v1/apps/x/releases HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {}\r\ncontent-length: 2000000\r\n\r\nx",
        w.token
    );
    let r = http::raw(host, wire.as_bytes());
    assert_eq!(r.status, 413, "{}", r.text());
    // Nothing was made, and no upload is left behind.
    assert!(releases(&w, "x").is_empty());
    let uploads = std::fs::read_dir(w.dir.join("uploads"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(uploads, 0);
}

/// A gzip'd tar whose one entry climbs out with `..`.
fn traversal_archive() -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.set_size(1);
    h.set_mode(0o644);
    h.set_entry_type(tar::EntryType::Regular);
    let name = b"../../escaped";
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.set_cksum();
    let mut b = tar::Builder::new(Vec::new());
    b.append(&h, &b"x"[..]).unwrap();
    let tar = b.into_inner().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &tar).unwrap();
    gz.finish().unwrap()
}

#[test]
fn an_app_made_again_under_a_removed_ones_name_has_only_its_own_release_logs() {
    let w = Warden::demo(BIN);
    let site = fixture("site");
    let log = |w: &Warden| w.api("GET", "/v1/apps/again/releases/1/log", None).text();
    push_ok(&w, "again", site.path());
    let first = log(&w);
    assert!(first.contains("a static app: nothing to build"), "{first}");
    assert_eq!(w.api("DELETE", "/v1/apps/again", None).status, 204);
    // Named the long way round: the release records the directory as the kernel resolves it.
    let name = site.path().file_name().unwrap();
    let roundabout = site.path().join(".").join("..").join(name);
    push_ok(&w, "again", &roundabout);
    let from = releases(&w, "again")[0]["source"]["from"].clone();
    let canonical = site.path().canonicalize().unwrap();
    assert_eq!(from, canonical.display().to_string());
    // The second delivery reuses the slug: its log says so, and nothing of the first's.
    let second = log(&w);
    assert!(
        second.contains("reusing its slug") && !second.contains("nothing to build"),
        "release 1 of the new app logs its own delivery only:\n{second}"
    );
    // Neither push replaced an instance (a static site has none): neither waited for the
    // gateway to apply a revision its view of instances never sees.
    assert!(
        !w.stderr().contains("has not applied a write yet"),
        "a push waited out the sync's bound:\n{}",
        w.stderr()
    );
}

#[test]
fn a_git_commit_is_pushed() {
    let w = Warden::demo(BIN);
    let repo = fixture("plain");
    let git = |args: &[&str]| {
        let s = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@example.com", "-C"])
            .arg(repo.path())
            .args(args)
            .output()
            .unwrap();
        assert!(s.status.success(), "{}", String::from_utf8_lossy(&s.stderr));
        String::from_utf8_lossy(&s.stdout).trim().to_owned()
    };
    git(&["init", "--quiet"]);
    git(&["add", "."]);
    git(&["commit", "--quiet", "-m", "first"]);
    let first = git(&["rev-parse", "HEAD"]);
    std::fs::write(
        repo.path().join("Procfile"),
        "web: python3 nonexistent.py\n",
    )
    .unwrap();
    git(&["commit", "--quiet", "-am", "broken"]);
    // The named commit, not the working tree or the branch's tip.
    let url = repo.path().display().to_string();
    let (ok, out, err) = run(&w, &["push", "g", "--git", &url, "--ref", &first]);
    assert!(ok, "{out}{err}");
    assert_eq!(answer(&w, "carol", "g")["label"], "TOP SECRET");
    let r = &releases(&w, "g")[0];
    assert_eq!(r["source"]["from"], format!("{url}@{first}"));
}

#[test]
fn a_release_runs_on_nodes_that_did_not_build_it() {
    let cluster = warden_test_support::etcd::EtcdCluster::start(1);
    let load = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        load.path(),
        r#"{"memory_used": 0.1, "cpu_busy": 0.1, "load_per_core": 0.1}"#,
    )
    .unwrap();
    let alpha = Launch::new(BIN)
        .arg("--store")
        .arg(&cluster.url())
        .arg("--node-name")
        .arg("alpha")
        .arg("--roles")
        .arg("gateway,api,agent")
        .arg("--advertise")
        .arg("127.0.0.1:0")
        .arg("--load-file")
        .arg(&load.path().display().to_string())
        .start();
    let beta = crate::healing::agent(&cluster, &alpha, "beta", "127.0.0.2:0", &[]);
    let src = fixture("plain");
    push_ok(&alpha, "plain", src.path());
    let (ok, _, err) = run(&alpha, &["apps", "scale", "plain", "SECRET=2"]);
    assert!(ok, "{err}");
    // One on each node: beta runs a slug it fetched from alpha over the node port.
    let on = wait_until(
        "one ready instance on each node",
        Duration::from_secs(60),
        || {
            let nodes: std::collections::BTreeSet<String> = alpha
                .instances()
                .iter()
                .filter(|i| i["app"] == "plain" && i["state"] == "ready")
                .map(|i| i["node"].as_str().unwrap().to_owned())
                .collect();
            (nodes.len() == 2).then_some(nodes)
        },
    );
    assert!(on.contains("beta"), "{on:?}");
    let slug = alpha.api("GET", "/v1/apps/plain", None).json()["release"]["slug"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(beta
        .dir
        .join("slugs")
        .join(&slug)
        .join("app/server.py")
        .is_file());
    // Both serve alice, whichever the gateway picks.
    for _ in 0..6 {
        assert_eq!(
            answer(&alpha, "alice", "plain")["answer"],
            "hello from plain"
        );
    }
    // A config change rolls out on both nodes, from the same slug.
    let (ok, _, err) = run(&alpha, &["config", "set", "plain", "ANSWER=everywhere"]);
    assert!(ok, "{err}");
    for _ in 0..6 {
        assert_eq!(answer(&alpha, "alice", "plain")["answer"], "everywhere");
    }
}

#[test]
fn a_build_writes_only_its_own_tree() {
    let w = Warden::demo(BIN);
    let dir = tempfile::tempdir().unwrap();
    let outside = w.dir.join("planted-by-a-build");
    // npm runs the package's own install scripts: hostile code at build time.
    let script = format!(
        "touch {} || true; touch /etc/planted-by-a-build || true; touch ../beside-the-tree || true; echo built > inside.txt",
        outside.display()
    );
    let pkg = json!({
        "name": "hostile",
        "version": "1.0.0",
        "scripts": {
            "preinstall": script,
            // It answers what its build left, and whether it can change its own code.
            "start": "node -e \"const fs=require('fs');let w='no';try{fs.writeFileSync('x','1');w='yes'}catch(e){}require('http').createServer((q,r)=>r.end(JSON.stringify({answer:fs.readFileSync('inside.txt','utf8').trim(),writable:w}))).listen(+process.env.PORT,'127.0.0.1')\""
        }
    });
    std::fs::write(dir.path().join("package.json"), pkg.to_string()).unwrap();
    push_ok(&w, "hostile", dir.path());
    let a = answer(&w, "alice", "hostile");
    assert_eq!(a["answer"], "built");
    assert_eq!(a["writable"], "no", "an instance sees its slug read-only");
    let slug = w.api("GET", "/v1/apps/hostile", None).json()["release"]["slug"]
        .as_str()
        .unwrap()
        .to_owned();
    let home = w.dir.join("slugs").join(&slug);
    assert!(home.join("app/inside.txt").is_file());
    assert!(!outside.exists() && !Path::new("/etc/planted-by-a-build").exists());
    assert!(!home.join("beside-the-tree").exists());
    // The built tree is warden's and nobody else may change it.
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(home.join("app/inside.txt")).unwrap();
    assert_eq!(m.uid(), nix::unistd::geteuid().as_raw());
    assert_eq!(m.mode() & 0o022, 0, "mode {:o}", m.mode());
}

/// A Node app whose build takes `secs` (its own install script sleeps) and which answers its
/// config var ANSWER, or `default`.
fn slow_node_app(secs: u32, default: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let start = format!(
        "node -e \"require('http').createServer((q,r)=>r.end(JSON.stringify({{answer:process.env.ANSWER||'{default}'}}))).listen(+process.env.PORT,'127.0.0.1')\""
    );
    let pkg = json!({
        "name": "slow",
        "version": "1.0.0",
        "scripts": { "preinstall": format!("sleep {secs}"), "start": start }
    });
    std::fs::write(dir.path().join("package.json"), pkg.to_string()).unwrap();
    dir
}

#[test]
fn a_late_build_never_undoes_what_happened_meanwhile() {
    let w = Warden::demo(BIN);
    let plain = fixture("plain");
    push_ok(&w, "app", plain.path());

    // A change made while a push builds stays.
    let slow = slow_node_app(3, "slow");
    let (dir, data) = (slow.path().to_owned(), w.dir.display().to_string());
    let pushing = std::thread::spawn(move || {
        let d = dir.display().to_string();
        cli(BIN, &["push", "app", &d, "--data-dir", &data], &[])
    });
    std::thread::sleep(Duration::from_millis(1500));
    let (ok, _, err) = run(&w, &["apps", "update", "app", "--env", "ANSWER=kept"]);
    assert!(ok, "{err}");
    let (ok, out, err) = pushing.join().unwrap();
    assert!(ok, "{out}{err}");
    assert_eq!(answer(&w, "alice", "app")["answer"], "kept");

    // An older release that finishes after a newer one is not applied.
    let slower = slow_node_app(4, "older");
    let (dir, data) = (slower.path().to_owned(), w.dir.display().to_string());
    let pushing = std::thread::spawn(move || {
        let d = dir.display().to_string();
        cli(BIN, &["push", "app", &d, "--data-dir", &data], &[])
    });
    std::thread::sleep(Duration::from_millis(1500));
    push_ok(&w, "app", plain.path());
    let (ok, _, err) = pushing.join().unwrap();
    assert!(
        !ok && err.contains("serves already, made after this one"),
        "{err}"
    );
    assert_eq!(answer(&w, "alice", "app")["answer"], "kept");
    let spec = w.api("GET", "/v1/apps/app", None).json();
    assert_eq!(spec["release"]["number"], 4);
}
