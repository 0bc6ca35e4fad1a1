//! TLS at the gateway, through the real binary over real TLS: resumption, SNI, ALPN h2, plain
//! HTTP on the TLS port, bad certificate files, and handshake admission control.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, HandshakeKind, RootCertStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;
use warden_test_support::http::basic;
use warden_test_support::{request, wait_until, Launch, Warden};

pub(crate) fn bin() -> &'static str {
    crate::BIN
}

pub(crate) fn tls_addr(w: &Warden) -> String {
    w.tls
        .as_deref()
        .expect("a TLS listener")
        .trim_start_matches("https://")
        .to_owned()
}

pub(crate) fn demo_cert(w: &Warden) -> PathBuf {
    w.dir.join("tls").join("demo-cert.pem")
}

pub(crate) fn client(
    roots: &[&Path],
    versions: &[&'static rustls::SupportedProtocolVersion],
    alpn: &[&[u8]],
) -> Arc<ClientConfig> {
    let mut store = RootCertStore::empty();
    for r in roots {
        for c in CertificateDer::pem_file_iter(r).unwrap() {
            store.add(c.unwrap()).unwrap();
        }
    }
    let mut cfg =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(store)
            .with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    Arc::new(cfg)
}

pub(crate) fn any_version() -> Vec<&'static rustls::SupportedProtocolVersion> {
    vec![&rustls::version::TLS13, &rustls::version::TLS12]
}

async fn connect(
    cfg: &Arc<ClientConfig>,
    addr: &str,
    name: &str,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    TlsConnector::from(cfg.clone())
        .connect(ServerName::try_from(name.to_owned()).unwrap(), tcp)
        .await
}

fn kind(s: &TlsStream<TcpStream>) -> Option<HandshakeKind> {
    s.get_ref().1.handshake_kind()
}

