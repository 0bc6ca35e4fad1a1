//! The operators' dashboard at the API's `/ui/` (issue 37, first slice), in headless Chromium
//! and over plain HTTP: signing in as an operator or with the admin token, the overview and an
//! app page showing what the API says, scaling from the page and the count changing live, a
//! viewer refused, hostile text inert, forms without their CSRF token refused, signing out.

use std::time::Duration;

use serde_json::{json, Value};
use warden_test_support::browser::Browser;
use warden_test_support::{request, Response, Warden};

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

fn scale(w: &Warden, app: &str, desired: Value) {
    let r = w.api(
        "POST",
        &format!("/v1/apps/{app}/scale"),
        Some(json!({ "desired": desired })),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

fn desired(w: &Warden, app: &str, label: &str) -> Value {
    w.api("GET", &format!("/v1/apps/{app}"), None).json()["desired"][label].clone()
}

fn sign_in(b: &Browser, name: &str, password: &str) {
    b.type_into(&b.find("form#password input[name=name]"), name);
    b.type_into(&b.find("form#password input[name=password]"), password);
    b.click(&b.find("form#password button[type=submit]"));
}

fn sign_out(b: &Browser) {
    b.click(&b.find("form[action='/ui/logout'] button[type=submit]"));
    b.wait_for("the sign-in page", Duration::from_secs(30), |b| {
        b.url().ends_with("/ui/login")
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

#[test]
fn an_operator_signs_in_sees_the_labels_scales_them_live_and_signs_out() {
    let w = Warden::demo(BIN);
    scale(&w, "demo", json!({"SECRET": 1}));
    add_operator(
        &w,
        "dee",
        "dee-password-1",
        json!([{"role": "deployer", "apps": ["demo"]}]),
    );
    let b = Browser::start();

    // Not signed in: the sign-in page. A wrong password: the page again, saying so (the API's
    // own refusal), and no session.
    b.goto(&format!("{}/ui/", w.api));
    assert!(b.url().ends_with("/ui/login"), "{}", b.url());
    sign_in(&b, "dee", "not her password");
    b.wait_for("the refusal", Duration::from_secs(30), |b| {
        cell(b, "p.message").contains("wrong operator name or password")
    });
    assert!(!b.cookies().iter().any(|c| c["name"] == "warden_ui"));

    // The right one: the overview, with the session in a strict, script-proof cookie.
    sign_in(&b, "dee", "dee-password-1");
    b.wait_for("the overview", Duration::from_secs(30), |b| {
        b.url().ends_with("/ui/")
    });
    let cookies = b.cookies();
    let session = cookies
        .iter()
        .find(|c| c["name"] == "warden_ui")
        .unwrap_or_else(|| panic!("no session cookie: {cookies:?}"));
    assert_eq!(
        (&session["httpOnly"], &session["sameSite"], &session["path"]),
        (&json!(true), &json!("Strict"), &json!("/ui"))
    );
    // It holds a session id, no token of the API; the session's token is dee's, kept by hash.
    let id = session["value"].as_str().unwrap().to_owned();
    let bearer = request(
        "GET",
        &format!("{}/v1/status", w.api),
        &[("authorization", &format!("Bearer {id}"))],
        b"",
    );
    assert_eq!(bearer.status, 401, "{}", bearer.text());
    let dee_tokens = |w: &Warden| {
        let all = w.api("GET", "/v1/tokens", None).json();
        let all = all.as_array().cloned().unwrap_or_default();
        all.iter().filter(|t| t["operator"] == "dee").count()
    };
    assert_eq!(dee_tokens(&w), 1);

    // The demo app's label, desired against ready, as `GET /v1/status` has them.
    let row = "#apps-table tr[data-app='demo'][data-label='SECRET']";
    assert_eq!(cell(&b, &format!("{row} td.desired")), "1");
    b.wait_for(
        "SECRET ready on the overview",
        Duration::from_secs(60),
        |b| cell(b, &format!("{row} td.ready")) == "1",
    );

    // Scale from the app page; the count changes on the page without a reload (the mark a
    // reload would wipe survives).
    b.goto(&format!("{}/ui/apps/demo", w.api));
    b.execute("window.wardenMark = 'kept'; return null;");
    b.type_into(&b.find("form#scale input[name=label]"), "SECRET");
    b.type_into(&b.find("form#scale input[name=count]"), "2");
    b.click(&b.find("form#scale button[type=submit]"));
    let ready = "#labels-table tr[data-label='SECRET'] td.ready";
    b.wait_for(
        "two SECRET instances ready, live",
        Duration::from_secs(60),
        |b| cell(b, ready) == "2",
    );
    assert_eq!(desired(&w, "demo", "SECRET"), json!(2));
    assert_eq!(b.execute("return window.wardenMark;"), json!("kept"));
    assert!(b.url().ends_with("/ui/apps/demo"), "{}", b.url());
    // The change names its operator in the audit trail, as any API call does.
    let audit = w.api("GET", "/v1/audit?kind=change", None).text();
    assert!(audit.contains("operator:dee"), "{audit}");

    // Signing out ends the session token itself, not only the cookie.
    sign_out(&b);
    assert_eq!(dee_tokens(&w), 0);
    b.goto(&format!("{}/ui/apps/demo", w.api));
    assert!(b.url().ends_with("/ui/login"), "{}", b.url());
}

#[test]
fn a_viewer_cannot_scale_and_hostile_text_is_shown_as_text() {
    let w = Warden::demo(BIN);
    let r = w.api(
        "POST",
        "/v1/apps",
        Some(json!({
            "name": "hostile",
            "command": ["/bin/sh", "-c", "echo '<img src=x id=injected>'; exit 3"],
            "desired": { "SECRET": 1 },
            "env": { "NOTE": "<script id=injected>document.title='pwned'</script>" },
        })),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    w.wait_crash_loop("hostile");
    add_operator(&w, "vee", "vee-password-1", json!([{"role": "viewer"}]));
    let b = Browser::start();

    // With the admin token: the config value and the crash's last line, both as text.
    b.goto(&format!("{}/ui/login", w.api));
    b.type_into(&b.find("form#token input[name=token]"), &w.token);
    b.click(&b.find("form#token button[type=submit]"));
    b.wait_for("the overview", Duration::from_secs(30), |b| {
        b.url().ends_with("/ui/")
    });
    b.goto(&format!("{}/ui/apps/hostile", w.api));
    let text = b.text();
    assert!(
        text.contains("<script id=injected>document.title='pwned'</script>")
            && text.contains("<img src=x id=injected>"),
        "{text}"
    );
    assert!(b.try_find("#injected").is_none(), "{}", b.source());
    assert_ne!(b.execute("return document.title;"), json!("pwned"));
    sign_out(&b);

    // A viewer: the value hidden, and a scale from the page refused with the API's words.
    sign_in(&b, "vee", "vee-password-1");
    b.wait_for("the overview", Duration::from_secs(30), |b| {
        b.url().ends_with("/ui/")
    });
    b.goto(&format!("{}/ui/apps/hostile", w.api));
    let text = b.text();
    assert!(
        !text.contains("pwned") && text.contains("(hidden"),
        "{text}"
    );
    b.type_into(&b.find("form#scale input[name=label]"), "SECRET");
    b.type_into(&b.find("form#scale input[name=count]"), "0");
    b.click(&b.find("form#scale button[type=submit]"));
    b.wait_for("the refusal", Duration::from_secs(30), |b| {
        cell(b, "#message").contains("needs the deployer role of app \"hostile\"")
    });
    assert_eq!(desired(&w, "hostile", "SECRET"), json!(1));
}

/// The value of cookie `name` a response sets.
fn set_cookie(r: &Response, name: &str) -> Option<String> {
    r.headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("set-cookie"))
        .find_map(|(_, v)| v.strip_prefix(&format!("{name}=")))
        .map(|v| v.split(';').next().unwrap_or("").to_owned())
        .filter(|v| !v.is_empty())
}

/// The CSRF field of a page.
fn field(page: &str) -> String {
    let at = page.find("name=\"csrf\" value=\"").expect("a CSRF field") + 19;
    page[at..at + 64].to_owned()
}

#[test]
fn forms_without_their_csrf_token_or_from_another_site_are_refused() {
    let w = Warden::demo(BIN);
    scale(&w, "demo", json!({"SECRET": 1}));
    add_operator(&w, "oona", "oona-password-1", json!([{"role": "owner"}]));
    let url = |p: &str| format!("{}{p}", w.api);
    let page = request("GET", &url("/ui/login"), &[], b"");
    assert_eq!(page.status, 200);
    let csrf = set_cookie(&page, "warden_ui_csrf").expect("a CSRF cookie");
    let f = field(&page.text());
    let cookie = format!("warden_ui_csrf={csrf}");
    let post = |path: &str, body: &str, origin: Option<&str>| {
        let mut h = vec![
            ("content-type", "application/x-www-form-urlencoded"),
            ("cookie", cookie.as_str()),
        ];
        if let Some(o) = origin {
            h.push(("origin", o));
        }
        request("POST", &url(path), &h, body.as_bytes())
    };
    let creds = "name=oona&password=oona-password-1";
    // No field, a field for another cookie, a foreign origin: refused, no session.
    for (body, origin) in [
        (creds.to_owned(), None),
        (format!("{creds}&csrf={}", "0".repeat(64)), None),
        (format!("{creds}&csrf={f}"), Some("http://evil.example")),
    ] {
        let r = post("/ui/login", &body, origin);
        assert_eq!(r.status, 403, "{body} {origin:?}: {}", r.text());
        assert_eq!(set_cookie(&r, "warden_ui"), None);
    }
    let r = post("/ui/login", &format!("{creds}&csrf={f}"), None);
    assert_eq!(r.status, 303, "{}", r.text());
    let session = set_cookie(&r, "warden_ui").expect("a session");

    // Signed in: a scale without its field is refused and changes nothing; with the field of
    // a signed-in page (bound to the session), it scales.
    let both = format!("warden_ui_csrf={csrf}; warden_ui={session}");
    let f = field(&request("GET", &url("/ui/"), &[("cookie", both.as_str())], b"").text());
    let scale_form = |body: &str| {
        request(
            "POST",
            &url("/ui/apps/demo/scale"),
            &[
                ("content-type", "application/x-www-form-urlencoded"),
                ("cookie", both.as_str()),
            ],
            body.as_bytes(),
        )
    };
    let r = scale_form("label=SECRET&count=3");
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(desired(&w, "demo", "SECRET"), json!(1));
    let r = scale_form(&format!("label=SECRET&count=3&csrf={f}"));
    assert_eq!(r.status, 303, "{}", r.text());
    assert_eq!(desired(&w, "demo", "SECRET"), json!(3));

    // The overview's headers: no inline script, no framing, no caching.
    let r = request("GET", &url("/ui/"), &[("cookie", both.as_str())], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let csp = r.header("content-security-policy").unwrap_or("");
    for part in [
        "default-src 'none'",
        "script-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
        "form-action 'self'",
    ] {
        assert!(csp.contains(part), "{csp}");
    }
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(r.header("cache-control"), Some("no-store"));
    assert_eq!(r.header("x-frame-options"), Some("DENY"));
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    let body = r.text();
    assert_eq!(body.matches("<script").count(), 1, "{body}");
    assert!(body.contains("<script src=\"/ui/live.js\" defer></script>"));
}
