//! The gateway's audit records (issue 35), through the real binary: a user's requests at two
//! labels appear as access records with the right counts once summed and flushed; a failed
//! sign-in and a 403 appear, by user; a taint appears with the labels before and after.
//! The flush period is set to half a second (`--audit-flush-ms`) so nothing waits a minute.

use std::time::Duration;

use serde_json::{json, Value};
use warden_test_support::http::basic;
use warden_test_support::{request, wait_until, Launch, Warden};

use crate::BIN;

const PASSWORD: &str = "correct horse battery";

fn get(w: &Warden, user: &str, password: &str, query: &str) -> u16 {
    let url = format!("{}/apps/labs/{query}", w.gateway);
    request(
        "GET",
        &url,
        &[("authorization", &basic(user, password))],
        b"",
    )
    .status
}

/// The label `user`'s request is served at, as the demo app says (one request).
fn served_label(w: &Warden, user: &str) -> String {
    let url = format!("{}/apps/labs/", w.gateway);
    let r = request(
        "GET",
        &url,
        &[("authorization", &basic(user, PASSWORD))],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["label"].as_str().unwrap().to_owned()
}

/// The events of this node's log of `kind`.
fn events(w: &Warden, kind: &str) -> Vec<Value> {
    let r = w.api("GET", &format!("/v1/audit?kind={kind}&limit=10000"), None);
    assert_eq!(r.status, 200, "{}", r.text());
    let records: Vec<Value> = serde_json::from_value(r.json()).unwrap();
    records.into_iter().map(|r| r["event"].clone()).collect()
}

/// Requests and bytes the access records of `user` at `label` sum to.
fn accesses(w: &Warden, user: &str, label: &str) -> (u64, u64) {
    events(w, "access")
        .iter()
        .filter(|e| e["user"] == user && e["label"] == label && e["app"] == "labs")
        .fold((0, 0), |(n, b), e| {
            (
                n + e["count"].as_u64().unwrap(),
                b + e["bytes"].as_u64().unwrap(),
            )
        })
}

#[test]
fn accesses_at_two_labels_a_failed_sign_in_a_403_and_a_taint_are_recorded() {
    let w = Launch::new(BIN)
        .no_demo()
        .arg("--audit-flush-ms")
        .arg("500")
        .start();
    let lattice = json!({ "levels": ["LOW", "HIGH"] });
    assert_eq!(w.api("PUT", "/v1/lattice", Some(lattice)).status, 200);
    for (name, clearance, groups) in [
        ("ann", "LOW", json!(["staff"])),
        ("cy", "HIGH", json!(["staff"])),
        ("zed", "LOW", json!([])),
    ] {
        let user =
            json!({ "name": name, "password": PASSWORD, "clearance": clearance, "groups": groups });
        let r = w.api("POST", "/v1/users", Some(user));
        assert_eq!(r.status, 201, "{}", r.text());
    }
    w.create_demo_app(BIN, "labs", json!({ "groups": ["staff"] }));

    let (low, high) = (served_label(&w, "ann"), served_label(&w, "cy"));
    assert_ne!(low, high);
    for _ in 0..2 {
        assert_eq!(get(&w, "ann", PASSWORD, ""), 200);
    }
    get(&w, "cy", PASSWORD, "");
    wait_until("ann's and cy's accesses", Duration::from_secs(30), || {
        (accesses(&w, "ann", &low).0 >= 3 && accesses(&w, "cy", &high).0 >= 2).then_some(())
    });
    // Two more flush periods: nothing is counted twice, and nothing more arrives.
    std::thread::sleep(Duration::from_millis(1200));
    let (ann, ann_bytes) = accesses(&w, "ann", &low);
    assert_eq!((ann, accesses(&w, "cy", &high).0), (3, 2));
    assert!(ann_bytes > 0, "the bytes are counted");
    assert_eq!(accesses(&w, "ann", &high).0, 0, "each at their own label");
    let access = events(&w, "access");
    let one = access.iter().find(|e| e["user"] == "cy").unwrap();
    assert!(
        one["instance"].as_str().is_some_and(|i| !i.is_empty()),
        "{one}"
    );
    assert!(one["node"].as_str().is_some_and(|n| !n.is_empty()), "{one}");

    // A wrong password and a user outside the app's groups.
    assert_eq!(get(&w, "ann", "not the password", ""), 401);
    assert_eq!(get(&w, "zed", PASSWORD, ""), 403);
    wait_until(
        "the failed sign-in and the 403",
        Duration::from_secs(30),
        || {
            let failed = events(&w, "sign_in").into_iter().find(|e| {
                e["user"] == "ann" && e["outcome"] == "failed" && e["method"] == "basic"
            })?;
            let refused = events(&w, "refusal")
                .into_iter()
                .find(|e| e["status"] == 403 && e["user"] == "zed" && e["app"] == "labs")?;
            Some((failed, refused))
        },
    );
    // A name no user has (perhaps a password typed in the wrong field) and an app no one has
    // are recorded as "(unknown)": never as given, and never one key per made-up name.
    let url = format!("{}/apps/no-such-app-q7/", w.gateway);
    let r = request(
        "GET",
        &url,
        &[("authorization", &basic("hunter2-typed", "x"))],
        b"",
    );
    assert_eq!(r.status, 401);
    wait_until("the unknown sign-in", Duration::from_secs(30), || {
        let signed = events(&w, "sign_in").into_iter().any(|e| {
            e["user"] == "(unknown)" && e["outcome"] == "failed" && e["method"] == "basic"
        });
        let refused = events(&w, "refusal")
            .into_iter()
            .any(|e| e["status"] == 401 && e["app"] == "(unknown)");
        (signed && refused).then_some(())
    });
    let all = w.api("GET", "/v1/audit?limit=10000", None).text();
    assert!(
        !all.contains("hunter2") && !all.contains("no-such-app-q7"),
        "{all}"
    );

    // ann's three good requests, summed over however many periods they fell in.
    let signed_in = events(&w, "sign_in");
    let ok: u64 = signed_in
        .iter()
        .filter(|e| e["user"] == "ann" && e["outcome"] == "ok" && e["method"] == "basic")
        .map(|e| e["count"].as_u64().unwrap())
        .sum();
    assert_eq!(ok, 3, "{signed_in:?}");
    assert!(
        !serde_json::to_string(&signed_in)
            .unwrap()
            .contains(PASSWORD),
        "no password in the log"
    );

    // ann's instance reads HIGH data: it is relabelled, and the log says from what to what.
    assert_eq!(get(&w, "ann", PASSWORD, "?taint=HIGH"), 200);
    let taint = wait_until("the taint record", Duration::from_secs(30), || {
        events(&w, "taint").into_iter().find(|e| e["app"] == "labs")
    });
    assert_eq!((&taint["from"], &taint["to"]), (&json!(low), &json!(high)));
    assert!(taint["instance"].as_str().is_some_and(|i| !i.is_empty()));
}

/// A per-request app's instances each serve one request: their accesses are summed per
/// (user, app, label, node) under one placeholder instance, not one record per request.
#[test]
fn a_per_request_apps_accesses_are_one_record_a_period_not_one_per_request() {
    let w = Launch::new(BIN)
        .no_demo()
        .arg("--audit-flush-ms")
        .arg("60000")
        .start();
    let lattice = json!({ "levels": ["LOW"] });
    assert_eq!(w.api("PUT", "/v1/lattice", Some(lattice)).status, 200);
    let user = json!({ "name": "ann", "password": PASSWORD, "clearance": "LOW", "groups": [] });
    let r = w.api("POST", "/v1/users", Some(user));
    assert_eq!(r.status, 201, "{}", r.text());
    w.create_demo_app(
        BIN,
        "once",
        json!({ "driver": "process", "lifetime": "per_request" }),
    );
    let url = format!("{}/apps/once/", w.gateway);
    let mut served = Vec::new();
    for _ in 0..3 {
        let r = request(
            "GET",
            &url,
            &[("authorization", &basic("ann", PASSWORD))],
            b"",
        );
        assert_eq!(r.status, 200, "{}", r.text());
        served.push(r.json()["instance"].clone());
    }
    served.dedup();
    assert_eq!(served.len(), 3, "three instances served: {served:?}");
    let mut w = w;
    w.stop();
    // Stopped, warden has flushed the period's sums: read its segment files as they are.
    let mut text = String::new();
    for f in std::fs::read_dir(w.dir.join("audit")).unwrap().flatten() {
        text += &std::fs::read_to_string(f.path()).unwrap_or_default();
    }
    let access: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|r| r["event"].clone())
        .filter(|e| e["kind"] == "access" && e["app"] == "once")
        .collect();
    assert_eq!(access.len(), 1, "{access:?}");
    assert_eq!(access[0]["count"], 3, "{access:?}");
    assert_eq!(access[0]["instance"], "(per request)", "{access:?}");
}
