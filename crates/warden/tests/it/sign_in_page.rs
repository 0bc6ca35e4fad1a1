//! People sign in on the gateway's page (issue 36): browsers sent to it, the page and its
//! headers, the form with its CSRF token and `next`, who am I, sign-out, error pages for
//! browsers and JSON for programs, and password sign-in turned off.

use serde_json::json;
use warden_test_support::http::{basic, h2c_get, Response};
use warden_test_support::{request, Launch, Warden};

use crate::BIN;

const HTML: &str = "text/html,application/xhtml+xml,*/*;q=0.8";

/// Every byte but letters and digits percent-encoded, as a browser encodes a form field.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b.is_ascii_alphanumeric() {
            true => (b as char).to_string(),
            false => format!("%{b:02X}"),
        })
        .collect()
}

/// The value of cookie `name` that a response sets.
fn set_cookie(r: &Response, name: &str) -> Option<String> {
    r.headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("set-cookie"))
        .find_map(|(_, v)| v.strip_prefix(&format!("{name}=")).map(str::to_owned))
}

/// A browser's sign-in page visit: the page, its CSRF cookie and the form's CSRF field.
struct Visit {
    page: Response,
    cookie: String,
    field: String,
}

fn visit(w: &Warden, query: &str) -> Visit {
    let page = request(
        "GET",
        &format!("{}/login{query}", w.gateway),
        &[("accept", HTML)],
        b"",
    );
    assert_eq!(page.status, 200, "{}", page.text());
    let cookie = set_cookie(&page, "warden_csrf")
        .expect("a CSRF cookie")
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    // None when the page has no form (password sign-in off).
    let field = hidden(&page.text(), "csrf").unwrap_or_default();
    Visit {
        page,
        cookie,
        field,
    }
}

/// The value of the hidden field `name` of a page.
fn hidden(page: &str, name: &str) -> Option<String> {
    let at = page.find(&format!("name=\"{name}\" value=\""))? + name.len() + 15;
    Some(page[at..].split('"').next()?.to_owned())
}

/// A form POST to `path` with `fields`, the CSRF cookie `csrf` if any, and more headers.
fn post_form(
    w: &Warden,
    path: &str,
    fields: &[(&str, &str)],
    cookies: &str,
    extra: &[(&str, &str)],
) -> Response {
    let body: Vec<String> = fields
        .iter()
        .map(|(n, v)| format!("{}={}", enc(n), enc(v)))
        .collect();
    let mut headers = vec![
        ("content-type", "application/x-www-form-urlencoded"),
        ("accept", HTML),
    ];
    if !cookies.is_empty() {
        headers.push(("cookie", cookies));
    }
    headers.extend_from_slice(extra);
    request(
        "POST",
        &format!("{}{path}", w.gateway),
        &headers,
        body.join("&").as_bytes(),
    )
}

/// Signs `user` in with the form, returning to `next`; the answer and the session cookie.
fn sign_in(w: &Warden, user: &str, next: &str) -> (Response, String) {
    let v = visit(w, "");
    let pw = w.password(user);
    let r = post_form(
        w,
        "/login",
        &[
            ("name", user),
            ("password", &pw),
            ("csrf", &v.field),
            ("next", next),
        ],
        &format!("warden_csrf={}", v.cookie),
        &[],
    );
    let session = set_cookie(&r, "warden_session").unwrap_or_default();
    (r, session)
}

fn get(w: &Warden, path: &str, headers: &[(&str, &str)]) -> Response {
    request("GET", &format!("{}{path}", w.gateway), headers, b"")
}

