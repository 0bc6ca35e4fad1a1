//! Operators with identities and roles (issue 36): a deployer changes only their apps, a viewer
//! changes nothing, every change names its operator; logins are throttled; a token that expired,
//! was revoked or predates a password change is refused; the break-glass admin token can be
//! turned off; `warden login` and a push through the CLI name the operator.

use serde_json::{json, Value};
use warden_test_support::{request, Launch, Response, Warden};

use crate::{app_bin, BIN};

/// A call to `w`'s API with `token`.
fn call(w: &Warden, token: &str, method: &str, path: &str, body: Option<Value>) -> Response {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    request(
        method,
        &format!("{}{path}", w.api),
        &[
            ("authorization", &format!("Bearer {token}")),
            ("content-type", "application/json"),
        ],
        body.as_bytes(),
    )
}

/// Makes operator `name` with `roles` through the admin token.
fn add_operator(w: &Warden, name: &str, password: &str, roles: Value) {
    let r = w.api(
        "POST",
        "/v1/operators",
        Some(json!({"name": name, "password": password, "roles": roles})),
    );
    assert_eq!(r.status, 201, "{}", r.text());
}

/// `POST /v1/login`, answered as it came.
fn login_as(w: &Warden, name: &str, password: &str) -> Response {
    call(
        w,
        "",
        "POST",
        "/v1/login",
        Some(json!({"name": name, "password": password})),
    )
}

/// A session token of `name`.
fn login(w: &Warden, name: &str, password: &str) -> String {
    let r = login_as(w, name, password);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["token"].as_str().unwrap().to_owned()
}

/// The actors of the finished change records of `route` on `target`, from the audit trail.
fn actors(w: &Warden, route: &str, target: &str) -> Vec<String> {
    let all = w.api("GET", "/v1/audit?kind=change", None).json();
    all.as_array()
        .unwrap()
        .iter()
        .map(|r| &r["event"])
        .filter(|e| e["route"] == route && e["target"] == target && e["outcome"] != "pending")
        .map(|e| e["actor"].as_str().unwrap_or("").to_owned())
        .collect()
}

