//! The control-plane API through the real binary: routes match the OpenAPI document, bad input
//! gets a JSON 4xx that says what is wrong, secrets never come back out.

use serde_json::json;
use warden_test_support::{request, Warden};

use crate::BIN;

#[test]
fn every_documented_route_is_served() {
    let w = Warden::demo(BIN);
    let doc = request("GET", &format!("{}/v1/openapi.json", w.api), &[], b"").json();
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() >= 10);
    for (path, ops) in paths {
        for method in ops.as_object().unwrap().keys() {
            let concrete = path
                .replace("{name}", "no-such-thing")
                .replace("{id}", "no-such-id");
            let r = w.api(&method.to_uppercase(), &concrete, Some(json!({})));
            assert_ne!(
                r.status, 405,
                "{method} {path} is documented but not routed"
            );
            if r.status == 404 {
                // git's routes answer git, in plain text.
                let plain = r
                    .header("content-type")
                    .is_some_and(|c| c.starts_with("text/plain"));
                let e = if plain {
                    r.text()
                } else {
                    r.json()["error"].as_str().unwrap().to_owned()
                };
                assert!(
                    !e.starts_with("no such route"),
                    "{method} {path} is documented but not routed: {e}"
                );
            }
        }
    }
}

#[test]
fn every_documented_route_answers_its_documented_success_for_a_valid_request() {
    let w = Warden::demo(BIN);
    let doc = request("GET", &format!("{}/v1/openapi.json", w.api), &[], b"").json();
    let lattice = w.api("GET", "/v1/lattice", None).json();
    let started = w.api(
        "POST",
        "/v1/instances",
        Some(json!({"app": "demo", "label": "SECRET"})),
    );
    let id = started.json()["id"].as_str().unwrap_or("").to_owned();
    let app = json!({"name": "doc-app", "command": [BIN, "demo-app"]});
    let user = json!({"name": "doc-user", "password": "doc-password-1", "clearance": "SECRET"});
    // An operator's own routes (`/v1/logout`, `/v1/tokens`) are called with their session.
    let operator =
        json!({"name": "doc-op", "password": "doc-password-1", "roles": [{"role": "owner"}]});
    let session =
        json!({"name": "doc-session", "password": "doc-password-1", "roles": [{"role": "viewer"}]});
    assert_eq!(w.api("POST", "/v1/operators", Some(session)).status, 201);
    let login = json!({"name": "doc-session", "password": "doc-password-1"});
    let own = w.api("POST", "/v1/login", Some(login.clone())).json()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let own_call = |method: &str, path: &str, body: Option<serde_json::Value>| {
        request(
            method,
            &format!("{}{path}", w.api),
            &[
                ("authorization", &format!("Bearer {own}")),
                ("content-type", "application/json"),
            ],
            body.map(|b| b.to_string()).unwrap_or_default().as_bytes(),
        )
    };
    let made = own_call("POST", "/v1/tokens", Some(json!({"label": "doc"}))).json();
    let token_id = made["id"].as_str().unwrap().to_owned();
    // In an order in which each request is valid; deletions last.
    let calls: Vec<(&str, &str, String, Option<serde_json::Value>)> = vec![
        ("get", "/healthz", "/healthz".into(), None),
        ("get", "/readyz", "/readyz".into(), None),
        ("get", "/metrics", "/metrics".into(), None),
        ("get", "/v1/openapi.json", "/v1/openapi.json".into(), None),
        ("get", "/v1/status", "/v1/status".into(), None),
        ("post", "/v1/apps", "/v1/apps".into(), Some(app)),
        ("get", "/v1/apps", "/v1/apps".into(), None),
        ("get", "/v1/apps/{name}", "/v1/apps/doc-app".into(), None),
        (
            "patch",
            "/v1/apps/{name}",
            "/v1/apps/doc-app".into(),
            Some(json!({"env": {"A": "1"}})),
        ),
        (
            "post",
            "/v1/apps/{name}/scale",
            "/v1/apps/doc-app/scale".into(),
            Some(json!({"desired": {"SECRET": 1}})),
        ),
        // A static site: pushed (its archive is sent below), configured and rolled back.
        (
            "post",
            "/v1/apps/{name}/releases",
            "/v1/apps/doc-site/releases".into(),
            None,
        ),
        (
            "get",
            "/v1/apps/{name}/releases",
            "/v1/apps/doc-site/releases".into(),
            None,
        ),
        (
            "get",
            "/v1/apps/{name}/releases/{number}/log",
            "/v1/apps/doc-site/releases/1/log".into(),
            None,
        ),
        (
            "post",
            "/v1/apps/{name}/config",
            "/v1/apps/doc-site/config".into(),
            Some(json!({"set": {"A": "1"}})),
        ),
        (
            "get",
            "/v1/apps/{name}/config",
            "/v1/apps/doc-site/config".into(),
            None,
        ),
        (
            "post",
            "/v1/apps/{name}/rollback",
            "/v1/apps/doc-site/rollback".into(),
            Some(json!({"to": 1})),
        ),
        (
            "post",
            "/v1/apps/{name}/restart",
            "/v1/apps/doc-app/restart".into(),
            Some(json!({})),
        ),
        (
            "get",
            "/v1/apps/{name}/git/info/refs",
            "/v1/apps/doc-app/git/info/refs?service=git-receive-pack".into(),
            None,
        ),
        (
            "get",
            "/v1/apps/{name}/logs",
            "/v1/apps/demo/logs".into(),
            None,
        ),
        ("get", "/v1/apps/{name}/ps", "/v1/apps/demo/ps".into(), None),
        (
            "get",
            "/v1/apps/{name}/requests",
            "/v1/apps/demo/requests".into(),
            None,
        ),
        ("get", "/v1/limits", "/v1/limits".into(), None),
        ("post", "/v1/users", "/v1/users".into(), Some(user)),
        ("get", "/v1/users", "/v1/users".into(), None),
        ("get", "/v1/users/{name}", "/v1/users/doc-user".into(), None),
        ("get", "/v1/sessions", "/v1/sessions".into(), None),
        (
            "delete",
            "/v1/users/{name}/sessions",
            "/v1/users/doc-user/sessions".into(),
            None,
        ),
        (
            "patch",
            "/v1/users/{name}",
            "/v1/users/doc-user".into(),
            Some(json!({"clearance": "CONFIDENTIAL"})),
        ),
        (
            "post",
            "/v1/instances",
            "/v1/instances".into(),
            Some(json!({"app": "demo", "label": "CONFIDENTIAL"})),
        ),
        ("get", "/v1/instances", "/v1/instances".into(), None),
        (
            "get",
            "/v1/instances/{id}/logs",
            format!("/v1/instances/{id}/logs"),
            None,
        ),
        ("get", "/v1/nodes", "/v1/nodes".into(), None),
        (
            "post",
            "/v1/nodes/{name}/drain",
            "/v1/nodes/doc-node/drain?ahead=true".into(),
            None,
        ),
        (
            "delete",
            "/v1/nodes/{name}/drain",
            "/v1/nodes/doc-node/drain".into(),
            None,
        ),
        ("get", "/v1/lattice", "/v1/lattice".into(), None),
        ("put", "/v1/lattice", "/v1/lattice".into(), Some(lattice)),
        ("get", "/v1/store/backup", "/v1/store/backup".into(), None),
        ("get", "/v1/audit", "/v1/audit?kind=change".into(), None),
        ("get", "/v1/audit/verify", "/v1/audit/verify".into(), None),
        (
            "get",
            "/v1/oidc/providers",
            "/v1/oidc/providers".into(),
            None,
        ),
        (
            "post",
            "/v1/operators",
            "/v1/operators".into(),
            Some(operator),
        ),
        ("get", "/v1/operators", "/v1/operators".into(), None),
        (
            "get",
            "/v1/operators/{name}",
            "/v1/operators/doc-op".into(),
            None,
        ),
        (
            "patch",
            "/v1/operators/{name}",
            "/v1/operators/doc-op".into(),
            Some(json!({"roles": [{"role": "viewer"}]})),
        ),
        ("post", "/v1/login", "/v1/login".into(), Some(login)),
        (
            "post",
            "/v1/tokens",
            "/v1/tokens".into(),
            Some(json!({"label": "doc2"})),
        ),
        ("get", "/v1/tokens", "/v1/tokens".into(), None),
        (
            "delete",
            "/v1/tokens/{id}",
            format!("/v1/tokens/{token_id}"),
            None,
        ),
        ("post", "/v1/logout", "/v1/logout".into(), None),
        (
            "delete",
            "/v1/operators/{name}",
            "/v1/operators/doc-op".into(),
            None,
        ),
        (
            "delete",
            "/v1/instances/{id}",
            format!("/v1/instances/{id}"),
            None,
        ),
        (
            "delete",
            "/v1/users/{name}",
            "/v1/users/doc-user".into(),
            None,
        ),
        ("delete", "/v1/apps/{name}", "/v1/apps/doc-app".into(), None),
    ];
    // Routes that need a data server, which this warden (`--data none`) lacks; their success
    // is asserted through `warden up` with PostgreSQL (`data_declassify`). The device login
    // and adding an identity provider (checked by a discovery) need an identity provider:
    // asserted against a real one (`operators_idp`, `oidc_api`).
    let elsewhere = [
        ("get", "/v1/apps/{name}/data"),
        ("post", "/v1/login/device"),
        ("post", "/v1/login/device/poll"),
        ("post", "/v1/oidc/providers"),
        ("get", "/v1/oidc/providers/{id}"),
        ("patch", "/v1/oidc/providers/{id}"),
        ("delete", "/v1/oidc/providers/{id}"),
        // A push needs git's own request: asserted through `git push` (`git_remote`).
        ("post", "/v1/apps/{name}/git/git-receive-pack"),
        // Answered 101 and then frames, which a plain request does not speak: asserted
        // through `warden run` (`run`).
        ("post", "/v1/apps/{name}/run"),
    ];
    let mut documented = 0;
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for method in ops.as_object().unwrap().keys() {
            if elsewhere.contains(&(method.as_str(), path.as_str())) {
                continue;
            }
            documented += 1;
            assert!(
                calls.iter().any(|(m, p, _, _)| m == method && p == path),
                "{method} {path} is documented: give it a valid request here"
            );
        }
    }
    assert_eq!(documented, calls.len(), "every call here is documented");
    for (method, path, concrete, body) in &calls {
        let op = &doc["paths"][*path][*method];
        let success: Vec<u16> = op["responses"]
            .as_object()
            .unwrap()
            .keys()
            .filter_map(|k| k.parse().ok())
            .filter(|s| (200..300).contains(s))
            .collect();
        assert_eq!(
            success.len(),
            1,
            "{method} {path} documents one success: {success:?}"
        );
        let r = if *path == "/v1/apps/{name}/releases" && *method == "post" {
            request(
                "POST",
                &format!("{}{concrete}", w.api),
                &[("authorization", &format!("Bearer {}", w.token))],
                &site_archive(),
            )
        } else if path.starts_with("/v1/tokens") || *path == "/v1/logout" {
            own_call(&method.to_uppercase(), concrete, body.clone())
        } else {
            w.api(&method.to_uppercase(), concrete, body.clone())
        };
        assert_eq!(r.status, success[0], "{method} {concrete}: {}", r.text());
        if *method == "post"
            && path.starts_with("/v1/apps/{name}/")
            && *path != "/v1/apps/{name}/scale"
            && *path != "/v1/apps/{name}/restart"
        {
            assert!(
                r.text().contains("\"done\""),
                "{method} {concrete}: {}",
                r.text()
            );
        }
    }
}

