//! Sign-in through an OpenID Connect provider (issue 36), against a real one: panva's certified
//! `oidc-provider` (tests/oidc-provider), with people in groups, short token lifetimes where a
//! test needs refreshes, and test-only hooks to rotate its keys or forge its next ID token.

use warden_test_support::http::{self, Response};
use warden_test_support::oidc::{Browser, OidcProvider, Person, Ttls};
use warden_test_support::{cli, free_port, wait_until, Launch, Warden};

use crate::BIN;

/// A gateway with provider `corp` in front of the demo, and the provider.
struct Setup {
    idp: OidcProvider,
    w: Warden,
    gw: String,
    _dir: tempfile::TempDir,
}

/// The demo's lattice: engineering gives SECRET, interns UNCLASSIFIED, finance only a group.
const RULES: &str = r#"rules = [
  { claim = "groups", value = "engineering", level = "SECRET", groups = ["staff"] },
  { claim = "groups", value = "interns", level = "UNCLASSIFIED" },
  { claim = "groups", value = "finance", groups = ["finance"] },
]"#;

fn setup(people: &[Person], ttls: Ttls) -> Setup {
    setup_with(people, ttls, &[])
}

fn setup_with(people: &[Person], ttls: Ttls, extra: &[&str]) -> Setup {
    let idp = OidcProvider::start(people, ttls);
    let port = free_port();
    let gw = format!("http://127.0.0.1:{port}");
    let redirect = format!("{gw}/login/oidc/corp/callback");
    idp.register("warden", "s3cret", &redirect);
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), &idp.issuer, &redirect);
    let mut launch = Launch::new(BIN)
        .listen(&format!("127.0.0.1:{port}"))
        .arg("--config")
        .arg(config.to_str().unwrap());
    for a in extra {
        launch = launch.arg(a);
    }
    let w = launch.start();
    assert_eq!(w.gateway, gw);
    Setup {
        idp,
        w,
        gw,
        _dir: dir,
    }
}

/// A config file in `dir` with provider `corp` at `issuer`, redirecting to `redirect`.
pub(crate) fn config_file(
    dir: &std::path::Path,
    issuer: &str,
    redirect: &str,
) -> std::path::PathBuf {
    let secret = dir.join("secret");
    std::fs::write(&secret, "s3cret\n").unwrap();
    let config = dir.join("warden.toml");
    std::fs::write(
        &config,
        format!(
            "[[oidc]]\nid = \"corp\"\nlabel = \"Corp\"\nissuer = \"{issuer}\"\nclient_id = \"warden\"\n\
             client_secret_file = \"{}\"\nredirect_url = \"{redirect}\"\njwks_refetch = \"1ms\"\n{RULES}\n",
            secret.display()
        ),
    )
    .unwrap();
    config
}

/// Whether a browser's request was answered as one with no session: sent to the sign-in page.
fn signed_out(r: &Response) -> bool {
    r.status == 303
        && r.header("location")
            .is_some_and(|l| l.starts_with("/login?next="))
}

pub(crate) fn alice() -> Person {
    Person::new("alice", "wonderland", &["engineering"])
}

