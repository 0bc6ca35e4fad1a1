//! The dashboard's sessions after review, its users page and its audit page (issue 37), against
//! the real binary: the cookie holds a session id (no API token), CSRF fields are bound to the
//! session, event streams are bounded per principal and end with their session, cookies are
//! `Secure` behind a TLS proxy the operator names; users created, changed and signed out from
//! the page (headless Chromium), as the users API does it; the audit trail searched.

use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};
use warden_test_support::browser::Browser;
use warden_test_support::{cli, request, Launch, Response, Warden};

use crate::BIN;

/// Makes operator `name` with `roles` through the admin token.
fn add_operator(w: &Warden, name: &str, password: &str, roles: Value) {
    let r = w.api(
        "POST",
        "/v1/operators",
        Some(json!({"name": name, "password": password, "roles": roles})),
    );
    assert_eq!(r.status, 201, "{}", r.text());
}

/// The whole `Set-Cookie` line a response gives cookie `name` (a value, not a removal).
fn set_cookie_line(r: &Response, name: &str) -> Option<String> {
    r.headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("set-cookie"))
        .map(|(_, v)| v.clone())
        .find(|v| v.starts_with(&format!("{name}=")) && !v.starts_with(&format!("{name}=;")))
}

/// The value of cookie `name` a response sets.
fn set_cookie(r: &Response, name: &str) -> Option<String> {
    set_cookie_line(r, name).map(|v| v.split(';').next().unwrap_or("")[name.len() + 1..].to_owned())
}

/// The CSRF field of a page.
fn field(page: &str) -> String {
    let at = page.find("name=\"csrf\" value=\"").expect("a CSRF field") + 19;
    page[at..at + 64].to_owned()
}

/// A signed-in browser, spoken to over HTTP.
struct Http {
    api: String,
    /// Both cookies, as a `Cookie` header.
    cookie: String,
    /// The field the sign-in page gave, before sign-in.
    before: String,
}

impl Http {
    /// Signs in as operator `name` from the sign-in page, as a browser would (`origin`: the
    /// `Origin` it sends, if any).
    fn sign_in(w: &Warden, name: &str, password: &str, origin: Option<&str>) -> (Self, Response) {
        let page = request("GET", &format!("{}/ui/login", w.api), &[], b"");
        assert_eq!(page.status, 200);
        let csrf = set_cookie(&page, "warden_ui_csrf").expect("a CSRF cookie");
        let before = field(&page.text());
        let cookie = format!("warden_ui_csrf={csrf}");
        let mut h = vec![
            ("content-type", "application/x-www-form-urlencoded"),
            ("cookie", cookie.as_str()),
        ];
        if let Some(o) = origin {
            h.push(("origin", o));
        }
        let body = format!("name={name}&password={password}&csrf={before}");
        let r = request("POST", &format!("{}/ui/login", w.api), &h, body.as_bytes());
        let session = set_cookie(&r, "warden_ui").unwrap_or_default();
        let http = Self {
            api: w.api.clone(),
            cookie: format!("warden_ui_csrf={csrf}; warden_ui={session}"),
            before,
        };
        (http, r)
    }

    fn get(&self, path: &str) -> Response {
        request(
            "GET",
            &format!("{}{path}", self.api),
            &[("cookie", self.cookie.as_str())],
            b"",
        )
    }

    fn post(&self, path: &str, body: &str) -> Response {
        request(
            "POST",
            &format!("{}{path}", self.api),
            &[
                ("content-type", "application/x-www-form-urlencoded"),
                ("cookie", self.cookie.as_str()),
            ],
            body.as_bytes(),
        )
    }

    /// The CSRF field of a signed-in page.
    fn field(&self) -> String {
        let page = self.get("/ui/");
        assert_eq!(page.status, 200, "{}", page.text());
        field(&page.text())
    }

    /// `GET /ui/events` on a thread: its answer arrives on the channel when the stream ends.
    fn stream(&self) -> mpsc::Receiver<Response> {
        let (tx, rx) = mpsc::channel();
        let (url, cookie) = (format!("{}/ui/events", self.api), self.cookie.clone());
        std::thread::spawn(move || {
            let _ = tx.send(request("GET", &url, &[("cookie", cookie.as_str())], b""));
        });
        rx
    }
}

fn desired(w: &Warden, app: &str, label: &str) -> Value {
    w.api("GET", &format!("/v1/apps/{app}"), None).json()["desired"][label].clone()
}

