//! Several warden nodes on one real 3-member etcd: joining, leaving, dying, and what they share.

use std::time::Duration;

use warden_test_support::etcd::EtcdCluster;
use warden_test_support::{cli, wait_until, Launch, Warden};

use crate::BIN;

/// A node of `cluster` named `name` with `extra` flags, no demo.
pub(crate) fn node(cluster: &EtcdCluster, name: &str, extra: &[&str]) -> Launch {
    leased_node(cluster, name, "2s", extra)
}

/// [`node`] with a lease of `lease` (a duration as `--node-lease-ttl` takes it).
pub(crate) fn leased_node(
    cluster: &EtcdCluster,
    name: &str,
    lease: &str,
    extra: &[&str],
) -> Launch {
    let mut l = Launch::new(BIN)
        .no_demo()
        .arg("--store")
        .arg(&cluster.url())
        .arg("--node-name")
        .arg(name)
        .arg("--node-lease-ttl")
        .arg(lease);
    for a in extra {
        l = l.arg(a);
    }
    l
}

/// The first node of `cluster`, with the demo (its users and app), running `roles`.
pub(crate) fn demo_node(cluster: &EtcdCluster, name: &str, roles: &str) -> Warden {
    Launch::new(BIN)
        .arg("--store")
        .arg(&cluster.url())
        .arg("--node-name")
        .arg(name)
        .arg("--roles")
        .arg(roles)
        .start()
}

pub(crate) fn join_token(first: &Warden) -> String {
    first.dir.join("join-token").display().to_string()
}

/// Live nodes as the API lists them: name → record.
pub(crate) fn nodes(api: &Warden) -> std::collections::BTreeMap<String, serde_json::Value> {
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

    // An agent node stopped cleanly leaves at once too, with its instances' records.
    let mut delta = node(
        &cluster,
        "delta",
        &[
            "--roles",
            "agent",
            "--advertise",
            "127.0.0.3:0",
            "--join-token-file",
            &token,
        ],
    )
    .start();
    wait_until("delta listed", Duration::from_secs(20), || {
        nodes(&first).contains_key("delta").then_some(())
    });
    delta.stop();
    assert!(
        !nodes(&first).contains_key("delta"),
        "a stopped agent node is gone at once"
    );
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
    let dump = cluster.etcdctl(&["get", "", "--prefix"]);
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

/// One of three etcd members killed under load: requests keep being served, API writes keep
/// succeeding, and every acknowledged write is there afterwards.
#[test]
fn requests_and_writes_go_on_when_an_etcd_member_dies() {
    let mut cluster = EtcdCluster::start(3);
    let alpha = demo_node(&cluster, "alpha", "gateway,agent,api");
    let pw = alpha.password("alice");
    assert_eq!(alpha.get_as("alice", &pw, "/apps/demo/").status, 200);
    let mut created = Vec::new();
    for i in 0..40 {
        if i == 10 {
            cluster.kill(0);
        }
        if i == 30 {
            cluster.restart(0);
        }
        let name = format!("user{i}");
        let r = alpha.api(
            "POST",
            "/v1/users",
            Some(serde_json::json!({"name": name, "password": "a-long-password", "clearance": "SECRET"})),
        );
        assert_eq!(r.status, 201, "write {i}: {}", r.text());
        created.push(name);
        let r = alpha.get_as("alice", &pw, "/apps/demo/");
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
    }
    let users = alpha.api("GET", "/v1/users", None).json();
    for name in &created {
        assert!(
            users
                .as_array()
                .unwrap()
                .iter()
                .any(|u| u["name"] == name.as_str()),
            "{name} was acknowledged and is gone"
        );
    }
}

/// A CA and a certificate it signed for `names`, as PEM files in `dir` (`<stem>.pem`,
/// `<stem>-key.pem`, `ca.pem`).
fn issue(
    dir: &std::path::Path,
    ca: &(rcgen::Certificate, rcgen::KeyPair),
    stem: &str,
    names: &[&str],
) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params =
        rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap();
    params.extended_key_usages = vec![
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = params.signed_by(&key, &ca.0, &ca.1).unwrap();
    std::fs::write(dir.join(format!("{stem}.pem")), cert.pem()).unwrap();
    std::fs::write(dir.join(format!("{stem}-key.pem")), key.serialize_pem()).unwrap();
}

fn new_ca(dir: &std::path::Path, stem: &str) -> (rcgen::Certificate, rcgen::KeyPair) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).unwrap();
    std::fs::write(dir.join(format!("{stem}.pem")), cert.pem()).unwrap();
    (cert, key)
}

/// warden reaches an etcd that serves TLS and asks for client certificates with --etcd-ca,
/// --etcd-cert and --etcd-key; without a client certificate, or trusting another CA, it stops
/// with an error that says it could not reach etcd.
#[test]
fn warden_speaks_tls_to_an_etcd_that_asks_for_client_certificates() {
    let certs = tempfile::tempdir().unwrap();
    let d = certs.path();
    let ca = new_ca(d, "ca");
    issue(d, &ca, "member", &["127.0.0.1", "localhost"]);
    issue(d, &ca, "client", &["warden"]);
    let other = new_ca(d, "other-ca");
    drop(other);
    let p = |f: &str| d.join(f).display().to_string();
    let cluster = EtcdCluster::start_with(
        1,
        Some(warden_test_support::etcd::MemberTls {
            cert: &d.join("member.pem"),
            key: &d.join("member-key.pem"),
            client_ca: &d.join("ca.pem"),
        }),
    );
    let with = |extra: &[&str]| {
        let mut l = Launch::new(BIN)
            .no_demo()
            .arg("--store")
            .arg(&cluster.url())
            .arg("--node-name")
            .arg("alpha");
        for a in extra {
            l = l.arg(a);
        }
        l
    };
    let err = with(&["--etcd-ca", &p("ca.pem")]).start_refused();
    assert!(err.contains("etcd"), "without a client certificate: {err}");
    let err = with(&[
        "--etcd-ca",
        &p("other-ca.pem"),
        "--etcd-cert",
        &p("client.pem"),
        "--etcd-key",
        &p("client-key.pem"),
    ])
    .start_refused();
    assert!(err.contains("etcd"), "trusting another CA: {err}");
    let w = with(&[
        "--etcd-ca",
        &p("ca.pem"),
        "--etcd-cert",
        &p("client.pem"),
        "--etcd-key",
        &p("client-key.pem"),
    ])
    .start();
    assert_eq!(nodes(&w).len(), 1);
}

