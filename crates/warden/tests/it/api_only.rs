//! A cluster whose API runs on a node without the agent (issue 33): pushes, config changes and
//! rollbacks through it are made on an agent node, which delivers them (its name in their
//! records) and resumes them after a crash; the API node relays what that node answers.

use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use warden_test_support::etcd::EtcdCluster;
use warden_test_support::{cli, wait_until, Warden};

use crate::cluster::{demo_node, join_token, leased_node, nodes};
use crate::interrupted::data_dir;
use crate::BIN;

/// The dependency-free Python app that answers its `ANSWER` config var; with
/// `requirements.txt` when `slow` (its build then makes a virtual environment, which takes
/// seconds: long enough to be killed in).
fn plain(slow: bool) -> tempfile::TempDir {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/apps/plain");
    let dir = tempfile::tempdir().unwrap();
    for f in ["server.py", "Procfile"] {
        std::fs::copy(from.join(f), dir.path().join(f)).unwrap();
    }
    if slow {
        std::fs::write(dir.path().join("requirements.txt"), "# nothing\n").unwrap();
    }
    dir
}

/// The CLI against `w`'s API.
fn run(w: &Warden, args: &[&str]) -> (bool, String, String) {
    let dir = w.dir.display().to_string();
    let mut all = args.to_vec();
    all.extend(["--data-dir", &dir]);
    cli(BIN, &all, &[])
}

/// What `app` answers alice at `w`'s gateway.
fn answer(w: &Warden, pw: &str, app: &str) -> Value {
    let got = w.get_as("alice", pw, &format!("/apps/{app}/"));
    assert_eq!(got.status, 200, "{}", got.text());
    got.json()["answer"].clone()
}

fn releases(w: &Warden, app: &str) -> Vec<Value> {
    let r = w.api("GET", &format!("/v1/apps/{app}/releases"), None);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json().as_array().unwrap().clone()
}

/// A push of bytes that are no archive, to `w`'s API: status and body.
fn bad_push(w: &Warden) -> (u16, String) {
    let r = warden_test_support::http::request(
        "POST",
        &format!("{}/v1/apps/plain/releases", w.api),
        &[("authorization", &format!("Bearer {}", w.token))],
        b"not even an archive",
    );
    (r.status, r.text())
}

/// Pushes `src` as `plain` through `front` in a thread of its own; the CLI's outcome comes on
/// the channel.
fn push_in_background(front: &Warden, src: &Path) -> mpsc::Receiver<(bool, String, String)> {
    let (dir, src) = (front.dir.display().to_string(), src.display().to_string());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(cli(BIN, &["push", "plain", &src, "--data-dir", &dir], &[]));
    });
    rx
}

/// Waits until release `number` of `plain` is being built, as its log says (read through
/// `front`).
fn wait_for_build(front: &Warden, number: u64) {
    wait_until(
        &format!("release {number} to be built on the builder"),
        Duration::from_secs(180),
        || {
            let r = releases(front, "plain")
                .into_iter()
                .find(|r| r["number"] == number)?;
            let path = format!("/v1/apps/plain/releases/{number}/log");
            let log = front.api("GET", &path, None).text();
            (r["status"] == "received" && log.contains("building a python app")).then_some(())
        },
    )
}

/// Waits until release `number` of `plain` has ended, and asserts it released by the builder.
fn assert_released(front: &Warden, number: u64) {
    let r = wait_until(
        &format!("release {number} to end"),
        Duration::from_secs(180),
        || {
            let r = releases(front, "plain")
                .into_iter()
                .find(|r| r["number"] == number)?;
            ["released", "failed"]
                .contains(&r["status"].as_str()?)
                .then_some(r)
        },
    );
    assert_eq!(r["status"], "released", "{r}");
    assert_eq!(r["node"], "builder", "delivered where it was built: {r}");
}

/// A push, a config change and a rollback through `front`, each delivered by the builder.
fn push_config_and_rollback(front: &Warden, pw: &str) {
    let src = plain(false);
    let (ok, out, err) = run(front, &["push", "plain", src.path().to_str().unwrap()]);
    assert!(
        ok && out.contains("release 1 of plain serves"),
        "{out}{err}"
    );
    assert_eq!(answer(front, pw, "plain"), "hello from plain");
    let (ok, out, err) = run(front, &["config", "set", "plain", "ANSWER=forty two"]);
    assert!(
        ok && out.contains("release 2 of plain serves"),
        "{out}{err}"
    );
    assert_eq!(answer(front, pw, "plain"), "forty two");
    let (ok, out, err) = run(front, &["rollback", "plain", "1"]);
    assert!(
        ok && out.contains("release 3 of plain serves"),
        "{out}{err}"
    );
    assert_eq!(answer(front, pw, "plain"), "hello from plain");
    let made = releases(front, "plain");
    assert_eq!(made.len(), 3, "{made:?}");
    for r in &made {
        assert_eq!(r["status"], "released", "{r}");
        assert_eq!(r["node"], "builder", "delivered where it was built: {r}");
    }
}

