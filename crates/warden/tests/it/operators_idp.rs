//! Operators from the identity provider (issue 36): `warden login --provider corp` runs the
//! device flow (RFC 8628) through the API against a real provider (panva's `oidc-provider`,
//! device flow on), the test approving on the provider's pages as a person would. The person's
//! groups give their roles (`operator_rules`); one in no operator group is refused; a change of
//! groups at the provider takes effect at the next login, and what they held before is refused.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

use warden_test_support::oidc::{Browser, OidcProvider, Person, Ttls};
use warden_test_support::{free_port, request, Launch, Response, Warden};

use crate::BIN;

pub(crate) const OPERATOR_RULES: &str = r#"operator_rules = [
  { claim = "groups", value = "platform", role = "owner" },
  { claim = "groups", value = "shop-devs", role = "deployer", apps = ["shop"] },
  { claim = "groups", value = "staff", role = "viewer" },
]"#;

/// ID tokens last this long: the sessions may last no longer.
const ID_TTL_SECS: u64 = 900;

struct Setup {
    idp: OidcProvider,
    w: Warden,
    home: tempfile::TempDir,
    dir: tempfile::TempDir,
    config: std::path::PathBuf,
}

fn setup(people: &[Person]) -> Setup {
    setup_with(people, &[])
}

/// A provider knowing `people`, warden with `extra` arguments and its data in the setup's dir
/// (so a test can restart it).
fn setup_with(people: &[Person], extra: &[&str]) -> Setup {
    let idp = OidcProvider::start(
        people,
        Ttls {
            id_token: ID_TTL_SECS,
            ..Ttls::default()
        },
    );
    let port = free_port();
    let redirect = format!("http://127.0.0.1:{port}/login/oidc/corp/callback");
    idp.register("warden", "s3cret", &redirect);
    let dir = tempfile::tempdir().unwrap();
    let config = crate::oidc::config_file(dir.path(), &idp.issuer, &redirect);
    // The file ends inside the [[oidc]] table: the rules join it.
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(OPERATOR_RULES);
    text.push('\n');
    std::fs::write(&config, text).unwrap();
    let w = launch(dir.path(), &config, port, extra);
    Setup {
        idp,
        w,
        home: tempfile::tempdir().unwrap(),
        dir,
        config,
    }
}

fn launch(dir: &std::path::Path, config: &std::path::Path, port: u16, extra: &[&str]) -> Warden {
    Launch::new(BIN)
        .listen(&format!("127.0.0.1:{port}"))
        .data_dir(dir.join("data"))
        .arg("--config")
        .arg(config.to_str().unwrap())
        .args(extra)
        .start()
}

impl Setup {
    /// Stops warden and starts it again on the same data with `extra` arguments.
    fn restart(&mut self, extra: &[&str]) {
        self.w.stop();
        self.w = launch(self.dir.path(), &self.config, free_port(), extra);
    }
}

