//! The instance table under concurrent use: paths that take its locks from several threads at
//! once neither deadlock nor leave a map naming an instance the other map has forgotten.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::thread;
use std::time::Duration;

use tokio::runtime::Runtime;
use tokio::sync::watch;
use warden_core::identity::IdentityKey;
use warden_core::{Activity, InstanceRecord, InstanceState, Lifetime};
use warden_store::{EmbeddedStore, Store};

use super::{record_key, Deps, Lifecycle, Running, Serving};
use crate::drivers::sandbox::{bridge::BridgeConfig, cgroup::Cgroups, SandboxDriver};
use crate::drivers::Drivers;
use crate::metrics::Metrics;
use crate::paths::Paths;
use crate::pools::Pools;
use crate::restarts::Restarts;
use crate::sync::lock;
use warden_cluster::node::{Node, NodeInfo};

/// Rounds each thread runs; a lock-order inversion shows within a few thousand.
const ROUNDS: usize = 200_000;
/// Longest wait for the rounds: past it, the threads are stuck for good.
const DEADLINE: Duration = Duration::from_secs(20);

/// A runtime that is never driven: what is spawned on it stays queued until it is dropped.
fn idle_runtime() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A lifecycle with an empty table, on a store in `dir`. Nothing is started: the tests drive
/// the table's own methods.
fn lifecycle(rt: &Runtime, dir: &Path) -> Arc<Lifecycle> {
    let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(&dir.join("store.redb")).unwrap());
    lifecycle_on(rt, dir, store)
}

/// [`lifecycle`] on `store`.
pub(super) fn lifecycle_on(rt: &Runtime, dir: &Path, store: Arc<dyn Store>) -> Arc<Lifecycle> {
    let info = NodeInfo {
        id: "locks".into(),
        ..NodeInfo::default()
    };
    let node = rt
        .block_on(Node::register(store.clone(), info, Duration::from_secs(30)))
        .unwrap();
    let paths = Paths {
        logs: dir.join("logs"),
        instances: dir.join("instances"),
        slugs: dir.join("slugs"),
    };
    let metrics = Arc::new(Metrics::new().unwrap());
    let children = warden_sandbox::process::Children::new();
    let drivers = Arc::new(Drivers::new(
        SandboxDriver::new(
            BridgeConfig::default(),
            Cgroups::off("unit test"),
            children.clone(),
        ),
        IdentityKey::from_hex(&"0".repeat(64)).unwrap(),
        children,
    ));
    let (refills, _) = tokio::sync::mpsc::unbounded_channel();
    let pools = Arc::new(Pools::new(
        drivers.clone(),
        paths.clone(),
        metrics.clone(),
        refills,
    ));
    let (_, stopping) = watch::channel(false);
    Lifecycle::new(Deps {
        store,
        node: Arc::new(node),
        paths,
        max_instances: 100,
        drivers,
        pools,
        restarts: Arc::new(Restarts::default()),
        metrics,
        stopping,
        slugs: Arc::default(),
        data: None,
    })
}

/// A ready shared instance `id` of app `a`, label `l`.
pub(super) fn record(id: &str) -> InstanceRecord {
    InstanceRecord {
        id: id.into(),
        app: "a".into(),
        label: "l".into(),
        node: "locks".into(),
        addr: "127.0.0.1:1".parse().unwrap(),
        pid: 0,
        state: InstanceState::Ready,
        started_at_ms: 0,
        lifetime: Lifetime::Shared,
        user: None,
        kept: false,
        generation: String::new(),
        release: None,
    }
}

/// Puts `record` in the table of running instances, as a start does.
pub(super) fn add_running(life: &Lifecycle, record: &InstanceRecord) {
    let (_, exited) = watch::channel(false);
    lock(&life.table).running.insert(
        record.id.clone(),
        Running {
            record: record.clone(),
            exited,
            activity: Arc::new(Activity::new()),
            idle_timeout: Duration::ZERO,
            stopping: Arc::new(AtomicBool::new(false)),
            log: PathBuf::new(),
            data: false,
            listener_uid: None,
            first: None,
        },
    );
}

