//! How the gateway spreads requests over the instances of one label, through the real binary:
//! in turn or to the least busy one, over pooled connections, and around every instance that
//! refuses while one lives.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{json, Value};
use warden_test_support::http::basic;
use warden_test_support::{request, wait_until, Warden};

use crate::{app_bin, BIN};
const WAIT: Duration = Duration::from_secs(60);

/// Registers `app` with `n` kept SECRET instances and `extra` spec fields, and waits until
/// they are ready and the gateway routes to each; returns (id, addr) of each.
fn kept(w: &Warden, app: &str, n: u32, extra: Value) -> Vec<(String, String)> {
    // No more than the kept ones: a request that came before the gateway saw them cannot start
    // another (it gets 503 and is asked again).
    // The tests reach instances at their addresses too: plain processes on loopback ports.
    let mut spec = json!({ "driver": "process", "desired": { "SECRET": n }, "max_instances": n });
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    w.create_demo_app(&app_bin(), app, spec);
    let ready = wait_until(&format!("{n} ready instances of {app}"), WAIT, || {
        let ready: Vec<(String, String)> = w
            .instances()
            .into_iter()
            .filter(|i| i["app"] == app && i["state"] == "ready")
            .map(|i| {
                let s = |k: &str| i[k].as_str().unwrap().to_owned();
                (s("id"), s("addr"))
            })
            .collect();
        (ready.len() == n as usize).then_some(ready)
    });
    // The gateway learns of instances through the store's watch: ask until each has answered.
    let alice = w.password("alice");
    let mut answered = BTreeSet::new();
    wait_until(
        &format!("the gateway to route to all of {app}"),
        WAIT,
        || {
            let r = w.get_as("alice", &alice, &format!("/apps/{app}/"));
            if r.status == 200 {
                answered.insert(r.json()["instance"].as_str().unwrap().to_owned());
            }
            (answered.len() == n as usize).then_some(())
        },
    );
    ready
}

/// Sends a request to `app` as alice that its instance never answers, and waits until one of
/// `instances` holds it; returns the connection (the request lives as long as it does) and
/// the id of the instance holding it.
fn hold(w: &Warden, app: &str, instances: &[(String, String)]) -> (TcpStream, String) {
    let mut held = TcpStream::connect(w.gateway.trim_start_matches("http://")).unwrap();
    write!(
        held,
        "GET /apps/{app}/_hang HTTP/1.1\r\nhost: x\r\nauthorization: {}\r\n\r\n",
        basic("alice", &w.password("alice"))
    )
    .unwrap();
    // Asked directly, each instance says how many requests it holds.
    let busy = wait_until("the held request to reach an instance", WAIT, || {
        instances
            .iter()
            .find(|(_, addr)| {
                request("GET", &format!("http://{addr}/_hanging"), &[], b"").text() == "1"
            })
            .map(|(id, _)| id.clone())
    });
    (held, busy)
}

#[test]
fn requests_take_turns_or_go_to_the_instance_with_fewest_in_flight() {
    let w = Warden::demo(BIN);
    let alice = w.password("alice");
    let turns = kept(&w, "turns", 2, json!({}));
    let least = kept(&w, "least", 2, json!({ "balance": "least_outstanding" }));
    let serve = |app: &str| w.get_as("alice", &alice, &format!("/apps/{app}/")).json();

    // In turn: each answer comes from the other instance than the one before.
    let answers: Vec<Value> = (0..6).map(|_| serve("turns")).collect();
    for pair in answers.windows(2) {
        assert_ne!(pair[0]["instance"], pair[1]["instance"], "{answers:?}");
    }
    // Each instance saw one connection from the gateway: it is kept and reused.
    let mut peers: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for a in &answers {
        peers
            .entry(a["instance"].as_str().unwrap().to_owned())
            .or_default()
            .insert(a["peer"].as_str().unwrap().to_owned());
    }
    assert_eq!(peers.len(), 2, "{peers:?}");
    assert!(peers.values().all(|p| p.len() == 1), "{peers:?}");

    // In turn, a busy instance still gets its share...
    let (held, busy) = hold(&w, "turns", &turns);
    let ids: Vec<Value> = (0..4).map(|_| serve("turns")["instance"].clone()).collect();
    assert!(ids.contains(&json!(busy)), "{ids:?}");
    drop(held);
    // ...while the least busy one takes everything while the other holds a request.
    let (held, busy) = hold(&w, "least", &least);
    for _ in 0..6 {
        let a = serve("least");
        assert_ne!(a["instance"], busy.as_str(), "{a}");
    }
    drop(held);
}

