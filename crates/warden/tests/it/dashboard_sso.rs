//! Single sign-on into the dashboard through the identity provider (issue 36), in headless
//! Chromium against a real provider (`oidc-provider`): a person in the platform group signs in
//! with the provider's button and sees the overview, in the same `warden_ui` session a password
//! gives; a person in no operator group gets a 403 page saying why, and no session.

use std::time::Duration;

use warden_test_support::browser::Browser;
use warden_test_support::oidc::{OidcProvider, Person, Ttls};
use warden_test_support::{free_port, Launch, Warden};

use crate::BIN;

fn setup(people: &[Person]) -> (OidcProvider, Warden, tempfile::TempDir) {
    let idp = OidcProvider::start(people, Ttls::default());
    let (gw, api) = (free_port(), free_port());
    let redirect = format!("http://127.0.0.1:{gw}/login/oidc/corp/callback");
    let dashboard = format!("http://127.0.0.1:{api}/ui/login/oidc/corp/callback");
    idp.register_redirects("warden", "s3cret", &[&redirect, &dashboard]);
    let dir = tempfile::tempdir().unwrap();
    let config = crate::oidc::config_file(dir.path(), &idp.issuer, &redirect);
    // The file ends inside the [[oidc]] table: these join it.
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(crate::operators_idp::OPERATOR_RULES);
    text.push_str(&format!("\ndashboard_redirect_url = \"{dashboard}\"\n"));
    std::fs::write(&config, text).unwrap();
    let w = Launch::new(BIN)
        .listen(&format!("127.0.0.1:{gw}"))
        .api_listen(&format!("127.0.0.1:{api}"))
        .arg("--config")
        .arg(config.to_str().unwrap())
        .start();
    (idp, w, dir)
}

/// Clicks the provider's button on the dashboard's sign-in page and signs in there as `who`.
fn sign_in_with_provider(b: &Browser, w: &Warden, who: &Person) {
    b.goto(&format!("{}/ui/", w.api));
    assert!(b.url().ends_with("/ui/login"), "{}", b.url());
    b.click(&b.find("a#oidc-corp"));
    b.wait_for(
        "the provider's sign-in page",
        Duration::from_secs(30),
        |b| b.url().contains("/interaction/"),
    );
    b.type_into(&b.find("input[name=login]"), &who.name);
    b.type_into(&b.find("input[name=password]"), &who.password);
    b.click(&b.find("form button"));
}

fn session_cookie(b: &Browser) -> Option<serde_json::Value> {
    b.cookies().into_iter().find(|c| c["name"] == "warden_ui")
}

#[test]
fn a_platform_person_signs_in_to_the_dashboard_through_the_provider_and_one_in_no_group_is_refused()
{
    let alice = Person::new("alice", "wonderland", &["platform"]);
    let bob = Person::new("bob", "builder", &["sales"]);
    let (_idp, w, _dir) = setup(&[alice.clone(), bob.clone()]);

    let b = Browser::start();
    sign_in_with_provider(&b, &w, &alice);
    b.wait_for("the overview", Duration::from_secs(30), |b| {
        b.url().ends_with("/ui/") && b.try_find("#apps-table").is_some()
    });
    let session = session_cookie(&b).expect("the dashboard's session cookie");
    assert_eq!(session["sameSite"], "Strict", "{session}");
    let op = w.api("GET", "/v1/operators/alice", None).json();
    assert_eq!(op["source"]["provider"]["id"], "corp", "{op}");
    assert_eq!(op["source"]["provider"]["subject"], "alice", "{op}");
    assert_eq!(op["roles"], serde_json::json!([{"role": "owner"}]), "{op}");

    // Another browser (the provider remembers alice in the first): bob is in no operator group.
    let b2 = Browser::start();
    sign_in_with_provider(&b2, &w, &bob);
    b2.wait_for("the refusal", Duration::from_secs(30), |b| {
        b.text().contains("no operator rule matched")
    });
    assert!(b2.text().contains(r#"groups=["sales"]"#), "{}", b2.text());
    assert!(session_cookie(&b2).is_none());
    b2.goto(&format!("{}/ui/", w.api));
    assert!(b2.url().ends_with("/ui/login"), "{}", b2.url());
}

#[test]
fn a_dashboard_sign_in_is_finished_only_by_its_browser_and_only_once() {
    use warden_test_support::oidc::Browser as Client;
    let alice = Person::new("alice", "wonderland", &["platform"]);
    let (_idp, w, _dir) = setup(std::slice::from_ref(&alice));
    let ui = format!("{}/ui", w.api);
    let api_host = w.api.strip_prefix("http://").unwrap().to_owned();

    // The provider's answer carried to another browser (a stolen callback URL) is refused.
    let callback = Client::new().sign_in_until_callback(&ui, "corp", "/ui/", &alice);
    let r = Client::new().send("GET", &callback, None);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text().contains("begun in another browser"),
        "{}",
        r.text()
    );

    // Its own browser finishes it once, into the dashboard's session; a replay finds nothing.
    let mut mine = Client::new();
    let callback = mine.sign_in_until_callback(&ui, "corp", "/ui/", &alice);
    let r = mine.send("GET", &callback, None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("refresh"), Some("0; url=/ui/"));
    assert!(mine.cookie(&api_host, "warden_ui").is_some());
    let r = mine.send("GET", &format!("{ui}/"), None);
    assert_eq!(r.status, 200, "{}", r.text());
    let r = mine.send("GET", &callback, None);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("already finished"), "{}", r.text());
}
