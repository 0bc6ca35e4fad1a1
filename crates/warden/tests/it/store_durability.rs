//! The embedded store through the real binary: acknowledged writes survive `kill -9`, damaged
//! files stop warden with a message naming the file, two wardens cannot share one store.

use serde_json::json;
use warden_test_support::{cli, Launch};

use crate::BIN;

#[test]
fn acknowledged_writes_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Launch::new(BIN).data_dir(dir.path()).no_demo().start();
    for i in 0..20 {
        let spec = json!({"name": format!("app{i}"), "command": ["/bin/true"]});
        assert_eq!(w.api("POST", "/v1/apps", Some(spec)).status, 201);
    }
    w.signal_and_wait(nix::sys::signal::Signal::SIGKILL);
    let w = Launch::new(BIN).data_dir(dir.path()).no_demo().start();
    let apps = w.api("GET", "/v1/apps", None).json();
    assert_eq!(
        apps.as_array().unwrap().len(),
        20,
        "every acknowledged app is back: {apps}"
    );
}

#[test]
fn a_restarted_node_drops_the_records_of_instances_that_died_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = Launch::new(BIN).data_dir(dir.path()).start();
    assert_eq!(
        w.get_as("alice", &w.password("alice"), "/apps/demo/")
            .status,
        200
    );
    w.signal_and_wait(nix::sys::signal::Signal::SIGKILL);
    let w = Launch::new(BIN).data_dir(dir.path()).start();
    // The agent removes what its previous life left behind before serving, so nobody is routed
    // to an instance that died with it.
    assert_eq!(w.instances().len(), 0);
    let nodes = w.api("GET", "/v1/nodes", None).json();
    assert_eq!(
        nodes.as_array().unwrap().len(),
        1,
        "only the live node remains: {nodes}"
    );
    let again = w.get_as("alice", &w.password("alice"), "/apps/demo/");
    assert_eq!(again.status, 200, "{}", again.text());
}

fn up_fails_with(dir: &std::path::Path) -> String {
    let (ok, _, stderr) = cli(
        BIN,
        &[
            "up",
            "--listen",
            "127.0.0.1:0",
            "--api-listen",
            "127.0.0.1:0",
            "--data-dir",
            dir.to_str().unwrap(),
        ],
        &[],
    );
    assert!(!ok, "warden up must refuse to start");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

#[test]
fn a_corrupt_store_file_is_a_clear_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("store.redb"), vec![0xA5; 100_000]).unwrap();
    let err = up_fails_with(dir.path());
    assert!(
        err.contains(&dir.path().join("store.redb").display().to_string()),
        "{err}"
    );
    assert!(
        err.contains("backup") || err.contains("move it away"),
        "{err}"
    );
}

#[test]
fn a_truncated_store_file_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut w = Launch::new(BIN).data_dir(dir.path()).start();
        w.stop();
    }
    let path = dir.path().join("store.redb");
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len / 4)
        .unwrap();
    let err = up_fails_with(dir.path());
    assert!(err.contains("store.redb"), "{err}");
}

#[test]
fn two_wardens_cannot_share_a_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let _first = Launch::new(BIN).data_dir(dir.path()).no_demo().start();
    let err = up_fails_with(dir.path());
    assert!(err.contains("another warden process has it open"), "{err}");
}

#[test]
fn records_and_routing_stay_put_for_many_node_lease_lifetimes() {
    let w = warden_test_support::Launch::new(BIN)
        .arg("--node-lease-ttl")
        .arg("1s")
        .start();
    let alice = w.password("alice");
    let first = w.get_as("alice", &alice, "/apps/demo/").json();
    let id = first["instance"].as_str().unwrap().to_owned();
    // Four lease lifetimes: the agent's keep-alives must carry the lease, or the store drops
    // the node's records when it ends.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(4);
    let mut looks = 0;
    while std::time::Instant::now() < until {
        let listed = w.instances();
        assert!(
            listed.iter().any(|i| i["id"] == id.as_str()),
            "instance {id} vanished from the store after {looks} looks: {listed:?}"
        );
        let nodes = w.api("GET", "/v1/nodes", None).json();
        assert_eq!(nodes.as_array().map(Vec::len), Some(1), "{nodes}");
        looks += 1;
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let again = w.get_as("alice", &alice, "/apps/demo/").json();
    assert_eq!(again["instance"], id.as_str());
    assert!(!w.stderr().contains("lease was lost"), "{}", w.stderr());
}
