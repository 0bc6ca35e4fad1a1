//! Provider users pinned to their provider account, the deciding claims in the audit trail,
//! and providers added and removed by API (issue 36), against the real test provider.

use std::time::Duration;

use warden_test_support::http::{self, Response};
use warden_test_support::oidc::{Browser, OidcProvider, Person, Ttls};
use warden_test_support::{cli, free_port, wait_until, Launch, Warden};

use crate::oidc::{alice, config_file, host};
use crate::BIN;

/// A gateway with provider `corp` (from its config file) in front of the demo.
pub(crate) struct Setup {
    pub(crate) idp: OidcProvider,
    pub(crate) w: Warden,
    pub(crate) gw: String,
    _dir: tempfile::TempDir,
}

pub(crate) fn setup(people: &[Person]) -> Setup {
    setup_ttls(people, Ttls::default())
}

fn setup_ttls(people: &[Person], ttls: Ttls) -> Setup {
    let idp = OidcProvider::start(people, ttls);
    let port = free_port();
    let gw = format!("http://127.0.0.1:{port}");
    let redirect = format!("{gw}/login/oidc/corp/callback");
    idp.register("warden", "s3cret", &redirect);
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path(), &idp.issuer, &redirect);
    let w = Launch::new(BIN)
        .listen(&format!("127.0.0.1:{port}"))
        .arg("--config")
        .arg(config.to_str().unwrap())
        .arg("--audit-flush-ms")
        .arg("200")
        .start();
    Setup {
        idp,
        w,
        gw,
        _dir: dir,
    }
}

/// `warden audit --kind sign_in` lines, as the CLI prints them.
fn audit_lines(w: &Warden) -> String {
    let env = [
        ("WARDEN_API", w.api.as_str()),
        ("WARDEN_TOKEN", w.token.as_str()),
    ];
    let (ok, out, err) = cli(
        BIN,
        &["audit", "--kind", "sign_in", "--limit", "10000"],
        &env,
    );
    assert!(ok, "{err}");
    out
}

/// Waits until a line of `warden audit --kind sign_in` satisfies `f`; that line.
fn audited(w: &Warden, what: &str, f: impl Fn(&str) -> bool) -> String {
    wait_until(what, Duration::from_secs(30), || {
        audit_lines(w).lines().find(|l| f(l)).map(str::to_owned)
    })
}

#[test]
fn a_name_belongs_to_the_provider_account_that_took_it_first() {
    // Mallory chose Alice's name as her preferred_username at the provider.
    let mallory = Person::new("mallory", "pw", &["engineering"]).with_username("alice");
    let s = setup(&[alice(), mallory.clone()]);
    let (r, _) = Browser::new().sign_in(&s.gw, "corp", "/apps/demo/", &alice());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["user"], "alice_corp");
    let mut b = Browser::new();
    let (r, _) = b.sign_in(&s.gw, "corp", "/apps/demo/", &mallory);
    assert_eq!(r.status, 403, "{}", r.text());
    let page = r.text();
    assert!(
        page.contains("belongs to another account of the identity provider")
            && page.contains("users rm alice_corp"),
        "{page}"
    );
    assert!(b.cookie(host(&s.gw), "warden_session").is_none());
    audited(&s.w, "the refusal audited by name", |l| {
        l.contains(r#""user":"alice_corp""#)
            && l.contains(r#""method":"oidc:corp""#)
            && l.contains(r#""outcome":"refused""#)
    });
    // Alice renamed at the provider (same sub): a new warden name, the old one left as it was.
    s.idp
        .set_people(&[alice().with_username("alice.smith"), mallory]);
    let (r, _) = Browser::new().sign_in(&s.gw, "corp", "/apps/demo/", &alice());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["user"], "alice-smith_corp");
    let user = s.w.api("GET", "/v1/users/alice-smith_corp", None);
    assert_eq!(user.status, 200, "{}", user.text());
    let mark = &user.json()["provider"];
    assert_eq!(mark["subject"], "alice");
    assert_eq!(
        mark["issuer"],
        s.idp.issuer.as_str(),
        "the issuer kept: {mark}"
    );
    let env = [
        ("WARDEN_API", s.w.api.as_str()),
        ("WARDEN_TOKEN", s.w.token.as_str()),
    ];
    let (ok, out, err) = cli(BIN, &["users", "show", "alice-smith_corp"], &env);
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!("issuer:     {}", s.idp.issuer)),
        "{out}"
    );
}

