//! A provider id is bound to the issuer it had: users pinned to it, sessions and sign-ins
//! ended or refused when the id names another issuer, the client secret not kept across such a
//! change, and the stored providers in place before a (re)started gateway serves (issue 36,
//! security review of the providers API).

use std::time::Duration;

use warden_test_support::http;
use warden_test_support::oidc::{Browser, OidcProvider, Ttls};
use warden_test_support::{free_port, wait_until, Launch};

use crate::oidc::{alice, config_file, host};
use crate::oidc_api::setup;
use crate::BIN;

#[test]
fn a_provider_id_pointed_at_another_issuer_does_not_take_its_users() {
    let s = setup(&[alice()]);
    // Another provider, whose alice (the same `sub`) is someone else.
    let other = OidcProvider::start(&[alice()], Ttls::default());
    let redirect = format!("{}/login/oidc/staff/callback", s.gw);
    for idp in [&s.idp, &other] {
        idp.register("warden-staff", "staff-secret", &redirect);
    }
    let add = |issuer: &str| {
        let body = serde_json::json!({
            "id": "staff", "issuer": issuer, "client_id": "warden-staff",
            "client_secret": "staff-secret", "redirect_url": redirect,
            "rules": [{ "claim": "groups", "value": "engineering", "level": "SECRET" }],
        });
        let r = s.w.api("POST", "/v1/oidc/providers", Some(body));
        assert_eq!(r.status, 201, "{}", r.text());
    };
    add(&s.idp.issuer);
    let start = |gw: &str| {
        wait_until(
            "the provider on the gateway",
            Duration::from_secs(30),
            || {
                let r = http::request("GET", &format!("{gw}/login/oidc/staff"), &[], b"");
                (r.status == 302).then_some(())
            },
        )
    };
    start(&s.gw);
    let (r, _) = Browser::new().sign_in(&s.gw, "staff", "/apps/demo/", &alice());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["user"], "alice_staff");
    let r = s.w.api("DELETE", "/v1/oidc/providers/staff", None);
    assert_eq!(r.status, 204, "{}", r.text());
    add(&other.issuer);
    // The gateway follows the new record: wait until a start goes to the other issuer.
    wait_until("the new issuer followed", Duration::from_secs(30), || {
        let r = http::request("GET", &format!("{}/login/oidc/staff", s.gw), &[], b"");
        r.header("location")
            .is_some_and(|l| l.starts_with(&other.issuer))
            .then_some(())
    });
    let mut b = Browser::new();
    let (r, _) = b.sign_in(&s.gw, "staff", "/apps/demo/", &alice());
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(
        r.text().contains("belongs to another account"),
        "{}",
        r.text()
    );
    assert!(b.cookie(host(&s.gw), "warden_session").is_none());
}

#[test]
fn a_provider_id_moved_to_another_issuer_ends_its_sessions_and_sign_ins_and_needs_its_secret_again()
{
    let s = setup(&[alice()]);
    let other = OidcProvider::start(&[alice()], Ttls::default());
    let redirect = format!("{}/login/oidc/staff/callback", s.gw);
    for idp in [&s.idp, &other] {
        idp.register("warden-staff", "staff-secret", &redirect);
    }
    let body = serde_json::json!({
        "id": "staff", "issuer": s.idp.issuer, "client_id": "warden-staff",
        "client_secret": "staff-secret", "redirect_url": redirect,
        "rules": [{ "claim": "groups", "value": "engineering", "level": "SECRET" }],
    });
    let r = s.w.api("POST", "/v1/oidc/providers", Some(body));
    assert_eq!(r.status, 201, "{}", r.text());
    let starts_at = |issuer: &str| {
        wait_until("the issuer followed", Duration::from_secs(30), || {
            let r = http::request("GET", &format!("{}/login/oidc/staff", s.gw), &[], b"");
            r.header("location")
                .is_some_and(|l| l.starts_with(issuer))
                .then_some(())
        })
    };
    starts_at(&s.idp.issuer);
    let mut signed_in = Browser::new();
    let (r, _) = signed_in.sign_in(&s.gw, "staff", "/apps/demo/", &alice());
    assert_eq!(r.status, 200, "{}", r.text());
    let mut in_flight = Browser::new();
    let cb = in_flight.sign_in_until_callback(&s.gw, "staff", "/apps/demo/", &alice());

    // The secret held is not sent to another issuer, nor under other trust roots.
    for change in [
        serde_json::json!({"issuer": other.issuer}),
        serde_json::json!({"ca_file": "/etc/hosts"}),
    ] {
        let r = s.w.api("PATCH", "/v1/oidc/providers/staff", Some(change));
        assert_eq!(r.status, 422, "{}", r.text());
        assert!(
            r.text().contains("client secret given again"),
            "{}",
            r.text()
        );
    }
    let change = serde_json::json!({"issuer": other.issuer, "client_secret": "staff-secret"});
    let r = s.w.api("PATCH", "/v1/oidc/providers/staff", Some(change));
    assert_eq!(r.status, 200, "{}", r.text());
    starts_at(&other.issuer);

    // The sign-in begun at the first issuer is refused here, its code never sent to the
    // other's token endpoint (which would answer 401 for a code it never gave).
    let r = in_flight.send("GET", &cb, None);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("for another provider"), "{}", r.text());
    assert!(in_flight.cookie(host(&s.gw), "warden_session").is_none());
    // The session from the first issuer ends at once (its tokens live minutes yet).
    let r = signed_in.send("GET", &format!("{}/apps/demo/", s.gw), None);
    assert_eq!(r.status, 303, "a session outlived its issuer: {}", r.text());
    // The other issuer's alice signs in afresh (and meets the pinned name, as above).
    let (r, _) = Browser::new().sign_in(&s.gw, "staff", "/apps/demo/", &alice());
    assert_eq!(r.status, 403, "{}", r.text());
}

