//! Instance lifetimes and self-healing through the real binary: per-request and per-user
//! instances, idle reaping, instance maximums, desired counts kept after kill -9, crash loops
//! in `warden status`, instance logs (and their size cap) and the node's published load.

use std::time::Duration;

use serde_json::{json, Value};
use warden_test_support::{cli, process_alive, wait_until, Launch, Warden};

use crate::{app_bin, BIN};

/// Registers an app running the demo app, with `extra` spec fields.
fn create_app(w: &Warden, name: &str, extra: Value) {
    w.create_demo_app(&app_bin(), name, extra);
}

fn instances_of(w: &Warden, app: &str) -> Vec<Value> {
    w.instances()
        .into_iter()
        .filter(|i| i["app"] == app)
        .collect()
}

fn get(w: &Warden, user: &str, path: &str) -> Value {
    let r = w.get_as(user, &w.password(user), path);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn add_user(w: &Warden, name: &str, clearance: &str) -> String {
    let password = format!("{name}-correct-horse-battery");
    let r = w.api(
        "POST",
        "/v1/users",
        Some(json!({ "name": name, "password": password, "clearance": clearance })),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    password
}

#[test]
fn a_per_request_instance_serves_one_request_and_is_gone_after_it() {
    let w = Warden::demo(BIN);
    // The app reports its pid, which the test watches on the host: a plain process.
    create_app(
        &w,
        "once",
        json!({ "driver": "process", "lifetime": "per_request" }),
    );
    let first = get(&w, "alice", "/apps/once/");
    let second = get(&w, "alice", "/apps/once/");
    assert_ne!(
        first["instance"], second["instance"],
        "a per-request instance is never reused"
    );
    for served in [&first, &second] {
        let pid = served["pid"].as_u64().unwrap() as u32;
        wait_until(
            "the per-request instance to stop",
            Duration::from_secs(20),
            || {
                let listed = instances_of(&w, "once")
                    .iter()
                    .any(|i| i["id"] == served["instance"]);
                (!listed && !process_alive(pid)).then_some(())
            },
        );
    }
}

#[test]
fn a_per_user_instance_never_serves_another_user_of_the_same_label() {
    let w = Warden::demo(BIN);
    let erin = add_user(&w, "erin", "SECRET");
    create_app(&w, "mine", json!({ "lifetime": "per_user" }));
    let alice = get(&w, "alice", "/apps/mine/");
    let r = w.get_as("erin", &erin, "/apps/mine/");
    assert_eq!(r.status, 200, "{}", r.text());
    let erins = r.json();
    assert_eq!(alice["label"], erins["label"], "both are SECRET");
    assert_ne!(alice["instance"], erins["instance"]);
    // Each user keeps their own instance.
    assert_eq!(
        get(&w, "alice", "/apps/mine/")["instance"],
        alice["instance"]
    );
    let again = w.get_as("erin", &erin, "/apps/mine/").json();
    assert_eq!(again["instance"], erins["instance"]);
    let owners: Vec<(Value, Value)> = instances_of(&w, "mine")
        .iter()
        .map(|i| (i["id"].clone(), i["owner"].clone()))
        .collect();
    assert!(
        owners.contains(&(alice["instance"].clone(), json!("alice"))),
        "{owners:?}"
    );
    assert!(
        owners.contains(&(erins["instance"].clone(), json!("erin"))),
        "{owners:?}"
    );
}

#[test]
fn idle_instances_are_reaped_and_started_again_on_the_next_request() {
    let w = Warden::demo(BIN);
    create_app(
        &w,
        "sleepy",
        json!({ "driver": "process", "idle_timeout_ms": 300 }),
    );
    let first = get(&w, "alice", "/apps/sleepy/");
    let pid = first["pid"].as_u64().unwrap() as u32;
    wait_until(
        "the idle instance to be reaped",
        Duration::from_secs(30),
        || (instances_of(&w, "sleepy").is_empty() && !process_alive(pid)).then_some(()),
    );
    let second = get(&w, "alice", "/apps/sleepy/");
    assert_ne!(first["instance"], second["instance"]);
}

#[test]
fn a_full_app_gets_a_clear_503_rather_than_another_instance() {
    let w = Warden::demo(BIN);
    let erin = add_user(&w, "erin", "SECRET");
    create_app(
        &w,
        "small",
        json!({ "lifetime": "per_user", "max_instances": 1 }),
    );
    get(&w, "alice", "/apps/small/");
    let r = w.get_as("erin", &erin, "/apps/small/");
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.header("retry-after").is_some());
    assert!(r.text().contains("maximum of 1 instances"), "{}", r.text());
    assert_eq!(instances_of(&w, "small").len(), 1);
    // The first user is still served.
    get(&w, "alice", "/apps/small/");
}

#[test]
fn a_killed_kept_instance_is_replaced_and_logs_are_readable() {
    let w = Warden::demo(BIN);
    let script = format!("echo hello-from-the-instance; exec {} demo-app", app_bin());
    let r = w.api(
        "POST",
        "/v1/apps",
        Some(json!({
            "name": "kept",
            "driver": "process",
            "command": ["/bin/sh", "-c", script],
            "desired": { "SECRET": 2 },
        })),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let ready = |w: &Warden| -> Vec<Value> {
        instances_of(w, "kept")
            .into_iter()
            .filter(|i| i["state"] == "ready" && i["kept"] == true)
            .collect()
    };
    let two = wait_until("two kept instances", Duration::from_secs(30), || {
        let v = ready(&w);
        (v.len() == 2).then_some(v)
    });
    let victim = &two[0];
    let pid = victim["pid"].as_u64().unwrap() as i32;
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let healed = wait_until(
        "the killed instance to be replaced",
        Duration::from_secs(30),
        || {
            let v = ready(&w);
            (v.len() == 2 && v.iter().all(|i| i["id"] != victim["id"])).then_some(v)
        },
    );
    assert!(healed.iter().any(|i| i["id"] == two[1]["id"]));

    let env = [
        ("WARDEN_API", w.api.as_str()),
        ("WARDEN_TOKEN", w.token.as_str()),
    ];
    let id = healed[0]["id"].as_str().unwrap();
    let (ok, out, err) = cli(BIN, &["logs", id], &env);
    assert!(ok, "{err}");
    assert!(out.contains("hello-from-the-instance"), "{out}");
    // The killed instance's log stays readable for a while.
    let (ok, out, err) = cli(BIN, &["logs", victim["id"].as_str().unwrap()], &env);
    assert!(ok, "{err}");
    assert!(out.contains("hello-from-the-instance"), "{out}");
    let (ok, _, err) = cli(BIN, &["logs", "no-such-instance"], &env);
    assert!(!ok && err.contains("no logs of instance"), "{err}");

    let (ok, out, err) = cli(BIN, &["status"], &env);
    assert!(ok, "{err}");
    assert!(out.contains("SECRET=2"), "{out}");
}

#[test]
fn a_crash_loop_shows_in_status_with_the_last_lines() {
    let w = Warden::demo(BIN);
    let r = w.api(
        "POST",
        "/v1/apps",
        Some(json!({
            "name": "broken",
            "command": ["/bin/sh", "-c", "echo cannot-open-database; exit 3"],
            "desired": { "SECRET": 1 },
        })),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let report = w.wait_crash_loop("broken");
    assert_eq!(report["label"], "SECRET");
    assert!(report["crashes"].as_u64().unwrap() >= 3);
    assert!(
        report["last_lines"]
            .as_str()
            .unwrap()
            .contains("cannot-open-database"),
        "{report}"
    );
    let env = [
        ("WARDEN_API", w.api.as_str()),
        ("WARDEN_TOKEN", w.token.as_str()),
    ];
    let (ok, out, err) = cli(BIN, &["status"], &env);
    assert!(ok, "{err}");
    assert!(
        out.contains("CRASH LOOP") && out.contains("cannot-open-database"),
        "{out}"
    );
}

#[test]
fn desired_counts_with_unknown_labels_or_other_lifetimes_are_refused() {
    let w = Warden::demo(BIN);
    let bad_label = w.api(
        "POST",
        "/v1/apps",
        Some(json!({ "name": "x", "command": ["x"], "desired": { "COSMIC": 1 } })),
    );
    assert_eq!(bad_label.status, 400, "{}", bad_label.text());
    assert!(bad_label.text().contains("COSMIC"), "{}", bad_label.text());
    let per_user = w.api(
        "POST",
        "/v1/apps",
        Some(json!({
            "name": "y", "command": ["y"], "lifetime": "per_user", "desired": { "SECRET": 1 }
        })),
    );
    assert_eq!(per_user.status, 400, "{}", per_user.text());
}

#[test]
fn nodes_publish_their_load() {
    let w = Warden::demo(BIN);
    let nodes = w.api("GET", "/v1/nodes", None).json();
    let load = &nodes[0]["load"];
    let mem = load["memory_used"].as_f64().unwrap();
    assert!(mem > 0.0 && mem <= 1.0, "{load}");
    assert!(load["load_per_core"].as_f64().unwrap() >= 0.0, "{load}");
}

#[test]
fn the_gateway_holds_the_first_request_until_the_health_path_answers() {
    let w = Warden::demo(BIN);
    // The demo app answers 503 to everything until its third health check: an app that
    // accepts connections before it has loaded.
    let loading = json!({ "WARDEN_DEMO_UNHEALTHY_CHECKS": "3" });
    create_app(&w, "eager", json!({ "env": loading }));
    let r = w.get_as("alice", &w.password("alice"), "/apps/eager/");
    assert_eq!(
        r.status,
        503,
        "without a health path the first request reaches the loading app: {}",
        r.text()
    );

    create_app(
        &w,
        "patient",
        json!({ "env": loading, "health_path": "/_health" }),
    );
    let served = get(&w, "alice", "/apps/patient/");
    assert_eq!(served["path"], "/", "{served}");
}

/// App `slow`, whose health path answers 503 for its first 120 checks: a start takes a second
/// or so.
fn create_slow_app(w: &Warden) {
    create_app(
        w,
        "slow",
        json!({
            "env": { "WARDEN_DEMO_UNHEALTHY_CHECKS": "120" },
            "health_path": "/_health",
            "start_timeout_ms": 60000,
        }),
    );
}

#[test]
fn a_start_still_under_way_is_listed_as_starting_and_then_as_ready() {
    let w = Warden::demo(BIN);
    create_slow_app(&w);
    let url = format!("{}/apps/slow/", w.gateway);
    let auth = warden_test_support::http::basic("alice", &w.password("alice"));
    let first = std::thread::spawn(move || {
        warden_test_support::request("GET", &url, &[("authorization", &auth)], b"").status
    });
    // Operators and other nodes see a start that takes long while it goes on.
    wait_until(
        "the start listed as starting",
        Duration::from_secs(20),
        || {
            instances_of(&w, "slow")
                .iter()
                .any(|i| i["state"] == "starting")
                .then_some(())
        },
    );
    assert_eq!(first.join().unwrap(), 200);
    let now = instances_of(&w, "slow");
    assert!(
        now.len() == 1 && now[0]["state"] == "ready",
        "the started instance is ready at once for this node's API: {now:?}"
    );
}

/// What other nodes see: the store's record of a start a request waits for, written behind
/// that request (after a short delay, as starting while it still is), then as ready.
#[test]
fn a_start_still_under_way_is_in_the_store_as_starting_and_then_as_ready() {
    let cluster = warden_test_support::etcd::EtcdCluster::start(1);
    let w = crate::cluster::demo_node(&cluster, "solo", "gateway,api,agent");
    create_slow_app(&w);
    let stored = || cluster.etcdctl(&["get", "--prefix", "instances/slow/", "--print-value-only"]);
    let url = format!("{}/apps/slow/", w.gateway);
    let auth = warden_test_support::http::basic("alice", &w.password("alice"));
    let first = std::thread::spawn(move || {
        warden_test_support::request("GET", &url, &[("authorization", &auth)], b"").status
    });
    wait_until("the store to say starting", Duration::from_secs(20), || {
        stored().contains(r#""state":"starting""#).then_some(())
    });
    assert_eq!(first.join().unwrap(), 200);
    wait_until("the store to say ready", Duration::from_secs(20), || {
        stored().contains(r#""state":"ready""#).then_some(())
    });
}

#[test]
fn an_instance_that_never_answers_its_health_path_fails_with_what_it_answered() {
    let w = Warden::demo(BIN);
    create_app(
        &w,
        "sick",
        json!({
            "env": { "WARDEN_DEMO_UNHEALTHY_CHECKS": "1000000" },
            "health_path": "/_health",
            "start_timeout_ms": 1500,
        }),
    );
    let r = w.get_as("alice", &w.password("alice"), "/apps/sick/");
    assert_eq!(r.status, 503, "{}", r.text());
    let r = w.api(
        "POST",
        "/v1/instances",
        Some(json!({ "app": "sick", "label": "SECRET" })),
    );
    assert_eq!(r.status, 502, "{}", r.text());
    assert!(
        r.text().contains("health path /_health answered 503"),
        "the error says what the health path answered: {}",
        r.text()
    );
    wait_until(
        "the unhealthy instances to be stopped",
        Duration::from_secs(20),
        || instances_of(&w, "sick").is_empty().then_some(()),
    );

    let r = w.api(
        "POST",
        "/v1/apps",
        Some(json!({ "name": "crooked", "command": [BIN, "demo-app"], "health_path": "healthz" })),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("must start with '/'"), "{}", r.text());
}

#[test]
fn an_instance_log_past_its_cap_keeps_its_newest_lines() {
    let w = Launch::new(BIN).arg("--max-log-mb").arg("1").start();
    // About 3 MiB of output, then a last line, then the app serves.
    let script = format!(
        "head -c 3000000 /dev/zero | tr '\\0' x | fold -w 99; echo last-line-kept; exec {} demo-app",
        app_bin()
    );
    let r = w.api(
        "POST",
        "/v1/apps",
        // A shell script that runs a host binary: a plain process.
        Some(json!({ "name": "noisy", "driver": "process", "command": ["/bin/sh", "-c", script] })),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let id = get(&w, "alice", "/apps/noisy/")["instance"]
        .as_str()
        .unwrap()
        .to_owned();
    let log = w.dir.join("logs").join(format!("noisy-{id}.log"));
    wait_until(
        "the log cut back under 1 MiB",
        Duration::from_secs(30),
        || {
            let len = std::fs::metadata(&log).ok()?.len();
            (len <= 1024 * 1024).then_some(())
        },
    );
    let text = std::fs::read_to_string(&log).unwrap();
    let first = text.lines().next().unwrap();
    assert!(
        first.starts_with("warden: this log reached ")
            && first.contains("older lines were dropped"),
        "{first}"
    );
    let r = w.api("GET", &format!("/v1/instances/{id}/logs?lines=5"), None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("last-line-kept"), "the newest lines stay");
    // The app keeps writing to the same file after the cut.
    assert_eq!(get(&w, "alice", "/apps/noisy/")["instance"], id.as_str());
}
