//! A cluster's audit logs read and verified together (issue 35), on a real etcd: two nodes each
//! keep their own log; one node's API lists the records of both, merged by time, and verifies
//! both logs; a line edited in the other node's log fails verify naming that node, file and
//! line; `--follow` through one node prints another's new records; a node that stops is
//! recorded as lost by the one that saw it go, and verify says it cannot be reached rather than
//! skipping it; a gateway-only node's log (the sign-ins its gateway decided) is read and
//! verified through another node's API like the rest.

use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;
use warden_test_support::etcd::EtcdCluster;
use warden_test_support::http::basic;
use warden_test_support::{cli, request, wait_until, Warden};

use crate::cluster::{join_token, leased_node, nodes};
use crate::BIN;

/// Every node's lease.
const LEASE: &str = "10s";

fn run(w: &Warden, args: &[&str]) -> (bool, String, String) {
    let env = [
        ("WARDEN_API", w.api.as_str()),
        ("WARDEN_TOKEN", w.token.as_str()),
    ];
    cli(BIN, args, &env)
}

/// The records `warden audit --json` lists through `w`'s API, with `args` added.
fn records(w: &Warden, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["audit", "--json", "--limit", "10000"];
    all.extend_from_slice(args);
    let (ok, out, err) = run(w, &all);
    assert!(ok, "{err}");
    serde_json::from_str(&out).expect("--json prints JSON")
}

/// `warden audit --follow --json` through `w`'s API, its lines as they come (the child is
/// killed when the guard drops).
fn follow(w: &Warden) -> (ChildGuard, mpsc::Receiver<String>) {
    let mut child = Command::new(BIN)
        .args(["audit", "--follow", "--json", "--limit", "1"])
        .env_remove("WARDEN_CONFIG")
        .env_remove("WARDEN_DATA_DIR")
        .env("XDG_CONFIG_HOME", "/nonexistent-warden-test")
        .env("WARDEN_API", &w.api)
        .env("WARDEN_TOKEN", &w.token)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("warden audit --follow runs");
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    (ChildGuard(child), rx)
}

/// The first line `lines` brings that is the `201` change of `app`; each record printed once
/// (`printed`: those so far, by node and seq).
fn printed_change(
    lines: &mpsc::Receiver<String>,
    app: &str,
    printed: &mut std::collections::BTreeSet<(String, u64)>,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(line) = lines.recv_timeout(left) else {
            panic!("--follow never printed the change of {app}: {seen:#?}");
        };
        let r: Value = serde_json::from_str(&line).expect("--follow --json prints JSON lines");
        let at = (
            r["node"].as_str().unwrap().to_owned(),
            r["seq"].as_u64().unwrap(),
        );
        assert!(printed.insert(at), "--follow printed a record twice: {r}");
        if r["event"]["target"] == app && r["event"]["outcome"] == "201" {
            return r;
        }
        seen.push(r);
    }
}

struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The only segment of the log under data dir `dir`.
fn segment(dir: &Path) -> PathBuf {
    let mut segs: Vec<_> = std::fs::read_dir(dir.join("audit"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    assert_eq!(segs.len(), 1, "{segs:?}");
    segs.pop().unwrap()
}

/// A failed sign-in through `w`'s gateway, as `user`.
fn sign_in_fails(w: &Warden, user: &str) {
    let url = format!("{}/apps/nothing/", w.gateway);
    let r = request(
        "GET",
        &url,
        &[("authorization", &basic(user, "not the password"))],
        b"",
    );
    assert_eq!(r.status, 401, "{}", r.text());
}

#[test]
fn one_api_reads_and_verifies_every_nodes_log_and_a_lost_node_is_recorded_and_not_skipped() {
    let cluster = EtcdCluster::start(1);
    let flush = ["--audit-flush-ms", "500"];
    // Leases long enough that a loaded machine's late heartbeat loses no node; a clean stop
    // deregisters at once anyway.
    let alpha = leased_node(&cluster, "alpha", LEASE, &flush).start();
    let token = join_token(&alpha);
    let mut beta = leased_node(
        &cluster,
        "beta",
        LEASE,
        &["--join-token-file", &token, "--audit-flush-ms", "500"],
    )
    .start();
    wait_until("both nodes live", Duration::from_secs(20), || {
        (nodes(&alpha).len() == 2).then_some(())
    });

    both_nodes_records_through_one_api(&alpha, &beta);
    follow_through_one_api(&alpha, &beta);
    // Both logs verify through alpha's API.
    let (ok, out, err) = run(&alpha, &["audit", "verify"]);
    assert!(ok, "verify fails on untouched logs: {out}{err}");
    for n in ["alpha", "beta"] {
        assert!(out.contains(&format!("node {n} is whole")), "{out}");
    }

    an_edit_in_the_other_nodes_log_fails_verify(&alpha, &beta);

    // Beta stops: alpha records it lost, and verify says beta cannot be reached.
    beta.stop();
    wait_until("alpha records beta lost", Duration::from_secs(20), || {
        records(&alpha, &["--node", "alpha", "--kind", "node"])
            .iter()
            .any(|r| r["event"]["event"] == "lost" && r["event"]["node"] == "beta")
            .then_some(())
    });
    let (ok, out, err) = run(&alpha, &["audit", "verify"]);
    assert!(!ok, "verify passes with beta not live: {out}");
    assert!(
        err.contains("node beta was not checked") && err.contains("cannot be reached"),
        "{err}"
    );

    a_gateway_only_nodes_log_is_read_and_verified_with_the_rest(&cluster, &alpha, &token);
}

/// A request through each node's gateway and a change through each node's API; through
/// alpha's API alone, both nodes' records, each naming its node, merged by time.
fn both_nodes_records_through_one_api(alpha: &Warden, beta: &Warden) {
    // A request through each node's gateway and a change through each node's API.
    for (w, name) in [(alpha, "alpha"), (beta, "beta")] {
        sign_in_fails(w, &format!("intruder-{name}"));
        let app = format!("app-{name}");
        let (ok, _, err) = run(w, &["apps", "create", &app, "--", BIN, "demo-app"]);
        assert!(ok, "{err}");
    }

    let listed = wait_until(
        "both nodes' sign-ins and changes listed through one API",
        Duration::from_secs(20),
        || {
            let all = records(alpha, &[]);
            let has = |node: &str, f: &dyn Fn(&Value) -> bool| {
                all.iter().any(|r| r["node"] == node && f(&r["event"]))
            };
            let wanted = ["alpha", "beta"].iter().all(|n| {
                // A name no user has is recorded as "(unknown)", never as given.
                has(n, &|e| e["kind"] == "sign_in" && e["user"] == "(unknown)")
                    && has(n, &|e| {
                        e["target"] == format!("app-{n}") && e["outcome"] == "201"
                    })
            });
            wanted.then_some(all)
        },
    );
    let times: Vec<u64> = listed
        .iter()
        .map(|r| r["at_ms"].as_u64().unwrap())
        .collect();
    assert!(times.is_sorted(), "records are merged by time: {times:?}");
    // Alpha saw beta join, in its own log.
    let alpha_nodes = records(alpha, &["--node", "alpha", "--kind", "node"]);
    assert!(
        alpha_nodes
            .iter()
            .any(|r| r["event"]["event"] == "joined" && r["event"]["node"] == "beta"),
        "{alpha_nodes:#?}"
    );
    assert!(alpha_nodes.iter().all(|r| r["node"] == "alpha"));
    let (ok, out, err) = run(alpha, &["audit"]);
    assert!(
        ok && out.contains(" beta ") && out.contains(" alpha "),
        "{out}{err}"
    );
}

/// Following through alpha's API: changes made through beta's come as they are made, the
/// first from where the follower began, the next after beta's last record printed; each
/// record printed once.
fn follow_through_one_api(alpha: &Warden, beta: &Warden) {
    let (following, lines) = follow(alpha);
    let mut printed = std::collections::BTreeSet::new();
    for app in ["app-followed", "app-followed-next"] {
        let (ok, _, err) = run(beta, &["apps", "create", app, "--", BIN, "demo-app"]);
        assert!(ok, "{err}");
        let followed = printed_change(&lines, app, &mut printed);
        assert_eq!(followed["node"], "beta", "{followed}");
    }
    drop(following);
}

/// Someone edits beta's log in place (beta runs on: verify reads the file), same length:
/// verify through alpha fails naming beta, the file and the line.
fn an_edit_in_the_other_nodes_log_fails_verify(alpha: &Warden, beta: &Warden) {
    let seg = segment(&beta.dir);
    let text = std::fs::read_to_string(&seg).unwrap();
    let at = text
        .lines()
        .position(|l| l.contains("\"outcome\":\"201\"") && l.contains("\"app-beta\""))
        .expect("beta's change is in its log");
    let offset = text.lines().take(at).map(|l| l.len() + 1).sum::<usize>();
    let line = text.lines().nth(at).unwrap();
    let name_at = offset + line.find("\"app-beta\"").unwrap();
    let mut f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
    f.seek(SeekFrom::Start(name_at as u64)).unwrap();
    f.write_all(b"\"app-xeta\"").unwrap();
    drop(f);
    let file = seg.file_name().unwrap().to_string_lossy().into_owned();
    let spot = format!("edited at {file} line {}", at + 1);
    let (ok, out, err) = run(alpha, &["audit", "verify"]);
    assert!(!ok, "verify passes with beta's log edited: {out}");
    assert!(
        err.contains("node beta") && err.contains(&spot),
        "verify must name beta and {spot:?}: {err}"
    );
    assert!(out.contains("node alpha is whole"), "{out}");
}

/// A node without the agent (gateway only) serves its node port for its log all the same: the
/// sign-ins its gateway decided are read through another node's API, and verified with the rest.
fn a_gateway_only_nodes_log_is_read_and_verified_with_the_rest(
    cluster: &EtcdCluster,
    alpha: &Warden,
    token: &str,
) {
    let gamma = leased_node(
        cluster,
        "gamma",
        LEASE,
        &[
            "--roles",
            "gateway",
            "--join-token-file",
            token,
            "--audit-flush-ms",
            "500",
        ],
    )
    .start();
    wait_until("gamma live", Duration::from_secs(20), || {
        nodes(alpha).contains_key("gamma").then_some(())
    });
    let url = format!("{}/apps/nothing/", gamma.gateway);
    let r = request(
        "GET",
        &url,
        &[("authorization", &basic("mallory", "guess"))],
        b"",
    );
    assert_eq!(r.status, 401, "{}", r.text());
    let seen = wait_until(
        "gamma's sign-in read through alpha",
        Duration::from_secs(30),
        || {
            records(alpha, &["--kind", "sign_in"])
                .into_iter()
                .find(|r| r["node"] == "gamma" && r["event"]["user"] == "(unknown)")
        },
    );
    assert_eq!(seen["event"]["outcome"], "failed", "{seen}");
    let v = alpha.api("GET", "/v1/audit/verify", None).json();
    let by_node: Vec<(&str, bool)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["node"].as_str().unwrap(), v["ok"].as_bool().unwrap()))
        .collect();
    assert_eq!(
        by_node,
        [("alpha", true), ("beta", false), ("gamma", true)],
        "{v}"
    );
}