/// What the builder refuses before anything runs comes back through `front` as it said it.
fn refusals_come_back_as_given(front: &Warden, builder: &Warden) {
    let (status, text) = bad_push(front);
    assert_eq!((status, &text), (400, &bad_push(builder).1), "{text}");
    // An upload the API node takes but the builder does not: the builder refuses it before
    // reading it, and its answer still reaches the pusher whole.
    let big: Vec<u8> = (0..3u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let r = warden_test_support::http::request(
        "POST",
        &format!("{}/v1/apps/plain/releases", front.api),
        &[("authorization", &format!("Bearer {}", front.token))],
        &big,
    );
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(r.text().contains("--max-upload-mb"), "{}", r.text());
    assert_eq!(releases(front, "plain").len(), 3);
}

#[test]
fn an_api_node_without_the_agent_has_releases_made_and_resumed_on_an_agent_node() {
    let cluster = EtcdCluster::start(1);
    let front = demo_node(&cluster, "front", "gateway,api");
    let pw = front.password("alice");
    let token = join_token(&front);
    let tmp = tempfile::tempdir().unwrap();
    let data = data_dir(&tmp);
    let builder = || {
        leased_node(
            &cluster,
            "builder",
            "2s",
            // Less than the API node takes: the builder's own bound holds.
            &["--join-token-file", &token, "--max-upload-mb", "1"],
        )
        .data_dir(&data)
    };
    let mut b = builder().start();
    wait_until(
        "the builder's node port listed",
        Duration::from_secs(30),
        || {
            nodes(&front)
                .get("builder")?
                .get("advertise")?
                .as_str()
                .map(drop)
        },
    );
    push_config_and_rollback(&front, &pw);
    refusals_come_back_as_given(&front, &b);

    // The builder killed in a build asked through the API node: the pusher hears that it was
    // lost and what becomes of the release; started again, it builds and releases it.
    let slow = plain(true);
    let pushing = push_in_background(&front, slow.path());
    wait_for_build(&front, 4);
    b.signal_and_wait(Signal::SIGKILL);
    let (ok, out, err) = pushing.recv().unwrap();
    assert!(
        !ok && err.contains("node builder was lost")
            && err.contains("resumes or fails it")
            && err.contains("`warden releases plain`"),
        "{out}{err}"
    );
    wait_until(
        "the killed builder's lease to end",
        Duration::from_secs(30),
        || (!nodes(&front).contains_key("builder")).then_some(()),
    );
    // No agent node is live: the API node says so, and keeps no upload.
    let (status, text) = bad_push(&front);
    assert_eq!(status, 503, "{text}");
    assert!(
        text.contains("no agent node of the cluster is live"),
        "{text}"
    );
    let left = std::fs::read_dir(front.dir.join("uploads")).map_or(0, |d| d.count());
    assert_eq!(left, 0, "the API node keeps no upload");
    let b = builder().start();
    assert_released(&front, 4);
    // Its log, kept where it was built, read through the API node.
    let log = front
        .api("GET", "/v1/apps/plain/releases/4/log", None)
        .text();
    assert!(
        log.contains("building a python app") && log.contains("warden started again"),
        "{log}"
    );
    let spec = front.api("GET", "/v1/apps/plain", None).json();
    assert_eq!(spec["release"]["number"], 4, "{spec}");
    assert_eq!(answer(&front, &pw, "plain"), "hello from plain");

    // The builder frozen in a build (SIGSTOP) keeps its connection open; once its lease ends,
    // the pusher hears it lost, instead of waiting for ever. Thawed, it delivers the release.
    // Back to release 1 (no Python) first, so that the next build makes its venv from nothing
    // and takes seconds, rather than starting from the serving release's.
    let (ok, out, err) = run(&front, &["rollback", "plain", "1"]);
    assert!(
        ok && out.contains("release 5 of plain serves"),
        "{out}{err}"
    );
    std::fs::write(slow.path().join("again.txt"), "a new archive: built again").unwrap();
    let pushing = push_in_background(&front, slow.path());
    wait_for_build(&front, 6);
    let pid = Pid::from_raw(b.pid() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    // Far beyond the 2 s lease; without the check the push would wait as long as the freeze.
    let heard = pushing.recv_timeout(Duration::from_secs(120));
    kill(pid, Signal::SIGCONT).unwrap();
    let (ok, out, err) = heard.expect("the push ended while its builder was frozen");
    assert!(
        !ok && err.contains("node builder was lost") && err.contains("lease ended"),
        "{out}{err}"
    );
    assert_released(&front, 6);
}
