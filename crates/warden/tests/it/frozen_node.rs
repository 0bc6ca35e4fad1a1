//! A frozen node must not stall the cluster (issue 33): while one agent node is stopped with
//! SIGSTOP (its lease, and so its records, outlive the freeze), the gateway routes around it
//! within about a second, sends idempotent requests that were on it to another instance, fails
//! a non-idempotent one that was on it fast with a clear error, and keeps its throughput.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use warden_test_support::etcd::EtcdCluster;
use warden_test_support::{wait_until, Warden};

use crate::cluster::{demo_node, join_token, leased_node, nodes};

/// Keep-alive clients of the gateway.
const CLIENTS: usize = 16;
/// How long the load runs calm, then frozen.
const WINDOW: Duration = Duration::from_secs(5);
/// Longer than the freeze: the frozen node's records stay in the store throughout, as a
/// node paused for less than its lease is.
const LEASE: &str = "20s";

/// An agent node `name` with its node port on `addr` and a lease outliving the freeze.
fn agent(cluster: &EtcdCluster, first: &Warden, name: &str, addr: &str) -> Warden {
    let even = first.dir.join("even-load.json");
    std::fs::write(
        &even,
        r#"{"memory_used": 0.1, "cpu_busy": 0.1, "load_per_core": 0.1}"#,
    )
    .unwrap();
    let token = join_token(first);
    let even = even.display().to_string();
    let w = leased_node(
        cluster,
        name,
        LEASE,
        &[
            "--roles",
            "agent",
            "--advertise",
            addr,
            "--join-token-file",
            &token,
            "--load-file",
            &even,
        ],
    )
    .start();
    wait_until(
        &format!("{name}'s node port listed"),
        Duration::from_secs(30),
        || nodes(first).get(name)?.get("advertise")?.as_str().map(drop),
    );
    w
}

/// One request's outcome: when it was sent, how long it took, its status (0: no answer) and
/// its body.
#[derive(Clone)]
struct Outcome {
    at: Instant,
    took: Duration,
    status: u16,
    body: String,
}

/// A keep-alive HTTP/1.1 connection to the gateway.
struct Conn {
    host: String,
    stream: Option<BufReader<TcpStream>>,
}

impl Conn {
    fn new(host: &str) -> Self {
        Self {
            host: host.to_owned(),
            stream: None,
        }
    }

    /// One request on the connection (opened again if it was closed).
    fn send(&mut self, method: &str, path: &str, auth: &str) -> (u16, String) {
        for _ in 0..2 {
            if self.stream.is_none() {
                let s = TcpStream::connect(&self.host).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(90))).unwrap();
                self.stream = Some(BufReader::new(s));
            }
            match self.exchange(method, path, auth) {
                Some(r) => return r,
                None => self.stream = None,
            }
        }
        (0, String::new())
    }

    fn exchange(&mut self, method: &str, path: &str, auth: &str) -> Option<(u16, String)> {
        let s = self.stream.as_mut()?;
        let body = if method == "POST" { "work" } else { "" };
        let req = format!(
            "{method} {path} HTTP/1.1\r\nhost: {}\r\nauthorization: {auth}\r\ncontent-length: {}\r\n\r\n{body}",
            self.host,
            body.len()
        );
        s.get_mut().write_all(req.as_bytes()).ok()?;
        let mut line = String::new();
        s.read_line(&mut line).ok()?;
        let status: u16 = line.split(' ').nth(1)?.parse().ok()?;
        let mut len = 0usize;
        let mut close = false;
        loop {
            let mut h = String::new();
            s.read_line(&mut h).ok()?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let (name, value) = h.split_once(':')?;
            match name.to_ascii_lowercase().as_str() {
                "content-length" => len = value.trim().parse().ok()?,
                "connection" => close = value.trim().eq_ignore_ascii_case("close"),
                _ => {}
            }
        }
        let mut body = vec![0u8; len];
        s.read_exact(&mut body).ok()?;
        if close {
            self.stream = None;
        }
        Some((status, String::from_utf8_lossy(&body).into_owned()))
    }
}

/// `CLIENTS` keep-alive clients sending GETs until stopped (at most 200,000 requests or
/// 120 s in all).
struct Load {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Outcome>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(host: &str, auth: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let seen: Arc<Mutex<Vec<Outcome>>> = Arc::default();
        let began = Instant::now();
        let threads = (0..CLIENTS)
            .map(|_| {
                let (stop, seen) = (stop.clone(), seen.clone());
                let (host, auth) = (host.to_owned(), auth.to_owned());
                std::thread::spawn(move || {
                    let mut conn = Conn::new(&host);
                    for _ in 0..200_000 / CLIENTS {
                        if stop.load(Ordering::Relaxed)
                            || began.elapsed() > Duration::from_secs(120)
                        {
                            break;
                        }
                        let at = Instant::now();
                        let (status, body) = conn.send("GET", "/apps/demo/", &auth);
                        let took = at.elapsed();
                        seen.lock().unwrap().push(Outcome {
                            at,
                            took,
                            status,
                            body,
                        });
                    }
                })
            })
            .collect();
        Self {
            stop,
            seen,
            threads,
        }
    }

    fn finish(self) -> Vec<Outcome> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        let seen = self.seen.lock().unwrap();
        seen.clone()
    }
}

/// Requests answered (any status) that were sent within [from, from + WINDOW).
fn in_window(seen: &[Outcome], from: Instant) -> Vec<&Outcome> {
    seen.iter()
        .filter(|o| o.at >= from && o.at < from + WINDOW)
        .collect()
}

