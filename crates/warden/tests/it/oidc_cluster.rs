//! Provider sign-in on a cluster: a sign-in begun on one gateway is finished on another (the
//! flow's record is in the store, sealed with a key every node derives from the cluster's
//! identity), and the session it makes works on both.

use warden_test_support::etcd::EtcdCluster;
use warden_test_support::http;
use warden_test_support::oidc::{Browser, OidcProvider, Ttls};
use warden_test_support::{free_port, Launch};

use crate::oidc::{alice, config_file, host};
use crate::BIN;

#[test]
fn a_sign_in_begun_on_one_gateway_is_finished_on_another() {
    let etcd = EtcdCluster::start(1);
    let idp = OidcProvider::start(&[alice()], Ttls::default());
    let port = free_port();
    let gw_a = format!("http://127.0.0.1:{port}");
    // The provider sends every browser back to gateway A.
    let redirect = format!("{gw_a}/login/oidc/corp/callback");
    idp.register("warden", "s3cret", &redirect);
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), &idp.issuer, &redirect);
    let config = config.to_str().unwrap();
    let a = Launch::new(BIN)
        .listen(&format!("127.0.0.1:{port}"))
        .args(&[
            "--store",
            &etcd.url(),
            "--node-name",
            "alpha",
            "--config",
            config,
        ])
        .start();
    let token = a.dir.join("join-token").display().to_string();
    let b = Launch::new(BIN)
        .no_demo()
        .args(&[
            "--store",
            &etcd.url(),
            "--node-name",
            "beta",
            "--roles",
            "gateway",
        ])
        .args(&["--join-token-file", &token, "--config", config])
        .start();

    let mut browser = Browser::new();
    let cb = browser.sign_in_until_callback(&b.gateway, "corp", "/apps/demo/", &alice());
    assert!(cb.starts_with(&gw_a), "{cb}");
    // A browser sends a host's cookies to each of its ports; this jar keeps them per port.
    let flow = browser.cookie(host(&b.gateway), "warden_oidc").unwrap();
    browser.set_cookie(host(&gw_a), "warden_oidc", Some(&flow));
    let r = browser.send("GET", &cb, None);
    assert_eq!(r.status, 303, "A finished B's sign-in: {}", r.text());
    let session = browser.cookie(host(&gw_a), "warden_session").unwrap();
    for gw in [&gw_a, &b.gateway] {
        let r = http::request(
            "GET",
            &format!("{gw}/apps/demo/"),
            &[("cookie", &format!("warden_session={session}"))],
            b"",
        );
        assert_eq!(r.status, 200, "{gw}: {}", r.text());
        assert_eq!(r.json()["label"], "SECRET", "{gw}");
    }
}