#[test]
fn admin_token_is_required_and_checked() {
    let w = Warden::demo(BIN);
    let url = format!("{}/v1/apps", w.api);
    let none = request("GET", &url, &[], b"");
    assert_eq!(none.status, 401);
    assert!(none.json()["error"]
        .as_str()
        .unwrap()
        .contains("admin-token"));
    let wrong = request("GET", &url, &[("authorization", "Bearer 0000")], b"");
    assert_eq!(wrong.status, 401);
    assert_eq!(w.api("GET", "/v1/apps", None).status, 200);
}

#[test]
fn bad_bodies_get_json_errors() {
    let w = Warden::demo(BIN);
    let broken = request(
        "POST",
        &format!("{}/v1/apps", w.api),
        &[
            ("authorization", &format!("Bearer {}", w.token)),
            ("content-type", "application/json"),
        ],
        b"{\"name\": ",
    );
    assert_eq!(broken.status, 400);
    assert!(broken.json()["error"].is_string());

    let unknown_field = w.api(
        "POST",
        "/v1/apps",
        Some(json!({"name": "x", "command": ["true"], "comand": 1})),
    );
    assert_eq!(unknown_field.status, 422);
    assert!(
        unknown_field.json()["error"]
            .as_str()
            .unwrap()
            .contains("comand"),
        "{}",
        unknown_field.text()
    );

    let bad_name = w.api(
        "POST",
        "/v1/apps",
        Some(json!({"name": "Bad/Name", "command": ["true"]})),
    );
    assert_eq!(bad_name.status, 400);
    assert!(bad_name.json()["error"].as_str().unwrap().contains("a-z"));

    let no_type = request(
        "POST",
        &format!("{}/v1/apps", w.api),
        &[("authorization", &format!("Bearer {}", w.token))],
        b"{}",
    );
    assert_eq!(no_type.status, 415);
    assert!(no_type.json()["error"].is_string());

    let nowhere = w.api("GET", "/v1/nowhere", None);
    assert_eq!(nowhere.status, 404);
    assert!(nowhere.json()["error"]
        .as_str()
        .unwrap()
        .contains("openapi"));
    assert_eq!(w.api("PATCH", "/v1/apps", None).status, 405);
}

