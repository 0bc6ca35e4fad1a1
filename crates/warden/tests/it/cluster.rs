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

/// The first node of `cluster`, with the demo (its users and app), running `roles`.
fn demo_node(cluster: &EtcdCluster, name: &str, roles: &str) -> Warden {
    Launch::new(BIN)
        .arg("--store")
        .arg(&cluster.url())
        .arg("--node-name")
        .arg(name)
        .arg("--roles")
        .arg(roles)
        .start()
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

fn port_metric(w: &Warden, outcome: &str) -> f64 {
    crate::metric(
        w,
        &format!("warden_node_port_connections_total{{outcome=\"{outcome}\"}}"),
    )
}

/// alpha runs the gateway and the API but no agent; beta runs the agent behind its node port
/// on another loopback address. A request at alpha starts an instance on beta and is served
/// through beta's node port, signed for that instance; later requests reuse the connection;
/// beta's own gateway reaches the instance directly.
#[test]
fn a_gateway_starts_and_reaches_instances_on_another_node_through_its_node_port() {
    let cluster = EtcdCluster::start(3);
    let alpha = demo_node(&cluster, "alpha", "gateway,api");
    let beta = node(
        &cluster,
        "beta",
        &[
            "--roles",
            "gateway,agent,api",
            "--advertise",
            "127.0.0.2:0",
            "--join-token-file",
            &join_token(&alpha),
        ],
    )
    .start();
    let pw = alpha.password("alice");
    wait_until(
        "beta listed with its node port",
        Duration::from_secs(20),
        || {
            nodes(&alpha)
                .get("beta")?
                .get("advertise")?
                .as_str()
                .map(str::to_owned)
        },
    );

    let r = alpha.get_as("alice", &pw, "/apps/demo/");
    assert_eq!(r.status, 200, "{}", r.text());
    let first = r.json();
    assert_eq!(
        first["verified"], true,
        "signed for the instance on beta: {first}"
    );
    let records = alpha.instances();
    let record = records
        .iter()
        .find(|i| i["id"] == first["instance"])
        .unwrap_or_else(|| panic!("{records:?}"));
    assert_eq!(
        record["node"], "beta",
        "the instance started on the agent node"
    );
    assert!(
        record["addr"].as_str().unwrap().starts_with("127.0.0.1:")
            || record["addr"].as_str().unwrap().starts_with("fd+unix:"),
        "the instance listens only inside its node: {record}"
    );

    // The status shows where instances run.
    let (ok, out, err) = cli(
        BIN,
        &["status", "--data-dir", alpha.dir.to_str().unwrap()],
        &[],
    );
    assert!(ok, "{err}");
    let beta_line = out
        .lines()
        .find(|l| l.starts_with("beta"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        beta_line.contains("gateway,agent,api") && beta_line.contains("demo: "),
        "{out}"
    );
    let alpha_line = out
        .lines()
        .find(|l| l.starts_with("alpha"))
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        alpha_line.trim_end().ends_with('-'),
        "no instance on alpha: {out}"
    );

    // Keep-alive across nodes: the same upstream connection carries the next requests.
    let joined = port_metric(&beta, "joined");
    for _ in 0..10 {
        let r = alpha.get_as("alice", &pw, "/apps/demo/");
        assert_eq!(r.status, 200);
        assert_eq!(r.json()["instance"], first["instance"]);
        assert_eq!(r.json()["peer"], first["peer"], "one pooled connection");
    }
    assert_eq!(
        port_metric(&beta, "joined"),
        joined,
        "no new node port connection"
    );

    // beta's own gateway takes the direct path to its own instance.
    let r = beta.get_as("alice", &pw, "/apps/demo/");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["instance"], first["instance"]);
    assert_eq!(
        port_metric(&beta, "joined"),
        joined,
        "beta never uses its own node port"
    );
}