/// One HTTP/1.1 request with `Connection: close`; the status and the whole response.
async fn get(mut s: TlsStream<TcpStream>, method: &str, path: &str, auth: &str) -> (u16, String) {
    let req = format!("{method} {path} HTTP/1.1\r\nhost: localhost\r\nauthorization: {auth}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

pub(crate) fn metric(w: &Warden, line_prefix: &str) -> f64 {
    request("GET", &format!("{}/metrics", w.api), &[], b"")
        .text()
        .lines()
        .filter(|l| l.starts_with(line_prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_tls_serves_resumes_both_versions_and_sets_a_secure_cookie() {
    let w = Launch::new(bin()).start();
    let addr = tls_addr(&w);
    assert!(
        w.stdout().contains(&format!("https://{addr}/apps/")),
        "{}",
        w.stdout()
    );
    // The faster provider (BENCHMARKS.md, "TLS cryptography") is the one built by default.
    assert!(
        w.stderr().contains("tls_crypto=\"aws-lc-rs\""),
        "{}",
        w.stderr()
    );
    let auth = basic("alice", &w.password("alice"));
    for versions in [vec![&rustls::version::TLS13], vec![&rustls::version::TLS12]] {
        let cfg = client(&[&demo_cert(&w)], &versions, &[b"http/1.1"]);
        let first = connect(&cfg, &addr, "localhost").await.unwrap();
        assert_eq!(kind(&first), Some(HandshakeKind::Full));
        let (status, body) = get(first, "GET", "/apps/demo/", &auth).await;
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("\"label\":\"SECRET\""), "{body}");
        let second = connect(&cfg, &addr, "localhost").await.unwrap();
        assert_eq!(kind(&second), Some(HandshakeKind::Resumed), "{versions:?}");
        let (status, _) = get(second, "GET", "/apps/demo/", &auth).await;
        assert_eq!(status, 200);
    }
    // The address works as a name too: the demo certificate covers 127.0.0.1.
    let cfg = client(&[&demo_cert(&w)], &any_version(), &[]);
    let s = connect(&cfg, &addr, "127.0.0.1").await.unwrap();
    let (status, text) = get(s, "POST", "/login", &auth).await;
    assert_eq!(status, 200, "{text}");
    let cookie = text
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .unwrap();
    assert!(
        cookie.contains("; Secure") && cookie.contains("HttpOnly"),
        "{cookie}"
    );

    assert!(
        metric(
            &w,
            "warden_gateway_tls_handshakes_total{result=\"resumed\"}"
        ) >= 2.0
    );
    assert!(
        metric(
            &w,
            "warden_gateway_connection_phase_seconds_count{phase=\"handshake_full\"}"
        ) >= 3.0
    );
    assert!(
        metric(
            &w,
            "warden_gateway_connection_phase_seconds_count{phase=\"service\"}"
        ) >= 5.0
    );

    // `warden status` summarises the phases and handshakes.
    let env = [
        ("WARDEN_API", w.api.as_str()),
        ("WARDEN_TOKEN", w.token.as_str()),
    ];
    let (ok, out, err) = warden_test_support::cli(bin(), &["status", "--json"], &env);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        v["gateway"]["tls"]["resumed"].as_f64().unwrap() >= 2.0,
        "{v}"
    );
    assert!(
        v["gateway"]["phases"]["service"]["mean_ms"]
            .as_f64()
            .unwrap()
            > 0.0,
        "{v}"
    );
    let (ok, out, _) = warden_test_support::cli(bin(), &["status"], &env);
    assert!(
        ok && out.contains("CONNECTION PHASE") && out.contains("handshake_resumed"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_on_the_tls_port_is_redirected() {
    let w = Launch::new(bin()).start();
    let addr = tls_addr(&w);
    let r = warden_test_support::http::raw(
        &addr,
        format!("GET /apps/demo/?x=1 HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes(),
    );
    assert_eq!(r.status, 308);
    assert_eq!(
        r.header("location"),
        Some(format!("https://{addr}/apps/demo/?x=1").as_str())
    );
    let r = warden_test_support::http::raw(&addr, b"GET / HTTP/1.0\r\n\r\n");
    assert_eq!(r.status, 400);
    assert!(r.text().contains("https://"));
    // A name no certificate is for is no place to send anyone: no open redirect.
    let port = addr.rsplit_once(':').unwrap().1;
    for host in ["evil.example".to_owned(), format!("evil.example:{port}")] {
        let r = warden_test_support::http::raw(
            &addr,
            format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes(),
        );
        assert_eq!(r.status, 400, "{host}");
        assert!(r.header("location").is_none(), "{host}");
    }
    let r = warden_test_support::http::raw(
        &addr,
        format!("GET /x HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n").as_bytes(),
    );
    assert_eq!(r.status, 308);
    assert_eq!(
        r.header("location"),
        Some(format!("https://localhost:{port}/x").as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_over_tls_serves_many_requests_and_a_slow_head_gets_408() {
    // Long enough for the next request of a loaded test machine, short enough to wait for.
    let w = Launch::new(bin())
        .arg("--header-timeout")
        .arg("1500ms")
        .start();
    let cfg = client(&[&demo_cert(&w)], &any_version(), &[b"http/1.1"]);
    let mut s = connect(&cfg, &tls_addr(&w), "localhost").await.unwrap();
    let auth = basic("alice", &w.password("alice"));
    for i in 0..3 {
        let req = format!(
            "GET /apps/demo/{i} HTTP/1.1\r\nhost: localhost\r\nauthorization: {auth}\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&got).contains(&format!("\"/{i}\"")) {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "connection closed after {i} requests");
            got.extend_from_slice(&buf[..n]);
        }
        assert!(String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    }
    // Half a head, then nothing: the header timeout answers 408 over TLS too.
    s.write_all(b"GET /apps/demo/ HTTP/1.1\r\nhost: localhost\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    // The connection ends with close_notify: a clean end, not a cut one.
    s.read_to_end(&mut got).await.unwrap();
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 408"), "{got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alpn_negotiates_h2_and_requests_are_served_over_it() {
    let w = Launch::new(bin()).start();
    let cfg = client(&[&demo_cert(&w)], &any_version(), &[b"h2", b"http/1.1"]);
    let s = connect(&cfg, &tls_addr(&w), "localhost").await.unwrap();
    assert_eq!(s.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(s),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = http::Request::get("https://localhost/apps/demo/")
        .header("authorization", basic("alice", &w.password("alice")))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.status(), 200);
    use http_body_util::BodyExt;
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("\"instance\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http2_large_bodies_pass_both_ways_and_request_trailers_never_become_headers() {
    use http_body_util::BodyExt;
    let w = Launch::new(bin()).start();
    let cfg = client(&[&demo_cert(&w)], &any_version(), &[b"h2"]);
    let s = connect(&cfg, &tls_addr(&w), "localhost").await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(s),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let auth = basic("alice", &w.password("alice"));

    // 8 MiB up, far past HTTP/2's flow-control windows, then trailers that name another user
    // and label: the gateway passes the body whole and drops the trailers, as it drops every
    // identity header a client sends.
    let sent: Vec<u8> = (0..8 << 20).map(|i: usize| (i % 251) as u8).collect();
    let mut trailers = http::HeaderMap::new();
    trailers.insert("x-warden-user", "mallory".parse().unwrap());
    trailers.insert("x-warden-label", "TOP SECRET".parse().unwrap());
    trailers.insert("x-smuggled", "1".parse().unwrap());
    let body = http_body_util::Full::new(bytes::Bytes::from(sent.clone()))
        .with_trailers(async move { Some(Ok(trailers)) })
        .boxed();
    let req = http::Request::post("https://localhost/apps/demo/_echo")
        .header("authorization", &auth)
        .body(body)
        .unwrap();
    send.ready().await.unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let h = |n: &str| {
        resp.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    assert_eq!(h("x-echo-h-x-warden-user").as_deref(), Some("alice"));
    assert_eq!(h("x-echo-h-x-warden-label").as_deref(), Some("SECRET"));
    assert_eq!(h("x-echo-h-x-smuggled"), None, "a trailer reached the app");
    let got = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(got.len(), sent.len());
    assert!(got[..] == sent[..], "the body came back changed");

    // 8 MiB down, sent by the app in chunks of unknown total length.
    let req = http::Request::get("https://localhost/apps/demo/_bytes?n=8388608&chunked=1")
        .header("authorization", &auth)
        .body(http_body_util::Empty::<bytes::Bytes>::new().boxed())
        .unwrap();
    send.ready().await.unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let got = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(got.len(), 8 << 20);
    assert!(got.iter().all(|&b| b == b'x'));
}

/// A self-signed certificate for `name`, written as PEM files under `dir`.
fn cert_for(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let ck = rcgen::generate_simple_self_signed(vec![name.to_owned()]).unwrap();
    let (c, k) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&c, ck.cert.pem()).unwrap();
    std::fs::write(&k, ck.key_pair.serialize_pem()).unwrap();
    (c, k)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_picks_the_certificate_for_the_name() {
    let tmp = tempfile::tempdir().unwrap();
    let (ca, ka) = cert_for(tmp.path(), "a.test");
    let (cb, kb) = cert_for(tmp.path(), "b.test");
    let w = Launch::new(bin())
        .arg("--tls-cert")
        .arg(ca.to_str().unwrap())
        .arg("--tls-key")
        .arg(ka.to_str().unwrap())
        .arg("--tls-cert")
        .arg(cb.to_str().unwrap())
        .arg("--tls-key")
        .arg(kb.to_str().unwrap())
        .start();
    let cfg = client(&[&ca, &cb], &any_version(), &[]);
    let addr = tls_addr(&w);
    for (name, file) in [("a.test", &ca), ("b.test", &cb)] {
        let s = connect(&cfg, &addr, name).await.unwrap();
        let served = s.get_ref().1.peer_certificates().unwrap()[0].clone();
        let expected = CertificateDer::pem_file_iter(file)
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        assert_eq!(served, expected, "{name}");
    }
    // A name no certificate covers gets the default one, which the client rightly rejects.
    assert!(connect(&cfg, &addr, "c.test").await.is_err());
}

/// Runs `warden up` with `extra` flags, expecting it to fail at start; returns its stderr.
fn up_fails(extra: &[&str]) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = Command::new(bin())
        .args([
            "up",
            "--listen",
            "127.0.0.1:0",
            "--api-listen",
            "127.0.0.1:0",
            "--data-dir",
        ])
        .arg(tmp.path().join("data"))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_until("warden up to give up", Duration::from_secs(60), || {
        child.try_wait().unwrap()
    });
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    err
}

#[test]
fn bad_certificate_files_fail_at_start_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let (ca, ka) = cert_for(tmp.path(), "a.test");
    let (_, kb) = cert_for(tmp.path(), "b.test");
    let junk = tmp.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate\n").unwrap();
    let missing = tmp.path().join("missing.pem");
    let s = |p: &Path| p.to_str().unwrap().to_owned();
    let tls = |cert: &Path, key: &Path| {
        vec![
            "--tls-listen".to_owned(),
            "127.0.0.1:0".into(),
            "--tls-cert".into(),
            s(cert),
            "--tls-key".into(),
            s(key),
        ]
    };
    let run = |args: Vec<String>| up_fails(&args.iter().map(String::as_str).collect::<Vec<_>>());

    let err = run(tls(&missing, &ka));
    assert!(
        err.contains("missing.pem") && err.contains("cannot read"),
        "{err}"
    );
    let err = run(tls(&junk, &ka));
    assert!(
        err.contains("junk.pem") && err.contains("no PEM certificate"),
        "{err}"
    );
    let err = run(tls(&ca, &junk));
    assert!(
        err.contains("junk.pem") && err.contains("private key"),
        "{err}"
    );
    let err = run(tls(&ca, &kb));
    assert!(err.contains("does not belong"), "{err}");
    let err = run(vec!["--tls-listen".into(), "127.0.0.1:0".into()]);
    assert!(err.contains("--tls-cert"), "{err}");
}

/// A client that connects to the TLS port and says nothing takes no connection slot: the
/// kernel holds the connection until its first bytes arrive (deferred accept), so silent
/// connections cannot shut real clients out, and admission decides on each connection with
/// its ClientHello in hand, in the accept loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_on_the_tls_port_take_no_connection_slot() {
    let w = Launch::new(bin()).arg("--max-connections").arg("2").start();
    let addr = tls_addr(&w);
    let auth = basic("alice", &w.password("alice"));
    let cert = demo_cert(&w);
    // Connected from the client's side, ahead of the real client in the backlog; the kernel
    // hands them over only after several seconds of silence.
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(TcpStream::connect(&addr).await.unwrap());
    }
    let s = connect(&client(&[&cert], &any_version(), &[]), &addr, "localhost")
        .await
        .expect("a silent connection took the slot of a real client");
    assert_eq!(get(s, "GET", "/apps/demo/", &auth).await.0, 200);
    drop(silent);
}

/// A connection that sent a fresh ClientHello and got the server's first flight, then stalls:
/// it holds a full-handshake slot until the server's handshake timeout.
async fn stalled_full_handshake(addr: &str, cfg: &Arc<ClientConfig>) -> TcpStream {
    let mut conn =
        rustls::ClientConnection::new(cfg.clone(), ServerName::try_from("localhost").unwrap())
            .unwrap();
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).unwrap();
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(&hello).await.unwrap();
    let mut buf = [0u8; 64];
    // The server answers only once it has admitted the handshake.
    let n = tcp.read(&mut buf).await.unwrap();
    assert!(
        n > 0 && buf[0] == 0x16,
        "expected a ServerHello, got {:?}",
        &buf[..n]
    );
    tcp
}

/// The TLS address, alice's credentials, the demo certificate, and a client holding a session
/// to come back to (its request makes it read its tickets).
async fn returning_client(w: &Warden) -> (String, String, PathBuf, Arc<ClientConfig>) {
    let addr = tls_addr(w);
    let auth = basic("alice", &w.password("alice"));
    let cert = demo_cert(w);
    let returning = client(&[&cert], &any_version(), &[]);
    let s = connect(&returning, &addr, "localhost").await.unwrap();
    assert_eq!(get(s, "GET", "/apps/demo/", &auth).await.0, 200);
    (addr, auth, cert, returning)
}

/// A connection from `cfg`, retried for up to 10 s while admission still refuses it.
async fn admitted_again(cfg: &Arc<ClientConfig>, addr: &str) -> TlsStream<TcpStream> {
    let mut tries = 0;
    loop {
        tries += 1;
        match connect(cfg, addr, "localhost").await {
            Ok(s) => return s,
            Err(e) if tries < 200 => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("full handshakes still refused: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_handshakes_beyond_the_limit_are_refused_but_resumptions_admitted() {
    let w = Launch::new(bin())
        .arg("--tls-handshake-concurrency")
        .arg("1")
        .arg("--tls-handshake-queue")
        .arg("0")
        .start();
    let (addr, auth, cert, returning) = returning_client(&w).await;

    let staller = stalled_full_handshake(&addr, &client(&[&cert], &any_version(), &[])).await;
    // The only slot is taken: a newcomer's full handshake is refused at once...
    let newcomer = client(&[&cert], &any_version(), &[]);
    assert!(connect(&newcomer, &addr, "localhost").await.is_err());
    assert!(metric(&w, "warden_gateway_tls_admission_refused_total") >= 1.0);
    // ...while the returning client resumes and is served.
    let s = connect(&returning, &addr, "localhost").await.unwrap();
    assert_eq!(kind(&s), Some(HandshakeKind::Resumed));
    assert_eq!(get(s, "GET", "/apps/demo/", &auth).await.0, 200);

    // Once the stalled handshake goes away, full handshakes are admitted again.
    drop(staller);
    let s = admitted_again(&newcomer, &addr).await;
    assert_eq!(kind(&s), Some(HandshakeKind::Full));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_control_switched_off_admits_every_handshake() {
    let w = Launch::new(bin())
        .arg("--tls-handshake-concurrency")
        .arg("1")
        .arg("--tls-handshake-queue")
        .arg("0")
        .arg("--no-tls-admission")
        .start();
    let addr = tls_addr(&w);
    let cert = demo_cert(&w);
    let _staller = stalled_full_handshake(&addr, &client(&[&cert], &any_version(), &[])).await;
    let s = connect(&client(&[&cert], &any_version(), &[]), &addr, "localhost")
        .await
        .unwrap();
    assert_eq!(kind(&s), Some(HandshakeKind::Full));
    assert_eq!(
        metric(&w, "warden_gateway_tls_admission_refused_total"),
        0.0
    );
}

/// Stops the process `pid` with SIGSTOP and waits until every one of its threads has stopped
/// (the signal reaches each a little later), so that none can still accept.
pub(crate) fn freeze(pid: nix::unistd::Pid) {
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    wait_until(
        "every thread of the gateway to stop",
        Duration::from_secs(10),
        || {
            let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
            tasks
                .flatten()
                .all(|t| {
                    let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                    // The state follows the command name in parentheses.
                    stat.rsplit_once(") ")
                        .is_some_and(|(_, rest)| rest.starts_with('T'))
                })
                .then_some(())
        },
    );
}

/// A connection whose ClientHello (from `cfg`, so a resumption attempt when `cfg` holds a
/// session) has been written; nothing is read.
pub(crate) async fn hello_written(addr: &str, cfg: &Arc<ClientConfig>) -> TcpStream {
    let mut conn =
        rustls::ClientConnection::new(cfg.clone(), ServerName::try_from("localhost").unwrap())
            .unwrap();
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).unwrap();
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(&hello).await.unwrap();
    tcp
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_handshake_stale_in_the_backlog_is_refused_and_a_resumption_as_stale_served() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let w = Launch::new(bin())
        .arg("--tls-queue-wait")
        .arg("250ms")
        .start();
    let (addr, auth, cert, returning) = returning_client(&w).await;

    // While the gateway is stopped, the kernel completes TCP handshakes and keeps the hellos,
    // as it does in a backlog the gateway is too busy to drain.
    let pid = Pid::from_raw(w.pid() as i32);
    freeze(pid);
    let mut fresh = hello_written(&addr, &client(&[&cert], &any_version(), &[])).await;
    let mut back = hello_written(&addr, &returning).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    kill(pid, Signal::SIGCONT).unwrap();

    // Both waited longer than the queue wait: the full handshake gets the refusal alert, the
    // resumption its ServerHello.
    let mut first = [0u8; 1];
    fresh.read_exact(&mut first).await.unwrap();
    assert_eq!(
        first[0], 0x15,
        "a stale full handshake is refused with an alert"
    );
    back.read_exact(&mut first).await.unwrap();
    assert_eq!(first[0], 0x16, "a stale resumption goes on (ServerHello)");
    assert!(metric(&w, "warden_gateway_tls_admission_refused_total") >= 1.0);

    // A hello that did not wait is served as before, once the gateway has measured that its
    // runtime caught up after the stop (the next tick of its lag timer).
    let s = admitted_again(&client(&[&cert], &any_version(), &[]), &addr).await;
    assert_eq!(kind(&s), Some(HandshakeKind::Full));
    assert_eq!(get(s, "GET", "/apps/demo/", &auth).await.0, 200);
}
