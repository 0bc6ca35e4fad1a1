use std::io::Write as _;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

/// A TLS server on loopback for "localhost" that answers each connection with `answer` (or
/// never, with `None`); its port and its certificate's PEM.
async fn server(answer: Option<Vec<u8>>) -> (u16, String) {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let cert_pem = ck.cert.pem();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![ck.cert.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(ck.key_pair.serialize_der().into()),
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let answer = answer.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = [0u8; 4096];
                let _ = tls.read(&mut buf).await;
                match answer {
                    Some(a) => {
                        let _ = tls.write_all(&a).await;
                        let _ = tls.shutdown().await;
                    }
                    None => tokio::time::sleep(Duration::from_secs(30)).await,
                }
            });
        }
    });
    (port, cert_pem)
}

fn ca_file(pem: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(pem.as_bytes()).unwrap();
    f
}

fn ok_answer(body: &[u8]) -> Vec<u8> {
    let mut a = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len()).into_bytes();
    a.extend_from_slice(body);
    a
}

#[tokio::test]
async fn https_is_verified_against_the_ca_file() {
    let (port, pem) = server(Some(ok_answer(b"{}"))).await;
    let ca = ca_file(&pem);
    let c = HttpClient::new(Some(ca.path())).unwrap();
    let (status, body) = c.get(&format!("https://localhost:{port}/x")).await.unwrap();
    assert_eq!((status.as_u16(), &body[..]), (200, &b"{}"[..]));
    // Without that root (the system's only), the same server is refused.
    let c = HttpClient::new(None).unwrap();
    let e = c
        .get(&format!("https://localhost:{port}/x"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("TLS"), "{e}");
}

#[tokio::test]
async fn an_answer_past_the_bound_is_refused() {
    let (port, pem) = server(Some(ok_answer(&vec![b'x'; MAX_ANSWER + 1]))).await;
    let ca = ca_file(&pem);
    let c = HttpClient::new(Some(ca.path())).unwrap();
    let e = c
        .get(&format!("https://localhost:{port}/x"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("bytes"), "{e}");
}

#[tokio::test]
async fn a_silent_provider_times_out() {
    let (port, pem) = server(None).await;
    let ca = ca_file(&pem);
    let mut c = HttpClient::new(Some(ca.path())).unwrap();
    c.timeout = Duration::from_millis(300);
    let e = c
        .get(&format!("https://localhost:{port}/x"))
        .await
        .unwrap_err();
    assert!(
        e.provider_down() && e.to_string().contains("no answer"),
        "{e}"
    );
}

#[test]
fn a_ca_file_without_certificates_is_an_error() {
    let ca = ca_file("not a certificate");
    assert!(matches!(
        HttpClient::new(Some(ca.path())),
        Err(OidcError::Roots(_))
    ));
}

#[test]
fn plain_http_only_to_loopback() {
    assert!(target("http://127.0.0.1:8080/x").is_ok());
    assert!(target("http://localhost/x").is_ok());
    assert!(target("http://[::1]:9/x").is_ok());
    assert!(target("http://idp.example.com/x").is_err());
    assert!(target("http://10.0.0.1/x").is_err());
    assert!(target("https://idp.example.com/x").is_ok());
    assert!(target("ftp://idp.example.com/x").is_err());
    assert!(target("https://u:p@idp.example.com/x").is_err());
}

#[test]
fn target_parts() {
    let t = target("https://idp.example.com/a/b?c=d").unwrap();
    assert_eq!(t.port, 443);
    assert_eq!(t.path_and_query, "/a/b?c=d");
    assert_eq!(t.host, "idp.example.com");
}