/// Whatever is not a node of this cluster gets nothing through a node port: a plain TCP client,
/// a TLS client without a certificate, one with a certificate of another CA.
#[test]
fn a_node_port_refuses_strangers() {
    let cluster = EtcdCluster::start(1);
    let beta = node(&cluster, "beta", &["--advertise", "127.0.0.2:0"]).start();
    let addr = wait_until("beta's node port", Duration::from_secs(20), || {
        nodes(&beta)
            .get("beta")?
            .get("advertise")?
            .as_str()
            .map(str::to_owned)
    });

    // Plain TCP, speaking HTTP or the node port's own framing: no byte of an answer.
    for probe in [&b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"[..], &kill_request()] {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        s.write_all(probe).unwrap();
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
        assert!(
            !String::from_utf8_lossy(&answer).contains("HTTP") && !answer.contains(&b'{'),
            "a plain client got {answer:?}"
        );
    }

    let rt = tokio::runtime::Runtime::new().unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    // Trusts anything: the server's refusal, not ours, is what is tested.
    let stranger_ca = rcgen::generate_simple_self_signed(vec!["stranger".into()]).unwrap();
    for with_cert in [false, true] {
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(std::sync::Arc::new(AnyServer(provider.clone())));
        let mut config = if with_cert {
            builder
                .with_client_auth_cert(
                    vec![stranger_ca.cert.der().clone()],
                    rustls::pki_types::PrivateKeyDer::try_from(
                        stranger_ca.key_pair.serialize_der(),
                    )
                    .unwrap(),
                )
                .unwrap()
        } else {
            builder.with_no_client_auth()
        };
        config.alpn_protocols = vec![b"warden-node/1".to_vec()];
        let outcome: std::io::Result<Vec<u8>> = rt.block_on(async {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let tcp = tokio::net::TcpStream::connect(&addr).await?;
            let name = rustls::pki_types::ServerName::try_from("127.0.0.2").unwrap();
            let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
                .connect(name, tcp)
                .await?;
            tls.write_all(&kill_request()).await?;
            let mut answer = Vec::new();
            tls.read_to_end(&mut answer).await?;
            Ok(answer)
        });
        assert!(
            outcome.as_ref().map_or(true, |a| a.is_empty()),
            "a TLS client (certificate of another CA: {with_cert}) got {outcome:?}"
        );
    }
    wait_until("the refusals counted", Duration::from_secs(10), || {
        (port_metric(&beta, "refused") >= 4.0).then_some(())
    });
    assert_eq!(port_metric(&beta, "admitted"), 0.0);
}

/// A well-formed node port request (a 4-byte length, then JSON), as a node would send it.
fn kill_request() -> Vec<u8> {
    let body = br#"{"op":"kill","id":"x"}"#;
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(body);
    frame
}

