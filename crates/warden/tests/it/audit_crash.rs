//! `kill -9` under load loses no acknowledged audit record (issue 35), through the real binary.
//! A few threads drive bounded load against `warden up` (a short `--audit-flush-ms`): API
//! changes (apps created and deleted: each one whose 2xx the client read is acknowledged) and
//! signed-in gateway requests. warden is SIGKILLed mid-load and started again on the same data
//! dir; then every acknowledged change has its `change` record, every access record read
//! before the kill is still there, the new run's first record is a `gap` saying the previous
//! run did not stop, and `audit verify` passes across the crash.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use warden_test_support::http::basic;
use warden_test_support::{cli, wait_until, Launch, Warden};

use crate::BIN;

const PASSWORD: &str = "correct horse battery";

/// Each load thread stops after this many requests, or at [`LOAD_LIMIT`].
const MAX_REQUESTS: usize = 2_000;
/// No load loop runs longer than this.
const LOAD_LIMIT: Duration = Duration::from_secs(90);

/// One request that never panics: the status, or `None` when warden died under it (then the
/// request is not acknowledged, whatever warden did with it).
fn try_request(url: &str, method: &str, headers: &[(&str, &str)], body: &str) -> Option<u16> {
    let rest = url.strip_prefix("http://")?;
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut s = TcpStream::connect(host).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {host}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (n, v) in headers {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    head.push_str(body);
    s.write_all(head.as_bytes()).ok()?;
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).ok()?;
    // A whole answer only: a status line alone, cut by the kill, acknowledges nothing.
    let text = String::from_utf8_lossy(&answer);
    let (head, _) = text.split_once("\r\n\r\n")?;
    head.split(' ').nth(1)?.parse().ok()
}

/// An acknowledged change: the app's name and the method (`POST`: its create, `DELETE`).
type Acked = Mutex<Vec<(String, &'static str)>>;

/// Creates and deletes apps `<prefix>-<i>` until `stop`, adding each acknowledged one to `acked`.
fn api_load(w: &Warden, prefix: &str, stop: &AtomicBool, acked: &Acked) {
    let bearer = format!("Bearer {}", w.token);
    let headers = [
        ("authorization", bearer.as_str()),
        ("content-type", "application/json"),
    ];
    let start = Instant::now();
    for i in 0..MAX_REQUESTS {
        if stop.load(Ordering::Relaxed) || start.elapsed() > LOAD_LIMIT {
            break;
        }
        let name = format!("{prefix}-{i}");
        let spec = json!({ "name": name, "command": ["/bin/true"] }).to_string();
        match try_request(&format!("{}/v1/apps", w.api), "POST", &headers, &spec) {
            Some(s) if (200..300).contains(&s) => {
                acked.lock().unwrap().push((name.clone(), "POST"))
            }
            _ => continue,
        }
        let url = format!("{}/v1/apps/{name}", w.api);
        if try_request(&url, "DELETE", &headers, "").is_some_and(|s| (200..300).contains(&s)) {
            acked.lock().unwrap().push((name, "DELETE"));
        }
    }
}

/// Signed-in requests to `labs` as `ann` until `stop`; how many were answered 200.
fn gateway_load(w: &Warden, stop: &AtomicBool) -> u64 {
    let auth = basic("ann", PASSWORD);
    let url = format!("{}/apps/labs/", w.gateway);
    let (mut served, start) = (0, Instant::now());
    for _ in 0..MAX_REQUESTS {
        if stop.load(Ordering::Relaxed) || start.elapsed() > LOAD_LIMIT {
            break;
        }
        if try_request(&url, "GET", &[("authorization", &auth)], "") == Some(200) {
            served += 1;
        }
    }
    served
}

/// Every record of the log, oldest first.
fn records(w: &Warden) -> Vec<Value> {
    let r = w.api("GET", "/v1/audit?limit=1000000", None);
    assert_eq!(r.status, 200, "{}", r.text());
    serde_json::from_value(r.json()).unwrap()
}

fn kind(kind: &str) -> impl Fn(&&Value) -> bool + '_ {
    move |r: &&Value| r["event"]["kind"] == kind
}

