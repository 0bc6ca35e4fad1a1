//! The slot pool and the warm pool through the real binary: requests served by instances
//! started ahead, pools refilled after a take and after a crash, never routed to before they
//! are handed out, torn down with their app, and specs that cannot work refused.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Value};
use warden_test_support::{cli, process_alive, wait_until, Warden};

use crate::{app_bin, BIN};
const WAIT: Duration = Duration::from_secs(30);

/// Registers an app running the demo app, with `extra` spec fields.
fn create_app(w: &Warden, name: &str, extra: Value) {
    w.create_demo_app(&app_bin(), name, extra);
}

fn get(w: &Warden, user: &str, path: &str) -> Value {
    let r = w.get_as(user, &w.password(user), path);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// Ids of the instances of `app` in `state`.
fn ids(w: &Warden, app: &str, state: &str) -> BTreeSet<String> {
    w.instances()
        .into_iter()
        .filter(|i| i["app"] == app && i["state"] == state)
        .map(|i| i["id"].as_str().unwrap().to_owned())
        .collect()
}

fn wait_spares(w: &Warden, app: &str, n: usize) -> BTreeSet<String> {
    wait_until(&format!("{n} spares of {app}"), WAIT, || {
        let s = ids(w, app, "spare");
        (s.len() == n).then_some(s)
    })
}

/// The value of one metric line, such as `warden_agent_pool_ready{app="x",kind="slot",label=""}`.
fn metric(w: &Warden, name_and_labels: &str) -> Option<f64> {
    let text = warden_test_support::request("GET", &format!("{}/metrics", w.api), &[], b"").text();
    text.lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok())
}

/// Registers app `slotted` (the demo app, one slot) and waits until its slot is prepared;
/// returns the gauge of its prepared slots.
fn slotted_app(w: &Warden) -> String {
    create_app(
        w,
        "slotted",
        json!({ "driver": "sandbox", "start": "slot", "slots": 1 }),
    );
    let ready = "warden_agent_pool_ready{app=\"slotted\",kind=\"slot\",label=\"\"}";
    wait_until("a prepared slot", WAIT, || {
        (metric(w, ready) == Some(1.0)).then_some(())
    });
    ready.to_owned()
}