/// The demo app's answer `r` as JSON, asserting it is one.
fn demo(r: &Response) -> serde_json::Value {
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

pub(crate) fn host(gw: &str) -> &str {
    gw.strip_prefix("http://").unwrap()
}

#[test]
fn groups_give_the_clearance_the_strictest_rule_gives_and_the_demo_serves_it() {
    let bob = Person::new("bob", "builder", &["engineering", "interns"]);
    let s = setup(&[alice(), bob.clone()], Ttls::default());
    let mut b = Browser::new();
    let (r, url) = b.sign_in(&s.gw, "corp", "/apps/demo/hello", &alice());
    assert_eq!(
        url,
        format!("{}/apps/demo/hello", s.gw),
        "back where she asked"
    );
    let a = demo(&r);
    assert_eq!(a["label"], "SECRET");
    assert_eq!(a["user"], "alice_corp");
    assert!(b.cookie(host(&s.gw), "warden_session").is_some());
    // Two matching rules: the lower level wins.
    let mut b2 = Browser::new();
    let (r, _) = b2.sign_in(&s.gw, "corp", "/apps/demo/", &bob);
    assert_eq!(demo(&r)["label"], "UNCLASSIFIED");
    // `users show` names the provider and what decided; the user has no usable password.
    let env = [
        ("WARDEN_API", s.w.api.as_str()),
        ("WARDEN_TOKEN", s.w.token.as_str()),
    ];
    let (ok, out, err) = cli(BIN, &["users", "show", "bob_corp"], &env);
    assert!(ok, "{err}");
    assert!(out.contains("identity provider corp"), "{out}");
    assert!(
        out.contains(r#"groups=["engineering", "interns"]"#),
        "{out}"
    );
    assert!(
        out.contains("groups=engineering, groups=interns"),
        "the matched rules: {out}"
    );
    let basic = s.w.get_as("alice_corp", "", "/apps/demo/");
    assert_eq!(basic.status, 401, "a provider user has no password");
    let r = s.w.api(
        "PATCH",
        "/v1/users/alice_corp",
        Some(serde_json::json!({ "password": "a second way in" })),
    );
    assert_eq!(r.status, 400, "nor can it be given one: {}", r.text());
}

#[test]
fn no_matching_rule_is_a_403_page_naming_the_claims_seen() {
    let eve = Person::new("eve", "pw", &["finance", "marketing"]);
    let s = setup(std::slice::from_ref(&eve), Ttls::default());
    let mut b = Browser::new();
    let (r, _) = b.sign_in(&s.gw, "corp", "/apps/demo/", &eve);
    assert_eq!(r.status, 403, "{}", r.text());
    let page = r.text();
    assert!(page.contains("no mapping rule matched"), "{page}");
    assert!(
        page.contains("finance") && page.contains("marketing"),
        "{page}"
    );
    assert!(b.cookie(host(&s.gw), "warden_session").is_none());
}

#[test]
fn forged_expired_and_wrong_audience_id_tokens_are_refused() {
    let s = setup(&[alice()], Ttls::default());
    for kind in ["key", "exp", "aud"] {
        s.idp.tamper(kind);
        let mut b = Browser::new();
        let (r, _) = b.sign_in(&s.gw, "corp", "/apps/demo/", &alice());
        assert_eq!(r.status, 401, "{kind}: {}", r.text());
        assert!(r.text().contains("was refused"), "{kind}: {}", r.text());
        assert!(
            b.cookie(host(&s.gw), "warden_session").is_none(),
            "{kind}: no session"
        );
    }
    // And untampered, the same person signs in.
    let (r, _) = Browser::new().sign_in(&s.gw, "corp", "/apps/demo/", &alice());
    assert_eq!(demo(&r)["label"], "SECRET");
}

#[test]
fn a_replayed_state_or_a_missing_or_foreign_flow_cookie_is_refused() {
    let s = setup(&[alice()], Ttls::default());
    let h = host(&s.gw).to_owned();
    // The flow cookie gone (another browser finishing the sign-in).
    let mut b = Browser::new();
    let cb = b.sign_in_until_callback(&s.gw, "corp", "/apps/demo/", &alice());
    b.set_cookie(&h, "warden_oidc", None);
    let r = b.send("GET", &cb, None);
    assert_eq!(r.status, 400, "{}", r.text());
    // Another browser's flow cookie.
    let mut b = Browser::new();
    let cb = b.sign_in_until_callback(&s.gw, "corp", "/apps/demo/", &alice());
    b.set_cookie(&h, "warden_oidc", Some("somebody-elses"));
    assert_eq!(b.send("GET", &cb, None).status, 400);
    // A second binding cookie beside the right one (a page of the origin planted one with a
    // longer path, which the browser sends first): refused, whichever comes first.
    for planted_first in [true, false] {
        let mut b = Browser::new();
        let cb = b.sign_in_until_callback(&s.gw, "corp", "/apps/demo/", &alice());
        let right = format!("warden_oidc={}", b.cookie(&h, "warden_oidc").unwrap());
        let cookies = match planted_first {
            true => format!("warden_oidc=planted; {right}"),
            false => format!("{right}; warden_oidc=planted"),
        };
        let headers = [("accept", "text/html"), ("cookie", cookies.as_str())];
        let r = http::request("GET", &cb, &headers, b"");
        assert_eq!(r.status, 400, "{cookies}: {}", r.text());
        assert!(r.text().contains("another browser"), "{}", r.text());
    }
    // The right browser signs in once; the same callback again is a replay.
    let mut b = Browser::new();
    let cb = b.sign_in_until_callback(&s.gw, "corp", "/apps/demo/", &alice());
    let flow = b.cookie(&h, "warden_oidc").unwrap();
    let r = b.send("GET", &cb, None);
    assert_eq!(r.status, 303, "{}", r.text());
    assert_eq!(r.header("location"), Some("/apps/demo/"));
    b.set_cookie(&h, "warden_oidc", Some(&flow));
    let again = b.send("GET", &cb, None);
    assert_eq!(again.status, 400, "{}", again.text());
    assert!(
        again.text().contains("already finished"),
        "{}",
        again.text()
    );
}

#[test]
fn next_never_leaves_the_gateway() {
    let s = setup(&[alice()], Ttls::default());
    for next in [
        "https%3A%2F%2Fevil.example%2F",
        "%2F%2Fevil.example%2F",
        "%2F%5Cevil.example",
    ] {
        let mut b = Browser::new();
        let cb = b.sign_in_until_callback(&s.gw, "corp", next, &alice());
        let r = b.send("GET", &cb, None);
        assert_eq!(r.status, 303, "{next}: {}", r.text());
        assert_eq!(r.header("location"), Some("/whoami"), "{next}");
    }
}

#[test]
fn a_provider_that_is_down_gets_a_clear_page_and_passwords_still_work() {
    let s = setup(&[alice()], Ttls::default());
    let Setup { idp, w, gw, _dir } = s;
    drop(idp);
    let r = Browser::new().send("GET", &format!("{gw}/login/oidc/corp?next=/"), None);
    assert_eq!(r.status, 502, "{}", r.text());
    assert!(r.text().contains("Corp did not answer"), "{}", r.text());
    assert!(r.text().contains("sign in with a password"), "{}", r.text());
    let pw = w.password("alice");
    assert_eq!(
        demo(&w.get_as("alice", &pw, "/apps/demo/"))["label"],
        "SECRET"
    );
}

#[test]
fn a_rotated_signing_key_is_fetched_without_a_restart() {
    let s = setup(&[alice()], Ttls::default());
    let (r, _) = Browser::new().sign_in(&s.gw, "corp", "/apps/demo/", &alice());
    assert_eq!(demo(&r)["label"], "SECRET");
    s.idp.rotate();
    let (r, _) = Browser::new().sign_in(&s.gw, "corp", "/apps/demo/", &alice());
    assert_eq!(demo(&r)["label"], "SECRET", "signed with the new key");
}

#[test]
fn a_refresh_brings_a_changed_group_and_ends_a_removed_person() {
    // Tokens live two seconds: each request after that refreshes first.
    let ttls = Ttls {
        id_token: 2,
        access_token: 2,
        refresh_token: 3600,
    };
    let s = setup(&[alice()], ttls);
    let mut b = Browser::new();
    let (r, _) = b.sign_in(&s.gw, "corp", "/apps/demo/", &alice());
    assert_eq!(demo(&r)["label"], "SECRET");
    let demo_url = format!("{}/apps/demo/", s.gw);
    s.idp
        .set_people(&[Person::new("alice", "wonderland", &["interns"])]);
    wait_until(
        "the new group at refresh",
        std::time::Duration::from_secs(30),
        || {
            let r = b.send("GET", &demo_url, None);
            (r.status == 200 && r.json()["label"] == "UNCLASSIFIED").then_some(())
        },
    );
    let user = s.w.api("GET", "/v1/users/alice_corp", None).json();
    assert_eq!(user["clearance"], "UNCLASSIFIED", "{user}");
    s.idp.set_people(&[]);
    wait_until(
        "the session ended at refresh",
        std::time::Duration::from_secs(30),
        || {
            let r = b.send("GET", &demo_url, None);
            signed_out(&r).then_some(())
        },
    );
    // Ended in the store, not only refused: the cookie alone never works again.
    let token = b.cookie(host(&s.gw), "warden_session").unwrap();
    let r = http::request(
        "GET",
        &demo_url,
        &[("authorization", &format!("Bearer {token}"))],
        b"",
    );
    assert_eq!(r.status, 401);
}

#[test]
fn provider_sign_ins_are_audited_as_oidc_and_no_token_reaches_a_log() {
    let s = setup_with(&[alice()], Ttls::default(), &["--audit-flush-ms", "200"]);
    let mut b = Browser::new();
    let cb = b.sign_in_until_callback(&s.gw, "corp", "/apps/demo/", &alice());
    assert_eq!(b.send("GET", &cb, None).status, 303);
    // What the provider put in the callback URL: the code and the state.
    let query: Vec<String> = cb
        .split_once('?')
        .unwrap()
        .1
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| *k == "code" || *k == "state")
        .map(|(_, v)| v.to_owned())
        .collect();
    assert_eq!(query.len(), 2, "{cb}");
    s.idp.tamper("aud");
    let (r, _) = Browser::new().sign_in(&s.gw, "corp", "/apps/demo/", &alice());
    assert_eq!(r.status, 401);
    let events = |w: &Warden| -> Vec<serde_json::Value> {
        let r = w.api("GET", "/v1/audit?kind=sign_in&limit=10000", None);
        assert_eq!(r.status, 200, "{}", r.text());
        let records: Vec<serde_json::Value> = serde_json::from_value(r.json()).unwrap();
        records.into_iter().map(|r| r["event"].clone()).collect()
    };
    wait_until(
        "both provider sign-ins recorded",
        std::time::Duration::from_secs(30),
        || {
            let e = events(&s.w);
            let ok = e.iter().any(|e| {
                e["user"] == "alice_corp" && e["method"] == "oidc:corp" && e["outcome"] == "ok"
            });
            let failed = e
                .iter()
                .any(|e| e["method"] == "oidc:corp" && e["outcome"] == "failed");
            (ok && failed).then_some(())
        },
    );
    // A JWT begins "eyJ" (base64 of '{"'); the session token is in the browser's jar.
    let session = b.cookie(host(&s.gw), "warden_session").unwrap();
    let audit = s.w.api("GET", "/v1/audit?limit=10000", None).text();
    for log in [audit, s.w.stderr(), s.w.stdout()] {
        assert!(!log.contains("eyJ"), "a token in a log: {log}");
        assert!(!log.contains(&session), "the session token in a log");
        for v in &query {
            assert!(
                !log.contains(v.as_str()),
                "the callback's code or state in a log"
            );
        }
    }
}

#[test]
fn without_a_refresh_token_a_session_ends_with_the_providers_tokens() {
    let ttls = Ttls {
        id_token: 2,
        access_token: 2,
        refresh_token: 0,
    };
    let s = setup(&[alice()], ttls);
    let mut b = Browser::new();
    let (r, _) = b.sign_in(&s.gw, "corp", "/apps/demo/", &alice());
    assert_eq!(demo(&r)["label"], "SECRET");
    let demo_url = format!("{}/apps/demo/", s.gw);
    wait_until(
        "the session's end",
        std::time::Duration::from_secs(30),
        || signed_out(&b.send("GET", &demo_url, None)).then_some(()),
    );
}

#[test]
fn concurrent_requests_past_the_tokens_expiry_refresh_once() {
    // The provider rotates refresh tokens and revokes the grant when a spent one comes back:
    // two refreshes of one session at once would end it.
    let ttls = Ttls {
        id_token: 2,
        access_token: 2,
        refresh_token: 3600,
    };
    let s = setup(&[alice()], ttls);
    let mut b = Browser::new();
    let (r, _) = b.sign_in(&s.gw, "corp", "/apps/demo/", &alice());
    assert_eq!(demo(&r)["label"], "SECRET");
    let token = b.cookie(host(&s.gw), "warden_session").unwrap();
    let demo_url = format!("{}/apps/demo/", s.gw);
    // Past the tokens' expiry, with no request in between.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let statuses: Vec<u16> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                scope.spawn(|| {
                    let cookie = format!("warden_session={token}");
                    http::request("GET", &demo_url, &[("cookie", &cookie)], b"").status
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(statuses.iter().all(|&st| st == 200), "{statuses:?}");
    let r = http::request(
        "GET",
        &demo_url,
        &[("cookie", &format!("warden_session={token}"))],
        b"",
    );
    assert_eq!(demo(&r)["label"], "SECRET", "the session lives on");
}

#[test]
fn a_provider_down_at_refresh_is_a_503_that_says_so() {
    let ttls = Ttls {
        id_token: 2,
        access_token: 2,
        refresh_token: 3600,
    };
    let Setup { idp, w, gw, _dir } = setup(&[alice()], ttls);
    let mut b = Browser::new();
    let (r, _) = b.sign_in(&gw, "corp", "/apps/demo/", &alice());
    assert_eq!(demo(&r)["label"], "SECRET");
    drop(idp);
    let demo_url = format!("{gw}/apps/demo/");
    let r = wait_until(
        "the refresh to fail",
        std::time::Duration::from_secs(30),
        || {
            let r = b.send("GET", &demo_url, None);
            (r.status != 200).then_some(r)
        },
    );
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(
        r.text().contains("Corp") && r.text().contains("did not answer"),
        "{}",
        r.text()
    );
    drop(w);
}
