//! Several warden nodes on one real 3-member etcd: joining, leaving, dying, and what they share.

use std::time::Duration;

use warden_test_support::etcd::EtcdCluster;
use warden_test_support::{cli, wait_until, Launch, Warden};

use crate::BIN;

/// A node of `cluster` named `name` with `extra` flags, no demo.
fn node(cluster: &EtcdCluster, name: &str, extra: &[&str]) -> Launch {
    let mut l = Launch::new(BIN)
        .no_demo()
        .arg("--store")
        .arg(&cluster.url())
        .arg("--node-name")
        .arg(name)
        .arg("--node-lease-ttl")
        .arg("2s");
    for a in extra {
        l = l.arg(a);
    }
    l
}

fn join_token(first: &Warden) -> String {
    first.dir.join("join-token").display().to_string()
}

/// Live nodes as the API lists them: name → record.
fn nodes(api: &Warden) -> std::collections::BTreeMap<String, serde_json::Value> {
    let r = api.api("GET", "/v1/nodes", None);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["id"].as_str().unwrap().to_owned(), n.clone()))
        .collect()
}

#[test]
fn nodes_join_with_the_token_publish_themselves_and_leave() {
    let cluster = EtcdCluster::start(3);
    let first = node(&cluster, "alpha", &[]).start();
    assert!(first.stdout().contains("join token"), "{}", first.stdout());
    let token = join_token(&first);

    // A second node, gateway only, joins with the token and shares the admin token.
    let mut gw = node(
        &cluster,
        "beta",
        &["--roles", "gateway", "--join-token-file", &token],
    )
    .start();
    assert_eq!(
        std::fs::read_to_string(gw.dir.join("admin-token")).unwrap(),
        std::fs::read_to_string(first.dir.join("admin-token")).unwrap(),
        "one admin token for the cluster"
    );
    let listed = wait_until(
        "both nodes listed with their load",
        Duration::from_secs(20),
        || {
            let n = nodes(&first);
            (n.len() == 2 && n["beta"]["load"]["memory_available_bytes"].as_u64()? > 0).then_some(n)
        },
    );
    assert_eq!(listed["beta"]["roles"], serde_json::json!(["gateway"]));
    assert_eq!(listed["beta"]["drivers"], serde_json::json!([]));
    assert_eq!(
        listed["alpha"]["roles"],
        serde_json::json!(["gateway", "agent", "api"])
    );
    assert!(!listed["alpha"]["drivers"].as_array().unwrap().is_empty());
    let (ok, out, err) = cli(
        BIN,
        &["nodes", "list", "--data-dir", first.dir.to_str().unwrap()],
        &[],
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("alpha") && out.contains("beta") && out.contains("gateway,agent,api"),
        "{out}"
    );

    // A clean stop deregisters at once.
    gw.stop();
    assert!(
        !nodes(&first).contains_key("beta"),
        "a stopped node is gone at once"
    );

    // A node that dies stays listed until its lease expires, then vanishes.
    let mut doomed = node(
        &cluster,
        "gamma",
        &["--roles", "agent", "--join-token-file", &token],
    )
    .start();
    wait_until("gamma listed", Duration::from_secs(20), || {
        nodes(&first).contains_key("gamma").then_some(())
    });
    doomed.signal_and_wait(nix::sys::signal::Signal::SIGKILL);
    assert!(
        nodes(&first).contains_key("gamma"),
        "its lease has not expired yet"
    );
    wait_until("gamma's lease to expire", Duration::from_secs(20), || {
        (!nodes(&first).contains_key("gamma")).then_some(())
    });
}

#[test]
fn a_node_without_the_right_token_or_with_a_taken_name_is_refused() {
    let cluster = EtcdCluster::start(3);
    let first = node(&cluster, "alpha", &[]).start();

    let err = node(&cluster, "beta", &[]).start_refused();
    assert!(err.contains("--join-token-file"), "{err}");

    let wrong = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(wrong.path(), format!("wjt1-{}", "0".repeat(64))).unwrap();
    let err = node(
        &cluster,
        "beta",
        &["--join-token-file", wrong.path().to_str().unwrap()],
    )
    .start_refused();
    assert!(err.contains("does not open"), "{err}");

    let err = node(
        &cluster,
        "alpha",
        &["--join-token-file", &join_token(&first)],
    )
    .start_refused();
    assert!(err.contains("taken by a live node"), "{err}");
}

/// No secret of the cluster is in etcd in clear: not the admin token, not the identity key,
/// not the CA's private key.
#[test]
fn the_cluster_secrets_are_sealed_in_etcd() {
    let cluster = EtcdCluster::start(1);
    let first = node(&cluster, "alpha", &[]).start();
    let out = std::process::Command::new("etcdctl")
        .args([
            "--endpoints",
            &cluster.client(0).to_string(),
            "get",
            "",
            "--prefix",
        ])
        .env("ETCDCTL_API", "3")
        .output()
        .expect("etcdctl runs (apt-get install etcd-client)");
    assert!(out.status.success());
    let dump = String::from_utf8_lossy(&out.stdout);
    assert!(
        dump.contains("cluster/secrets"),
        "the dump holds the cluster's keys"
    );
    for file in ["admin-token", "identity-key"] {
        let secret = std::fs::read_to_string(first.dir.join(file)).unwrap();
        assert!(!dump.contains(secret.trim()), "{file} is in etcd in clear");
    }
    assert!(
        !dump.contains("PRIVATE KEY"),
        "a private key is in etcd in clear"
    );
}