/// With etcd's authentication on, warden signs in with --etcd-user and the password from
/// --etcd-password-file; a wrong password stops it with an error that never shows a password.
#[test]
fn warden_signs_in_to_an_etcd_with_authentication() {
    let cluster = EtcdCluster::start(1);
    cluster.etcdctl(&["user", "add", "root:root-secret-1"]);
    cluster.etcdctl(&["auth", "enable"]);
    let dir = tempfile::tempdir().unwrap();
    let (right, wrong) = (dir.path().join("right"), dir.path().join("wrong"));
    std::fs::write(&right, "root-secret-1\n").unwrap();
    std::fs::write(&wrong, "guessed-wrong-2\n").unwrap();
    let with = |file: &std::path::Path| {
        Launch::new(BIN)
            .no_demo()
            .arg("--store")
            .arg(&cluster.url())
            .arg("--etcd-user")
            .arg("root")
            .arg("--etcd-password-file")
            .arg(file.to_str().unwrap())
    };
    let err = with(&wrong).start_refused();
    assert!(err.contains("etcd"), "{err}");
    assert!(
        !err.contains("guessed-wrong-2") && !err.contains("root-secret-1"),
        "{err}"
    );
    let w = with(&right).start();
    assert_eq!(nodes(&w).len(), 1);
    assert!(!w.stderr().contains("root-secret-1"));
}

/// `--demo` on a second node leaves the demo as the first node seeded it: the passwords the
/// first node shows keep working, at either gateway.
#[test]
fn the_demo_is_seeded_once_per_cluster() {
    let cluster = EtcdCluster::start(1);
    let alpha = demo_node(&cluster, "alpha", "gateway,agent,api");
    let beta = Launch::new(BIN)
        .arg("--store")
        .arg(&cluster.url())
        .arg("--node-name")
        .arg("beta")
        .arg("--roles")
        .arg("gateway")
        .arg("--join-token-file")
        .arg(&join_token(&alpha))
        .start();
    assert!(!beta.dir.join("demo-users.json").exists());
    let pw = alpha.password("alice");
    for w in [&alpha, &beta] {
        let r = warden_test_support::request(
            "GET",
            &format!("{}/apps/demo/", w.gateway),
            &[(
                "authorization",
                &warden_test_support::http::basic("alice", &pw),
            )],
            b"",
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
}

/// The checker removes the records of instances that are gone (its node's port does not know
/// it, or its node is not live) and leaves live ones; two checkers never remove one twice.
#[test]
fn checkers_remove_the_records_of_dead_instances_and_only_those() {
    let cluster = EtcdCluster::start(1);
    let alpha = demo_node(&cluster, "alpha", "gateway,agent,api");
    let pw = alpha.password("alice");
    let live = alpha.get_as("alice", &pw, "/apps/demo/").json()["instance"]
        .as_str()
        .unwrap()
        .to_owned();
    let ghost = |id: &str, node: &str| {
        serde_json::json!({
            "id": id, "app": "demo", "label": "UNCLASSIFIED", "node": node,
            "addr": "127.0.0.1:1", "pid": 1, "state": "ready", "started_at_ms": 0,
        })
    };
    // One on a live node that does not run it, one on a node that does not exist.
    cluster.etcdctl(&[
        "put",
        "instances/demo/ghost-on-alpha",
        &ghost("ghost-on-alpha", "alpha").to_string(),
    ]);
    cluster.etcdctl(&[
        "put",
        "instances/demo/ghost-nowhere",
        &ghost("ghost-nowhere", "nowhere").to_string(),
    ]);
    let checkers: Vec<Warden> = ["gamma", "delta"]
        .iter()
        .map(|name| {
            node(
                &cluster,
                name,
                &[
                    "--roles",
                    "checker,api",
                    "--join-token-file",
                    &join_token(&alpha),
                ],
            )
            .start()
        })
        .collect();
    wait_until(
        "the ghosts' records removed",
        Duration::from_secs(30),
        || {
            let ids: Vec<String> = alpha
                .instances()
                .iter()
                .map(|i| i["id"].as_str().unwrap_or_default().to_owned())
                .collect();
            (!ids.iter().any(|i| i.starts_with("ghost"))).then_some(())
        },
    );
    let metric = |line: &str| checkers.iter().map(|c| crate::metric(c, line)).sum::<f64>();
    wait_until(
        "both checkers probed the live instance",
        Duration::from_secs(30),
        || {
            checkers
                .iter()
                .all(|c| crate::metric(c, "warden_checker_probes_total{outcome=\"alive\"}") >= 1.0)
                .then_some(())
        },
    );
    assert_eq!(
        metric("warden_checker_removed_total"),
        2.0,
        "each ghost removed once"
    );
    assert!(
        alpha.instances().iter().any(|i| i["id"] == live.as_str()),
        "the live instance keeps its record"
    );
    assert_eq!(
        alpha.get_as("alice", &pw, "/apps/demo/").json()["instance"],
        live.as_str()
    );
}