fn slot_dirs(w: &Warden) -> BTreeSet<String> {
    std::fs::read_dir(w.dir.join("instances"))
        .map(|d| {
            // Directories: beside each lies the record of its processes (`<id>.pid`).
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_warm_pool_hands_out_running_spares_and_refills_behind_them() {
    let w = Warden::demo(BIN);
    create_app(
        &w,
        "warm",
        json!({ "driver": "process", "lifetime": "per_request", "start": "warm", "warm": { "SECRET": 2 } }),
    );
    let spares = wait_spares(&w, "warm", 2);

    // alice is SECRET: her request is served by one of the spares started before it.
    let served = get(&w, "alice", "/apps/warm/");
    let id = served["instance"].as_str().unwrap().to_owned();
    assert!(spares.contains(&id), "{id} is not one of {spares:?}");
    assert_eq!(served["label"], "SECRET");
    assert_eq!(served["user"], "alice");

    // Per request: the handed-out spare is gone after its response, and the pool is full again
    // with a new spare in its place.
    let pid = served["pid"].as_u64().unwrap() as u32;
    wait_until("the used instance to exit", WAIT, || {
        (!process_alive(pid)).then_some(())
    });
    // Records follow the processes a moment later (the hand-out's record is written after the
    // response, the exit's delete after the reap): wait for the pool as the store shows it.
    let refilled = wait_until(
        "the pool to be full again without the used spare",
        WAIT,
        || {
            let s = ids(&w, "warm", "spare");
            (s.len() == 2 && !s.contains(&id)).then_some(s)
        },
    );
    assert_eq!(refilled.intersection(&spares).count(), 1);
    assert!(metric(&w, "warden_agent_start_seconds_count{path=\"warm\"}").unwrap() >= 1.0);
    assert_eq!(
        metric(
            &w,
            "warden_agent_pool_ready{app=\"warm\",kind=\"spare\",label=\"SECRET\"}"
        ),
        Some(2.0)
    );

    // bob is CONFIDENTIAL, a label without spares: his instance is started for him.
    let bobs = get(&w, "bob", "/apps/warm/");
    assert_eq!(bobs["label"], "CONFIDENTIAL");
    assert!(!refilled.contains(bobs["instance"].as_str().unwrap()));

    // `warden status` tells spares from instances that serve.
    let status = w.api("GET", "/v1/status", None).json();
    let app = status["apps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "warm")
        .unwrap()
        .clone();
    assert_eq!(app["spares"], json!({ "SECRET": 2 }), "{app}");

    // A changed spec: the spares of the earlier one stop and the pool fills with new ones (a
    // per-request app's spares were once left in the pool for good, never handed out).
    let r = w.api(
        "PATCH",
        "/v1/apps/warm",
        Some(json!({ "env": { "EDITION": "2" } })),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let renewed = wait_until("the pool to hold only spares of the new spec", WAIT, || {
        let s = ids(&w, "warm", "spare");
        (s.len() == 2 && s.is_disjoint(&refilled)).then_some(s)
    });
    let served = get(&w, "alice", "/apps/warm/");
    assert!(
        renewed.contains(served["instance"].as_str().unwrap()),
        "{served} is not one of {renewed:?}"
    );
}

#[test]
fn spares_serve_no_request_until_handed_out_and_a_killed_spare_is_replaced() {
    let w = Warden::demo(BIN);
    create_app(
        &w,
        "shared",
        json!({ "start": "warm", "warm": { "SECRET": 1 } }),
    );
    let first_spare = wait_spares(&w, "shared", 1);
    let served = get(&w, "alice", "/apps/shared/");
    let shared = served["instance"].as_str().unwrap().to_owned();
    assert!(first_spare.contains(&shared));
    // A new spare starts behind the handed-out one, and the shared instance keeps serving: the
    // spare never takes a request while it waits.
    // The hand-out's record is written behind the request, so the store may list the taken
    // spare as a spare for a moment; a pool that never replaced it would time out here.
    let spare = wait_until("a new spare beside the handed-out one", WAIT, || {
        let s = ids(&w, "shared", "spare");
        (s.len() == 1 && !s.contains(&shared)).then_some(s)
    });
    for _ in 0..5 {
        assert_eq!(get(&w, "alice", "/apps/shared/")["instance"], shared);
    }
    assert_eq!(ids(&w, "shared", "spare"), spare);

    // kill -9 the spare: the pool starts another.
    let spare_id = spare.iter().next().unwrap().clone();
    let pid = w
        .instances()
        .into_iter()
        .find(|i| i["id"] == spare_id.as_str())
        .unwrap()["pid"]
        .as_u64()
        .unwrap() as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let replaced = wait_until("a new spare", WAIT, || {
        let s = ids(&w, "shared", "spare");
        (s.len() == 1 && !s.contains(&spare_id)).then_some(s)
    });
    assert!(!replaced.contains(&shared));
}

#[test]
fn a_slot_pool_starts_the_app_in_a_prepared_sandbox() {
    let w = Warden::demo(BIN);
    let ready = &slotted_app(&w);
    // The slot's directory is named after the instance it will become.
    let before = slot_dirs(&w);
    assert_eq!(before.len(), 1, "{before:?}");

    let served = get(&w, "alice", "/apps/slotted/");
    let id = served["instance"].as_str().unwrap().to_owned();
    assert!(
        before.contains(&id),
        "{id} was not the prepared slot {before:?}"
    );
    // The label arrived with the start message, not with the preparation.
    assert_eq!(served["label"], "SECRET");
    assert!(metric(&w, "warden_agent_start_seconds_count{path=\"slot\"}").unwrap() >= 1.0);
    assert!(metric(&w, "warden_agent_slot_prepare_seconds_count").unwrap() >= 1.0);

    // A new slot is prepared behind it.
    wait_until("the slot pool to refill", WAIT, || {
        (metric(&w, ready) == Some(1.0) && slot_dirs(&w).len() == 2).then_some(())
    });
    // bob's label gets its own instance, from the new slot.
    let bobs = get(&w, "bob", "/apps/slotted/");
    assert_eq!(bobs["label"], "CONFIDENTIAL");
    assert_ne!(bobs["instance"], served["instance"]);

    // Removing the app stops its instances and throws its slots away.
    assert_eq!(w.api("DELETE", "/v1/apps/slotted", None).status, 204);
    wait_until("instances and slots to be gone", WAIT, || {
        (slot_dirs(&w).is_empty() && ids(&w, "slotted", "ready").is_empty()).then_some(())
    });
    assert_eq!(metric(&w, ready), None);
}

#[test]
fn start_paths_that_cannot_work_are_refused_with_what_to_do() {
    let w = Warden::demo(BIN);
    for (spec, says) in [
        (
            json!({ "start": "slot", "driver": "process" }),
            "needs driver \\\"sandbox\\\"",
        ),
        (
            json!({ "start": "slot", "driver": "sandbox", "slots": 0 }),
            "at least one slot",
        ),
        (json!({ "start": "warm" }), "spare counts per label"),
        (
            json!({ "start": "warm", "warm": { "NO SUCH LEVEL": 1 } }),
            "warm label",
        ),
        (
            json!({ "start": "warm", "warm": { "SECRET": 100000 } }),
            "at most 256",
        ),
    ] {
        let mut body = json!({ "name": "bad", "command": [BIN, "demo-app"] });
        for (k, v) in spec.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = w.api("POST", "/v1/apps", Some(body));
        assert_eq!(r.status, 400, "{spec}: {}", r.text());
        assert!(r.text().contains(says), "{spec}: {}", r.text());
    }
    let r = w.api(
        "POST",
        "/v1/apps",
        Some(json!({ "name": "bad", "command": [BIN, "demo-app"], "start": "someday" })),
    );
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(r.text().contains("`jit`, `slot`, `warm`"), "{}", r.text());
    assert!(w.api("GET", "/v1/apps/bad", None).status == 404);

    // The CLI passes the flags through and shows the refusal.
    let env = [
        ("WARDEN_API", w.api.as_str()),
        ("WARDEN_TOKEN", w.token.as_str()),
    ];
    let (ok, _, err) = cli(
        BIN,
        &[
            "apps", "create", "bad", "--start", "slot", "--driver", "process", "--", BIN,
            "demo-app",
        ],
        &env,
    );
    assert!(!ok && err.contains("needs driver"), "{err}");
    let (ok, out, err) = cli(
        BIN,
        &[
            "apps", "create", "good", "--start", "warm", "--warm", "SECRET=1", "--", BIN,
            "demo-app",
        ],
        &env,
    );
    assert!(ok, "{out}{err}");
    wait_spares(&w, "good", 1);
    let (ok, _, err) = cli(
        BIN,
        &[
            "apps", "create", "bad", "--warm", "SECRET", "--", BIN, "demo-app",
        ],
        &env,
    );
    assert!(!ok && err.contains("LABEL=COUNT"), "{err}");
}

#[test]
fn spares_that_keep_crashing_are_backed_off_and_shown_as_a_crash_loop() {
    let w = Warden::demo(BIN);
    // Each spare prints a line, serves for a second (or never gets that far), then dies.
    let script = format!("echo spare-lost-its-database; exec timeout -s KILL 1 {BIN} demo-app");
    create_app(
        &w,
        "flaky",
        json!({
            "command": ["/bin/sh", "-c", script],
            "start": "warm",
            "warm": { "SECRET": 1 },
        }),
    );
    let report = w.wait_crash_loop("flaky");
    assert_eq!(report["label"], "SECRET");
    assert!(report["crashes"].as_u64().unwrap() >= 3, "{report}");
    // The next refill waits: a start time is set, after the last exit.
    assert!(report["next_start_ms"].as_u64().unwrap() > 0, "{report}");
    assert!(
        report["last_lines"]
            .as_str()
            .unwrap()
            .contains("spare-lost-its-database"),
        "{report}"
    );
}

#[test]
fn a_sandboxs_init_says_when_its_app_accepts_and_a_process_is_polled() {
    let w = Warden::demo(BIN);
    create_app(&w, "told-jit", json!({ "driver": "sandbox" }));
    create_app(
        &w,
        "told-slot",
        json!({ "driver": "sandbox", "start": "slot", "slots": 1 }),
    );
    create_app(&w, "polled", json!({ "driver": "process" }));
    let ready = "warden_agent_pool_ready{app=\"told-slot\",kind=\"slot\",label=\"\"}";
    wait_until("a prepared slot", WAIT, || {
        (metric(&w, ready) == Some(1.0)).then_some(())
    });
    let seen = |how: &str| {
        metric(
            &w,
            &format!("warden_agent_ready_seen_total{{how=\"{how}\"}}"),
        )
        .unwrap_or(0.0)
    };
    let (told, polled) = (seen("told"), seen("polled"));
    // A JIT start and a slot start: both sandboxes' inits say when the app listens.
    for app in ["told-jit", "told-slot"] {
        assert_eq!(get(&w, "alice", &format!("/apps/{app}/"))["app"], app);
    }
    assert!(
        seen("told") >= told + 2.0,
        "told {told} -> {}, polled {polled} -> {}",
        seen("told"),
        seen("polled")
    );
    // A plain process has no init to say it: the agent's own connection attempts see it.
    assert_eq!(get(&w, "alice", "/apps/polled/")["app"], "polled");
    assert!(seen("polled") >= polled + 1.0);
}

/// An app with one worker, as gunicorn's default is: it answers each request with how many
/// connections it has accepted, and closes the connection.
const COUNTING_APP: &str = r#"
import os, socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(os.environ["PORT"])))
s.listen(16)
n = 0
while True:
    c, _ = s.accept()
    n += 1
    head = b""
    while b"\r\n\r\n" not in head:
        part = c.recv(4096)
        if not part:
            break
        head += part
    if head:
        body = str(n).encode()
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
    c.close()
"#;

#[test]
fn the_first_request_of_a_sandboxed_start_goes_over_the_connection_init_saw_it_accept_on() {
    // Init's probe is the app's first connection; the request that waited for the start is
    // sent on it, not on a second connection handed over through init (and no other
    // connection comes between: the agent takes init's word that the app accepts).
    let w = Warden::demo(BIN);
    for (name, extra) in [
        ("count-jit", json!({})),
        ("count-slot", json!({ "start": "slot", "slots": 1 })),
    ] {
        let mut spec = json!({
            "name": name,
            "command": ["python3", "-c", COUNTING_APP],
            "driver": "sandbox",
        });
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        let r = w.api("POST", "/v1/apps", Some(spec));
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let ready = "warden_agent_pool_ready{app=\"count-slot\",kind=\"slot\",label=\"\"}";
    wait_until("a prepared slot", WAIT, || {
        (metric(&w, ready) == Some(1.0)).then_some(())
    });
    for app in ["count-jit", "count-slot"] {
        let path = format!("/apps/{app}/");
        let answers: Vec<(u16, String)> = (0..2)
            .map(|_| {
                let r = w.get_as("alice", &w.password("alice"), &path);
                (r.status, r.text())
            })
            .collect();
        assert_eq!(
            answers,
            [(200, "1".to_owned()), (200, "2".to_owned())],
            "{app}"
        );
    }
}

/// The processes below `pid`, each with its depth (1 for a child).
fn descendants(pid: u32) -> Vec<(u32, usize)> {
    let mut out = Vec::new();
    let mut next = vec![(pid, 0)];
    while let Some((p, depth)) = next.pop() {
        let children =
            std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
        for c in children.split_whitespace().filter_map(|c| c.parse().ok()) {
            out.push((c, depth + 1));
            next.push((c, depth + 1));
        }
    }
    out
}

#[test]
fn a_slot_whose_waiting_app_process_was_killed_is_thrown_away_not_handed_out() {
    // A prepared slot holds the app's process forked ahead (helper, its child, init, then
    // that process). Killed from outside before any request, the slot must not be handed out
    // (its app could never start): the request is served all the same.
    let w = Warden::demo(BIN);
    slotted_app(&w);
    let slot = slot_dirs(&w).into_iter().next().unwrap();
    let record =
        std::fs::read_to_string(w.dir.join("instances").join(format!("{slot}.pid"))).unwrap();
    let helper: u32 = record.split_whitespace().next().unwrap().parse().unwrap();
    let waiting = wait_until("the app's process forked ahead", WAIT, || {
        descendants(helper)
            .into_iter()
            .find(|(_, depth)| *depth == 3)
            .map(|(pid, _)| pid)
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(waiting as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Its init ends the sandbox: the pool sees it dead and throws it away at the next take.
    wait_until("the slot's sandbox to end", WAIT, || {
        (!process_alive(helper)).then_some(())
    });
    let served = get(&w, "alice", "/apps/slotted/");
    assert_eq!(served["label"], "SECRET");
    assert_ne!(served["instance"].as_str(), Some(slot.as_str()));
}