#[test]
fn a_provider_sign_in_is_audited_with_the_claims_that_decided_it() {
    let bob = Person::new("bob", "builder", &["engineering", "interns", "marketing"]);
    let s = setup(std::slice::from_ref(&bob));
    let mut b = Browser::new();
    let (r, _) = b.sign_in(&s.gw, "corp", "/apps/demo/", &bob);
    assert_eq!(r.status, 200, "{}", r.text());
    // The matched rules' claim values, not the claims no rule consulted ("marketing").
    let line = audited(&s.w, "the sign-in with its claims", |l| {
        l.contains(r#""user":"bob_corp""#) && l.contains(r#""outcome":"ok""#)
    });
    assert!(line.contains(r#""method":"oidc:corp""#), "{line}");
    assert!(
        line.contains(r#""claims":["groups=engineering","groups=interns"]"#),
        "{line}"
    );
    assert!(!line.contains("marketing"), "{line}");
    let session = b.cookie(host(&s.gw), "warden_session").unwrap();
    let all = audit_lines(&s.w);
    assert!(
        !all.contains("eyJ") && !all.contains(&session),
        "a token in the audit trail"
    );
}

/// A request to the API with `token`.
fn call(
    w: &Warden,
    token: &str,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> Response {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    http::request(
        method,
        &format!("{}{path}", w.api),
        &[
            ("authorization", &format!("Bearer {token}")),
            ("content-type", "application/json"),
        ],
        body.as_bytes(),
    )
}

/// A session token of a new operator `name` with `roles`.
fn operator(w: &Warden, name: &str, roles: serde_json::Value) -> String {
    let r = w.api(
        "POST",
        "/v1/operators",
        Some(serde_json::json!({"name": name, "password": "long enough pw", "roles": roles})),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let r = call(
        w,
        "",
        "POST",
        "/v1/login",
        Some(serde_json::json!({"name": name, "password": "long enough pw"})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["token"].as_str().unwrap().to_owned()
}

/// The sign-in page as a browser gets it.
fn sign_in_page(gw: &str) -> String {
    http::request(
        "GET",
        &format!("{gw}/login"),
        &[("accept", "text/html")],
        b"",
    )
    .text()
}

#[test]
fn a_provider_added_by_api_signs_people_in_until_it_is_removed() {
    let s = setup(&[alice()]);
    const SECRET: &str = "staff-client-secret-7f3a9c";
    let redirect = format!("{}/login/oidc/staff/callback", s.gw);
    s.idp.register("warden-staff", SECRET, &redirect);
    let body = |issuer: &str| {
        serde_json::json!({
            "id": "staff", "label": "Staff SSO", "issuer": issuer, "client_id": "warden-staff",
            "client_secret": SECRET, "redirect_url": redirect,
            "rules": [{ "claim": "groups", "value": "engineering", "level": "SECRET" }],
        })
    };
    // Owner only.
    let viewer = operator(&s.w, "vera", serde_json::json!([{"role": "viewer"}]));
    let deployer = operator(
        &s.w,
        "dan",
        serde_json::json!([{"role": "deployer", "apps": ["demo"]}]),
    );
    for t in [&viewer, &deployer] {
        assert_eq!(call(&s.w, t, "GET", "/v1/oidc/providers", None).status, 403);
        let r = call(
            &s.w,
            t,
            "POST",
            "/v1/oidc/providers",
            Some(body(&s.idp.issuer)),
        );
        assert_eq!(r.status, 403, "{}", r.text());
    }
    // An issuer nobody answers at: refused before it is stored, saying what failed.
    let r = s.w.api(
        "POST",
        "/v1/oidc/providers",
        Some(body(&format!("http://127.0.0.1:{}", free_port()))),
    );
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(r.text().contains("discovery of issuer"), "{}", r.text());
    // ... without saying how it failed (a refused port, no TLS, an error status: a map of
    // what the node reaches).
    assert!(!r.text().to_lowercase().contains("refused"), "{}", r.text());
    // A ca_file that is no regular file (a FIFO would block the read forever) is a 422 at
    // once, saying nothing of which paths exist.
    let fifo = s.w.dir.join("ca-fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    for ca in [fifo.to_str().unwrap(), "/no/such/ca.pem"] {
        let mut b = body(&s.idp.issuer);
        b["ca_file"] = ca.into();
        let r = s.w.api("POST", "/v1/oidc/providers", Some(b));
        assert_eq!(r.status, 422, "{}", r.text());
        assert!(
            r.text().contains("not a readable regular file"),
            "{}",
            r.text()
        );
    }
    assert_eq!(s.w.api("GET", "/v1/oidc/providers/staff", None).status, 404);
    // An id so long that user names would have little room for the person's name.
    let mut long = body(&s.idp.issuer);
    long["id"] = "s".repeat(33).into();
    let r = s.w.api("POST", "/v1/oidc/providers", Some(long));
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(r.text().contains("at most 32"), "{}", r.text());

    let r =
        s.w.api("POST", "/v1/oidc/providers", Some(body(&s.idp.issuer)));
    assert_eq!(r.status, 201, "{}", r.text());
    let list = s.w.api("GET", "/v1/oidc/providers", None);
    assert_eq!(list.status, 200, "{}", list.text());
    assert!(
        !list.text().contains(SECRET),
        "a secret listed: {}",
        list.text()
    );
    let views: Vec<serde_json::Value> = serde_json::from_value(list.json()).unwrap();
    let by_id = |id: &str| views.iter().find(|v| v["id"] == id).cloned().unwrap();
    assert_eq!(by_id("corp")["source"], "config");
    assert_eq!(by_id("staff")["source"], "api");
    assert_eq!(by_id("staff")["secret"], "set");
    // The config file's provider changes only in the file.
    for m in ["PATCH", "DELETE"] {
        let r = s.w.api(
            m,
            "/v1/oidc/providers/corp",
            (m == "PATCH").then(|| serde_json::json!({"label": "x"})),
        );
        assert_eq!(r.status, 409, "{m}: {}", r.text());
        assert!(r.text().contains("config file"), "{}", r.text());
    }
    // Sealed in the store: the raw file holds the record but not the secret.
    let raw = std::fs::read(s.w.dir.join("store.redb")).unwrap();
    let holds = |needle: &str| raw.windows(needle.len()).any(|w| w == needle.as_bytes());
    assert!(holds("client_secret_sealed"), "the record is in the file");
    assert!(!holds(SECRET), "the client secret in clear in the store");

    wait_until(
        "the button on the sign-in page",
        Duration::from_secs(30),
        || {
            sign_in_page(&s.gw)
                .contains("/login/oidc/staff")
                .then_some(())
        },
    );
    let mut signed_in = Browser::new();
    let (r, _) = signed_in.sign_in(&s.gw, "staff", "/apps/demo/", &alice());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["user"], "alice_staff");

    // A sign-in begun before the removal cannot finish after it; a new one cannot begin.
    let mut b = Browser::new();
    let cb = b.sign_in_until_callback(&s.gw, "staff", "/apps/demo/", &alice());
    let r = s.w.api("DELETE", "/v1/oidc/providers/staff", None);
    assert_eq!(r.status, 204, "{}", r.text());
    wait_until("the button gone", Duration::from_secs(30), || {
        (!sign_in_page(&s.gw).contains("/login/oidc/staff")).then_some(())
    });
    let r = b.send("GET", &cb, None);
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(r.text().contains("no identity provider"), "{}", r.text());
    assert!(b.cookie(host(&s.gw), "warden_session").is_none());
    // Alice's session ends at once, not when the provider's word would have run out.
    let r = signed_in.send("GET", &format!("{}/apps/demo/", s.gw), None);
    assert_eq!(r.status, 303, "a removed provider's session still counts");
    let (r, _) = Browser::new().follow(&format!("{}/login/oidc/staff?next=/apps/demo/", s.gw));
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(
        sign_in_page(&s.gw).contains("/login/oidc/corp"),
        "the config file's stays"
    );
}

/// `warden ARGS` against `w` with `stdin`.
fn run_cli(w: &Warden, args: &[&str], stdin: &str) -> (bool, String, String) {
    use std::io::Write;
    let mut child = std::process::Command::new(BIN)
        .args(args)
        .env_remove("WARDEN_CONFIG")
        .env("WARDEN_API", &w.api)
        .env("WARDEN_TOKEN", &w.token)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn warden_oidc_adds_changes_and_removes_and_a_removed_providers_sessions_end_at_refresh() {
    // Tokens live two seconds: each request after that refreshes first.
    let ttls = Ttls {
        id_token: 2,
        access_token: 2,
        refresh_token: 3600,
    };
    let s = setup_ttls(&[alice()], ttls);
    let secret = "cli-secret-4d1e0b";
    let redirect = format!("{}/login/oidc/staff/callback", s.gw);
    s.idp.register("warden-staff", secret, &redirect);
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.json");
    std::fs::write(
        &rules,
        r#"[{ "claim": "groups", "value": "engineering", "level": "SECRET" }]"#,
    )
    .unwrap();
    let add = [
        "oidc",
        "add",
        "staff",
        "--issuer",
        &s.idp.issuer,
        "--client-id",
        "warden-staff",
        "--redirect-url",
        &redirect,
        "--secret-stdin",
        "--rules",
        rules.to_str().unwrap(),
    ];
    let (ok, out, err) = run_cli(&s.w, &add, &format!("{secret}\n"));
    assert!(ok, "{out}{err}");
    let (ok, out, err) = run_cli(
        &s.w,
        &["oidc", "change", "staff", "--label", "Staff SSO"],
        "",
    );
    assert!(ok, "{out}{err}");
    let (ok, out, err) = run_cli(&s.w, &["oidc", "list"], "");
    assert!(ok, "{err}");
    assert!(out.contains("Staff SSO") && out.contains("api"), "{out}");
    assert!(out.contains("corp") && out.contains("config"), "{out}");
    assert!(!out.contains(secret), "{out}");
    wait_until("the button", Duration::from_secs(30), || {
        sign_in_page(&s.gw).contains("Staff SSO").then_some(())
    });
    let mut b = Browser::new();
    let (r, _) = b.sign_in(&s.gw, "staff", "/apps/demo/", &alice());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["user"], "alice_staff");
    let (ok, out, err) = run_cli(&s.w, &["oidc", "remove", "staff"], "");
    assert!(ok, "{out}{err}");
    let demo = format!("{}/apps/demo/", s.gw);
    wait_until(
        "the session ended at its refresh",
        Duration::from_secs(30),
        || {
            let r = b.send("GET", &demo, None);
            (r.status == 303
                && r.header("location")
                    .is_some_and(|l| l.starts_with("/login?next=")))
            .then_some(())
        },
    );
    let (ok, _, err) = run_cli(&s.w, &["oidc", "remove", "corp"], "");
    assert!(!ok && err.contains("config file"), "{err}");
}

#[test]
fn on_a_cluster_a_provider_added_through_one_node_serves_on_every_gateway() {
    let etcd = warden_test_support::etcd::EtcdCluster::start(1);
    let idp = OidcProvider::start(&[alice()], Ttls::default());
    let a = Launch::new(BIN)
        .args(&["--store", &etcd.url(), "--node-name", "alpha"])
        .start();
    let port = free_port();
    let gw_b = format!("http://127.0.0.1:{port}");
    let token = a.dir.join("join-token").display().to_string();
    let b = Launch::new(BIN)
        .no_demo()
        .listen(&format!("127.0.0.1:{port}"))
        .args(&["--store", &etcd.url(), "--node-name", "beta"])
        .args(&["--roles", "gateway", "--join-token-file", &token])
        .start();
    let redirect = format!("{gw_b}/login/oidc/staff/callback");
    idp.register("warden-staff", "staff-secret", &redirect);
    let body = serde_json::json!({
        "id": "staff", "label": "Staff SSO", "issuer": idp.issuer, "client_id": "warden-staff",
        "client_secret": "staff-secret", "redirect_url": redirect,
        "rules": [{ "claim": "groups", "value": "engineering", "level": "SECRET" }],
    });
    let r = a.api("POST", "/v1/oidc/providers", Some(body));
    assert_eq!(r.status, 201, "{}", r.text());
    wait_until("the button on beta", Duration::from_secs(30), || {
        sign_in_page(&gw_b).contains("Staff SSO").then_some(())
    });
    // Beta opens the secret alpha sealed: the provider takes beta's code exchange.
    let (r, _) = Browser::new().sign_in(&gw_b, "staff", "/whoami", &alice());
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("alice_staff"), "{}", r.text());
    let r = a.api("DELETE", "/v1/oidc/providers/staff", None);
    assert_eq!(r.status, 204, "{}", r.text());
    wait_until("the button gone on beta", Duration::from_secs(30), || {
        (!sign_in_page(&gw_b).contains("Staff SSO")).then_some(())
    });
    drop(b);
}
