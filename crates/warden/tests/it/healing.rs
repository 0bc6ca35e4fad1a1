//! A cluster that heals (seed 003 §3.3, §6.2): desired counts kept across agent nodes by the
//! scheduler, spread over nodes, moved off drained, stopping and loaded nodes with no failed
//! request, and replaced on other nodes when a node dies.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use warden_test_support::etcd::EtcdCluster;
use warden_test_support::{cli, wait_until, Warden};

use crate::cluster::{demo_node, join_token, node, nodes};
use crate::BIN;

/// An agent-only node `name` with its node port on `addr`, joined with `first`'s token, with
/// `extra` flags; returned once `first` lists its node port.
///
/// Every node here shares one host, whose load says nothing about any one node (and is sampled
/// by each at other moments): unless `extra` gives another, each reads one even load from a
/// file, so that placement goes by instances alone.
pub(crate) fn agent(
    cluster: &EtcdCluster,
    first: &Warden,
    name: &str,
    addr: &str,
    extra: &[&str],
) -> Warden {
    let token = join_token(first);
    let even = first.dir.join("even-load.json");
    std::fs::write(
        &even,
        r#"{"memory_used": 0.1, "cpu_busy": 0.1, "load_per_core": 0.1}"#,
    )
    .unwrap();
    let even = even.display().to_string();
    let mut args = vec![
        "--roles",
        "agent",
        "--advertise",
        addr,
        "--join-token-file",
        &token,
    ];
    if !extra.contains(&"--load-file") {
        args.extend_from_slice(&["--load-file", &even]);
    }
    args.extend_from_slice(extra);
    let w = node(cluster, name, &args).start();
    wait_until(
        &format!("{name}'s node port listed"),
        Duration::from_secs(30),
        || nodes(first).get(name)?.get("advertise")?.as_str().map(drop),
    );
    w
}

fn run_cli(api: &Warden, args: &[&str]) -> String {
    let mut all: Vec<&str> = args.to_vec();
    let dir = api.dir.display().to_string();
    all.extend_from_slice(&["--data-dir", &dir]);
    let (ok, out, err) = cli(BIN, &all, &[]);
    assert!(ok, "warden {args:?}: {err}");
    out
}

/// Kept instances of the demo app by label, then node, in the given states.
fn kept(api: &Warden, states: &[&str]) -> BTreeMap<String, BTreeMap<String, usize>> {
    let mut m: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for i in api.instances() {
        if i["app"] == "demo" && i["kept"] == true && states.iter().any(|s| i["state"] == *s) {
            *m.entry(i["label"].as_str().unwrap().to_owned())
                .or_default()
                .entry(i["node"].as_str().unwrap().to_owned())
                .or_default() += 1;
        }
    }
    m
}

fn ready(api: &Warden) -> BTreeMap<String, BTreeMap<String, usize>> {
    kept(api, &["ready"])
}

fn total(m: &BTreeMap<String, usize>) -> usize {
    m.values().sum()
}

/// Requests in a loop as a user until stopped: (status or error) → count.
struct Load {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<BTreeMap<String, usize>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Load {
    /// At most 20,000 requests or 120 s, whichever ends first.
    fn start(gateway: &Warden, user: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let seen: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
        let (s, c) = (stop.clone(), seen.clone());
        let password = gateway.password(user);
        let (url, user) = (gateway.gateway.clone(), user.to_owned());
        let thread = std::thread::spawn(move || {
            let began = std::time::Instant::now();
            for _ in 0..20_000 {
                if s.load(Ordering::Relaxed) || began.elapsed() > Duration::from_secs(120) {
                    break;
                }
                let r = warden_test_support::http::request(
                    "GET",
                    &format!("{url}/apps/demo/"),
                    &[(
                        "authorization",
                        &warden_test_support::http::basic(&user, &password),
                    )],
                    b"",
                );
                *c.lock().unwrap().entry(r.status.to_string()).or_default() += 1;
            }
        });
        Self {
            stop,
            seen,
            thread: Some(thread),
        }
    }

    /// Stops the loop; every outcome seen.
    fn finish(mut self) -> BTreeMap<String, usize> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
        self.seen.lock().unwrap().clone()
    }

    fn served(&self) -> usize {
        self.seen.lock().unwrap().get("200").copied().unwrap_or(0)
    }