#[derive(Debug)]
struct AnyServer(std::sync::Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// alpha (every role, the demo) and beta (a second gateway, with an agent of its own).
fn two_gateways(cluster: &EtcdCluster) -> (Warden, Warden) {
    let alpha = demo_node(cluster, "alpha", "gateway,agent,api");
    let beta = node(
        cluster,
        "beta",
        &[
            "--roles",
            "gateway,agent",
            "--advertise",
            "127.0.0.2:0",
            "--join-token-file",
            &join_token(&alpha),
        ],
    )
    .start();
    (alpha, beta)
}

fn get_with_token(gateway: &str, token: &str) -> u16 {
    warden_test_support::request(
        "GET",
        &format!("{gateway}/apps/demo/"),
        &[("authorization", &format!("Bearer {token}"))],
        b"",
    )
    .status
}

/// A login at one gateway is valid at the other; a logout at either ends it at both.
#[test]
fn a_session_is_valid_at_every_gateway_until_a_logout_at_any() {
    let cluster = EtcdCluster::start(3);
    let (alpha, beta) = two_gateways(&cluster);
    let pw = alpha.password("bob");
    let r = warden_test_support::request(
        "POST",
        &format!("{}/login", alpha.gateway),
        &[(
            "authorization",
            &warden_test_support::http::basic("bob", &pw),
        )],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let token = r.json()["token"].as_str().unwrap().to_owned();
    wait_until("beta to know the session", Duration::from_secs(10), || {
        (get_with_token(&beta.gateway, &token) == 200).then_some(())
    });
    let out = warden_test_support::request(
        "POST",
        &format!("{}/logout", beta.gateway),
        &[("authorization", &format!("Bearer {token}"))],
        b"",
    );
    assert!(out.status < 300, "{}", out.text());
    assert_eq!(get_with_token(&beta.gateway, &token), 401);
    wait_until("alpha to drop the session", Duration::from_secs(10), || {
        (get_with_token(&alpha.gateway, &token) == 401).then_some(())
    });
}

/// A node that dies while a start is asked of it is passed over: a node record that looks
/// like the least loaded agent of the cluster but whose port is closed does not stop the start.
#[test]
fn a_start_passes_over_a_node_that_does_not_answer() {
    let cluster = EtcdCluster::start(1);
    let alpha = demo_node(&cluster, "alpha", "gateway,api");
    let _beta = node(
        &cluster,
        "beta",
        &[
            "--roles",
            "agent",
            "--advertise",
            "127.0.0.2:0",
            "--join-token-file",
            &join_token(&alpha),
        ],
    )
    .start();
    // A ghost: idle, every driver, a node port nobody listens on.
    let closed = std::net::TcpListener::bind("127.0.0.3:0").unwrap();
    let ghost_port = closed.local_addr().unwrap();
    drop(closed);
    let ghost = serde_json::json!({
        "id": "ghost", "hostname": "elsewhere", "pid": 1, "started_at_ms": 0,
        "load": {"memory_used": 0.0, "cpu_busy": 0.0, "load_per_core": 0.0, "instances": 0},
        "roles": ["agent"], "advertise": ghost_port.to_string(),
        "drivers": ["sandbox", "process"],
    });
    let put = std::process::Command::new("etcdctl")
        .args([
            "--endpoints",
            &cluster.client(0).to_string(),
            "put",
            "nodes/ghost",
            &ghost.to_string(),
        ])
        .env("ETCDCTL_API", "3")
        .output()
        .unwrap();
    assert!(
        put.status.success(),
        "{}",
        String::from_utf8_lossy(&put.stderr)
    );
    wait_until("the ghost and beta listed", Duration::from_secs(20), || {
        let n = nodes(&alpha);
        (n.contains_key("ghost") && n.get("beta")?.get("advertise")?.is_string()).then_some(())
    });
    let pw = alpha.password("alice");
    let r = alpha.get_as("alice", &pw, "/apps/demo/");
    assert_eq!(r.status, 200, "{}", r.text());
    let id = r.json()["instance"].clone();
    let record = alpha
        .instances()
        .into_iter()
        .find(|i| i["id"] == id)
        .unwrap();
    assert_eq!(record["node"], "beta");
}

/// A client that got a session ticket from one gateway resumes at the other: the gateways
/// share their ticket keys through the store (TLS 1.3 and 1.2).
#[test]
fn a_tls_session_from_one_gateway_resumes_at_the_other() {
    let cluster = EtcdCluster::start(1);
    let certs = tempfile::tempdir().unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let (cert, key) = (certs.path().join("cert.pem"), certs.path().join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.key_pair.serialize_pem()).unwrap();
    let tls = |l: Launch| {
        l.arg("--tls-listen")
            .arg("127.0.0.1:0")
            .arg("--tls-cert")
            .arg(cert.to_str().unwrap())
            .arg("--tls-key")
            .arg(key.to_str().unwrap())
    };
    let alpha = tls(node(&cluster, "alpha", &["--roles", "gateway"])).start();
    let beta = tls(node(
        &cluster,
        "beta",
        &[
            "--roles",
            "gateway",
            "--join-token-file",
            &join_token(&alpha),
        ],
    ))
    .start();
    let addr = |w: &Warden| {
        w.tls
            .clone()
            .unwrap()
            .trim_start_matches("https://")
            .to_owned()
    };

    let rt = tokio::runtime::Runtime::new().unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ck.cert.der().clone()).unwrap();
    for version in [&rustls::version::TLS13, &rustls::version::TLS12] {
        let config = std::sync::Arc::new(
            rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_protocol_versions(&[version])
                .unwrap()
                .with_root_certificates(roots.clone())
                .with_no_client_auth(),
        );
        let handshake = |to: String| {
            let config = config.clone();
            rt.block_on(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let tcp = tokio::net::TcpStream::connect(&to).await.unwrap();
                let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
                let mut s = tokio_rustls::TlsConnector::from(config)
                    .connect(name, tcp)
                    .await
                    .unwrap();
                // A request and its answer: the ticket arrives on the way.
                s.write_all(
                    b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n",
                )
                .await
                .unwrap();
                let mut answer = Vec::new();
                let _ = s.read_to_end(&mut answer).await;
                assert!(
                    answer.starts_with(b"HTTP/1.1 200"),
                    "{}",
                    String::from_utf8_lossy(&answer)
                );
                s.get_ref().1.handshake_kind()
            })
        };
        assert_eq!(handshake(addr(&alpha)), Some(rustls::HandshakeKind::Full));
        assert_eq!(
            handshake(addr(&beta)),
            Some(rustls::HandshakeKind::Resumed),
            "{version:?}: a ticket of alpha resumes at beta"
        );
    }
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
    let etcdctl = |args: &[&str]| {
        let out = std::process::Command::new("etcdctl")
            .args(["--endpoints", &cluster.client(0).to_string()])
            .args(args)
            .env("ETCDCTL_API", "3")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "etcdctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    etcdctl(&["user", "add", "root:root-secret-1"]);
    etcdctl(&["auth", "enable"]);
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