/// Runs the CLI as the person at the terminal: their config dir, no token but the session.
fn cli(s: &Setup, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args)
        .env_remove("WARDEN_TOKEN")
        .env_remove("WARDEN_CONFIG")
        .env("WARDEN_API", &s.w.api)
        .env("XDG_CONFIG_HOME", s.home.path())
        .env("WARDEN_DATA_DIR", s.home.path().join("no-data-dir"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Runs the CLI to its end: (success, stdout, stderr).
fn run(s: &Setup, args: &[&str]) -> (bool, String, String) {
    let out = cli(s, args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `warden login --provider corp`, approved as `who` on the provider's pages from the page
/// and code the CLI printed: (success, stdout, stderr).
fn login(s: &Setup, who: &Person) -> (bool, String, String) {
    let mut child = cli(s, &["login", "--provider", "corp"]).spawn().unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let (uri, code) = loop {
        let mut line = String::new();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "the CLI said: {seen}"
        );
        seen.push_str(&line);
        if let Some(rest) = line.trim().strip_prefix("To log in, open ") {
            let (uri, code) = rest
                .split_once(" in a browser and enter the code ")
                .unwrap();
            break (uri.to_owned(), code.to_owned());
        }
    };
    let (page, url) = Browser::new().approve_device(&uri, &code, who);
    assert_eq!(page.status, 200, "{url}: {}", page.text());
    assert!(page.text().contains("Sign-in Success"), "{}", page.text());
    err.read_to_string(&mut seen).unwrap();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    (child.wait().unwrap().success(), out, seen)
}

/// The session token `warden login` kept.
fn session_token(s: &Setup) -> String {
    let text = std::fs::read_to_string(s.home.path().join("warden/session.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["token"].as_str().unwrap().to_owned()
}

fn as_token(s: &Setup, token: &str, method: &str, path: &str) -> Response {
    request(
        method,
        &format!("{}{path}", s.w.api),
        &[("authorization", &format!("Bearer {token}"))],
        b"",
    )
}

#[test]
fn a_platform_person_logs_in_through_the_provider_pushes_as_themselves_and_loses_it_with_the_group()
{
    let alice = Person::new("alice", "wonderland", &["platform"]);
    let s = setup(std::slice::from_ref(&alice));
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let (ok, out, err) = login(&s, &alice);
    assert!(
        ok && out.contains("logged in as operator alice"),
        "{out}{err}"
    );

    // An operator record from the provider: no password, the owner role its group gives.
    let op = s.w.api("GET", "/v1/operators/alice", None).json();
    let from = &op["source"]["provider"];
    assert_eq!(from["id"], "corp", "{op}");
    assert_eq!(from["issuer"], s.idp.issuer.as_str(), "{op}");
    assert_eq!(from["subject"], "alice", "{op}");
    assert_eq!(op["password"], false, "{op}");
    assert_eq!(op["roles"], serde_json::json!([{"role": "owner"}]), "{op}");
    let listed = cli(&s, &["operators", "list"])
        .env("WARDEN_TOKEN", &s.w.token)
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with("alice") && l.contains("provider corp")),
        "{listed}"
    );
    // The session ends when the provider's ID token does, not 12 hours on.
    let tokens = s.w.api("GET", "/v1/tokens", None).json();
    let expires = tokens[0]["expires_ms"].as_u64().unwrap();
    // Where the sign-in began and where it was finished (a code phished from another network
    // would show a start from there).
    assert_eq!(
        tokens[0]["label"], "device login started from 127.0.0.1, finished from 127.0.0.1 at corp",
        "{tokens}"
    );
    assert!(
        expires <= before + (ID_TTL_SECS + 120) * 1000,
        "{tokens} (logged in at {before})"
    );

    // A push through the CLI with that session names her in the audit trail.
    let src = crate::deploy::fixture("plain");
    let (ok, out, err) = run(&s, &["push", "plain", &src.path().display().to_string()]);
    assert!(ok && out.contains("of plain serves"), "{out}{err}");
    let changes = s.w.api("GET", "/v1/audit?kind=change", None).json();
    let pushers: Vec<&str> = changes
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["event"])
        .filter(|e| e["route"] == "/v1/apps/{name}/releases" && e["outcome"] != "pending")
        .map(|e| e["actor"].as_str().unwrap())
        .collect();
    assert_eq!(pushers, ["operator:alice"], "{changes}");

    // Removed from the group at the provider: refused at her next login, and the session she
    // still holds stops working at once.
    let held = session_token(&s);
    assert_eq!(as_token(&s, &held, "GET", "/v1/apps").status, 200);
    s.idp
        .set_people(&[Person::new("alice", "wonderland", &["sales"])]);
    let (ok, out, err) = login(&s, &alice);
    assert!(
        !ok && err.contains("no operator rule matched") && err.contains(r#"groups=["sales"]"#),
        "{out}{err}"
    );
    let r = as_token(&s, &held, "GET", "/v1/apps");
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(s.w.api("GET", "/v1/operators/alice", None).status, 404);
}

#[test]
fn no_operator_group_is_refused_a_changed_group_ends_old_tokens_and_a_local_name_is_never_taken() {
    let bob = Person::new("bob", "builder", &["sales"]);
    let dave = Person::new("dave", "diver", &["shop-devs"]);
    let carol = Person::new("carol", "singer", &["platform"]);
    let s = setup(&[bob.clone(), dave.clone(), carol.clone()]);

    let (ok, out, err) = login(&s, &bob);
    assert!(
        !ok && err.contains("no operator rule matched") && err.contains(r#"groups=["sales"]"#),
        "{out}{err}"
    );
    assert_eq!(s.w.api("GET", "/v1/operators/bob", None).status, 404);

    // A deployer of shop, then a viewer once moved to staff: the deployer's token is refused.
    let (ok, out, err) = login(&s, &dave);
    assert!(ok, "{out}{err}");
    let deployer = session_token(&s);
    let op = s.w.api("GET", "/v1/operators/dave", None).json();
    assert_eq!(
        op["roles"],
        serde_json::json!([{"role": "deployer", "apps": ["shop"]}]),
        "{op}"
    );
    s.idp.set_people(&[
        bob.clone(),
        Person::new("dave", "diver", &["staff"]),
        carol.clone(),
    ]);
    let (ok, out, err) = login(&s, &dave);
    assert!(ok, "{out}{err}");
    let op = s.w.api("GET", "/v1/operators/dave", None).json();
    assert_eq!(op["roles"], serde_json::json!([{"role": "viewer"}]), "{op}");
    // The change of roles is in the audit trail (with the SHA-256 of the roles before).
    let changes = s.w.api("GET", "/v1/audit?kind=change", None).json();
    let changed = changes
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["event"])
        .filter(|e| {
            e["route"] == "/v1/login/device/poll"
                && e["target"] == "dave"
                && e["before"].is_string()
        })
        .count();
    assert_eq!(changed, 1, "{changes}");
    let r = as_token(&s, &deployer, "GET", "/v1/apps");
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(
        as_token(&s, &session_token(&s), "GET", "/v1/apps").status,
        200
    );

    // A local operator named carol is not taken over by the provider's carol.
    let r = s.w.api(
        "POST",
        "/v1/operators",
        Some(serde_json::json!({"name": "carol", "password": "local-password-1", "roles": [{"role": "viewer"}]})),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let (ok, out, err) = login(&s, &carol);
    assert!(
        !ok && err.contains("the operator name \"carol\" your account gives is another operator's"),
        "{out}{err}"
    );
    let op = s.w.api("GET", "/v1/operators/carol", None).json();
    assert_eq!(op["source"], "local", "{op}");
    assert_eq!(op["roles"], serde_json::json!([{"role": "viewer"}]), "{op}");
}

fn post(s: &Setup, path: &str, body: serde_json::Value) -> Response {
    request(
        "POST",
        &format!("{}{path}", s.w.api),
        &[("content-type", "application/json")],
        body.to_string().as_bytes(),
    )
}

#[test]
fn device_sign_ins_are_throttled_per_address_and_polled_no_faster_than_the_provider_allows() {
    let s = setup(&[Person::new("ann", "pw", &["staff"])]);
    let r = post(
        &s,
        "/v1/login/device",
        serde_json::json!({"provider": "nope"}),
    );
    assert_eq!(r.status, 404, "{}", r.text());
    // The answer names no provider that does: the caller is anyone.
    assert!(
        r.text().contains("ask an owner") && !r.text().contains("corp"),
        "{}",
        r.text()
    );
    let r = post(
        &s,
        "/v1/login/device",
        serde_json::json!({"provider": "corp"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let started = r.json();
    assert!(
        started["user_code"].as_str().is_some_and(|c| !c.is_empty()),
        "{started}"
    );
    let handle = started["handle"].as_str().unwrap();
    // The first poll asks the provider (pending); one right after it is told to slow down,
    // without the provider being asked.
    let poll = |h: &str| {
        post(
            &s,
            "/v1/login/device/poll",
            serde_json::json!({"handle": h}),
        )
    };
    let r = poll(handle);
    assert_eq!(r.json()["status"], "pending", "{}", r.text());
    let r = poll(handle);
    assert_eq!(r.json()["status"], "slow_down", "{}", r.text());
    let r = poll("not-a-handle");
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(r.text().contains("warden login --provider"), "{}", r.text());
    // Starts from one address are counted: at most 3 in flight from it (the first above is
    // one), then 429; and a handful a minute, then 429 with Retry-After.
    let mut statuses = vec![];
    for _ in 0..8 {
        statuses.push(post(
            &s,
            "/v1/login/device",
            serde_json::json!({"provider": "corp"}),
        ));
    }
    let started = statuses.iter().filter(|r| r.status == 200).count();
    assert_eq!(
        started,
        2,
        "{:?}",
        statuses.iter().map(Response::text).collect::<Vec<_>>()
    );
    assert!(
        statuses[2].status == 429
            && statuses[2]
                .text()
                .contains("too many device sign-ins are in flight from your address"),
        "{}",
        statuses[2].text()
    );
    let refused = statuses
        .iter()
        .find(|r| r.status == 429 && r.header("retry-after").is_some())
        .expect("a start is throttled");
    assert!(
        refused
            .text()
            .contains("too many device sign-ins from this address"),
        "{}",
        refused.text()
    );
}

fn post_as(s: &Setup, token: &str, path: &str, body: serde_json::Value) -> Response {
    request(
        "POST",
        &format!("{}{path}", s.w.api),
        &[
            ("authorization", &format!("Bearer {token}")),
            ("content-type", "application/json"),
        ],
        body.to_string().as_bytes(),
    )
}

#[test]
fn a_provider_operator_mints_no_api_token_and_loses_access_when_the_provider_stops_giving_roles() {
    let alice = Person::new("alice", "wonderland", &["platform"]);
    let mut s = setup(std::slice::from_ref(&alice));
    let (ok, out, err) = login(&s, &alice);
    assert!(ok, "{out}{err}");
    let held = session_token(&s);
    // A year-long token would outlive her removal from the group, which warden learns only
    // when she signs in again: refused.
    let r = post_as(
        &s,
        &held,
        "/v1/tokens",
        serde_json::json!({"label": "ci", "expires_in": 31_536_000}),
    );
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.text().contains("makes no API tokens"), "{}", r.text());
    assert_eq!(as_token(&s, &held, "GET", "/v1/apps").status, 200);

    // The operator_rules gone from the config: her session, still within the ID token's life,
    // is refused at once.
    let text = std::fs::read_to_string(&s.config).unwrap();
    std::fs::write(&s.config, text.replace(OPERATOR_RULES, "")).unwrap();
    s.restart(&[]);
    let r = as_token(&s, &held, "GET", "/v1/apps");
    assert_eq!(r.status, 401, "{}", r.text());
    assert!(
        r.text().contains("no longer gives operator roles"),
        "{}",
        r.text()
    );
}

#[test]
fn another_account_of_the_same_name_never_takes_the_operator_and_the_last_owner_is_kept() {
    // The provider's "Alice" is another account (subject "Alice") whose name maps to alice.
    let alice = Person::new("alice", "wonderland", &["platform"]);
    let impostor = Person::new("Alice", "mirror", &["staff"]);
    let mut s = setup(&[alice.clone(), impostor.clone()]);
    let (ok, out, err) = login(&s, &alice);
    assert!(ok, "{out}{err}");
    let held = session_token(&s);
    let owner_kept = |s: &Setup| {
        let op = as_token(s, &held, "GET", "/v1/operators/alice").json();
        assert_eq!(op["roles"], serde_json::json!([{"role": "owner"}]), "{op}");
        assert_eq!(op["source"]["provider"]["subject"], "alice", "{op}");
    };

    // With a matching rule the impostor is refused, alice's roles and session untouched.
    let (ok, out, err) = login(&s, &impostor);
    assert!(
        !ok && err.contains("your account gives is another operator's"),
        "{out}{err}"
    );
    owner_kept(&s);
    // With none, alice is not removed either.
    s.idp
        .set_people(&[alice.clone(), Person::new("Alice", "mirror", &["sales"])]);
    let (ok, out, err) = login(&s, &impostor);
    assert!(
        !ok && err.contains("no operator rule matched"),
        "{out}{err}"
    );
    owner_kept(&s);

    // With the admin token off, the provider demoting or dropping the last owner is refused:
    // the operator kept, the refusal in the audit trail.
    s.restart(&["--admin-token", "off"]);
    for groups in [["staff"], ["sales"]] {
        s.idp
            .set_people(&[Person::new("alice", "wonderland", &groups)]);
        let (ok, out, err) = login(&s, &alice);
        assert!(!ok && err.contains("warden's last owner"), "{out}{err}");
        owner_kept(&s);
    }
    let changes = as_token(&s, &held, "GET", "/v1/audit?kind=change").json();
    let kept = changes
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["event"])
        .filter(|e| {
            e["route"] == "/v1/login/device/poll" && e["outcome"] == "409" && e["target"] == "alice"
        })
        .count();
    assert_eq!(kept, 2, "{changes}");
}