#[test]
fn the_cookie_holds_no_token_and_a_csrf_pair_from_before_sign_in_does_not_work_after() {
    let w = Warden::demo(BIN);
    let r = w.api(
        "POST",
        "/v1/apps/demo/scale",
        Some(json!({"desired": {"SECRET": 1}})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    add_operator(&w, "oona", "oona-password-1", json!([{"role": "owner"}]));
    let (s, r) = Http::sign_in(&w, "oona", "oona-password-1", None);
    assert_eq!(r.status, 303, "{}", r.text());
    let id = set_cookie(&r, "warden_ui").expect("a session");
    // The cookie's id opens nothing of the API by itself.
    let bearer = request(
        "GET",
        &format!("{}/v1/status", w.api),
        &[("authorization", &format!("Bearer {id}"))],
        b"",
    );
    assert_eq!(bearer.status, 401, "{}", bearer.text());

    // The pair the sign-in page gave (a page or script could have planted or read it before
    // sign-in): refused after, nothing changed. The signed-in page's own field: taken.
    let scale = |f: &str| {
        s.post(
            "/ui/apps/demo/scale",
            &format!("label=SECRET&count=2&csrf={f}"),
        )
    };
    let r = scale(&s.before);
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.text().contains("does not match"), "{}", r.text());
    assert_eq!(desired(&w, "demo", "SECRET"), json!(1));
    let r = scale(&s.field());
    assert_eq!(r.status, 303, "{}", r.text());
    assert_eq!(desired(&w, "demo", "SECRET"), json!(2));

    // The admin token signs in too, and is not what the cookie holds.
    let page = request("GET", &format!("{}/ui/login", w.api), &[], b"");
    let csrf = set_cookie(&page, "warden_ui_csrf").unwrap();
    let body = format!("token={}&csrf={}", w.token, field(&page.text()));
    let r = request(
        "POST",
        &format!("{}/ui/login", w.api),
        &[
            ("content-type", "application/x-www-form-urlencoded"),
            ("cookie", &format!("warden_ui_csrf={csrf}")),
        ],
        body.as_bytes(),
    );
    assert_eq!(r.status, 303, "{}", r.text());
    let admin = set_cookie(&r, "warden_ui").expect("a session");
    assert!(!admin.contains(&w.token) && admin != id, "{admin}");
    let page = request(
        "GET",
        &format!("{}/ui/", w.api),
        &[(
            "cookie",
            &format!("warden_ui_csrf={csrf}; warden_ui={admin}"),
        )],
        b"",
    );
    assert_eq!(page.status, 200, "{}", page.text());
}

#[test]
fn event_streams_are_bounded_per_principal_and_end_with_their_session() {
    let w = Warden::demo(BIN);
    add_operator(&w, "vee", "vee-password-1", json!([{"role": "viewer"}]));
    let (s, r) = Http::sign_in(&w, "vee", "vee-password-1", None);
    assert_eq!(r.status, 303, "{}", r.text());
    let open: Vec<_> = (0..4).map(|_| s.stream()).collect();
    // The fifth of one principal (another session of the same operator too) is refused at once.
    let (s2, _) = Http::sign_in(&w, "vee", "vee-password-1", None);
    let fifth = s2
        .stream()
        .recv_timeout(Duration::from_secs(30))
        .expect("the fifth stream answered at once");
    assert_eq!(fifth.status, 429, "{}", fifth.text());
    for rx in &open {
        assert!(
            matches!(rx.try_recv(), Err(mpsc::TryRecvError::Empty)),
            "a stream within the bound ended"
        );
    }

    // Signed out (from the page's form): every stream of that session ends soon after.
    let r = s.post("/ui/logout", &format!("csrf={}", s.field()));
    assert_eq!(r.status, 303, "{}", r.text());
    for rx in open {
        let ended = rx.recv_timeout(Duration::from_secs(40));
        assert!(ended.is_ok(), "a signed-out session's stream still runs");
    }

    // A stream of the other session ends when its token is revoked, as `warden tokens
    // revoke` does it.
    let live = s2.stream();
    std::thread::sleep(Duration::from_millis(500));
    assert!(matches!(live.try_recv(), Err(mpsc::TryRecvError::Empty)));
    let tokens = w.api("GET", "/v1/tokens", None).json();
    for t in tokens.as_array().unwrap() {
        let r = w.api(
            "DELETE",
            &format!("/v1/tokens/{}", t["id"].as_str().unwrap()),
            None,
        );
        assert_eq!(r.status, 204, "{}", r.text());
    }
    assert!(
        live.recv_timeout(Duration::from_secs(40)).is_ok(),
        "a revoked token's stream still runs"
    );
}

#[test]
fn behind_a_tls_proxy_the_cookies_are_secure_and_forms_from_its_origin_are_taken() {
    let w = Launch::new(BIN)
        .args(&["--ui-origin", "https://dash.example"])
        .start();
    add_operator(&w, "oona", "oona-password-1", json!([{"role": "owner"}]));
    // From the API's own plain origin: not the dashboard's any more.
    let (_, r) = Http::sign_in(&w, "oona", "oona-password-1", Some(&w.api));
    assert_eq!(r.status, 403, "{}", r.text());
    // From the proxy's: taken, and both cookies are Secure.
    let (s, r) = Http::sign_in(&w, "oona", "oona-password-1", Some("https://dash.example"));
    assert_eq!(r.status, 303, "{}", r.text());
    let line = set_cookie_line(&r, "warden_ui").expect("a session");
    assert!(line.contains("; Secure"), "{line}");
    let page = request("GET", &format!("{}/ui/login", w.api), &[], b"");
    let line = set_cookie_line(&page, "warden_ui_csrf").expect("a CSRF cookie");
    assert!(line.contains("; Secure"), "{line}");
    assert_eq!(s.get("/ui/").status, 200);
}

/// Signs the browser in as operator `name` from the sign-in page.
fn browser_sign_in(b: &Browser, w: &Warden, name: &str, password: &str) {
    b.goto(&format!("{}/ui/login", w.api));
    b.type_into(&b.find("form#password input[name=name]"), name);
    b.type_into(&b.find("form#password input[name=password]"), password);
    b.click(&b.find("form#password button[type=submit]"));
    b.wait_for("the overview", Duration::from_secs(30), |b| {
        b.url().ends_with("/ui/")
    });
}

/// The text of the first element matching `selector`, read in one step: the live script
/// may replace the element between a find and a read.
fn cell(b: &Browser, selector: &str) -> String {
    let script = format!(
        "var e = document.querySelector({}); return e ? e.textContent : '';",
        json!(selector)
    );
    b.execute(&script).as_str().unwrap_or_default().to_owned()
}

/// A gateway session of app user `name`: its `Cookie` header.
fn gateway_session(w: &Warden, name: &str, password: &str) -> String {
    let r = request(
        "POST",
        &format!("{}/login", w.gateway),
        &[("content-type", "application/json")],
        json!({"name": name, "password": password})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    format!("warden_session={}", r.json()["token"].as_str().unwrap())
}

/// `GET /whoami` at the gateway with `cookie`.
fn whoami(w: &Warden, cookie: &str) -> Response {
    request(
        "GET",
        &format!("{}/whoami", w.gateway),
        &[("accept", "application/json"), ("cookie", cookie)],
        b"",
    )
}

#[test]
fn an_owner_creates_a_user_changes_their_clearance_and_ends_their_sessions_from_the_page() {
    let w = Warden::demo(BIN);
    add_operator(&w, "oona", "oona-password-1", json!([{"role": "owner"}]));
    let b = Browser::start();
    browser_sign_in(&b, &w, "oona", "oona-password-1");
    b.goto(&format!("{}/ui/users", w.api));
    // The demo's users, with their clearance.
    assert_eq!(cell(&b, "tr[data-user='bob'] td.clearance"), "CONFIDENTIAL");

    // Created from the page: the new user signs in at the gateway.
    let pw = "newbie-password-1";
    let form = "form#create-user";
    b.type_into(&b.find(&format!("{form} input[name=name]")), "newbie");
    b.type_into(&b.find(&format!("{form} input[name=password]")), pw);
    b.type_into(&b.find(&format!("{form} input[name=clearance]")), "SECRET");
    b.type_into(&b.find(&format!("{form} input[name=groups]")), "staff");
    b.click(&b.find(&format!("{form} button[type=submit]")));
    let row = "tr[data-user='newbie']";
    b.wait_for("the new user's row", Duration::from_secs(30), |b| {
        cell(b, &format!("{row} td.clearance")) == "SECRET"
    });
    let session = gateway_session(&w, "newbie", pw);
    let me = whoami(&w, &session);
    assert_eq!(me.status, 200, "{}", me.text());
    assert_eq!(me.json()["clearance"], "SECRET");

    // Their clearance changed from the page: `warden users show` says so.
    b.type_into(&b.find("form#set-clearance input[name=name]"), "newbie");
    b.type_into(
        &b.find("form#set-clearance input[name=clearance]"),
        "CONFIDENTIAL",
    );
    b.click(&b.find("form#set-clearance button[type=submit]"));
    b.wait_for("the new clearance", Duration::from_secs(30), |b| {
        cell(b, &format!("{row} td.clearance")) == "CONFIDENTIAL"
    });
    let env = [
        ("WARDEN_API", w.api.as_str()),
        ("WARDEN_TOKEN", w.token.as_str()),
    ];
    let (ok, out, err) = cli(BIN, &["users", "show", "newbie"], &env);
    assert!(ok, "{err}");
    assert!(out.contains("CONFIDENTIAL"), "{out}");

    // Their sessions ended from the page: the next request with one is refused.
    let session = gateway_session(&w, "newbie", pw);
    assert_eq!(whoami(&w, &session).status, 200);
    b.goto(&format!("{}/ui/users", w.api));
    assert_eq!(cell(&b, &format!("{row} td.sessions")), "1");
    b.type_into(&b.find("form#end-sessions input[name=name]"), "newbie");
    b.click(&b.find("form#end-sessions button[type=submit]"));
    b.wait_for("no sessions", Duration::from_secs(30), |b| {
        cell(b, &format!("{row} td.sessions")) == "0"
    });
    let r = whoami(&w, &session);
    assert_eq!(r.status, 401, "{}", r.text());

    // The password was never shown nor logged.
    assert!(!b.source().contains(pw));
    assert!(!w.stderr().contains(pw) && !w.stdout().contains(pw));
}

#[test]
fn a_user_name_with_html_is_inert_and_a_viewer_may_not_create_users() {
    let w = Warden::demo(BIN);
    add_operator(&w, "oona", "oona-password-1", json!([{"role": "owner"}]));
    add_operator(&w, "vee", "vee-password-1", json!([{"role": "viewer"}]));
    let b = Browser::start();
    browser_sign_in(&b, &w, "oona", "oona-password-1");
    b.goto(&format!("{}/ui/users", w.api));
    let hostile = "<img src=x id=injected onerror=\"document.title='pwned'\">";
    let form = "form#create-user";
    b.type_into(&b.find(&format!("{form} input[name=name]")), hostile);
    b.type_into(
        &b.find(&format!("{form} input[name=password]")),
        "pw-12345678",
    );
    b.type_into(&b.find(&format!("{form} input[name=clearance]")), "SECRET");
    b.click(&b.find(&format!("{form} button[type=submit]")));
    // The API's refusal, naming the name as text: no element made, no script run.
    b.wait_for("the refusal", Duration::from_secs(30), |b| {
        cell(b, "#message").contains("<img src=x id=injected")
    });
    assert!(b.try_find("#injected").is_none(), "{}", b.source());
    assert_ne!(b.execute("return document.title;"), json!("pwned"));
    assert!(w.api("GET", "/v1/users", None).text().contains("alice"));

    // A viewer sees the users, and a create from the page is refused with the API's words.
    b.click(&b.find("form[action='/ui/logout'] button[type=submit]"));
    b.wait_for("the sign-in page", Duration::from_secs(30), |b| {
        b.url().ends_with("/ui/login")
    });
    browser_sign_in(&b, &w, "vee", "vee-password-1");
    b.goto(&format!("{}/ui/users", w.api));
    assert_eq!(cell(&b, "tr[data-user='alice'] td.clearance"), "SECRET");
    b.type_into(&b.find(&format!("{form} input[name=name]")), "sneaky");
    b.type_into(
        &b.find(&format!("{form} input[name=password]")),
        "pw-12345678",
    );
    b.type_into(&b.find(&format!("{form} input[name=clearance]")), "SECRET");
    b.click(&b.find(&format!("{form} button[type=submit]")));
    b.wait_for("the refusal", Duration::from_secs(30), |b| {
        cell(b, "#message").contains("needs the owner role")
    });
    let r = w.api("GET", "/v1/users/sneaky", None);
    assert_eq!(r.status, 404, "{}", r.text());
}

/// The number of audit rows on the page whose actor is `actor` and whose record holds `text`.
fn audit_rows(b: &Browser, actor: &str, text: &str) -> (u64, u64) {
    let script = format!(
        "var rows = Array.from(document.querySelectorAll('#audit-table tr[data-kind]'));\
         var mine = rows.filter(function (r) {{ return r.querySelector('td.actor').textContent === {actor}; }});\
         return [rows.length, mine.filter(function (r) {{ return r.textContent.indexOf({text}) >= 0; }}).length];",
        actor = json!(actor),
        text = json!(text),
    );
    let v = b.execute(&script);
    (v[0].as_u64().unwrap_or(0), v[1].as_u64().unwrap_or(0))
}

/// A scale of the demo app answered 200, as its audit record says it (each change is recorded
/// `pending` first, then with its status).
const SCALED: &str = r#""route":"/v1/apps/{name}/scale","target":"demo","outcome":"200""#;

#[test]
fn the_audit_page_finds_a_change_by_its_actor_and_tails_new_ones_live() {
    let w = Warden::demo(BIN);
    add_operator(&w, "oona", "oona-password-1", json!([{"role": "owner"}]));
    let login = request(
        "POST",
        &format!("{}/v1/login", w.api),
        &[("content-type", "application/json")],
        json!({"name": "oona", "password": "oona-password-1"})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(login.status, 200, "{}", login.text());
    let token = login.json()["token"].as_str().unwrap().to_owned();
    let scale = |n: u32| {
        let r = request(
            "POST",
            &format!("{}/v1/apps/demo/scale", w.api),
            &[
                ("authorization", &format!("Bearer {token}")),
                ("content-type", "application/json"),
            ],
            json!({"desired": {"SECRET": n}}).to_string().as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", r.text());
    };
    scale(1);

    let b = Browser::start();
    browser_sign_in(&b, &w, "oona", "oona-password-1");
    b.goto(&format!("{}/ui/audit", w.api));
    b.type_into(&b.find("form#search input[name=actor]"), "operator:oona");
    b.type_into(&b.find("form#search input[name=kind]"), "change");
    b.click(&b.find("form#search button[type=submit]"));
    b.wait_for("oona's scale", Duration::from_secs(30), |b| {
        audit_rows(b, "operator:oona", SCALED).1 == 1
    });
    // Only hers: the admin token's changes (the operator it made) are not among them.
    let rows = b.execute("return Array.from(document.querySelectorAll('#audit-table td.actor')).map(function (c) { return c.textContent; });");
    let actors: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    assert!(
        !actors.is_empty() && actors.iter().all(|a| *a == "operator:oona"),
        "{actors:?}"
    );
    assert!(w
        .api("GET", "/v1/audit?kind=change", None)
        .text()
        .contains("admin token"));

    // A new change appears on the open page by itself (the mark a reload would wipe survives),
    // under the same search.
    b.execute("window.wardenMark = 'kept'; return null;");
    scale(2);
    b.wait_for("the new change, live", Duration::from_secs(30), |b| {
        audit_rows(b, "operator:oona", SCALED).1 == 2
    });
    assert_eq!(b.execute("return window.wardenMark;"), json!("kept"));
    assert!(b.url().contains("actor=operator"), "{}", b.url());
}

#[test]
fn the_metrics_page_charts_an_apps_requests_and_latency_live() {
    let w = Warden::demo(BIN);
    let r = w.api(
        "POST",
        "/v1/apps/demo/scale",
        Some(json!({"desired": {"SECRET": 1}})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    add_operator(&w, "vee", "vee-password-1", json!([{"role": "viewer"}]));
    let pw = w.password("alice");
    warden_test_support::wait_until(
        "the demo app serving alice",
        Duration::from_secs(60),
        || (w.get_as("alice", &pw, "/apps/demo/").status == 200).then_some(()),
    );
    let b = Browser::start();
    browser_sign_in(&b, &w, "vee", "vee-password-1");
    b.goto(&format!("{}/ui/metrics", w.api));
    b.execute("window.wardenMark = 'kept'; return null;");
    // Traffic while the page is open, bounded in count and time.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let traffic = {
        let (gateway, stop) = (w.gateway.clone(), stop.clone());
        let auth = warden_test_support::http::basic("alice", &pw);
        std::thread::spawn(move || {
            let end = std::time::Instant::now() + Duration::from_secs(60);
            for _ in 0..3000 {
                if stop.load(std::sync::atomic::Ordering::Relaxed)
                    || std::time::Instant::now() > end
                {
                    break;
                }
                request(
                    "GET",
                    &format!("{gateway}/apps/demo/"),
                    &[("authorization", &auth)],
                    b"",
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let row = "#metrics-table tr[data-app='demo']";
    let num = |b: &Browser, sel: &str| {
        cell(b, &format!("{row} {sel}"))
            .parse::<f64>()
            .unwrap_or(0.0)
    };
    b.wait_for(
        "demo's requests and latency, live",
        Duration::from_secs(40),
        |b| num(b, "td.rps") > 0.0 && num(b, "td.latency") > 0.0,
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    traffic.join().unwrap();
    assert_eq!(b.execute("return window.wardenMark;"), json!("kept"));
    let charts = b.execute(&format!(
        "return document.querySelectorAll(\"{row} svg polyline\").length;"
    ));
    assert_eq!(charts, json!(3));
}