#[test]
fn apps_lifecycle() {
    let w = Warden::demo(BIN);
    let spec = json!({"name": "echo", "command": [BIN, "demo-app"], "groups": ["admin"]});
    assert_eq!(w.api("POST", "/v1/apps", Some(spec.clone())).status, 201);
    assert_eq!(w.api("POST", "/v1/apps", Some(spec)).status, 409);
    let shown = w.api("GET", "/v1/apps/echo", None).json();
    assert_eq!(shown["groups"], json!(["admin"]));
    assert_eq!(shown["start_timeout_ms"], 10000);
    let names: Vec<String> = w
        .api("GET", "/v1/apps", None)
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["demo", "echo"]);
    assert_eq!(w.api("DELETE", "/v1/apps/echo", None).status, 204);
    assert_eq!(w.api("GET", "/v1/apps/echo", None).status, 404);
    assert_eq!(w.api("DELETE", "/v1/apps/echo", None).status, 404);
}

#[test]
fn users_store_only_hashes_and_need_a_known_clearance() {
    let w = Warden::demo(BIN);
    let created = w.api(
        "POST",
        "/v1/users",
        Some(json!({"name": "erin", "password": "erin-password-1", "clearance": "RESTRICTED", "groups": ["staff"]})),
    );
    assert_eq!(created.status, 201, "{}", created.text());
    assert!(!created.text().contains("erin-password-1") && !created.text().contains("argon2"));
    let listed = w.api("GET", "/v1/users", None).text();
    assert!(listed.contains("erin") && !listed.contains("argon2") && !listed.contains("password"));
    // The new user works at the gateway straight away (the view follows the store's watch).
    let r = w.get_as("erin", "erin-password-1", "/apps/demo/");
    assert_eq!(
        (r.status, r.json()["label"].as_str()),
        (200, Some("RESTRICTED"))
    );

    let bad = w.api(
        "POST",
        "/v1/users",
        Some(json!({"name": "x", "password": "long-enough-1", "clearance": "COSMIC"})),
    );
    assert_eq!(bad.status, 400);
    assert!(
        bad.json()["error"]
            .as_str()
            .unwrap()
            .contains("UNCLASSIFIED < RESTRICTED"),
        "{}",
        bad.text()
    );
    let short = w.api(
        "POST",
        "/v1/users",
        Some(json!({"name": "y", "password": "short", "clearance": "SECRET"})),
    );
    assert_eq!(short.status, 400);
    assert_eq!(
        w.api(
            "POST",
            "/v1/users",
            Some(json!({"name": "erin", "password": "another-pass", "clearance": "SECRET"}))
        )
        .status,
        409
    );

    assert_eq!(w.api("DELETE", "/v1/users/erin", None).status, 204);
    assert_eq!(
        w.get_as("erin", "erin-password-1", "/apps/demo/").status,
        401,
        "a removed user is refused"
    );
}

