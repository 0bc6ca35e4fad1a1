//! One rule for an app's environment, whichever route sets it: `POST /v1/apps`,
//! `PATCH /v1/apps/NAME` and `POST /v1/apps/NAME/config` refuse the same keys and values with a
//! 400 that names the key and the rule, and never store an altered value.

use serde_json::{json, Value};
use warden_test_support::{request, Warden};

use crate::BIN;

/// Variables every route must refuse, with a word the error must hold.
fn refused() -> Vec<(Value, &'static str, &'static str)> {
    vec![
        (json!({"A=B": "1"}), "\"A=B\"", "letters, digits"),
        (json!({"1A": "1"}), "\"1A\"", "letters, digits"),
        (json!({"TOKEN": "se\u{0}cret"}), "\"TOKEN\"", "NUL"),
        (
            json!({"WARDEN_INSTANCE_SECRET": "x"}),
            "WARDEN_INSTANCE_SECRET",
            "set by warden",
        ),
        (json!({"PORT": "80"}), "\"PORT\"", "set by warden"),
        (
            json!({"WARDEN_LABEL": "TOP"}),
            "WARDEN_LABEL",
            "set by warden",
        ),
    ]
}

fn assert_refused(r: &warden_test_support::Response, key: &str, rule: &str, route: &str) {
    assert_eq!(r.status, 400, "{route} {key}: {}", r.text());
    let e = r.json()["error"].as_str().unwrap_or("").to_owned();
    assert!(e.contains(key) && e.contains(rule), "{route}: {e}");
    assert!(!e.contains("cret"), "a value is never echoed: {e}");
}

#[test]
fn every_route_refuses_the_same_environment() {
    let w = Warden::demo(BIN);
    let env_of = |app: &str| w.api("GET", &format!("/v1/apps/{app}"), None).json()["env"].clone();

    for (env, key, rule) in refused() {
        let spec = json!({"name": "fresh", "command": [BIN, "demo-app"], "env": env});
        let r = w.api("POST", "/v1/apps", Some(spec));
        assert_refused(&r, key, rule, "apps create");
        assert_eq!(w.api("GET", "/v1/apps/fresh", None).status, 404);

        let r = w.api("PATCH", "/v1/apps/demo", Some(json!({ "env": env })));
        assert_refused(&r, key, rule, "apps update");
        assert_eq!(env_of("demo"), json!({}), "nothing stored");
    }

    // `config set` on an app that runs a release (a static site, pushed).
    let pushed = request(
        "POST",
        &format!("{}/v1/apps/site/releases", w.api),
        &[("authorization", &format!("Bearer {}", w.token))],
        &crate::api::site_archive(),
    );
    assert_eq!(pushed.status, 200, "{}", pushed.text());
    assert!(pushed.text().contains("\"done\""), "{}", pushed.text());
    let releases = || w.api("GET", "/v1/apps/site/releases", None).json();
    let before = releases();
    for (env, key, rule) in refused() {
        let r = w.api("POST", "/v1/apps/site/config", Some(json!({ "set": env })));
        assert_refused(&r, key, rule, "config set");
    }
    assert_eq!(
        releases(),
        before,
        "no release was made of a refused change"
    );
    assert_eq!(env_of("site"), json!({}));

    // What every route accepts, stored byte for byte.
    let ok = json!({"GREETING": "hello = world\t!", "WARDEN_DEMO_X": "1"});
    let spec = json!({"name": "fresh", "command": [BIN, "demo-app"], "env": ok});
    assert_eq!(w.api("POST", "/v1/apps", Some(spec)).status, 201);
    assert_eq!(env_of("fresh"), ok);
}