#[test]
fn a_deployer_changes_only_their_apps_and_a_viewer_changes_nothing() {
    let w = Warden::demo(BIN);
    for app in ["a", "b"] {
        w.create_demo_app(&app_bin(), app, json!({}));
    }
    add_operator(
        &w,
        "dep",
        "dep-password-1",
        json!([{"role": "deployer", "apps": ["a"]}]),
    );
    add_operator(&w, "view", "view-password-1", json!([{"role": "viewer"}]));
    let dep = login(&w, "dep", "dep-password-1");
    let view = login(&w, "view", "view-password-1");
    let scale = json!({"desired": {"SECRET": 0}});

    // The deployer of a: a, and reads of it; not b, nor users, the lattice or operators.
    let r = call(&w, &dep, "POST", "/v1/apps/a/scale", Some(scale.clone()));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(call(&w, &dep, "GET", "/v1/apps/a", None).status, 200);
    let r = call(&w, &dep, "POST", "/v1/apps/b/scale", Some(scale.clone()));
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(
        r.json()["error"]
            .as_str()
            .unwrap()
            .contains("deployer role of app \"b\""),
        "{}",
        r.text()
    );
    let denied: [(&str, &str, Option<Value>); 7] = [
        (
            "POST",
            "/v1/apps/b/config",
            Some(json!({"set": {"K": "v"}})),
        ),
        ("GET", "/v1/apps/b/config", None),
        (
            "POST",
            "/v1/users",
            Some(json!({"name": "x", "password": "x-password-1", "clearance": "SECRET"})),
        ),
        ("GET", "/v1/users", None),
        (
            "PUT",
            "/v1/lattice",
            Some(json!({"levels": ["L"], "categories": []})),
        ),
        (
            "POST",
            "/v1/operators",
            Some(json!({"name": "x", "password": "x-password-1", "roles": [{"role": "owner"}]})),
        ),
        ("GET", "/v1/store/backup", None),
    ];
    for (method, path, body) in denied {
        let r = call(&w, &dep, method, path, body);
        assert_eq!(r.status, 403, "deployer {method} {path}: {}", r.text());
    }
    // Instances of a, started, read and killed; not of b.
    let start = |app: &str| json!({"app": app, "label": "SECRET"});
    let r = call(&w, &dep, "POST", "/v1/instances", Some(start("b")));
    assert_eq!(r.status, 403, "{}", r.text());
    let r = call(&w, &dep, "POST", "/v1/instances", Some(start("a")));
    assert_eq!(r.status, 201, "{}", r.text());
    let mine = r.json()["id"].as_str().unwrap().to_owned();
    let r = w.api("POST", "/v1/instances", Some(start("b")));
    assert_eq!(r.status, 201, "{}", r.text());
    let theirs = r.json()["id"].as_str().unwrap().to_owned();
    for (method, path) in [
        ("GET", format!("/v1/instances/{theirs}/logs")),
        ("DELETE", format!("/v1/instances/{theirs}")),
    ] {
        let r = call(&w, &dep, method, &path, None);
        assert_eq!(r.status, 403, "deployer {method} {path}: {}", r.text());
    }
    let r = call(&w, &dep, "GET", &format!("/v1/instances/{mine}/logs"), None);
    assert_eq!(r.status, 200, "{}", r.text());
    let r = call(&w, &dep, "DELETE", &format!("/v1/instances/{mine}"), None);
    assert!(r.status < 300, "{}", r.text());
    // The change is recorded as the operator's, not the admin token's.
    assert_eq!(actors(&w, "/v1/apps/{name}/scale", "a"), ["operator:dep"]);

    // The viewer: every change refused, by the route's template from the OpenAPI document.
    let doc = w.api("GET", "/v1/openapi.json", None).json();
    // Outside the token check (they make tokens), or the caller's own.
    let own = [
        "/v1/login",
        "/v1/login/device",
        "/v1/login/device/poll",
        "/v1/logout",
        "/v1/tokens",
        "/v1/tokens/{id}",
    ];
    let mut refused = 0;
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for method in ops.as_object().unwrap().keys() {
            if method == "get" || own.contains(&path.as_str()) {
                continue;
            }
            let concrete = path
                .replace("{name}", "a")
                .replace("{id}", "x")
                .replace("{number}", "1");
            let r = call(
                &w,
                &view,
                &method.to_uppercase(),
                &concrete,
                Some(json!({})),
            );
            assert_eq!(r.status, 403, "viewer {method} {concrete}: {}", r.text());
            refused += 1;
        }
    }
    assert!(refused >= 18, "{refused} changes tried");
    // Reads, but not secrets, the backup or the operators.
    for path in [
        "/v1/apps",
        "/v1/apps/a",
        "/v1/users",
        "/v1/audit",
        "/v1/status",
    ] {
        assert_eq!(
            call(&w, &view, "GET", path, None).status,
            200,
            "viewer GET {path}"
        );
    }
    for path in ["/v1/apps/a/config", "/v1/store/backup", "/v1/operators"] {
        assert_eq!(
            call(&w, &view, "GET", path, None).status,
            403,
            "viewer GET {path}"
        );
    }
    // Config values are secrets: only b's deployers and owners see them; the names show.
    let r = w.api(
        "PATCH",
        "/v1/apps/b",
        Some(json!({"env": {"API_KEY": "b-key-123"}})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // (A deployer of a reads b only in the list of apps; a viewer reads it everywhere.)
    let reads: [(&str, &String, &[&str]); 2] = [
        (
            "viewer",
            &view,
            &["/v1/apps", "/v1/apps/b", "/v1/apps/b/releases"],
        ),
        ("deployer of a", &dep, &["/v1/apps"]),
    ];
    for (who, token, paths) in reads {
        for path in paths {
            let r = call(&w, token, "GET", path, None);
            assert_eq!(r.status, 200, "{who} GET {path}: {}", r.text());
            assert!(
                !r.text().contains("b-key-123")
                    && (path.ends_with("releases") || r.text().contains("API_KEY")),
                "{who} GET {path}: {}",
                r.text()
            );
        }
    }
    assert_eq!(
        w.api("GET", "/v1/apps/b", None).json()["env"]["API_KEY"],
        "b-key-123"
    );
    // Nothing shows a hash.
    let ops = w.api("GET", "/v1/operators", None).text();
    assert!(!ops.contains("argon2") && !ops.contains("hash"), "{ops}");
}

#[test]
fn logins_are_throttled_and_expired_revoked_or_stale_tokens_are_refused() {
    let w = Launch::new(BIN).no_demo().start();
    add_operator(&w, "ann", "ann-password-1", json!([{"role": "viewer"}]));
    add_operator(&w, "bob", "bob-password-1", json!([{"role": "viewer"}]));

    // Wrong passwords: 401, then 429 with Retry-After, even for the right one.
    for _ in 0..5 {
        let r = login_as(&w, "ann", "wrong");
        assert_eq!(r.status, 401, "{}", r.text());
        assert!(r.json()["error"]
            .as_str()
            .unwrap()
            .contains("wrong operator name or password"));
    }
    let r = login_as(&w, "ann", "ann-password-1");
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(r
        .headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("retry-after")));

    // An API token that expired.
    let session = login(&w, "bob", "bob-password-1");
    let r = call(
        &w,
        &session,
        "POST",
        "/v1/tokens",
        Some(json!({"label": "brief", "expires_in": 1})),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let brief = r.json()["token"].as_str().unwrap().to_owned();
    let brief_id = r.json()["id"].as_str().unwrap().to_owned();
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let r = call(&w, &brief, "GET", "/v1/status", None);
    assert_eq!(r.status, 401, "{}", r.text());
    assert!(r.text().contains("expired"), "{}", r.text());

    // A revoked one: listed by id and label (never the token), then refused.
    let r = call(
        &w,
        &session,
        "POST",
        "/v1/tokens",
        Some(json!({"label": "ci"})),
    );
    let (ci, id) = (
        r.json()["token"].as_str().unwrap().to_owned(),
        r.json()["id"].as_str().unwrap().to_owned(),
    );
    assert_eq!(call(&w, &ci, "GET", "/v1/status", None).status, 200);
    let listed = call(&w, &session, "GET", "/v1/tokens", None);
    // The expired one is gone: making a token sweeps them (they would pile up in the store).
    assert!(!listed.text().contains(&brief_id), "{}", listed.text());
    assert!(listed
        .json()
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["id"] == id.as_str() && t["label"] == "ci"));
    assert!(!listed.text().contains(&ci), "{}", listed.text());
    assert_eq!(
        call(&w, &session, "DELETE", &format!("/v1/tokens/{id}"), None).status,
        204
    );
    let r = call(&w, &ci, "GET", "/v1/status", None);
    assert_eq!(r.status, 401, "{}", r.text());
    assert!(r.text().contains("revoked"), "{}", r.text());

    // A password change ends every token of the operator.
    assert_eq!(call(&w, &session, "GET", "/v1/status", None).status, 200);
    let r = w.api(
        "PATCH",
        "/v1/operators/bob",
        Some(json!({"password": "bob-password-2"})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(call(&w, &session, "GET", "/v1/status", None).status, 401);
    let fresh = login(&w, "bob", "bob-password-2");
    assert_eq!(call(&w, &fresh, "GET", "/v1/status", None).status, 200);
    // Logged out, the session is refused.
    assert_eq!(call(&w, &fresh, "POST", "/v1/logout", None).status, 204);
    assert_eq!(call(&w, &fresh, "GET", "/v1/status", None).status, 401);
}

#[test]
fn with_the_admin_token_off_only_operators_get_in() {
    // Off with no owner would leave nobody able to change anything: refused.
    let err = Launch::new(BIN)
        .no_demo()
        .arg("--admin-token")
        .arg("off")
        .start_refused();
    assert!(err.contains("owner role"), "{err}");

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let mut first = Launch::new(BIN).no_demo().data_dir(&dir).start();
    add_operator(
        &first,
        "root",
        "root-password-1",
        json!([{"role": "owner"}]),
    );
    let old = first.token.clone();
    first.stop();
    drop(first);

    let w = Launch::new(BIN)
        .no_demo()
        .data_dir(&dir)
        .arg("--admin-token")
        .arg("off")
        .start();
    assert!(
        !dir.join("admin-token").exists(),
        "the admin token file is left behind"
    );
    let r = call(&w, &old, "GET", "/v1/status", None);
    assert_eq!(r.status, 401, "{}", r.text());
    let root = login(&w, "root", "root-password-1");
    let r = call(
        &w,
        &root,
        "POST",
        "/v1/apps",
        Some(json!({"name": "mine", "command": [BIN, "demo-app"]})),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let changes = call(&w, &root, "GET", "/v1/audit?kind=change", None).json();
    let actor: Vec<&Value> = changes
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["event"]["target"] == "mine")
        .map(|r| &r["event"]["actor"])
        .collect();
    assert!(
        !actor.is_empty() && actor.iter().all(|a| *a == "operator:root"),
        "{actor:?}"
    );
    // The last owner stays one: nobody could change warden any more.
    let r = call(&w, &root, "DELETE", "/v1/operators/root", None);
    assert_eq!(r.status, 409, "{}", r.text());
    let demote = json!({"roles": [{"role": "viewer"}]});
    let r = call(&w, &root, "PATCH", "/v1/operators/root", Some(demote));
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.text().contains("last owner"), "{}", r.text());
}

/// Runs the CLI with `env` (and no other WARDEN_ setting), `stdin` on its standard input.
fn run_cli(args: &[&str], env: &[(&str, &str)], stdin: &str) -> (bool, String, String) {
    use std::io::Write;
    let mut child = std::process::Command::new(BIN)
        .args(args)
        .env_remove("WARDEN_API")
        .env_remove("WARDEN_TOKEN")
        .env_remove("WARDEN_CONFIG")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn warden_login_then_a_push_and_a_scale_through_the_cli_name_the_operator() {
    use std::os::unix::fs::PermissionsExt;
    let w = Warden::demo(BIN);
    let home = tempfile::tempdir().unwrap();
    let config = home.path().display().to_string();
    // No data dir to fall back on: only the session opens the API.
    let nowhere = home.path().join("no-data-dir").display().to_string();
    let admin = [
        ("WARDEN_API", w.api.as_str()),
        ("WARDEN_TOKEN", w.token.as_str()),
    ];
    let (ok, out, err) = run_cli(
        &["operators", "add", "dev", "--deploys", "plain"],
        &admin,
        "",
    );
    assert!(
        ok && out.contains("operator dev added (deployer of plain)"),
        "{out}{err}"
    );
    let (ok, _, err) = run_cli(
        &[
            "operators",
            "change",
            "dev",
            "--deploys",
            "plain",
            "--password-stdin",
        ],
        &admin,
        "dev-password-1\n",
    );
    assert!(ok, "{err}");

    let me = [
        ("WARDEN_API", w.api.as_str()),
        ("XDG_CONFIG_HOME", config.as_str()),
        ("WARDEN_DATA_DIR", nowhere.as_str()),
    ];
    let (ok, out, err) = run_cli(
        &["login", "--name", "dev", "--password-stdin"],
        &me,
        "wrong\n",
    );
    assert!(
        !ok && err.contains("wrong operator name or password"),
        "{out}{err}"
    );
    let (ok, out, err) = run_cli(
        &["login", "--name", "dev", "--password-stdin"],
        &me,
        "dev-password-1\n",
    );
    assert!(
        ok && out.contains("logged in as operator dev"),
        "{out}{err}"
    );
    let session = home.path().join("warden/session.json");
    let mode = std::fs::metadata(&session).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");

    let src = crate::deploy::fixture("plain");
    let (ok, out, err) = run_cli(
        &["push", "plain", &src.path().display().to_string()],
        &me,
        "",
    );
    assert!(ok && out.contains("of plain serves"), "{out}{err}");
    let (ok, out, err) = run_cli(&["apps", "scale", "plain", "SECRET=1"], &me, "");
    assert!(ok, "{out}{err}");
    let (ok, out, err) = run_cli(&["apps", "scale", "demo", "SECRET=1"], &me, "");
    assert!(
        !ok && err.contains("deployer role of app \"demo\""),
        "{out}{err}"
    );

    // The release's `by` and the audit trail's actor are the operator, whatever the CLI said.
    let releases = w.api("GET", "/v1/apps/plain/releases", None).json();
    assert_eq!(releases[0]["by"], "operator:dev", "{releases}");
    assert_eq!(
        actors(&w, "/v1/apps/{name}/scale", "plain"),
        ["operator:dev"]
    );
    assert_eq!(
        actors(&w, "/v1/apps/{name}/releases", "plain"),
        ["operator:dev"]
    );

    // Personal tokens through the CLI.
    let (ok, out, err) = run_cli(&["tokens", "create", "--label", "ci", "--json"], &me, "");
    assert!(ok, "{err}");
    let made: Value = serde_json::from_str(&out).unwrap();
    let (ok, out, _) = run_cli(&["tokens", "list"], &me, "");
    assert!(
        ok && out.contains(made["id"].as_str().unwrap()) && out.contains("ci"),
        "{out}"
    );
    let id = made["id"].as_str().unwrap();
    let (ok, _, err) = run_cli(&["tokens", "revoke", id], &me, "");
    assert!(ok, "{err}");
    let r = call(
        &w,
        made["token"].as_str().unwrap(),
        "GET",
        "/v1/status",
        None,
    );
    assert_eq!(r.status, 401);

    // Logged out: the session is gone here and at the API.
    let token: Value = serde_json::from_str(&std::fs::read_to_string(&session).unwrap()).unwrap();
    let (ok, out, err) = run_cli(&["logout"], &me, "");
    assert!(ok && out.contains("logged out"), "{out}{err}");
    assert!(!session.exists());
    let r = call(
        &w,
        token["token"].as_str().unwrap(),
        "GET",
        "/v1/status",
        None,
    );
    assert_eq!(r.status, 401);
    let (ok, _, err) = run_cli(&["status"], &me, "");
    assert!(!ok && err.contains("warden login"), "{err}");

    // A stored session that expired: the CLI says to log in again.
    let mut stale = token.clone();
    stale["expires_ms"] = json!(1);
    std::fs::write(&session, stale.to_string()).unwrap();
    let (ok, _, err) = run_cli(&["status"], &me, "");
    assert!(
        !ok && err.contains("expired") && err.contains("warden login"),
        "{err}"
    );
}
