//! Provider users pinned to their provider account, the deciding claims in the audit trail,
//! and providers added and removed by API (issue 36), against the real test provider.

use std::time::Duration;

use warden_test_support::oidc::{Browser, OidcProvider, Person, Ttls};
use warden_test_support::{cli, free_port, wait_until, Launch, Warden};

use crate::oidc::{alice, config_file, host};
use crate::BIN;

/// A gateway with provider `corp` (from its config file) in front of the demo.
struct Setup {
    idp: OidcProvider,
    w: Warden,
    gw: String,
    _dir: tempfile::TempDir,
}

fn setup(people: &[Person]) -> Setup {
    let idp = OidcProvider::start(people, Ttls::default());
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