/// What a round saw before its kill.
struct Round {
    acked: Vec<(String, &'static str)>,
    seen_access: Vec<Value>,
    killed_ms: u64,
}

/// Drives load on `w` and SIGKILLs it mid-load, once a few more periods of accesses are
/// flushed and many changes acknowledged, while more keep coming.
fn load_and_kill(w: &mut Warden, round: usize) -> Round {
    let access_before = records(w).iter().filter(kind("access")).count();
    let stop = AtomicBool::new(false);
    let acked: Acked = Mutex::new(Vec::new());
    let served = Mutex::new(0u64);
    let mut seen_access = Vec::new();
    let killed_ms = std::thread::scope(|s| {
        for t in 0..2 {
            let (w, stop, acked) = (&*w, &stop, &acked);
            s.spawn(move || api_load(w, &format!("c{round}-{t}"), stop, acked));
        }
        for _ in 0..2 {
            let (w, stop, served) = (&*w, &stop, &served);
            s.spawn(move || *served.lock().unwrap() += gateway_load(w, stop));
        }
        seen_access = wait_until("access records under load", LOAD_LIMIT, || {
            let access: Vec<Value> = records(w).iter().filter(kind("access")).cloned().collect();
            (access.len() >= access_before + 3 && acked.lock().unwrap().len() >= 60)
                .then_some(access)
        });
        std::thread::sleep(Duration::from_millis(200));
        // Right after an acknowledgement: where a record still waiting to be written would be
        // one the client was already told is done.
        let n = acked.lock().unwrap().len();
        wait_until("one more acknowledged change", LOAD_LIMIT, || {
            (acked.lock().unwrap().len() > n).then_some(())
        });
        let killed_ms = warden_core::model::now_ms();
        let pid = nix::unistd::Pid::from_raw(w.pid() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
        stop.store(true, Ordering::Relaxed);
        killed_ms
    });
    // Reaps it (the signal again finds it dead).
    w.signal_and_wait(nix::sys::signal::Signal::SIGKILL);
    let acked = acked.into_inner().unwrap();
    let served = served.into_inner().unwrap();
    eprintln!(
        "round {round}: {} changes acknowledged, {served} requests served before the kill",
        acked.len()
    );
    assert!(
        acked.len() >= 10,
        "too little API load to mean anything: {acked:?}"
    );
    assert!(served >= 10, "too little gateway load: {served}");
    Round {
        acked,
        seen_access,
        killed_ms,
    }
}

/// What the restarted `w` must hold of the killed run `r`.
fn check(w: &Warden, r: &Round) {
    let all = records(w);

    // Every acknowledged change is there, at least as its durable `pending` record.
    let changes: Vec<&Value> = all.iter().filter(kind("change")).collect();
    let missing: Vec<_> = r
        .acked
        .iter()
        .filter(|(name, method)| {
            let route = match *method {
                "POST" => "/v1/apps",
                _ => "/v1/apps/{name}",
            };
            !changes.iter().any(|r| {
                let e = &r["event"];
                e["route"] == route && e["method"] == *method && e["target"] == name.as_str()
            })
        })
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged changes have no record: {missing:?}",
        missing.len(),
        r.acked.len()
    );

    // Every access period flushed before the kill is still there, as it was.
    for a in &r.seen_access {
        assert!(
            all.contains(a),
            "an access record read before the kill is gone: {a}"
        );
    }

    // The new run begins with a gap that says the previous run did not stop.
    let new_run = all
        .iter()
        .position(|x| x["at_ms"].as_u64().unwrap() > r.killed_ms)
        .expect("the new run wrote records");
    assert!(new_run > 0);
    let first = &all[new_run];
    assert_eq!(first["event"]["kind"], "gap", "{first}");
    let started = all[new_run..]
        .iter()
        .position(|r| r["event"] == json!({ "kind": "node", "event": "started" }))
        .expect("the new run's start is recorded");
    let said = all[new_run..new_run + started].iter().any(|r| {
        r["event"]["kind"] == "gap"
            && r["event"]["why"]
                .as_str()
                .is_some_and(|w| w.contains("ended without stopping"))
    });
    assert!(
        said,
        "no gap says the previous run did not stop: {:#?}",
        &all[new_run..]
    );
    assert_ne!(
        all[new_run - 1]["event"],
        json!({ "kind": "node", "event": "stopped" }),
        "a killed warden cannot have recorded its stop"
    );

    let env = [
        ("WARDEN_API", w.api.as_str()),
        ("WARDEN_TOKEN", w.token.as_str()),
    ];
    let (ok, out, err) = cli(BIN, &["audit", "verify"], &env);
    assert!(
        ok && out.contains("is whole"),
        "verify fails across the crash: {out}{err}"
    );
}

/// Three rounds of load and kill on one data dir: each round's restart must hold all of it.
#[test]
fn kill_9_under_load_loses_no_acknowledged_record_and_the_log_verifies_across_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let launch = || {
        Launch::new(BIN)
            .data_dir(&data)
            .no_demo()
            .arg("--audit-flush-ms")
            .arg("200")
            .start()
    };
    let mut w = launch();
    assert_eq!(
        w.api("PUT", "/v1/lattice", Some(json!({ "levels": ["LOW"] })))
            .status,
        200
    );
    let ann =
        json!({ "name": "ann", "password": PASSWORD, "clearance": "LOW", "groups": ["staff"] });
    assert_eq!(w.api("POST", "/v1/users", Some(ann)).status, 201);
    w.create_demo_app(BIN, "labs", json!({ "groups": ["staff"] }));
    let first = w.get_as("ann", PASSWORD, "/apps/labs/");
    assert_eq!(first.status, 200, "{}", first.text());
    // A kill must land while a record waits to be written for a lost one to show: each round
    // is another chance for a broken promise to be caught.
    for round in 0..3 {
        let r = load_and_kill(&mut w, round);
        w = launch();
        check(&w, &r);
    }
}
