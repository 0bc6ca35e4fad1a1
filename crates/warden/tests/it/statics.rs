//! Static files served by the gateway itself, through the real binary.

use serde_json::json;
use warden_test_support::http::{basic, raw};
use warden_test_support::{request, Warden};

use crate::BIN;

fn site(w: &Warden) -> (String, std::path::PathBuf) {
    // Beside the data directory, never in it.
    let root = w.dir.parent().unwrap().join("site");
    std::fs::create_dir_all(root.join("docs")).unwrap();
    std::fs::write(root.join("style.css"), "body { color: red }\n").unwrap();
    std::fs::write(root.join("docs/index.html"), "<h1>docs</h1>").unwrap();
    std::fs::write(w.dir.join("outside.txt"), "secret outside").unwrap();
    std::os::unix::fs::symlink(w.dir.join("outside.txt"), root.join("escape.txt")).unwrap();
    let spec = json!({"name": "site", "command": [BIN, "demo-app"], "static_dir": root.display().to_string(), "static_prefix": "/assets/"});
    assert_eq!(w.api("POST", "/v1/apps", Some(spec)).status, 201);
    (basic("alice", &w.password("alice")), root)
}

#[test]
fn files_come_with_type_validators_and_ranges_without_starting_an_instance() {
    let w = Warden::demo(BIN);
    let (auth, _) = site(&w);
    let url = format!("{}/apps/site/assets/style.css", w.gateway);
    let r = request("GET", &url, &[("authorization", &auth)], b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "body { color: red }\n");
    assert!(r.header("content-type").unwrap().starts_with("text/css"));
    let etag = r.header("etag").unwrap().to_owned();
    let modified = r.header("last-modified").unwrap().to_owned();

    assert_eq!(
        request(
            "GET",
            &url,
            &[("authorization", &auth), ("if-none-match", &etag)],
            b""
        )
        .status,
        304
    );
    assert_eq!(
        request(
            "GET",
            &url,
            &[("authorization", &auth), ("if-modified-since", &modified)],
            b""
        )
        .status,
        304
    );
    assert_eq!(
        request(
            "GET",
            &url,
            &[("authorization", &auth), ("if-none-match", "\"other\"")],
            b""
        )
        .status,
        200
    );

    let part = request(
        "GET",
        &url,
        &[("authorization", &auth), ("range", "bytes=0-3")],
        b"",
    );
    assert_eq!((part.status, part.text().as_str()), (206, "body"));
    assert_eq!(part.header("content-range"), Some("bytes 0-3/20"));
    let past = request(
        "GET",
        &url,
        &[("authorization", &auth), ("range", "bytes=100-")],
        b"",
    );
    assert_eq!(
        (past.status, past.header("content-range")),
        (416, Some("bytes */20"))
    );
    // An end past the file is the file's end, however many digits it has.
    for end in ["18446744073709551615", "99999999999999999999999"] {
        let r = request(
            "GET",
            &url,
            &[
                ("authorization", &auth),
                ("range", &format!("bytes=16-{end}")),
            ],
            b"",
        );
        assert_eq!(
            (r.status, r.header("content-range")),
            (206, Some("bytes 16-19/20")),
            "{end}"
        );
    }

    let head = request("HEAD", &url, &[("authorization", &auth)], b"");
    assert_eq!(
        (head.status, head.header("content-length")),
        (200, Some("20"))
    );
    assert_eq!(
        request("POST", &url, &[("authorization", &auth)], b"x").status,
        405
    );
    let index = request(
        "GET",
        &format!("{}/apps/site/assets/docs/", w.gateway),
        &[("authorization", &auth)],
        b"",
    );
    assert_eq!(
        (index.status, index.text().as_str()),
        (200, "<h1>docs</h1>")
    );

    assert!(
        w.instances().is_empty(),
        "static files never start an instance"
    );
    assert_eq!(
        request("GET", &url, &[], b"").status,
        401,
        "static files need a signed-in user too"
    );
}

#[test]
fn no_traversal_or_symlink_escape() {
    let w = Warden::demo(BIN);
    let (auth, _) = site(&w);
    let h = w.gateway.trim_start_matches("http://").to_owned();
    for path in [
        "/apps/site/assets/../../outside.txt",
        "/apps/site/assets/%2e%2e/%2e%2e/outside.txt",
        "/apps/site/assets/..%2f..%2foutside.txt",
        "/apps/site/assets/escape.txt",
        "/apps/site/assets/docs/../../outside.txt",
        "/apps/site/assets/%00",
    ] {
        let r = raw(&h, format!("GET {path} HTTP/1.1\r\nhost: x\r\nauthorization: {auth}\r\nconnection: close\r\n\r\n").as_bytes());
        assert!(r.status == 404 || r.status == 400, "{path}: {}", r.status);
        assert!(
            !r.text().contains("secret outside"),
            "{path} leaked a file outside the root"
        );
    }
}