/// Runs `a` and `b` on two OS threads, `ROUNDS` times each; fails (instead of hanging) when
/// they have not finished by `DEADLINE`.
fn race(a: impl FnMut() + Send + 'static, b: impl FnMut() + Send + 'static, what: &str) {
    let barrier = Arc::new(Barrier::new(2));
    let rounds: Arc<[AtomicUsize; 2]> = Arc::default();
    let (done, finished) = mpsc::channel();
    for (i, f) in [Box::new(a) as Box<dyn FnMut() + Send>, Box::new(b)]
        .into_iter()
        .enumerate()
    {
        let (barrier, done, rounds) = (barrier.clone(), done.clone(), rounds.clone());
        let mut f = f;
        // Detached on purpose: deadlocked threads cannot be joined; the test process ends.
        thread::spawn(move || {
            barrier.wait();
            for _ in 0..ROUNDS {
                f();
                rounds[i].fetch_add(1, Ordering::Relaxed);
            }
            let _ = done.send(());
        });
    }
    for _ in 0..2 {
        if finished.recv_timeout(DEADLINE).is_err() {
            let [a, b] = [0, 1].map(|i| rounds[i].load(Ordering::Relaxed));
            panic!("{what}: the threads stopped after {a} and {b} of {ROUNDS} rounds and did not finish in {DEADLINE:?}: the instance table is deadlocked");
        }
    }
}

#[test]
fn settling_a_start_and_relabelling_at_once_do_not_deadlock() {
    let rt = idle_runtime();
    let dir = tempfile::tempdir().unwrap();
    let life = lifecycle(&rt, dir.path());
    let started = record("i1");
    add_running(&life, &started);
    let key = record_key(&started).unwrap();

    let settler = {
        let life = life.clone();
        move || life.settle(key.clone(), &Ok(started.clone()))
    };
    let relabeller = {
        let (life, mut queue, mut queued) = (life.clone(), idle_runtime(), 0);
        move || {
            // Relabel's background record writes are only queued, and dropped now and then.
            queued += 1;
            if queued % 1000 == 0 {
                queue = idle_runtime();
            }
            let _rt = queue.enter();
            life.relabel("i1", "l").unwrap();
        }
    };
    race(settler, relabeller, "settle and relabel");

    let table = lock(&life.table);
    assert!(matches!(
        table.serving.get(&("a".into(), "l".into(), String::new())),
        Some(Serving::Ready(r)) if r.id == "i1"
    ));
}

#[test]
fn an_instance_tainted_right_after_its_start_serves_only_its_new_label() {
    let rt = idle_runtime();
    let dir = tempfile::tempdir().unwrap();
    let life = lifecycle(&rt, dir.path());
    let started = record("i1");
    let low: super::ServeKey = ("a".into(), "l".into(), String::new());
    let high: super::ServeKey = ("a".into(), "m".into(), String::new());
    let (_starting, rx) = watch::channel(None);
    lock(&life.table)
        .serving
        .insert(low.clone(), Serving::Starting(rx));
    add_running(&life, &started);
    // Its first request taints it before the start is settled; the paths that settle a start
    // still hold the record it was started with, of the lower label.
    let _rt = rt.enter();
    life.relabel("i1", "m").unwrap();
    let low_is_free = |when: &str| {
        let table = lock(&life.table);
        assert!(
            !table.serving.contains_key(&low),
            "{when}: the tainted instance serves its old label again"
        );
        assert!(
            matches!(table.serving.get(&high), Some(Serving::Ready(r)) if r.id == "i1" && r.label == "m"),
            "{when}: it no longer serves its new label"
        );
    };
    life.settle(low.clone(), &Ok(started.clone()));
    low_is_free("a request's start settled");
    life.serve_if_free(&started);
    low_is_free("a kept start settled");
    life.take_over("old", &started);
    low_is_free("a replacement took over");
}