    /// Waits until 20 more requests have been served than now.
    fn serves_on(&self) {
        let from = self.served();
        wait_until("requests served", Duration::from_secs(20), || {
            (self.served() > from + 20).then_some(())
        });
    }
}

/// `n` concurrent POSTs (never retried by the gateway) that each take `ms` at the instance;
/// their statuses once all are answered.
fn slow_posts(
    gateway: &Warden,
    user: &str,
    n: usize,
    ms: u64,
) -> std::thread::JoinHandle<Vec<u16>> {
    let password = gateway.password(user);
    let (url, user) = (gateway.gateway.clone(), user.to_owned());
    let posts: Vec<_> = (0..n)
        .map(|_| {
            let (url, user, password) = (url.clone(), user.clone(), password.clone());
            std::thread::spawn(move || {
                warden_test_support::http::request(
                    "POST",
                    &format!("{url}/apps/demo/_slow?ms={ms}"),
                    &[(
                        "authorization",
                        &warden_test_support::http::basic(&user, &password),
                    )],
                    b"work",
                )
                .status
            })
        })
        .collect();
    // Under way before the caller goes on.
    std::thread::sleep(Duration::from_millis(300));
    std::thread::spawn(move || posts.into_iter().map(|p| p.join().unwrap()).collect())
}

fn all_ok(seen: &BTreeMap<String, usize>) {
    assert!(
        seen.keys().all(|k| k == "200") && seen.get("200").copied().unwrap_or(0) > 0,
        "every request is served: {seen:?}"
    );
}

/// alpha: gateway and API with the demo; agents beta and gamma, keeping one SECRET instance
/// of the demo app each.
fn two_agents_one_secret_each(cluster: &EtcdCluster) -> (Warden, Warden, Warden) {
    let alpha = demo_node(cluster, "alpha", "gateway,api");
    let beta = agent(cluster, &alpha, "beta", "127.0.0.2:0", &[]);
    let gamma = agent(cluster, &alpha, "gamma", "127.0.0.3:0", &[]);
    run_cli(&alpha, &["apps", "scale", "demo", "SECRET=2"]);
    wait_until("one SECRET per node", Duration::from_secs(30), || {
        (ready(&alpha).get("SECRET")?.len() == 2).then_some(())
    });
    (alpha, beta, gamma)
}

/// alpha: gateway and API with the demo; agents beta, gamma, delta.
fn three_agents(cluster: &EtcdCluster, extra: [&[&str]; 3]) -> (Warden, Vec<Warden>) {
    let alpha = demo_node(cluster, "alpha", "gateway,api");
    let agents = [
        ("beta", "127.0.0.2:0"),
        ("gamma", "127.0.0.3:0"),
        ("delta", "127.0.0.4:0"),
    ]
    .iter()
    .zip(extra)
    .map(|((name, addr), extra)| agent(cluster, &alpha, name, addr, extra))
    .collect();
    (alpha, agents)
}