#[test]
fn no_app_may_serve_warden_s_own_data_as_static_files() {
    let w = Warden::demo(BIN);
    let data = std::fs::canonicalize(&w.dir).unwrap();
    for dir in [
        "/".to_owned(),
        data.display().to_string(),
        data.parent().unwrap().display().to_string(),
        data.join("tls").display().to_string(),
    ] {
        let spec = json!({"name": "leak", "command": [BIN, "demo-app"], "static_dir": dir});
        let r = w.api("POST", "/v1/apps", Some(spec));
        assert_eq!(r.status, 400, "{dir}: {}", r.text());
        assert!(r.text().contains("data directory"), "{}", r.text());
    }
}

/// A static directory is judged when a file is served, not only when the app is written: a
/// path that did not exist then, made a symlink to warden's data directory (or to a directory
/// holding it) later, serves nothing of warden's.
#[test]
fn a_static_dir_made_a_symlink_later_serves_nothing_of_warden_s() {
    let w = Warden::demo(BIN);
    let data = std::fs::canonicalize(&w.dir).unwrap();
    let parent = data.parent().unwrap();
    let root = parent.join("later");
    let spec = json!({"name": "later", "command": [BIN, "demo-app"], "static_dir": root.display().to_string(), "static_prefix": "/assets/"});
    assert_eq!(w.api("POST", "/v1/apps", Some(spec)).status, 201);
    let token = std::fs::read_to_string(data.join("admin-token")).unwrap();
    let auth = basic("alice", &w.password("alice"));
    let get = |path: &str| {
        let url = format!("{}/apps/later/assets/{path}", w.gateway);
        request("GET", &url, &[("authorization", &auth)], b"")
    };

    std::os::unix::fs::symlink(&data, &root).unwrap();
    for path in ["admin-token", "tls/demo-key.pem", "demo-users.json"] {
        let r = get(path);
        assert_eq!(r.status, 404, "{path}: {}", r.text());
        assert!(!r.text().contains(token.trim()));
    }

    std::fs::remove_file(&root).unwrap();
    std::os::unix::fs::symlink(parent, &root).unwrap();
    std::fs::write(parent.join("hello.txt"), "hello beside").unwrap();
    let r = get("hello.txt");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), "hello beside");
    let name = data.file_name().unwrap().to_str().unwrap();
    let r = get(&format!("{name}/admin-token"));
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(!r.text().contains(token.trim()));
}

/// `warden apps create --static-dir` (a relative path made absolute, as the gateway needs it)
/// and `--static-prefix`.
#[test]
fn static_files_are_set_from_the_cli() {
    let w = Warden::demo(BIN);
    let base = w.dir.parent().unwrap().to_owned();
    std::fs::create_dir_all(base.join("pub")).unwrap();
    std::fs::write(base.join("pub/hello.txt"), "hello from disk").unwrap();
    // Run from `base`, so that `pub` is relative to it.
    let out = std::process::Command::new(BIN)
        .current_dir(&base)
        .args([
            "apps",
            "create",
            "files2",
            "--static-dir",
            "pub",
            "--static-prefix",
            "/files/",
            "--data-dir",
            w.dir.to_str().unwrap(),
            "--",
            BIN,
            "demo-app",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let spec = w.api("GET", "/v1/apps/files2", None).json();
    assert_eq!(spec["static_dir"], base.join("pub").display().to_string());
    let r = w.get_as(
        "alice",
        &w.password("alice"),
        "/apps/files2/files/hello.txt",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), "hello from disk");
}

/// A file replaced by another of the same size and the same modification time (as a pushed
/// slug's files are: the archive gives them all time 0) is not "not modified": neither by its
/// old ETag nor by its old Last-Modified.
#[test]
fn a_file_replaced_by_one_of_the_same_size_and_time_is_served_anew() {
    let w = Warden::demo(BIN);
    let (auth, root) = site(&w);
    let replace = |text: &str| {
        let tmp = root.join("style.css.tmp");
        std::fs::write(&tmp, text).unwrap();
        let f = std::fs::File::options().write(true).open(&tmp).unwrap();
        f.set_modified(std::time::UNIX_EPOCH).unwrap();
        drop(f);
        std::fs::rename(&tmp, root.join("style.css")).unwrap();
    };
    replace("body { color: red }\n");
    let url = format!("{}/apps/site/assets/style.css", w.gateway);
    let r = request("GET", &url, &[("authorization", &auth)], b"");
    assert_eq!(r.status, 200);
    let (etag, modified) = (
        r.header("etag").unwrap().to_owned(),
        r.header("last-modified").unwrap().to_owned(),
    );
    // A second later, so that a clock of whole seconds sees the change too.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    replace("body { color: tan }\n");
    for validator in [
        ("if-none-match", etag.as_str()),
        ("if-modified-since", &modified),
    ] {
        let r = request("GET", &url, &[("authorization", &auth), validator], b"");
        assert_eq!(r.status, 200, "{validator:?}");
        assert_eq!(r.text(), "body { color: tan }\n");
    }
}
