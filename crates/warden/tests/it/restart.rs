//! `warden apps restart` (POST /v1/apps/NAME/restart): fresh instances of the same release
//! replace the running ones, rolling like a deploy (no failed request), with no new release;
//! a label's restart replaces only that label's; the audit trail records it; a deployer of
//! another app is refused.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use warden_test_support::{http, request, wait_until, Response, Warden};

use crate::BIN;

/// Ids of `app`'s instances by label, and how many are ready.
fn instances(w: &Warden, app: &str) -> (BTreeMap<String, String>, usize) {
    let all: Vec<Value> = w
        .instances()
        .into_iter()
        .filter(|i| i["app"] == app)
        .collect();
    let ready = all.iter().filter(|i| i["state"] == "ready").count();
    let ids = all
        .iter()
        .map(|i| {
            (
                i["id"].as_str().unwrap().to_owned(),
                i["label"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    (ids, ready)
}

/// POSTs as alice to `app` until `stop` (bounded); the statuses seen. The gateway never
/// retries a POST, so a request an old instance dropped would show.
fn load(
    w: &Warden,
    app: &str,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<BTreeMap<u16, usize>> {
    let auth = http::basic("alice", &w.password("alice"));
    let url = format!("{}/apps/{app}/", w.gateway);
    std::thread::spawn(move || {
        let mut statuses = BTreeMap::new();
        for _ in 0..50_000 {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let r = http::request("POST", &url, &[("authorization", &auth)], b"x");
            *statuses.entry(r.status).or_default() += 1;
        }
        statuses
    })
}

/// A call to `w`'s API with `token`.
fn call(w: &Warden, token: &str, path: &str, body: Value) -> Response {
    request(
        "POST",
        &format!("{}{path}", w.api),
        &[
            ("authorization", &format!("Bearer {token}")),
            ("content-type", "application/json"),
        ],
        body.to_string().as_bytes(),
    )
}

#[test]
fn a_restart_replaces_the_instances_with_the_same_release_and_no_failed_request() {
    let w = Warden::demo(BIN);
    let src = crate::deploy::fixture("plain");
    crate::deploy::push_ok(&w, "plain", src.path());
    let r = w.api(
        "POST",
        "/v1/apps/plain/scale",
        Some(json!({"desired": {"SECRET": 2}})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // dave's request starts an instance of his label, which nobody keeps.
    let dave = w.get_as("dave", &w.password("dave"), "/apps/plain/");
    assert_eq!(dave.status, 200, "{}", dave.text());
    let (before, _) = wait_until("3 ready instances", Duration::from_secs(60), || {
        let (ids, ready) = instances(&w, "plain");
        (ready == 3 && ids.len() == 3).then_some((ids, ready))
    });
    let releases = crate::deploy::releases(&w, "plain").len();

    // Only dave's label: his instance is replaced, the kept ones stay.
    let (ok, out, err) =
        crate::deploy::run(&w, &["apps", "restart", "plain", "--label", "UNCLASSIFIED"]);
    assert!(ok, "{err}");
    assert!(out.contains("1 instance(s) of label UNCLASSIFIED"), "{out}");
    let after = wait_until("dave's instance replaced", Duration::from_secs(60), || {
        let (ids, ready) = instances(&w, "plain");
        let fresh = ids
            .iter()
            .any(|(id, l)| l == "UNCLASSIFIED" && !before.contains_key(id));
        (fresh && ready == 3 && ids.len() == 3).then_some(ids)
    });
    for (id, label) in &before {
        assert_eq!(
            after.contains_key(id),
            label == "SECRET",
            "{before:?} {after:?}"
        );
    }

    // The whole app, under load: every instance anew, every request served.
    let stop = Arc::new(AtomicBool::new(false));
    let requests = load(&w, "plain", stop.clone());
    std::thread::sleep(Duration::from_millis(300));
    let (ok, out, err) = crate::deploy::run(&w, &["apps", "restart", "plain"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("of release 1") && out.contains("no release is made"),
        "{out}"
    );
    let last = wait_until("every instance replaced", Duration::from_secs(90), || {
        let (ids, ready) = instances(&w, "plain");
        let fresh = ids.keys().all(|id| !after.contains_key(id));
        (fresh && ready == 3 && ids.len() == 3).then_some(ids)
    });
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let statuses = requests.join().unwrap();
    assert!(
        statuses.keys().all(|s| *s == 200) && statuses.get(&200).copied().unwrap_or(0) > 10,
        "every request served: {statuses:?}"
    );
    assert_eq!(last.values().filter(|l| *l == "SECRET").count(), 2);
    let spec = w.api("GET", "/v1/apps/plain", None).json();
    assert_eq!(spec["release"]["number"], 1, "{spec}");
    assert_eq!(crate::deploy::releases(&w, "plain").len(), releases);
    let status = w.api("GET", "/v1/status", None).json();
    let plain = status["apps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "plain")
        .unwrap();
    assert_eq!(plain["outdated"], 0, "{plain}");

    // The audit trail has both, each with its actor.
    let audit = w.api("GET", "/v1/audit?kind=change", None).json();
    let restarts = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["event"])
        .filter(|e| e["route"] == "/v1/apps/{name}/restart" && e["target"] == "plain")
        .filter(|e| e["outcome"] != "pending")
        .count();
    assert_eq!(restarts, 2, "{audit}");
}

#[test]
fn a_deployer_of_another_app_may_not_restart_it() {
    let w = Warden::demo(BIN);
    for (name, apps) in [("other", ["elsewhere"]), ("own", ["demo"])] {
        let r = w.api(
            "POST",
            "/v1/operators",
            Some(json!({"name": name, "password": format!("{name}-password-1"), "roles": [{"role": "deployer", "apps": apps}]})),
        );
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let token = |name: &str| {
        let r = call(
            &w,
            "",
            "/v1/login",
            json!({"name": name, "password": format!("{name}-password-1")}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["token"].as_str().unwrap().to_owned()
    };
    let before = w.api("GET", "/v1/apps/demo", None).json();
    let r = call(&w, &token("other"), "/v1/apps/demo/restart", json!({}));
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(
        r.text().contains("deployer role of app \\\"demo\\\""),
        "{}",
        r.text()
    );
    assert_eq!(w.api("GET", "/v1/apps/demo", None).json(), before);
    let r = call(
        &w,
        &token("own"),
        "/v1/apps/demo/restart",
        json!({"label": "SECRET"}),
    );
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(r.json()["restart"], 1);
    let spec = w.api("GET", "/v1/apps/demo", None).json();
    assert_eq!(spec["restarts"], json!({"labels": {"SECRET": 1}}));
    // Nor are the counts anyone's to set by hand.
    let r = w.api(
        "PATCH",
        "/v1/apps/demo",
        Some(json!({"restarts": {"app": 5}})),
    );
    assert_eq!(r.status, 400, "{}", r.text());
}

#[test]
fn on_a_cluster_a_restart_reaches_every_nodes_instances() {
    let cluster = warden_test_support::etcd::EtcdCluster::start(1);
    let alpha = crate::cluster::demo_node(&cluster, "alpha", "gateway,api");
    let _agents: Vec<Warden> = [("beta", "127.0.0.2:0"), ("gamma", "127.0.0.3:0")]
        .iter()
        .map(|(name, addr)| crate::healing::agent(&cluster, &alpha, name, addr, &[]))
        .collect();
    let r = alpha.api(
        "POST",
        "/v1/apps/demo/scale",
        Some(json!({"desired": {"SECRET": 2}})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // Ids of the demo app's ready instances → their node.
    let ready = |w: &Warden| -> BTreeMap<String, String> {
        w.instances()
            .into_iter()
            .filter(|i| i["app"] == "demo" && i["state"] == "ready")
            .map(|i| {
                (
                    i["id"].as_str().unwrap().to_owned(),
                    i["node"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let before = wait_until("one on each agent", Duration::from_secs(60), || {
        let r = ready(&alpha);
        let nodes: std::collections::BTreeSet<&String> = r.values().collect();
        (r.len() == 2 && nodes.len() == 2).then_some(r)
    });

    let (ok, out, err) = crate::deploy::run(&alpha, &["apps", "restart", "demo"]);
    assert!(ok, "{err}");
    assert!(out.contains("2 instance(s)"), "{out}");
    let after = wait_until("both replaced", Duration::from_secs(90), || {
        let r = ready(&alpha);
        let all = alpha
            .instances()
            .into_iter()
            .filter(|i| i["app"] == "demo")
            .count();
        (r.len() == 2 && all == 2 && r.keys().all(|id| !before.contains_key(id))).then_some(r)
    });
    let was: std::collections::BTreeSet<&String> = before.values().collect();
    let now: std::collections::BTreeSet<&String> = after.values().collect();
    assert_eq!(was, now, "each node replaced its own: {before:?} {after:?}");
}