#[test]
fn a_restarted_gateway_has_its_stored_providers_before_it_serves() {
    let idp = OidcProvider::start(&[alice()], Ttls::default());
    let port = free_port();
    let gw = format!("http://127.0.0.1:{port}");
    let redirect = format!("{gw}/login/oidc/staff/callback");
    idp.register(
        "warden",
        "s3cret",
        &format!("{gw}/login/oidc/corp/callback"),
    );
    idp.register("warden-staff", "staff-secret", &redirect);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let config = config_file(
        dir.path(),
        &idp.issuer,
        &format!("{gw}/login/oidc/corp/callback"),
    );
    let launch = || {
        Launch::new(BIN)
            .data_dir(&data)
            .listen(&format!("127.0.0.1:{port}"))
            .arg("--config")
            .arg(config.to_str().unwrap())
            .start()
    };
    let mut w = launch();
    let body = serde_json::json!({
        "id": "staff", "issuer": idp.issuer, "client_id": "warden-staff",
        "client_secret": "staff-secret", "redirect_url": redirect,
        "rules": [{ "claim": "groups", "value": "engineering", "level": "SECRET" }],
    });
    let r = w.api("POST", "/v1/oidc/providers", Some(body));
    assert_eq!(r.status, 201, "{}", r.text());
    wait_until("the provider served", Duration::from_secs(30), || {
        let r = http::request("GET", &format!("{gw}/login/oidc/staff"), &[], b"");
        (r.status == 302).then_some(())
    });
    let mut b = Browser::new();
    let (r, _) = b.sign_in(&gw, "staff", "/apps/demo/", &alice());
    assert_eq!(r.status, 200, "{}", r.text());
    w.stop();
    drop(w);
    let _w = launch();
    // The first requests after the restart: the stored provider is there, and its session,
    // not taken for a removed provider's, goes on.
    let r = b.send("GET", &format!("{gw}/apps/demo/"), None);
    assert_eq!(
        r.status,
        200,
        "the session did not survive the restart: {}",
        r.text()
    );
    let r = http::request("GET", &format!("{gw}/login/oidc/staff"), &[], b"");
    assert_eq!(r.status, 302, "{}", r.text());
}

#[test]
fn a_user_from_before_issuers_were_kept_is_not_taken_by_a_provider_added_through_the_api() {
    let etcd = warden_test_support::etcd::EtcdCluster::start(1);
    let idp = OidcProvider::start(&[alice()], Ttls::default());
    let port = free_port();
    let gw = format!("http://127.0.0.1:{port}");
    let w = Launch::new(BIN)
        .listen(&format!("127.0.0.1:{port}"))
        .args(&["--store", &etcd.url(), "--node-name", "alpha"])
        .start();
    let redirect = format!("{gw}/login/oidc/staff/callback");
    idp.register("warden-staff", "staff-secret", &redirect);
    // alice_staff as an older warden wrote it: provider id and sub, no issuer (the id may have
    // named another provider then).
    let old = serde_json::json!({
        "name": "alice_staff", "password_hash": "", "clearance": "SECRET", "groups": [],
        "generation": "g1", "provider": {"id": "staff", "subject": "alice"},
    });
    etcd.etcdctl(&["put", "users/alice_staff", &old.to_string()]);
    let body = serde_json::json!({
        "id": "staff", "issuer": idp.issuer, "client_id": "warden-staff",
        "client_secret": "staff-secret", "redirect_url": redirect,
        "rules": [{ "claim": "groups", "value": "engineering", "level": "SECRET" }],
    });
    let r = w.api("POST", "/v1/oidc/providers", Some(body));
    assert_eq!(r.status, 201, "{}", r.text());
    wait_until("the provider served", Duration::from_secs(30), || {
        let r = http::request("GET", &format!("{gw}/login/oidc/staff"), &[], b"");
        (r.status == 302).then_some(())
    });
    let mut b = Browser::new();
    let (r, _) = b.sign_in(&gw, "staff", "/apps/demo/", &alice());
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(
        r.text().contains("belongs to another account"),
        "{}",
        r.text()
    );
    assert!(b.cookie(host(&gw), "warden_session").is_none());
    let user = w.api("GET", "/v1/users/alice_staff", None);
    assert_eq!(
        user.json()["provider"].get("issuer"),
        None,
        "{}",
        user.text()
    );
}
