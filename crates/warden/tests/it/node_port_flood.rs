//! A node port under a stranger's flood of connections that never finish a handshake: peers'
//! connections still get through, so other nodes' gateways keep reaching the node's instances,
//! and the node stays alive to the scheduler.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use warden_test_support::etcd::EtcdCluster;
use warden_test_support::{wait_until, Warden};

use crate::cluster::{demo_node, nodes};
use crate::healing::agent;

/// Connections the flood opens at most, and for how long at most.
const FLOOD_MAX: usize = 20_000;
const FLOOD_FOR: Duration = Duration::from_secs(40);
/// Flooding threads, and connections each holds open at once (the oldest dropped beyond).
const FLOOD_THREADS: usize = 8;
const HELD: usize = 250;
/// Pause of each flooding thread between two connections: up to 1,000 a second in all, more
/// unfinished handshakes within the node port's handshake timeout than it keeps at once.
const FLOOD_PACE: Duration = Duration::from_millis(8);

/// A stranger on loopback opening connections to a node port and never finishing a handshake:
/// silent ones, one byte, a TLS record header announcing a hello that never comes, and one byte
/// then a half-close.
struct Flood {
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicUsize>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Flood {
    fn start(addr: SocketAddr) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let opened = Arc::new(AtomicUsize::new(0));
        let threads = (0..FLOOD_THREADS)
            .map(|t| {
                let (stop, opened) = (stop.clone(), opened.clone());
                std::thread::spawn(move || {
                    let began = Instant::now();
                    let mut held = VecDeque::new();
                    for i in t.. {
                        if stop.load(Ordering::Relaxed)
                            || began.elapsed() > FLOOD_FOR
                            || opened.load(Ordering::Relaxed) >= FLOOD_MAX
                        {
                            break;
                        }
                        // A connection the port does not take in time is not counted.
                        if let Ok(mut s) =
                            TcpStream::connect_timeout(&addr, Duration::from_millis(500))
                        {
                            opened.fetch_add(1, Ordering::Relaxed);
                            let _ = match i % 4 {
                                0 => Ok(()),
                                1 => s.write_all(&[0x16]),
                                2 => s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]),
                                _ => s
                                    .write_all(&[0x16])
                                    .and_then(|()| s.shutdown(Shutdown::Write)),
                            };
                            held.push_back(s);
                            if held.len() > HELD {
                                held.pop_front();
                            }
                        }
                        std::thread::sleep(FLOOD_PACE);
                    }
                })
            })
            .collect();
        Self {
            stop,
            opened,
            threads,
        }
    }

    fn opened(&self) -> usize {
        self.opened.load(Ordering::Relaxed)
    }

    /// Ends the flood, closing its connections; how many it opened.
    fn finish(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        self.opened.load(Ordering::Relaxed)
    }
}

/// `n` requests at once as alice, each held 200 ms at the instance, so that the gateway needs
/// `n` connections to the instance's node at once: statuses and the instances that answered.
fn at_once(alpha: &Warden, password: &str, n: usize) -> Vec<(u16, String)> {
    std::thread::scope(|s| {
        let all: Vec<_> = (0..n)
            .map(|_| {
                s.spawn(|| {
                    let r = alpha.get_as("alice", password, "/apps/demo/_slow?ms=200");
                    let instance = match r.status {
                        200 => r.json()["instance"].as_str().unwrap_or("").to_owned(),
                        _ => r.text(),
                    };
                    (r.status, instance)
                })
            })
            .collect();
        all.into_iter().map(|t| t.join().unwrap()).collect()
    })
}

/// The demo app's kept instances: id → node.
fn kept(alpha: &Warden) -> BTreeMap<String, String> {
    alpha
        .instances()
        .iter()
        .filter(|i| i["app"] == "demo" && i["kept"] == true)
        .map(|i| {
            let field = |k: &str| i[k].as_str().unwrap().to_owned();
            (field("id"), field("node"))
        })
        .collect()
}

fn checker_probes(alpha: &Warden, outcome: &str) -> f64 {
    crate::metric(
        alpha,
        &format!("warden_checker_probes_total{{outcome=\"{outcome}\"}}"),
    )
}

/// alpha runs the gateway, the API and the checker; agents beta and gamma keep one SECRET
/// instance between them. A stranger floods the port of the node that runs it with thousands of
/// connections that never finish a handshake. Meanwhile every request through alpha's gateway
/// is served by that instance, over new connections to the flooded port as well as pooled ones;
/// the checker's own handshakes get through; no scheduler takes the node for dead; and alpha's
/// pings never go unanswered, so the stranger cannot take the node out of alpha's routing.
#[test]
fn a_flood_of_unfinished_handshakes_on_a_node_port_starves_no_peer() {
    let cluster = EtcdCluster::start(1);
    let alpha = demo_node(&cluster, "alpha", "gateway,api,checker");
    let _beta = agent(&cluster, &alpha, "beta", "127.0.0.2:0", &[]);
    let _gamma = agent(&cluster, &alpha, "gamma", "127.0.0.3:0", &[]);
    let r = alpha.api(
        "POST",
        "/v1/apps/demo/scale",
        Some(serde_json::json!({"desired": {"SECRET": 1}})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let (id, node) = wait_until("one SECRET ready", Duration::from_secs(30), || {
        alpha
            .instances()
            .into_iter()
            .find(|i| i["app"] == "demo" && i["label"] == "SECRET" && i["state"] == "ready")
            .map(|i| {
                let field = |k: &str| i[k].as_str().unwrap().to_owned();
                (field("id"), field("node"))
            })
    });
    let before = kept(&alpha);
    assert_eq!(before.len(), 1, "{before:?}");
    let password = alpha.password("alice");
    assert_eq!(at_once(&alpha, &password, 1), [(200, id.clone())]);
    let addr: SocketAddr = nodes(&alpha)[&node]["advertise"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();

    let flood = Flood::start(addr);
    let flooded = wait_until("the flood under way", Duration::from_secs(20), || {
        let n = flood.opened();
        (n >= 1_000).then_some(n)
    });
    let (unreachable, alive) = (
        checker_probes(&alpha, "unreachable"),
        checker_probes(&alpha, "alive"),
    );
    // One more request at once each round: each round needs one connection more than the
    // gateway has pooled, so a new one to the flooded port.
    let mut seen: BTreeMap<(u16, String), usize> = BTreeMap::new();
    for n in 2..=12 {
        for answer in at_once(&alpha, &password, n) {
            *seen.entry(answer).or_default() += 1;
        }
    }
    assert_eq!(
        seen.keys().collect::<Vec<_>>(),
        [&(200, id.clone())],
        "every request was served by the instance on the flooded node: {seen:?}"
    );
    // The checker opens a connection of its own to probe the instance every 2 s.
    wait_until("two probes by the checker", Duration::from_secs(20), || {
        (checker_probes(&alpha, "alive") >= alive + 2.0).then_some(())
    });
    let still_flooding = flood.opened() < FLOOD_MAX;
    let after = kept(&alpha);
    let opened = flood.finish();

    assert!(
        opened > flooded && still_flooding,
        "the flood went on throughout: {flooded} connections before, {opened} in all"
    );
    assert_eq!(
        checker_probes(&alpha, "unreachable"),
        unreachable,
        "the checker reached the flooded node every time"
    );
    assert_eq!(
        after, before,
        "the flooded node is alive to the scheduler: its instance stays"
    );
    assert_eq!(
        crate::metric(&alpha, "warden_peer_silences_total"),
        0.0,
        "the flooded node answered every ping of alpha's: it never left alpha's routing"
    );
}