#[test]
fn a_spare_with_a_database_login_of_no_user_is_never_one_users_own() {
    let rt = idle_runtime();
    let dir = tempfile::tempdir().unwrap();
    let life = lifecycle(&rt, dir.path());
    let mut spec = warden_core::AppSpec::new("a", vec!["./a".into()]);
    spec.data = true;
    let mut spare = record("s1");
    spare.state = InstanceState::Spare;
    spare.generation = spec.generation("l");
    add_running(&life, &spare);
    // Its data socket was attached when no user was known: its role reads every user's rows.
    lock(&life.table).running.get_mut("s1").unwrap().data = true;
    let alice = warden_core::Owner::User("alice".into());
    let mut table = lock(&life.table);
    assert!(
        super::handout::take_spare_from(&mut table, &spec, "l", &alice).is_none(),
        "a spare that reads every user's rows was handed to one user"
    );
    let shared =
        super::handout::take_spare_from(&mut table, &spec, "l", &warden_core::Owner::Shared);
    assert_eq!(shared.map(|r| r.id), Some("s1".to_owned()));
}

#[test]
fn a_relabel_is_told_to_this_processs_gateway_whoever_asked() {
    let rt = idle_runtime();
    let dir = tempfile::tempdir().unwrap();
    let life = lifecycle(&rt, dir.path());
    let told = Arc::new(std::sync::Mutex::new(Vec::new()));
    let t = told.clone();
    life.on_relabel(Arc::new(move |id: &str, label: Option<&str>| {
        t.lock()
            .unwrap()
            .push((id.to_owned(), label.map(str::to_owned)))
    }));
    add_running(&life, &record("i1"));
    let mut data = record("d1");
    data.id = "d1".into();
    add_running(&life, &data);
    lock(&life.table).running.get_mut("d1").unwrap().data = true;
    let _rt = rt.enter();
    // Asked by another node's gateway (through the node port) as by this one's: the same call.
    life.relabel("i1", "m").unwrap();
    // A second gateway reaching the same join changes nothing, and tells nothing.
    life.relabel("i1", "m").unwrap();
    assert!(
        life.relabel("d1", "m").is_err(),
        "a data instance is stopped, not relabelled"
    );
    assert_eq!(
        *told.lock().unwrap(),
        [
            ("i1".to_owned(), Some("m".to_owned())),
            ("d1".to_owned(), None)
        ]
    );
}

#[test]
fn retiring_an_instance_never_signals_a_group_its_id_no_longer_leads() {
    // The table still names an instance whose process is gone (its monitor has not removed it
    // yet), and another process group now has its id: a stand-in here, which no child
    // registry of this node knows. Retiring the instance must leave the stand-in alone.
    use std::os::unix::process::CommandExt;
    let rt = idle_runtime();
    let dir = tempfile::tempdir().unwrap();
    let life = lifecycle(&rt, dir.path());
    let mut stand_in = std::process::Command::new("sleep")
        .arg("300")
        .process_group(0)
        .spawn()
        .unwrap();
    let mut gone = record("i1");
    gone.pid = stand_in.id();
    add_running(&life, &gone);
    life.retire("i1");
    std::thread::sleep(Duration::from_millis(100));
    let status = stand_in.try_wait().unwrap();
    let _ = stand_in.kill();
    let _ = stand_in.wait();
    assert_eq!(
        status, None,
        "the process group that took the id was signalled"
    );
}

#[test]
fn a_connection_kept_for_a_request_that_never_takes_it_is_closed_after_a_second() {
    // The connection init's probe made waits in the table for the request that waited for the
    // start; if that request never takes it, an app with one worker must not be held by it.
    // What else comes behind the request (the start's log line) runs too.
    use std::io::Read;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let life = lifecycle(&rt, dir.path());
    add_running(&life, &record("i1"));
    let app = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let kept = std::net::TcpStream::connect(app.local_addr().unwrap()).unwrap();
    let (mut apps_end, _) = app.accept().unwrap();
    assert!(life.keep_first("i1", kept));
    let then = Arc::new(AtomicBool::new(false));
    let ran = then.clone();
    let behind = life
        .clone()
        .behind("i1".into(), true, move || ran.store(true, Ordering::SeqCst));
    rt.block_on(async { tokio::time::timeout(Duration::from_secs(30), behind).await })
        .expect("the bookkeeping behind the request ends");
    assert!(
        then.load(Ordering::SeqCst),
        "what comes behind the request ran"
    );
    assert!(
        lock(&life.table).running["i1"].first.is_none(),
        "still kept"
    );
    apps_end
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut buf = [0u8; 1];
    assert_eq!(
        apps_end.read(&mut buf).unwrap(),
        0,
        "the app's end sees the connection closed"
    );
}