#[test]
fn lattice_changes_that_strand_users_are_refused() {
    let w = Warden::demo(BIN);
    assert_eq!(
        w.api("GET", "/v1/lattice", None).json()["levels"][0],
        "UNCLASSIFIED"
    );
    let r = w.api(
        "PUT",
        "/v1/lattice",
        Some(json!({"levels": ["LOW", "HIGH"]})),
    );
    assert_eq!(r.status, 409);
    assert!(r.json()["error"].as_str().unwrap().contains("alice"));
    assert_eq!(
        w.api("PUT", "/v1/lattice", Some(json!({"levels": []})))
            .status,
        400
    );
}

#[test]
fn instances_start_list_and_kill() {
    let w = Warden::demo(BIN);
    let started = w.api(
        "POST",
        "/v1/instances",
        Some(json!({"app": "demo", "label": "SECRET"})),
    );
    assert_eq!(started.status, 201, "{}", started.text());
    let rec = started.json();
    assert_eq!(rec["state"], "ready");
    // Alice (SECRET) is served by the instance started through the API.
    let served = w
        .get_as("alice", &w.password("alice"), "/apps/demo/")
        .json();
    assert_eq!(served["instance"], rec["id"]);
    let id = rec["id"].as_str().unwrap();
    assert_eq!(
        w.api("DELETE", &format!("/v1/instances/{id}"), None).status,
        204
    );
    assert_eq!(w.instances().len(), 0);
    assert_eq!(
        w.api("DELETE", &format!("/v1/instances/{id}"), None).status,
        404
    );
    let again = w
        .get_as("alice", &w.password("alice"), "/apps/demo/")
        .json();
    assert_ne!(
        again["instance"], rec["id"],
        "a killed instance is replaced on the next request"
    );

    assert_eq!(
        w.api(
            "POST",
            "/v1/instances",
            Some(json!({"app": "nope", "label": "SECRET"}))
        )
        .status,
        404
    );
    assert_eq!(
        w.api(
            "POST",
            "/v1/instances",
            Some(json!({"app": "demo", "label": "COSMIC"}))
        )
        .status,
        400
    );
}

#[test]
fn nodes_and_status() {
    let w = Warden::demo(BIN);
    let nodes = w.api("GET", "/v1/nodes", None).json();
    assert_eq!(nodes.as_array().unwrap().len(), 1);
    assert_eq!(nodes[0]["pid"].as_u64(), Some(w.pid() as u64));
    w.get_as("alice", &w.password("alice"), "/apps/demo/");
    let status = w.api("GET", "/v1/status", None).json();
    assert_eq!(
        (status["nodes"].as_u64(), status["users"].as_u64()),
        (Some(1), Some(4))
    );
    assert_eq!(status["apps"][0]["instances"]["SECRET"], 1);
}

/// A gzip'd tar of a one-page static site.
pub(crate) fn site_archive() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let page = b"<h1>docs</h1>";
    let mut h = tar::Header::new_gnu();
    h.set_size(page.len() as u64);
    h.set_mode(0o644);
    b.append_data(&mut h, "index.html", &page[..]).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &b.into_inner().unwrap()).unwrap();
    gz.finish().unwrap()
}
