//! The dashboard's everyday actions (issue 37), in headless Chromium against the real binary:
//! a release pushed from the CLI seen on the app page without a reload, with its build output;
//! a rollback from the page, which `warden releases` agrees with, and a restart (fresh
//! instances, no release); a crash loop
//! with its last lines on the instances page, hostile lines inert; drain and undrain of a node
//! of a two-node cluster; and the actions refused without their CSRF field or to a viewer.

use std::time::Duration;

use serde_json::{json, Value};
use warden_test_support::browser::Browser;
use warden_test_support::etcd::EtcdCluster;
use warden_test_support::{request, Response, Warden};

use crate::BIN;

/// Signs `b` in to `w`'s dashboard with the admin token.
fn sign_in_admin(b: &Browser, w: &Warden) {
    b.goto(&format!("{}/ui/login", w.api));
    b.type_into(&b.find("form#token input[name=token]"), &w.token);
    press(b, "form#token button[type=submit]");
    b.wait_for("the overview", Duration::from_secs(30), |b| {
        b.url().ends_with("/ui/")
    });
}

/// The text of the first element matching `selector`, read in one step (the live script may
/// replace the element between a find and a read); empty when there is none.
fn cell(b: &Browser, selector: &str) -> String {
    let script = format!(
        "var e = document.querySelector({}); return e ? e.textContent : '';",
        json!(selector)
    );
    b.execute(&script).as_str().unwrap_or_default().to_owned()
}

/// Clicks the first element matching `selector` in one step: the live script replaces the
/// live sections as the store changes, so a found element may be gone by the click.
fn press(b: &Browser, selector: &str) {
    let script = format!(
        "var e = document.querySelector({}); if (e) {{ e.click(); return true; }} return false;",
        json!(selector)
    );
    b.wait_for(
        &format!("{selector} to click"),
        Duration::from_secs(30),
        |b| b.execute(&script) == json!(true),
    );
}

fn serving(w: &Warden, app: &str) -> Value {
    w.api("GET", &format!("/v1/apps/{app}"), None).json()["release"]["number"].clone()
}

