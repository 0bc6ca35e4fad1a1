//! What a person sees in a real browser (headless Chromium over WebDriver; see
//! `warden_test_support::browser`): the sign-in page, the demo app at their clearance,
//! the signed-in page and signing out.

use std::time::Duration;

use warden_test_support::browser::Browser;
use warden_test_support::Warden;

const BIN: &str = env!("CARGO_BIN_EXE_warden");

fn sign_in(b: &Browser, name: &str, password: &str) {
    b.type_into(&b.find("input[name=name]"), name);
    b.type_into(&b.find("input[name=password]"), password);
    b.click(&b.find("form[action='/login'] button[type=submit]"));
}

#[test]
fn a_person_signs_in_on_the_page_reaches_the_app_at_their_clearance_and_signs_out() {
    let w = Warden::demo(BIN);
    let b = Browser::start();

    // The app, asked for without a session: the browser lands on the sign-in page, which
    // remembers where it was going.
    b.goto(&format!("{}/apps/demo/", w.gateway));
    assert!(b.url().contains("/login?next="), "{}", b.url());

    // A wrong password: the page again, saying so, and no session.
    sign_in(&b, "alice", "not her password");
    b.wait_for("the page to say so", Duration::from_secs(30), |b| {
        b.try_find("p.message").is_some()
    });
    assert!(
        b.try_find("input[name=password]").is_some(),
        "{} {}",
        b.url(),
        b.source()
    );
    assert!(!b.cookies().iter().any(|c| c["name"] == "warden_session"));

    // The right one: back to the app, served at alice's clearance.
    sign_in(&b, "alice", &w.password("alice"));
    b.wait_for("the demo app", Duration::from_secs(30), |b| {
        b.url().ends_with("/apps/demo/")
    });
    let text = b.text();
    assert!(
        text.contains("\"SECRET\"") && text.contains("alice"),
        "{text}"
    );
    let cookies = b.cookies();
    let session = cookies
        .iter()
        .find(|c| c["name"] == "warden_session")
        .unwrap_or_else(|| panic!("no session cookie: {cookies:?}"));
    assert_eq!(
        (&session["httpOnly"], &session["sameSite"]),
        (&serde_json::json!(true), &serde_json::json!("Lax"))
    );

    // Who is signed in, and signing out ends it: the app asks for a sign-in again.
    b.goto(&format!("{}/whoami", w.gateway));
    let me = b.text();
    assert!(me.contains("alice") && me.contains("SECRET"), "{me}");
    b.click(&b.find("form[action='/logout'] button[type=submit]"));
    b.wait_for("the sign-in page", Duration::from_secs(30), |b| {
        b.url().contains("/login")
    });
    b.goto(&format!("{}/apps/demo/", w.gateway));
    assert!(b.url().contains("/login?next="), "{}", b.url());
    assert!(!b.text().contains("\"SECRET\""));
}

#[test]
fn a_person_signs_in_through_the_identity_provider_in_a_browser() {
    use warden_test_support::oidc::{OidcProvider, Person, Ttls};
    let idp = OidcProvider::start(
        &[Person::new("alice", "wonderland", &["engineering"])],
        Ttls::default(),
    );
    let port = warden_test_support::free_port();
    let gw = format!("http://127.0.0.1:{port}");
    let redirect = format!("{gw}/login/oidc/corp/callback");
    idp.register("warden", "s3cret", &redirect);
    let dir = tempfile::tempdir().unwrap();
    let config = crate::oidc::config_file(dir.path(), &idp.issuer, &redirect);
    let _w = warden_test_support::Launch::new(BIN)
        .listen(&format!("127.0.0.1:{port}"))
        .arg("--config")
        .arg(config.to_str().unwrap())
        .start();
    let b = Browser::start();

    // The sign-in page offers the provider; its button leads to the provider's own page.
    b.goto(&format!("{gw}/apps/demo/"));
    let button = b.find("a[href^='/login/oidc/corp']");
    assert_eq!(b.text_of(&button), "Corp");
    b.click(&button);
    b.wait_for("the provider's page", Duration::from_secs(20), |b| {
        b.try_find("input[name=login]").is_some()
    });
    b.type_into(&b.find("input[name=login]"), "alice");
    b.type_into(&b.find("input[name=password]"), "wonderland");
    b.click(&b.find("button"));
    // Back at the app, at the clearance the provider's groups give (engineering: SECRET).
    b.wait_for("the demo app", Duration::from_secs(30), |b| {
        b.url().starts_with(&gw) && b.url().ends_with("/apps/demo/")
    });
    let text = b.text();
    assert!(text.contains("\"SECRET\""), "{text}");
    b.goto(&format!("{gw}/whoami"));
    assert!(b.text().contains("alice_corp"), "{}", b.text());
}