#[test]
fn a_browser_is_sent_to_sign_in_and_a_program_gets_401() {
    let w = Warden::demo(BIN);
    let want = "/login?next=/apps/demo/x%3Fy%3D1";
    // On the lane, and through hyper (HTTP/2), the same answer.
    let lane = get(&w, "/apps/demo/x?y=1", &[("accept", HTML)]);
    assert_eq!((lane.status, lane.header("location")), (303, Some(want)));
    let head = request(
        "HEAD",
        &format!("{}/apps/demo/x?y=1", w.gateway),
        &[("accept", HTML)],
        b"",
    );
    assert_eq!((head.status, head.header("location")), (303, Some(want)));
    let (_, h2) = h2c_get(
        &format!("{}/apps/demo/x?y=1", w.gateway),
        &[("accept", HTML)],
    );
    assert_eq!((h2.status, h2.header("location")), (303, Some(want)));
    // Both downstreams count what they answered.
    let counted = crate::metric(
        &w,
        "warden_gateway_requests_total{app=\"demo\",status=\"303\"}",
    );
    assert_eq!(counted, 3.0);
    // Programs: 401 and the Basic challenge, as before.
    for accept in [None, Some("application/json"), Some("*/*")] {
        let headers: Vec<(&str, &str)> = accept.map(|a| ("accept", a)).into_iter().collect();
        let r = get(&w, "/apps/demo/x", &headers);
        assert_eq!(r.status, 401, "{accept:?}");
        assert!(r.header("www-authenticate").unwrap().starts_with("Basic"));
        assert!(r.json()["error"].is_string());
    }
    // A form sent without a session: a page that says to sign in, never a redirect that
    // would drop what was typed, nor the bare Basic prompt.
    let post = request(
        "POST",
        &format!("{}/apps/demo/x", w.gateway),
        &[
            ("accept", HTML),
            ("content-type", "application/x-www-form-urlencoded"),
        ],
        b"note=hello",
    );
    assert_eq!(post.status, 401);
    assert_eq!(post.header("location"), None);
    assert!(!post
        .header("www-authenticate")
        .unwrap()
        .starts_with("Basic"));
    assert!(post
        .header("content-type")
        .unwrap()
        .starts_with("text/html"));
    assert!(
        post.text().contains("/login?next=/apps/demo/x"),
        "{}",
        post.text()
    );
    // An app on a host of its own owns /login there: the browser's prompt, on a readable page.
    w.create_demo_app(
        &crate::app_bin(),
        "hosted",
        json!({ "hosts": ["hosted.localhost"] }),
    );
    let hosted = get(&w, "/x", &[("host", "hosted.localhost"), ("accept", HTML)]);
    assert_eq!((hosted.status, hosted.header("location")), (401, None));
    assert!(hosted
        .header("www-authenticate")
        .unwrap()
        .starts_with("Basic"));
    assert!(hosted
        .header("content-type")
        .unwrap()
        .starts_with("text/html"));
}

#[test]
fn the_sign_in_page_has_its_headers_and_escapes_what_it_shows() {
    let w = Warden::demo(BIN);
    let next = "/apps/demo/<script>alert(1)</script>";
    let v = visit(&w, &format!("?next={}", enc(next)));
    let p = &v.page;
    assert_eq!(p.header("content-type"), Some("text/html; charset=utf-8"));
    let csp = p.header("content-security-policy").unwrap();
    assert!(csp.starts_with("default-src 'none';"), "{csp}");
    assert!(csp.contains("frame-ancestors 'none'") && csp.contains("form-action 'self'"));
    assert!(
        !csp.contains("script-src") && !csp.contains("unsafe"),
        "{csp}"
    );
    assert_eq!(p.header("x-frame-options"), Some("DENY"));
    assert_eq!(p.header("cache-control"), Some("no-store"));
    assert_eq!(p.header("referrer-policy"), Some("same-origin"));
    let set = p.header("set-cookie").unwrap();
    assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict") && set.contains("Path=/"));
    let text = p.text();
    for field in ["name=\"name\"", "name=\"password\"", "type=\"submit\""] {
        assert!(text.contains(field), "{field} in {text}");
    }
    assert!(
        !text.contains("<script"),
        "markup from next in the page: {text}"
    );
    assert_eq!(
        hidden(&text, "next").as_deref(),
        Some("/apps/demo/&lt;script&gt;alert(1)&lt;/script&gt;")
    );
    // An error page escapes the path it names too.
    let r = get(&w, "/nowhere/%3Cscript%3E", &[("accept", HTML)]);
    assert_eq!(r.status, 404);
    assert!(!r.text().contains("<script"), "{}", r.text());
}