#[test]
fn desired_counts_spread_over_nodes_and_never_overshoot() {
    let cluster = EtcdCluster::start(1);
    let (alpha, _agents) = three_agents(&cluster, [&[], &[], &[]]);

    let out = run_cli(
        &alpha,
        &["apps", "scale", "demo", "SECRET=3", "CONFIDENTIAL=2"],
    );
    assert!(out.contains("SECRET=3"), "{out}");
    let r = wait_until(
        "3 SECRET and 2 CONFIDENTIAL ready",
        Duration::from_secs(30),
        || {
            let r = ready(&alpha);
            (total(r.get("SECRET")?) == 3 && total(r.get("CONFIDENTIAL")?) == 2).then_some(r)
        },
    );
    assert_eq!(r["SECRET"].len(), 3, "one SECRET on each node: {r:?}");
    assert_eq!(r["CONFIDENTIAL"].len(), 2, "on two nodes: {r:?}");

    // Counts changed quickly, again and again, settle exactly, and then stay.
    for counts in [["SECRET=1"], ["SECRET=4"], ["SECRET=2"], ["SECRET=5"]] {
        run_cli(&alpha, &["apps", "scale", "demo", counts[0]]);
    }
    wait_until("5 SECRET kept", Duration::from_secs(30), || {
        let all = kept(&alpha, &["starting", "ready", "draining"]);
        (total(ready(&alpha).get("SECRET")?) == 5 && total(all.get("SECRET")?) == 5).then_some(())
    });
    for _ in 0..20 {
        let all = kept(&alpha, &["starting", "ready", "draining", "spare"]);
        assert_eq!(total(&all["SECRET"]), 5, "no more than desired: {all:?}");
        let per_node = &all["SECRET"];
        assert!(
            per_node.values().max() <= Some(&2) && per_node.len() == 3,
            "spread 2/2/1: {per_node:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = run_cli(&alpha, &["status"]);
    assert!(status.contains("demo SECRET: 5/5 ready"), "{status}");
    assert!(status.contains("scheduler: "), "{status}");

    // Scaling to 0 stops keeping the label.
    run_cli(
        &alpha,
        &["apps", "scale", "demo", "SECRET=0", "CONFIDENTIAL=0"],
    );
    wait_until("no kept instance", Duration::from_secs(30), || {
        kept(&alpha, &["starting", "ready", "draining"])
            .is_empty()
            .then_some(())
    });
    let r = alpha.api(
        "POST",
        "/v1/apps/demo/scale",
        Some(serde_json::json!({"desired": {"NO SUCH LEVEL": 1}})),
    );
    assert_eq!(r.status, 400, "{}", r.text());
}

#[test]
fn a_dead_nodes_instances_are_replaced_elsewhere_and_it_comes_back_clean() {
    let cluster = EtcdCluster::start(1);
    let (alpha, mut agents) = three_agents(&cluster, [&[], &[], &[]]);
    run_cli(&alpha, &["apps", "scale", "demo", "SECRET=3"]);
    wait_until("one SECRET per node", Duration::from_secs(30), || {
        (ready(&alpha).get("SECRET")?.len() == 3).then_some(())
    });
    let load = Load::start(&alpha, "alice");
    load.serves_on();

    let gamma_dir = agents[1].dir.clone();
    // The instances' private directories (beside each, the record of its process group, which
    // the dead agent's reaper uses and removes).
    let private_dirs = || -> Vec<String> {
        std::fs::read_dir(gamma_dir.join("instances"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| !n.ends_with(".pid"))
                    .collect()
            })
            .unwrap_or_default()
    };
    let before_kill = private_dirs();
    assert!(
        !before_kill.is_empty(),
        "gamma's instance has its directory"
    );
    agents[1].signal_and_wait(nix::sys::signal::Signal::SIGKILL);
    assert_eq!(private_dirs(), before_kill, "a kill -9 leaves them behind");
    let r = wait_until(
        "3 SECRET ready on the two nodes left",
        Duration::from_secs(30),
        || {
            let r = ready(&alpha);
            let s = r.get("SECRET")?;
            let live: usize = s
                .iter()
                .filter(|(n, _)| *n != "gamma")
                .map(|(_, c)| c)
                .sum();
            (live == 3).then_some(r)
        },
    );
    assert!(r["SECRET"].contains_key("beta") && r["SECRET"].contains_key("delta"));
    wait_until("gamma's records gone", Duration::from_secs(30), || {
        (!alpha.instances().iter().any(|i| i["node"] == "gamma")).then_some(())
    });

    // gamma comes back under its name and takes its share again, one move at a time.
    let token = join_token(&alpha);
    let even = alpha.dir.join("even-load.json").display().to_string();
    let _gamma = node(
        &cluster,
        "gamma",
        &[
            "--roles",
            "agent",
            "--advertise",
            "127.0.0.3:0",
            "--join-token-file",
            &token,
            "--load-file",
            &even,
        ],
    )
    .data_dir(&gamma_dir)
    .start();
    let left = private_dirs();
    assert!(
        before_kill.iter().all(|d| !left.contains(d)),
        "a node that comes back removes what its dead instances left: {left:?}"
    );
    wait_until("one SECRET per node again", Duration::from_secs(60), || {
        let all = kept(&alpha, &["starting", "ready", "draining"]);
        let r = ready(&alpha);
        (r.get("SECRET")?.len() == 3 && total(all.get("SECRET")?) == 3).then_some(())
    });
    load.serves_on();
    all_ok(&load.finish());
}

#[test]
fn drain_moves_every_instance_off_with_no_failed_request_and_undrain_reverses_it() {
    let cluster = EtcdCluster::start(1);
    let (alpha, mut beta, _gamma) = two_agents_one_secret_each(&cluster);
    // An instance nobody keeps, started by a request (bob's label), is moved too.
    let bob = alpha.password("bob");
    assert_eq!(alpha.get_as("bob", &bob, "/apps/demo/").status, 200);
    let load = Load::start(&alpha, "alice");
    load.serves_on();

    // Requests in flight on beta's instance when the drain begins finish there.
    let slow = slow_posts(&alpha, "alice", 4, 1500);
    let out = run_cli(&alpha, &["nodes", "drain", "beta", "--wait", "60"]);
    assert!(out.contains("drained"), "{out}");
    assert_eq!(
        slow.join().unwrap(),
        vec![200; 4],
        "in-flight requests finished"
    );
    let r = ready(&alpha);
    assert_eq!(r["SECRET"].get("gamma"), Some(&2), "{r:?}");
    assert!(
        !alpha.instances().iter().any(|i| i["node"] == "beta"),
        "nothing left on beta: {:?}",
        alpha.instances()
    );
    // The list says the drain is done once beta's record (published each second) counts
    // nothing left on it; never `draining` with nothing to move.
    wait_until("beta listed as drained", Duration::from_secs(10), || {
        let listed = run_cli(&alpha, &["nodes", "list"]);
        let beta = listed.lines().find(|l| l.starts_with("beta"))?.to_owned();
        assert!(!beta.contains("draining (0"), "{listed}");
        beta.contains("drained").then_some(())
    });
    // Nothing new goes to a drained node, not even a start a request asks for.
    let carol = alpha.password("carol");
    assert_eq!(alpha.get_as("carol", &carol, "/apps/demo/").status, 200);
    assert!(
        !alpha.instances().iter().any(|i| i["node"] == "beta"),
        "a drained node starts nothing"
    );
    assert_eq!(alpha.get_as("bob", &bob, "/apps/demo/").status, 200);

    run_cli(&alpha, &["nodes", "undrain", "beta"]);
    wait_until("one SECRET per node again", Duration::from_secs(60), || {
        (ready(&alpha).get("SECRET")?.len() == 2).then_some(())
    });
    all_ok(&load.finish());
    let r = alpha.api("DELETE", "/v1/nodes/beta/drain", None);
    assert_eq!(r.status, 404, "not drained any more: {}", r.text());

    // A misspelt name is refused rather than drained; a node not running yet can be, on purpose.
    let dir = alpha.dir.display().to_string();
    let (ok, _, err) = cli(BIN, &["nodes", "drain", "betta", "--data-dir", &dir], &[]);
    assert!(!ok && err.contains("no live node named \"betta\""), "{err}");
    run_cli(&alpha, &["nodes", "drain", "epsilon", "--ahead"]);
    assert_eq!(
        alpha.api("DELETE", "/v1/nodes/epsilon/drain", None).status,
        204
    );

    // An operator's drain outlives the node's own drain when it stops with instances left.
    run_cli(&alpha, &["nodes", "drain", "beta"]);
    beta.stop();
    let r = alpha.api("DELETE", "/v1/nodes/beta/drain", None);
    assert_eq!(r.status, 204, "the operator's order stays: {}", r.text());
}

#[test]
fn a_node_stopped_with_sigterm_moves_its_instances_first() {
    let cluster = EtcdCluster::start(1);
    let (alpha, mut beta, _gamma) = two_agents_one_secret_each(&cluster);
    let load = Load::start(&alpha, "alice");
    load.serves_on();
    let slow = slow_posts(&alpha, "alice", 4, 1500);
    beta.stop();
    assert_eq!(
        slow.join().unwrap(),
        vec![200; 4],
        "in-flight requests finished"
    );
    assert!(
        beta.stderr()
            .contains("moving instances to other nodes first"),
        "{}",
        beta.stderr()
    );
    let r = alpha.api("DELETE", "/v1/nodes/beta/drain", None);
    assert_eq!(
        r.status,
        404,
        "a stopping node's own order goes with it: {}",
        r.text()
    );
    let r = ready(&alpha);
    assert_eq!(r["SECRET"].get("gamma"), Some(&2), "{r:?}");
    load.serves_on();
    all_ok(&load.finish());
}

#[test]
fn a_loaded_node_sheds_an_instance_with_no_failed_request() {
    let cluster = EtcdCluster::start(1);
    let loads = tempfile::tempdir().unwrap();
    let file = |name: &str| loads.path().join(format!("{name}.json"));
    let set = |name: &str, x: f64| {
        let v = serde_json::json!({"memory_used": x, "cpu_busy": x, "load_per_core": x});
        std::fs::write(file(name), v.to_string()).unwrap();
    };
    for n in ["beta", "gamma", "delta"] {
        set(n, 0.1);
    }
    let (fb, fg, fd) = (
        file("beta").display().to_string(),
        file("gamma").display().to_string(),
        file("delta").display().to_string(),
    );
    let (alpha, _agents) = three_agents(
        &cluster,
        [
            &["--load-file", &fb],
            &["--load-file", &fg],
            &["--load-file", &fd],
        ],
    );
    run_cli(&alpha, &["apps", "scale", "demo", "SECRET=3"]);
    wait_until("one SECRET per node", Duration::from_secs(30), || {
        (ready(&alpha).get("SECRET")?.len() == 3).then_some(())
    });
    let load = Load::start(&alpha, "alice");
    load.serves_on();

    // beta at 0.9 against a mean of about 0.37: above it by more than the 0.2 shedding margin.
    set("beta", 0.9);
    let r = wait_until("beta shed its instance", Duration::from_secs(30), || {
        let r = ready(&alpha);
        let s = r.get("SECRET")?;
        (s.get("beta").is_none() && total(s) == 3).then_some(r)
    });
    assert_eq!(r["SECRET"].len(), 2, "{r:?}");
    // And nothing comes back to the loaded node.
    for _ in 0..10 {
        assert!(!ready(&alpha)["SECRET"].contains_key("beta"));
        std::thread::sleep(Duration::from_millis(200));
    }
    load.serves_on();
    all_ok(&load.finish());
    let metrics = nodes(&alpha);
    assert!(
        (metrics["beta"]["load"]["cpu_busy"].as_f64().unwrap() - 0.9).abs() < 1e-9,
        "the load file is what beta publishes: {:?}",
        metrics["beta"]
    );
}

/// Spread for availability wins over balance by load: a node busier than the others (77%
/// against a mean of 56%, over the start margin) but with room still holds its share of a
/// label, so losing any one node never takes every instance of it.
#[test]
fn a_busier_node_with_room_still_holds_its_share_of_a_label() {
    let cluster = EtcdCluster::start(1);
    let loads = tempfile::tempdir().unwrap();
    let file = |name: &str, x: f64| {
        let path = loads.path().join(format!("{name}.json"));
        let v = serde_json::json!({"memory_used": x, "cpu_busy": x, "load_per_core": x});
        std::fs::write(&path, v.to_string()).unwrap();
        path.display().to_string()
    };
    let (fb, fg, fd) = (file("beta", 0.77), file("gamma", 0.45), file("delta", 0.45));
    let (alpha, _agents) = three_agents(
        &cluster,
        [
            &["--load-file", &fb],
            &["--load-file", &fg],
            &["--load-file", &fd],
        ],
    );
    run_cli(&alpha, &["apps", "scale", "demo", "SECRET=4"]);
    let placed = wait_until(
        "four SECRET instances ready",
        Duration::from_secs(30),
        || {
            let r = ready(&alpha);
            let s = r.get("SECRET")?;
            (total(s) == 4).then(|| s.clone())
        },
    );
    assert_eq!(placed.len(), 3, "a node holds none: {placed:?}");
    let (most, fewest) = (placed.values().max(), placed.values().min());
    assert_eq!(most.unwrap() - fewest.unwrap(), 1, "{placed:?}");
}

#[test]
fn a_label_that_crashes_everywhere_backs_off_and_stays_put() {
    let cluster = EtcdCluster::start(1);
    let alpha = demo_node(&cluster, "alpha", "gateway,api");
    let _beta = agent(&cluster, &alpha, "beta", "127.0.0.2:0", &[]);
    let _gamma = agent(&cluster, &alpha, "gamma", "127.0.0.3:0", &[]);
    let r = alpha.api(
        "POST",
        "/v1/apps",
        Some(serde_json::json!({
            "name": "crasher",
            "command": ["/bin/sh", "-c", "echo cannot start: no database; exit 3"],
            "driver": "process",
        })),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let r = alpha.api(
        "POST",
        "/v1/apps/crasher/scale",
        Some(serde_json::json!({"desired": {"SECRET": 2}})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let crash = alpha.wait_crash_loop("crasher");
    assert!(
        crash["last_lines"]
            .as_str()
            .unwrap()
            .contains("no database"),
        "{crash}"
    );
    let status = |w: &Warden| -> Value {
        let s = w.api("GET", "/v1/status", None).json();
        s["apps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["name"] == "crasher")
            .cloned()
            .unwrap()
    };
    // Both nodes keep their one and back off; neither gives it to the other.
    let a = wait_until(
        "both nodes in a crash loop",
        Duration::from_secs(60),
        || {
            let a = status(&alpha);
            let loops = a["crash_loops"].as_array()?;
            (loops.len() == 2 && loops.iter().all(|c| c["crash_loop"] == true)).then_some(a)
        },
    );
    assert_eq!(
        a["placed"]["SECRET"],
        serde_json::json!({"beta": 1, "gamma": 1})
    );
    assert_eq!(a["moving"], serde_json::json!([]));
    let crashes = |a: &Value| -> u64 {
        a["crash_loops"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["crashes"].as_u64().unwrap())
            .sum()
    };
    std::thread::sleep(Duration::from_secs(2));
    let b = status(&alpha);
    assert_eq!(b["placed"], a["placed"], "placement stays put");
    assert_eq!(b["moving"], serde_json::json!([]));
    // Without backoff each node would restart it every few milliseconds.
    assert!(
        crashes(&b) <= crashes(&a) + 8,
        "restarts back off: {} then {}",
        crashes(&a),
        crashes(&b)
    );
    let out = run_cli(&alpha, &["status"]);
    assert!(
        out.contains("CRASH LOOP") && out.contains("no database"),
        "{out}"
    );
}

/// A node that stops answering without dying (frozen here; a lost network looks the same to the
/// others) is not dead to the scheduler until its lease ends: then its instances are replaced.
/// When it wakes, it registers again and stops what the placement no longer gives it.
#[test]
fn a_frozen_node_is_replaced_when_its_lease_ends_and_stops_its_instances_when_it_wakes() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let cluster = EtcdCluster::start(1);
    let (alpha, agents) = three_agents(&cluster, [&[], &[], &[]]);
    run_cli(&alpha, &["apps", "scale", "demo", "SECRET=3"]);
    wait_until("one SECRET per node", Duration::from_secs(30), || {
        (ready(&alpha).get("SECRET")?.len() == 3).then_some(())
    });
    let old = alpha
        .instances()
        .into_iter()
        .find(|i| i["node"] == "gamma" && i["app"] == "demo")
        .expect("gamma's instance");
    let old_pid = old["pid"].as_u64().unwrap() as u32;
    let gamma = Pid::from_raw(agents[1].pid() as i32);
    kill(gamma, Signal::SIGSTOP).unwrap();
    let r = wait_until(
        "gamma's lease to end and its instance to be replaced",
        Duration::from_secs(30),
        || {
            let r = ready(&alpha);
            let s = r.get("SECRET")?;
            (!s.contains_key("gamma") && total(s) == 3).then_some(r)
        },
    );
    assert_eq!(r["SECRET"].len(), 2, "{r:?}");
    kill(gamma, Signal::SIGCONT).unwrap();
    wait_until("gamma back", Duration::from_secs(30), || {
        nodes(&alpha).contains_key("gamma").then_some(())
    });
    // Its old instance, still running when it froze, is stopped: the placement moved it.
    wait_until(
        "gamma's old instance to stop",
        Duration::from_secs(60),
        || (!warden_test_support::process_alive(old_pid)).then_some(()),
    );
    // And it gets its share back by spreading, with no instance more than desired.
    wait_until("one SECRET per node again", Duration::from_secs(60), || {
        let all = kept(&alpha, &["starting", "ready", "draining"]);
        (ready(&alpha).get("SECRET")?.len() == 3 && total(all.get("SECRET")?) == 3).then_some(())
    });
}
