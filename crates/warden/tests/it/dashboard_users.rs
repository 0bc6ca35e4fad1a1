//! The dashboard's sessions after review, its users page and its audit page (issue 37), against
//! the real binary: the cookie holds a session id (no API token), CSRF fields are bound to the
//! session, event streams are bounded per principal and end with their session, cookies are
//! `Secure` behind a TLS proxy the operator names; users created, changed and signed out from
//! the page (headless Chromium), as the users API does it; the audit trail searched.

use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};
use warden_test_support::{request, Launch, Response, Warden};

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