#[test]
fn the_form_signs_in_and_returns_to_next() {
    let w = Warden::demo(BIN);
    let (r, session) = sign_in(&w, "bob", "/apps/demo/?from=form");
    assert_eq!(r.status, 303, "{}", r.text());
    assert_eq!(r.header("location"), Some("/apps/demo/?from=form"));
    assert!(
        session.contains("HttpOnly") && session.contains("SameSite=Lax"),
        "{session}"
    );
    let token = session.split(';').next().unwrap();
    let app = get(
        &w,
        "/apps/demo/",
        &[("cookie", &format!("warden_session={token}"))],
    );
    assert_eq!(
        (app.status, app.json()["user"].as_str()),
        (200, Some("bob"))
    );
    // Programs still sign in with JSON and Basic.
    let j = request(
        "POST",
        &format!("{}/login", w.gateway),
        &[("content-type", "application/json")],
        json!({"name": "bob", "password": w.password("bob")})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(j.status, 200, "{}", j.text());
    assert!(j.json()["token"].is_string());
}

#[test]
fn a_wrong_password_shows_the_page_again_and_is_throttled() {
    let w = Launch::new(BIN)
        .arg("--auth-failures-per-addr-user")
        .arg("3")
        .start();
    let v = visit(&w, "");
    let cookie = format!("warden_csrf={}", v.cookie);
    let attempt = |pw: &str| {
        post_form(
            &w,
            "/login",
            &[
                ("name", "alice"),
                ("password", pw),
                ("csrf", &v.field),
                ("next", "/apps/demo/"),
            ],
            &cookie,
            &[],
        )
    };
    for i in 0..3 {
        let r = attempt(&format!("wrong-{i}"));
        assert_eq!(r.status, 401, "{}", r.text());
        assert!(r.text().contains("Wrong name or password."), "{}", r.text());
        assert_eq!(hidden(&r.text(), "next").as_deref(), Some("/apps/demo/"));
        assert_eq!(set_cookie(&r, "warden_session"), None);
    }
    let r = attempt("wrong-again");
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(r.header("retry-after").unwrap().parse::<u64>().unwrap() >= 1);
    assert!(
        r.text().contains("Too many failed sign-ins"),
        "{}",
        r.text()
    );
    // Throttled like every sign-in: the right password waits too.
    assert_eq!(attempt(&w.password("alice")).status, 429);
}

#[test]
fn forms_without_their_token_or_from_another_site_are_refused() {
    let w = Warden::demo(BIN);
    let v = visit(&w, "");
    let other = visit(&w, "");
    let pw = w.password("bob");
    let cookie = format!("warden_csrf={}", v.cookie);
    let host = w.gateway.trim_start_matches("http://").to_owned();
    let own = format!("http://{host}");
    let cases: [(&str, &str, &str, &str); 5] = [
        ("no cookie", "", &v.field, ""),
        ("no field", &cookie, "", ""),
        ("another cookie's field", &cookie, &other.field, ""),
        ("another site", &cookie, &v.field, "http://evil.example"),
        ("an opaque origin", &cookie, &v.field, "null"),
    ];
    for (what, cookies, field, origin) in cases {
        let mut fields = vec![("name", "bob"), ("password", pw.as_str())];
        if !field.is_empty() {
            fields.push(("csrf", field));
        }
        let extra: Vec<(&str, &str)> = match origin {
            "" => vec![],
            o => vec![("origin", o)],
        };
        let r = post_form(&w, "/login", &fields, cookies, &extra);
        assert_eq!(r.status, 403, "{what}: {}", r.text());
        assert!(
            r.text().contains("reload the sign-in page"),
            "{what}: {}",
            r.text()
        );
        assert_eq!(set_cookie(&r, "warden_session"), None, "{what}");
    }
    // A page of another site can POST text/plain that reads as JSON, or JSON from its own
    // origin: neither signs anyone in.
    let body = json!({"name": "bob", "password": pw}).to_string();
    for (kind, origin) in [
        ("text/plain", None),
        ("application/json", Some("http://evil.example")),
    ] {
        let mut headers = vec![("content-type", kind)];
        headers.extend(origin.map(|o| ("origin", o)));
        let r = request(
            "POST",
            &format!("{}/login", w.gateway),
            &headers,
            body.as_bytes(),
        );
        assert!(
            matches!(r.status, 400 | 403),
            "{kind}: {} {}",
            r.status,
            r.text()
        );
        assert_eq!(set_cookie(&r, "warden_session"), None, "{kind}");
    }
    // The same form from this gateway's own origin goes through.
    let ok = post_form(
        &w,
        "/login",
        &[("name", "bob"), ("password", &pw), ("csrf", &v.field)],
        &cookie,
        &[("origin", &own)],
    );
    assert_eq!(ok.status, 303, "{}", ok.text());
    let session = set_cookie(&ok, "warden_session").unwrap();
    let token = session.split(';').next().unwrap();
    // Sign-out is a form too: without its token it ends nothing.
    let both = format!("{cookie}; warden_session={token}");
    let r = post_form(&w, "/logout", &[], &both, &[]);
    assert_eq!(r.status, 403, "{}", r.text());
    let r = post_form(
        &w,
        "/logout",
        &[("csrf", &v.field)],
        &both,
        &[("origin", "http://evil.example")],
    );
    assert_eq!(r.status, 403, "{}", r.text());
    let app = get(
        &w,
        "/apps/demo/",
        &[("cookie", &format!("warden_session={token}"))],
    );
    assert_eq!(app.status, 200, "the session lives on");
}

#[test]
fn open_redirect_attempts_land_on_whoami() {
    let w = Warden::demo(BIN);
    for next in [
        "//evil.example",
        "/\\evil.example",
        "https://evil.example",
        "/%2F%2Fevil.example",
        "/\tevil.example",
        "/apps/demo/\t/",
    ] {
        let (r, _) = sign_in(&w, "bob", next);
        assert_eq!(r.status, 303, "{next:?}: {}", r.text());
        assert_eq!(r.header("location"), Some("/whoami"), "{next:?}");
        let v = visit(&w, &format!("?next={}", enc(next)));
        assert_eq!(
            hidden(&v.page.text(), "next").as_deref(),
            Some("/whoami"),
            "{next:?}"
        );
    }
}

#[test]
fn whoami_shows_the_clearance_and_signing_out_ends_the_session() {
    let w = Warden::demo(BIN);
    // Not signed in: a browser is sent to sign in, a program gets 401.
    let r = get(&w, "/whoami", &[("accept", HTML)]);
    assert_eq!(
        (r.status, r.header("location")),
        (303, Some("/login?next=/whoami"))
    );
    assert_eq!(
        get(&w, "/whoami", &[("accept", "application/json")]).status,
        401
    );

    let (_, session) = sign_in(&w, "carol", "/whoami");
    let token = session.split(';').next().unwrap().to_owned();
    let session_cookie = format!("warden_session={token}");
    let page = get(
        &w,
        "/whoami",
        &[("accept", HTML), ("cookie", &session_cookie)],
    );
    assert_eq!(page.status, 200, "{}", page.text());
    let text = page.text();
    assert!(text.contains("<dd id=\"user\">carol</dd>"), "{text}");
    assert!(
        text.contains("<dd id=\"clearance\">TOP SECRET</dd>"),
        "{text}"
    );
    assert!(text.contains("admin, staff"), "{text}");
    let json = get(
        &w,
        "/whoami",
        &[("accept", "application/json"), ("cookie", &session_cookie)],
    )
    .json();
    assert_eq!(
        json,
        json!({"user": "carol", "clearance": "TOP SECRET", "groups": ["admin", "staff"]})
    );

    // The page's sign-out form, with the page's own CSRF cookie and field.
    let csrf = set_cookie(&page, "warden_csrf").unwrap();
    let csrf = csrf.split(';').next().unwrap();
    let field = hidden(&text, "csrf").unwrap();
    let out = post_form(
        &w,
        "/logout",
        &[("csrf", &field)],
        &format!("warden_csrf={csrf}; {session_cookie}"),
        &[],
    );
    assert_eq!((out.status, out.header("location")), (303, Some("/login")));
    assert!(set_cookie(&out, "warden_session")
        .unwrap()
        .contains("Max-Age=0"));
    let after = get(&w, "/apps/demo/", &[("cookie", &session_cookie)]);
    assert_eq!(after.status, 401, "the session is over");
}

#[test]
fn errors_are_pages_for_browsers_and_json_for_programs() {
    let w = Warden::demo(BIN);
    w.create_demo_app(&crate::app_bin(), "admins", json!({ "groups": ["admin"] }));
    let dave = basic("dave", &w.password("dave"));
    for (path, status, says) in [
        ("/nowhere", 404, "nothing is served at /nowhere"),
        (
            "/apps/admins/",
            403,
            "a group allowed to use app &quot;admins&quot; (it admits members of: admin)",
        ),
    ] {
        let page = get(&w, path, &[("accept", HTML), ("authorization", &dave)]);
        assert_eq!(page.status, status, "{}", page.text());
        assert_eq!(
            page.header("content-type"),
            Some("text/html; charset=utf-8")
        );
        assert_eq!(page.header("x-frame-options"), Some("DENY"));
        assert!(page.text().contains("<!DOCTYPE html>"));
        assert!(page.text().contains(says), "{}", page.text());
        let program = get(
            &w,
            path,
            &[("accept", "application/json"), ("authorization", &dave)],
        );
        assert_eq!(program.status, status);
        let error = program.json()["error"].as_str().unwrap().to_owned();
        assert!(error.contains(&says.replace("&quot;", "\"")), "{error}");
    }
    // A throttled browser reads why, with Retry-After.
    for i in 0..12 {
        get(
            &w,
            "/apps/demo/",
            &[("authorization", &basic("bob", &format!("guess-{i}")))],
        );
    }
    let page = get(
        &w,
        "/apps/demo/",
        &[("accept", HTML), ("authorization", &basic("bob", "x"))],
    );
    assert_eq!(page.status, 429);
    assert!(page.header("retry-after").is_some());
    assert!(
        page.text().contains("too many failed sign-ins"),
        "{}",
        page.text()
    );
}

#[test]
fn password_sign_in_can_be_turned_off() {
    let w = Launch::new(BIN).arg("--no-password-sign-in").start();
    let pw = w.password("bob");
    let by_basic = w.get_as("bob", &pw, "/apps/demo/");
    assert_eq!(by_basic.status, 403, "{}", by_basic.text());
    assert!(by_basic.json()["error"]
        .as_str()
        .unwrap()
        .contains("password sign-in is turned off"));
    let by_json = request(
        "POST",
        &format!("{}/login", w.gateway),
        &[("content-type", "application/json")],
        json!({"name": "bob", "password": pw})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(by_json.status, 403, "{}", by_json.text());
    let v = visit(&w, "");
    let text = v.page.text();
    assert!(!text.contains("name=\"password\""), "{text}");
    assert!(text.contains("Password sign-in is turned off"), "{text}");
    let by_form = post_form(
        &w,
        "/login",
        &[("name", "bob"), ("password", &pw), ("csrf", &v.field)],
        &format!("warden_csrf={}", v.cookie),
        &[],
    );
    assert_eq!(by_form.status, 403, "{}", by_form.text());
    assert!(
        by_form.text().contains("Password sign-in is turned off"),
        "{}",
        by_form.text()
    );
    assert_eq!(set_cookie(&by_form, "warden_session"), None);
}