/// A draining instance takes no new request, though it still runs and accepts connections
/// (it waits for the requests it holds): every gateway takes it out of routing at once.
#[test]
fn a_draining_instance_gets_no_new_request() {
    let w = Warden::demo(BIN);
    let all = kept(&w, "drain", 2, json!({}));
    let auth = basic("alice", &w.password("alice"));
    // One request held on each instance (they take turns), so whichever drains waits.
    let held: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = TcpStream::connect(w.gateway.trim_start_matches("http://")).unwrap();
            write!(
                s,
                "GET /apps/drain/_hang HTTP/1.1\r\nhost: x\r\nauthorization: {auth}\r\n\r\n"
            )
            .unwrap();
            s
        })
        .collect();
    wait_until("a held request on each instance", WAIT, || {
        all.iter()
            .all(|(_, addr)| {
                request("GET", &format!("http://{addr}/_hanging"), &[], b"").text() == "1"
            })
            .then_some(())
    });
    let r = w.api(
        "POST",
        "/v1/apps/drain/scale",
        Some(json!({"desired": {"SECRET": 1}})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let draining = wait_until("one instance to drain", WAIT, || {
        w.instances()
            .into_iter()
            .find(|i| i["app"] == "drain" && i["state"] == "draining")
            .map(|i| i["id"].as_str().unwrap().to_owned())
    });
    // It still runs and answers whoever reaches it directly...
    let addr = &all.iter().find(|(id, _)| *id == draining).unwrap().1;
    assert_eq!(
        request("GET", &format!("http://{addr}/_hanging"), &[], b"").text(),
        "1"
    );
    // ...but the gateway sends nothing new to it.
    let alice = w.password("alice");
    for _ in 0..8 {
        let r = w.get_as("alice", &alice, "/apps/drain/");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_ne!(
            r.json()["instance"],
            draining.as_str(),
            "a draining instance was routed to"
        );
    }
    drop(held);
}

#[test]
fn every_refusing_instance_is_passed_over_while_one_lives() {
    let w = Warden::demo(BIN);
    let all = kept(&w, "many", 8, json!({}));
    // Seven instances stop accepting connections but keep running, so only refusals tell.
    let (open, closing) = all.split_first().unwrap();
    for (_, addr) in closing {
        let r = request("GET", &format!("http://{addr}/_close"), &[], b"");
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let alice = w.password("alice");
    for _ in 0..4 {
        let r = w.get_as("alice", &alice, "/apps/many/");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["instance"], open.0.as_str());
    }
}

#[test]
fn killing_the_only_instance_under_load_fails_no_request() {
    let w = Warden::demo(BIN);
    w.create_demo_app(&app_bin(), "solo", json!({ "driver": "process" }));
    let auth = basic("alice", &w.password("alice"));
    let url = format!("{}/apps/solo/", w.gateway);
    let first = request("GET", &url, &[("authorization", &auth)], b"");
    assert_eq!(first.status, 200, "{}", first.text());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Thirty-two clients, each a bounded loop of GETs until the kills are over.
    let clients: Vec<_> = (0..32)
        .map(|_| {
            let (url, auth, stop) = (url.clone(), auth.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut failures = Vec::new();
                let mut sent = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && sent < 200_000 {
                    let r = request("GET", &url, &[("authorization", &auth)], b"");
                    if r.status != 200 {
                        failures.push(format!("{}: {}", r.status, r.text()));
                    }
                    sent += 1;
                }
                (sent, failures)
            })
        })
        .collect();
    for round in 0..3 {
        // Apart by more than the time after which an instance's death is a first crash again.
        std::thread::sleep(Duration::from_millis(2500));
        let pid = wait_until("a ready instance", WAIT, || {
            w.instances()
                .into_iter()
                .find(|i| i["app"] == "solo" && i["state"] == "ready")
                .and_then(|i| i["pid"].as_u64())
        });
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap_or_else(|e| panic!("round {round}: kill {pid}: {e}"));
    }
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut sent, mut failures) = (0, Vec::new());
    for c in clients {
        let (n, f) = c.join().unwrap();
        sent += n;
        failures.extend(f);
    }
    assert!(sent > 100, "{sent} requests sent");
    assert!(
        failures.is_empty(),
        "{} of {sent} requests failed: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
}