#[test]
fn a_push_shows_live_and_a_rollback_and_a_restart_from_the_page_serve() {
    let w = Warden::demo(BIN);
    let src = crate::deploy::fixture("plain");
    crate::deploy::push_ok(&w, "plain", src.path());
    // The log route's `?tail=BYTES`: the end of the same output, no more.
    let all = w.api("GET", "/v1/apps/plain/releases/1/log", None).text();
    let end = w
        .api("GET", "/v1/apps/plain/releases/1/log?tail=16", None)
        .text();
    assert!(all.len() > 16, "{all}");
    assert!(end.len() <= 16 && all.ends_with(&end), "{end:?} of {all:?}");
    let b = Browser::start();
    sign_in_admin(&b, &w);
    b.goto(&format!("{}/ui/apps/plain", w.api));
    assert_eq!(cell(&b, "tr[data-release='1'] td.status"), "released");
    b.execute("window.wardenMark = 'kept'; return null;");

    // A push from the CLI: its row, its status and its output come to the page by themselves.
    std::fs::write(src.path().join("second.txt"), "two").unwrap();
    crate::deploy::push_ok(&w, "plain", src.path());
    b.wait_for("release 2 released, live", Duration::from_secs(60), |b| {
        cell(b, "tr[data-release='2'] td.status") == "released"
    });
    b.wait_for("release 2's output, live", Duration::from_secs(30), |b| {
        cell(b, "#build p").starts_with("Release 2 (released)")
            && !cell(b, "#build-output").is_empty()
    });
    let by = cell(&b, "tr[data-release='2'] td.by");
    assert_eq!(by, "admin token");
    assert_eq!(b.execute("return window.wardenMark;"), json!("kept"));

    // A rollback to 1: asked to confirm, then a new release that runs release 1 serves.
    press(&b, "tr[data-release='1'] form.rollback button");
    b.wait_for("the confirmation", Duration::from_secs(30), |b| {
        b.try_find("form#confirm").is_some()
    });
    assert_eq!(
        serving(&w, "plain"),
        json!(2),
        "nothing before the confirmation"
    );
    press(&b, "form#confirm button[type=submit]");
    b.wait_for("release 3 serving", Duration::from_secs(60), |b| {
        b.url().ends_with("/ui/apps/plain")
            && cell(b, "tr[data-release='3'] td.status") == "released"
    });
    assert_eq!(serving(&w, "plain"), json!(3));
    let (ok, out, err) = crate::deploy::run(&w, &["releases", "plain"]);
    assert!(ok, "{err}");
    let three = out
        .lines()
        .find(|l| l.trim_start().starts_with('3'))
        .unwrap_or("");
    assert!(three.contains("rollback to 1"), "{out}");

    // A restart: fresh instances of release 3, and no new release.
    let ids = || -> Vec<String> {
        w.instances()
            .into_iter()
            .filter(|i| i["app"] == "plain")
            .map(|i| i["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let alice = w.get_as("alice", &w.password("alice"), "/apps/plain/");
    assert_eq!(alice.status, 200, "{}", alice.text());
    let before = ids();
    assert!(!before.is_empty());
    press(&b, "tr[data-release='3'] form.restart button");
    b.wait_for("the confirmation", Duration::from_secs(30), |b| {
        b.try_find("form#confirm").is_some()
    });
    press(&b, "form#confirm button[type=submit]");
    b.wait_for("the app page again", Duration::from_secs(30), |b| {
        b.url().ends_with("/ui/apps/plain")
    });
    warden_test_support::wait_until("fresh instances", Duration::from_secs(60), || {
        let now = ids();
        (!now.is_empty() && now.iter().all(|i| !before.contains(i))).then_some(())
    });
    assert_eq!(serving(&w, "plain"), json!(3));
    assert_eq!(crate::deploy::releases(&w, "plain").len(), 3);
    assert_eq!(cell(&b, "tr[data-release='4'] td.status"), "");
}

#[test]
fn a_crash_loop_shows_its_last_lines_as_inert_text() {
    let w = Warden::demo(BIN);
    let line = r#"printf '<script>alert(1)</script> <img src=x onerror=alert(2)> \033[31mRED\033[0m\n'; exit 3"#;
    let r = w.api(
        "POST",
        "/v1/apps",
        Some(json!({
            "name": "crashy",
            "command": ["/bin/sh", "-c", line],
            "desired": { "SECRET": 1 },
        })),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    w.wait_crash_loop("crashy");
    let b = Browser::start();
    sign_in_admin(&b, &w);
    b.goto(&format!("{}/ui/apps/crashy", w.api));
    press(&b, "#instances-link");
    b.wait_for("the crash loop", Duration::from_secs(30), |b| {
        cell(b, "#crashes-table tr.crash td.state") == "crash-looping"
    });
    let lines = cell(&b, "#crashes-table tr.crash-lines pre");
    assert!(
        lines.contains("<script>alert(1)</script> <img src=x onerror=alert(2)> RED"),
        "{lines:?}"
    );
    assert!(
        !lines.contains('\u{1b}') && !lines.contains("[31m"),
        "{lines:?}"
    );
    let markup = b.execute("return document.querySelectorAll('main img, main script').length;");
    assert_eq!(markup, json!(0), "{}", b.source());
    // No alert is open: one would make WebDriver refuse this.
    assert_eq!(
        b.execute("return document.title;"),
        json!("Instances of crashy · warden")
    );
}

#[test]
fn a_node_of_two_is_drained_and_undrained_from_the_page() {
    let cluster = EtcdCluster::start(1);
    let alpha = crate::cluster::demo_node(&cluster, "alpha", "gateway,agent,api");
    let _beta = crate::healing::agent(&cluster, &alpha, "beta", "127.0.0.2:0", &[]);
    let b = Browser::start();
    sign_in_admin(&b, &alpha);
    b.goto(&format!("{}/ui/nodes", alpha.api));
    let state = "#nodes-table tr[data-node='beta'] td.state";
    b.wait_for("beta listed", Duration::from_secs(30), |b| {
        cell(b, state) == "ready"
    });
    press(&b, "#nodes-table tr[data-node='beta'] form.drain button");
    b.wait_for("beta drained", Duration::from_secs(60), |b| {
        cell(b, state) == "drained"
    });
    let nodes = crate::cluster::nodes(&alpha);
    assert_eq!(nodes["beta"]["draining"], json!(true));
    assert_eq!(nodes["alpha"]["draining"], json!(false));
    press(&b, "#nodes-table tr[data-node='beta'] form.undrain button");
    b.wait_for("beta ready again", Duration::from_secs(60), |b| {
        cell(b, state) == "ready"
    });
    assert_eq!(
        crate::cluster::nodes(&alpha)["beta"]["draining"],
        json!(false)
    );
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

/// A signed-in form poster for operator `name`: (cookie header, CSRF field).
fn session(w: &Warden, name: &str, password: &str) -> (String, String) {
    let page = request("GET", &format!("{}/ui/login", w.api), &[], b"");
    let csrf = set_cookie(&page, "warden_ui_csrf").expect("a CSRF cookie");
    let f = field(&page.text());
    let r = request(
        "POST",
        &format!("{}/ui/login", w.api),
        &[
            ("content-type", "application/x-www-form-urlencoded"),
            ("cookie", &format!("warden_ui_csrf={csrf}")),
        ],
        format!("name={name}&password={password}&csrf={f}").as_bytes(),
    );
    assert_eq!(r.status, 303, "{}", r.text());
    let s = set_cookie(&r, "warden_ui").expect("a session");
    let cookie = format!("warden_ui_csrf={csrf}; warden_ui={s}");
    // The field is bound to the session: the sign-in page's is worth nothing after it.
    let page = request(
        "GET",
        &format!("{}/ui/", w.api),
        &[("cookie", &cookie)],
        b"",
    );
    assert_eq!(page.status, 200, "{}", page.text());
    let f = field(&page.text());
    (cookie, f)
}

#[test]
fn actions_without_their_csrf_field_or_by_a_viewer_are_refused() {
    let w = Warden::demo(BIN);
    for (name, role) in [("oona", "owner"), ("vee", "viewer")] {
        let r = w.api(
            "POST",
            "/v1/operators",
            Some(json!({"name": name, "password": format!("{name}-password-1"), "roles": [{"role": role}]})),
        );
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let post = |cookie: &str, path: &str, body: &str| {
        request(
            "POST",
            &format!("{}{path}", w.api),
            &[
                ("content-type", "application/x-www-form-urlencoded"),
                ("cookie", cookie),
            ],
            body.as_bytes(),
        )
    };
    let node = crate::cluster::nodes(&w).into_keys().next().unwrap();
    let drain = format!("/ui/nodes/{node}/drain");

    // The owner: without the field, refused before anything; with it, asked to confirm, and
    // once confirmed, the API's own refusal (the demo app has no release) on the page.
    let (owner, f) = session(&w, "oona", "oona-password-1");
    let r = post(&owner, "/ui/apps/demo/rollback", "to=1&confirm=yes");
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(
        r.text().contains("does not match its cookie"),
        "{}",
        r.text()
    );
    let r = post(&owner, &drain, "");
    assert_eq!(r.status, 403, "{}", r.text());
    let r = post(&owner, "/ui/apps/demo/rollback", &format!("to=1&csrf={f}"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r
        .text()
        .contains("form method=\"post\" action=\"/ui/apps/demo/rollback\" id=\"confirm\""));
    let r = post(
        &owner,
        "/ui/apps/demo/rollback",
        &format!("to=1&confirm=yes&csrf={f}"),
    );
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(r.text().contains("has no release 1"), "{}", r.text());
    // A confirm page left open: it says what served when shown, and once another release
    // serves (here: none does) the API refuses it, whatever it rolls back to.
    let r = post(
        &owner,
        "/ui/apps/demo/rollback",
        &format!("to=1&from=2&csrf={f}"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.text().contains("It now serves release 2."),
        "{}",
        r.text()
    );
    assert!(
        r.text().contains("name=\"from\" value=\"2\""),
        "{}",
        r.text()
    );
    let r = post(
        &owner,
        "/ui/apps/demo/rollback",
        &format!("to=1&from=2&confirm=yes&csrf={f}"),
    );
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.text().contains("now serves no release"), "{}", r.text());
    let r = w.api(
        "POST",
        "/v1/apps/demo/rollback",
        Some(json!({"to": 1, "expect": 2})),
    );
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(crate::cluster::nodes(&w)[&node]["draining"], json!(false));

    // A viewer: the pages, but no rollback, restart or drain (the API's 403, said on the page).
    let (viewer, f) = session(&w, "vee", "vee-password-1");
    for path in ["/ui/nodes", "/ui/apps/demo", "/ui/apps/demo/instances"] {
        let r = request(
            "GET",
            &format!("{}{path}", w.api),
            &[("cookie", &viewer)],
            b"",
        );
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    for path in ["/ui/apps/demo/rollback", "/ui/apps/demo/restart", &drain] {
        let r = post(&viewer, path, &format!("to=1&confirm=yes&csrf={f}"));
        assert_eq!(r.status, 403, "{path}: {}", r.text());
        assert!(r.text().contains("needs the"), "{path}: {}", r.text());
    }
    // A deployer of another app: no rollback or restart of this one.
    let r = w.api(
        "POST",
        "/v1/operators",
        Some(json!({"name": "dee", "password": "dee-password-1", "roles": [{"role": "deployer", "apps": ["other"]}]})),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let (dee, f) = session(&w, "dee", "dee-password-1");
    for path in ["/ui/apps/demo/rollback", "/ui/apps/demo/restart"] {
        let r = post(&dee, path, &format!("to=1&confirm=yes&csrf={f}"));
        assert_eq!(r.status, 403, "{path}: {}", r.text());
    }
    // Nor this app's pages: reading it is a viewer's or its deployers'.
    for path in ["/ui/apps/demo", "/ui/apps/demo/instances"] {
        let r = request("GET", &format!("{}{path}", w.api), &[("cookie", &dee)], b"");
        assert_eq!(r.status, 403, "{path}: {}", r.text());
    }
    assert_eq!(crate::cluster::nodes(&w)[&node]["draining"], json!(false));
    assert_eq!(serving(&w, "demo"), Value::Null);
    let r = w.api("GET", "/v1/nodes", None);
    assert!(!r.text().contains("\"draining\":true"), "{}", r.text());
}

/// The value of the field matching `selector`.
fn value(b: &Browser, selector: &str) -> Value {
    b.execute(&format!(
        "var e = document.querySelector({}); return e ? e.value : null;",
        json!(selector)
    ))
}

#[test]
fn a_form_being_filled_in_outlives_heartbeats_and_a_real_change_still_shows() {
    let w = Warden::demo(BIN);
    let r = w.api(
        "POST",
        "/v1/apps/demo/scale",
        Some(json!({"desired": {"SECRET": 1}})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let b = Browser::start();
    sign_in_admin(&b, &w);
    b.goto(&format!("{}/ui/apps/demo", w.api));
    let desired = "#labels-table tr[data-label='SECRET'] td.desired";
    b.wait_for("SECRET ready", Duration::from_secs(60), |b| {
        cell(b, "#labels-table tr[data-label='SECRET'] td.ready") == "1"
    });
    // A second stream of this page, counted: it must say nothing while nothing it shows moves.
    b.execute(
        "window.wardenChanges = 0; \
         var s = new EventSource('/ui/events?app=demo&page=' + encodeURIComponent(location.pathname)); \
         s.addEventListener('change', function () { window.wardenChanges += 1; }); \
         document.getElementById('labels-table').wardenMark = 'kept'; return null;",
    );
    b.type_into(&b.find("form#scale input[name=label]"), "SECRET");
    b.type_into(&b.find("form#scale input[name=count]"), "7");

    // A few node heartbeats (one a second, each a store change every stream sees).
    let revision = |w: &Warden| w.api("GET", "/v1/status", None).json()["revision"].clone();
    let first = revision(&w);
    std::thread::sleep(Duration::from_secs(5));
    assert_ne!(revision(&w), first, "the store changed meanwhile");
    assert_eq!(b.execute("return window.wardenChanges;"), json!(0));
    assert_eq!(
        b.execute("return document.getElementById('labels-table').wardenMark || null;"),
        json!("kept")
    );
    assert_eq!(value(&b, "form#scale input[name=label]"), json!("SECRET"));
    assert_eq!(value(&b, "form#scale input[name=count]"), json!("7"));

    // A real change, from the CLI: it shows, and the typing stays.
    let (ok, _, err) = crate::deploy::run(&w, &["apps", "scale", "demo", "SECRET=3"]);
    assert!(ok, "{err}");
    b.wait_for("SECRET desired 3, live", Duration::from_secs(30), |b| {
        cell(b, desired) == "3"
    });
    assert_eq!(value(&b, "form#scale input[name=label]"), json!("SECRET"));
    assert_eq!(value(&b, "form#scale input[name=count]"), json!("7"));
    assert!(b.execute("return window.wardenChanges;").as_u64().unwrap() >= 1);
}

#[test]
fn an_idle_overview_stays_quiet_over_heartbeats_and_a_real_change_still_shows() {
    let w = Warden::demo(BIN);
    let r = w.api(
        "POST",
        "/v1/apps/demo/scale",
        Some(json!({"desired": {"SECRET": 1}})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let b = Browser::start();
    sign_in_admin(&b, &w);
    b.goto(&format!("{}/ui/", w.api));
    let row = "#apps-table tr[data-app='demo'][data-label='SECRET']";
    b.wait_for("SECRET ready", Duration::from_secs(60), |b| {
        cell(b, &format!("{row} td.ready")) == "1"
    });
    // A second stream of the overview, counted: the store's revision moves with every
    // heartbeat, but nothing the overview shows does.
    b.execute(
        "window.wardenChanges = 0; \
         var s = new EventSource('/ui/events?page=' + encodeURIComponent(location.pathname)); \
         s.addEventListener('change', function () { window.wardenChanges += 1; }); return null;",
    );
    let revision = |w: &Warden| w.api("GET", "/v1/status", None).json()["revision"].clone();
    let page = |b: &Browser| {
        b.execute("var x = new XMLHttpRequest(); x.open('GET', '/ui/', false); x.send(); return x.responseText;")
    };
    let before = page(&b);
    let first = revision(&w);
    std::thread::sleep(Duration::from_secs(5));
    assert_ne!(revision(&w), first, "the store changed meanwhile");
    let after = page(&b);
    assert_eq!(
        b.execute("return window.wardenChanges;"),
        json!(0),
        "{before}\n----\n{after}"
    );

    let (ok, _, err) = crate::deploy::run(&w, &["apps", "scale", "demo", "SECRET=2"]);
    assert!(ok, "{err}");
    b.wait_for("SECRET desired 2, live", Duration::from_secs(30), |b| {
        cell(b, &format!("{row} td.desired")) == "2"
    });
    b.wait_for("the counted stream saw it", Duration::from_secs(30), |b| {
        b.execute("return window.wardenChanges;")
            .as_u64()
            .unwrap_or(0)
            >= 1
    });
}
