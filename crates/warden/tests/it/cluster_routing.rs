//! Requests across the nodes of a cluster: the node port, starts on other nodes, two gateways
//! sharing sessions and TLS tickets.

use std::time::Duration;

use warden_test_support::etcd::EtcdCluster;
use warden_test_support::{cli, wait_until, Launch, Warden};

use crate::cluster::{demo_node, join_token, node, nodes};
use crate::BIN;

/// An agent node `name` of `cluster` running `roles`, joined with `first`'s token, its node
/// port on 127.0.0.2; returned once `first` lists that port.
fn agent_node(cluster: &EtcdCluster, first: &Warden, name: &str, roles: &str) -> Warden {
    let w = node(
        cluster,
        name,
        &[
            "--roles",
            roles,
            "--advertise",
            "127.0.0.2:0",
            "--join-token-file",
            &join_token(first),
        ],
    )
    .start();
    wait_until(
        &format!("{name}'s node port listed"),
        Duration::from_secs(20),
        || {
            nodes(first)
                .get(name)?
                .get("advertise")?
                .as_str()
                .map(str::to_owned)
        },
    );
    w
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
/// The record of instance `id` as `api`'s node lists it. A start's record is written behind
/// the request that waited for it (`handout.rs::behind`), so on a node without that agent it
/// may come a moment after the answer.
fn record_of(api: &Warden, id: &serde_json::Value) -> serde_json::Value {
    wait_until("the instance's record", Duration::from_secs(10), || {
        api.instances().into_iter().find(|i| i["id"] == *id)
    })
}

#[test]
fn a_gateway_starts_and_reaches_instances_on_another_node_through_its_node_port() {
    let cluster = EtcdCluster::start(3);
    let alpha = demo_node(&cluster, "alpha", "gateway,api");
    let beta = agent_node(&cluster, &alpha, "beta", "gateway,agent,api");
    let pw = alpha.password("alice");

    let r = alpha.get_as("alice", &pw, "/apps/demo/");
    assert_eq!(r.status, 200, "{}", r.text());
    let first = r.json();
    assert_eq!(
        first["verified"], true,
        "signed for the instance on beta: {first}"
    );
    let record = record_of(&alpha, &first["instance"]);
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
    let _beta = agent_node(&cluster, &alpha, "beta", "agent");
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
    cluster.etcdctl(&["put", "nodes/ghost", &ghost.to_string()]);
    wait_until("the ghost and beta listed", Duration::from_secs(20), || {
        let n = nodes(&alpha);
        (n.contains_key("ghost") && n.get("beta")?.get("advertise")?.is_string()).then_some(())
    });
    let pw = alpha.password("alice");
    let r = alpha.get_as("alice", &pw, "/apps/demo/");
    assert_eq!(r.status, 200, "{}", r.text());
    let record = record_of(&alpha, &r.json()["instance"]);
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

/// An instance that serves one request, started on another node, stops when its request is
/// done: the gateway retires it through its node's port.
#[test]
fn a_per_request_instance_on_another_node_is_retired_after_its_request() {
    let cluster = EtcdCluster::start(1);
    let alpha = demo_node(&cluster, "alpha", "gateway,api");
    let _beta = agent_node(&cluster, &alpha, "beta", "agent");
    alpha.create_demo_app(
        &crate::app_bin(),
        "once",
        serde_json::json!({ "driver": "process", "lifetime": "per_request" }),
    );
    let pw = alpha.password("alice");
    let r = alpha.get_as("alice", &pw, "/apps/once/");
    assert_eq!(r.status, 200, "{}", r.text());
    let id = r.json()["instance"].clone();
    wait_until(
        "the per-request instance on beta to stop",
        Duration::from_secs(20),
        || (!alpha.instances().iter().any(|i| i["id"] == id)).then_some(()),
    );
}

/// A node at its instance limit sends a start on to a node with room, rather than failing
/// it: its "full" says that another node may do better. To have the full node asked first
/// whatever the hosts' load figures say, a record "ghost" that looks idle names the full node's
/// port.
#[test]
fn a_start_goes_on_from_a_node_at_its_limit_to_one_with_room() {
    let cluster = EtcdCluster::start(1);
    let alpha = demo_node(&cluster, "alpha", "gateway,agent,api");
    let _beta = node(
        &cluster,
        "beta",
        &[
            "--roles",
            "agent",
            "--max-instances",
            "0",
            "--advertise",
            "127.0.0.2:0",
            "--join-token-file",
            &join_token(&alpha),
        ],
    )
    .start();
    let full_port = wait_until("beta's node port listed", Duration::from_secs(20), || {
        nodes(&alpha)
            .get("beta")?
            .get("advertise")?
            .as_str()
            .map(str::to_owned)
    });
    let ghost = serde_json::json!({
        "id": "ghost", "hostname": "elsewhere", "pid": 1, "started_at_ms": 0,
        "load": {"memory_used": 0.0, "cpu_busy": 0.0, "load_per_core": 0.0, "instances": 0},
        "roles": ["agent"], "advertise": full_port,
        "drivers": ["sandbox", "process"],
    });
    cluster.etcdctl(&["put", "nodes/ghost", &ghost.to_string()]);
    wait_until("the ghost listed", Duration::from_secs(20), || {
        nodes(&alpha).contains_key("ghost").then_some(())
    });

    let pw = alpha.password("alice");
    let r = alpha.get_as("alice", &pw, "/apps/demo/");
    assert_eq!(r.status, 200, "{}", r.text());
    let record = record_of(&alpha, &r.json()["instance"]);
    assert_eq!(record["node"], "alpha", "started on the node with room");
    let log = alpha.stderr();
    assert!(
        log.lines()
            .any(|l| l.contains("node passed over") && l.contains("ghost")),
        "the full node was asked first and passed over: {log}"
    );
}