/// Three agent nodes keep one SECRET instance of the demo app each; alpha's gateway takes 16
/// keep-alive clients' GETs. Calm for a window, then gamma is frozen for a window (and 24 slow
/// POSTs are on their way when it freezes).
#[test]
fn a_frozen_node_is_routed_around_within_a_second_and_stalls_nothing() {
    let cluster = EtcdCluster::start(3);
    let alpha = demo_node(&cluster, "alpha", "gateway,api");
    let _beta = agent(&cluster, &alpha, "beta", "127.0.0.2:0");
    let gamma = agent(&cluster, &alpha, "gamma", "127.0.0.3:0");
    let _delta = agent(&cluster, &alpha, "delta", "127.0.0.4:0");
    let r = alpha.api(
        "POST",
        "/v1/apps/demo/scale",
        Some(serde_json::json!({"desired": {"SECRET": 3}})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let on_gamma = wait_until("one SECRET per node", Duration::from_secs(60), || {
        let ready: Vec<_> = alpha
            .instances()
            .into_iter()
            .filter(|i| i["app"] == "demo" && i["label"] == "SECRET" && i["state"] == "ready")
            .collect();
        let mut by_node: Vec<_> = ready.iter().map(|i| i["node"].clone()).collect();
        by_node.sort_by_key(|n| n.to_string());
        by_node.dedup();
        let gamma = ready.iter().find(|i| i["node"] == "gamma")?;
        (ready.len() == 3 && by_node.len() == 3).then(|| gamma["id"].as_str().unwrap().to_owned())
    });
    let host = alpha.gateway.trim_start_matches("http://").to_owned();
    let auth = warden_test_support::http::basic("alice", &alpha.password("alice"));
    // Warm: every instance has served, and the credential is cached.
    let mut warm = Conn::new(&host);
    for _ in 0..30 {
        assert_eq!(warm.send("GET", "/apps/demo/", &auth).0, 200);
    }
    assert_eq!(crate::metric(&alpha, "warden_peer_silences_total"), 0.0);

    let load = Load::start(&host, &auth);
    std::thread::sleep(Duration::from_millis(500));
    let calm_from = Instant::now();
    std::thread::sleep(WINDOW);
    // Slow POSTs, each 3 s at its instance, on their way to all three instances.
    let posts: Vec<_> = (0..24)
        .map(|_| {
            let (host, auth) = (host.clone(), auth.clone());
            std::thread::spawn(move || {
                let at = Instant::now();
                let (status, body) =
                    Conn::new(&host).send("POST", "/apps/demo/_slow?ms=3000", &auth);
                Outcome {
                    at,
                    took: at.elapsed(),
                    status,
                    body,
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let pid = Pid::from_raw(gamma.pid() as i32);
    kill(pid, Signal::SIGSTOP).unwrap();
    let frozen_from = Instant::now();
    std::thread::sleep(WINDOW + Duration::from_secs(3));
    let silent = crate::metric(&alpha, "warden_peers_silent");
    kill(pid, Signal::SIGCONT).unwrap();
    let seen = load.finish();
    let posts: Vec<Outcome> = posts.into_iter().map(|p| p.join().unwrap()).collect();

    let calm = in_window(&seen, calm_from);
    let frozen = in_window(&seen, frozen_from);
    eprintln!(
        "requests in {WINDOW:?}: calm {}, frozen {}; POSTs: {:?}",
        calm.len(),
        frozen.len(),
        posts
            .iter()
            .map(|o| (o.status, o.took.as_millis()))
            .collect::<Vec<_>>()
    );
    let failed: Vec<_> = frozen
        .iter()
        .filter(|o| o.status != 200)
        .map(|o| (o.status, &o.body))
        .collect();
    assert!(
        failed.is_empty(),
        "every GET during the freeze was answered: {failed:?}"
    );
    // Requests sent in the window but answered only after it count against it: a stalled
    // client sends nothing more.
    assert!(
        frozen.len() * 3 >= calm.len() * 2,
        "throughput frozen {} against calm {}: at least two thirds",
        frozen.len(),
        calm.len()
    );
    let slowest = seen
        .iter()
        .filter(|o| o.at + o.took > frozen_from && o.at < frozen_from + WINDOW)
        .map(|o| o.took)
        .max()
        .unwrap();
    eprintln!("slowest GET around the freeze: {slowest:?}");
    assert!(
        slowest < Duration::from_secs(4),
        "no GET waited long for the frozen node (about a second to notice it): {slowest:?}"
    );
    assert_eq!(silent, 1.0, "gamma was out of routing while frozen");
    // The POSTs on gamma failed fast and said why; the others were answered.
    let refused: Vec<_> = posts.iter().filter(|o| o.status != 200).collect();
    assert!(
        !refused.is_empty() && refused.len() < posts.len(),
        "some POSTs were on gamma, not all: {:?}",
        posts.iter().map(|o| o.status).collect::<Vec<_>>()
    );
    for o in &refused {
        assert_eq!(o.status, 502, "{}", o.body);
        assert!(o.body.contains("stopped answering"), "{}", o.body);
        assert!(o.took < Duration::from_secs(7), "failed fast: {:?}", o.took);
    }
    // gamma answers again and is routed to again, its instance unchanged.
    wait_until("gamma served again", Duration::from_secs(30), || {
        let r = alpha.get_as("alice", &alpha.password("alice"), "/apps/demo/");
        (r.status == 200 && r.json()["instance"] == on_gamma.as_str()).then_some(())
    });
    assert_eq!(crate::metric(&alpha, "warden_peers_silent"), 0.0);
}
