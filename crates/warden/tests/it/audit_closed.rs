//! When the audit log cannot write (issue 35, "disk full in both modes"), through the binary on
//! a small tmpfs: with `--audit on` a user's requests are served while the disk is full, the
//! alarm is in `/readyz`, `/metrics` and `warden status`, and once space is back the gap says
//! what was lost; with `--audit required` the same requests, a sign-in and API changes get 503
//! saying why, reads of the API still answer, and once space is back warden serves again by
//! itself, the refused change was never acted on and the log verifies. And the API's refusals
//! of its token are recorded, summed, without the token.

use std::time::Duration;

use serde_json::{json, Value};
use warden_test_support::http::{basic, h2c_get};
use warden_test_support::{cli, request, wait_until, Launch, Warden};

use crate::store_durability::SmallDisk;
use crate::BIN;

const PASSWORD: &str = "correct horse battery";

fn run(w: &Warden, args: &[&str]) -> (bool, String, String) {
    let env = [
        ("WARDEN_API", w.api.as_str()),
        ("WARDEN_TOKEN", w.token.as_str()),
    ];
    cli(BIN, args, &env)
}

/// A user's GET of the app `web` through the gateway.
fn get_app(w: &Warden) -> warden_test_support::http::Response {
    request(
        "GET",
        &format!("{}/apps/web/", w.gateway),
        &[("authorization", &basic("ann", PASSWORD))],
        b"",
    )
}

/// What [`on_small_disk`] made: drop the warden first, then its data dir and the disk.
type OnSmallDisk = (Warden, tempfile::TempDir, SmallDisk);

/// warden with `--audit mode` whose audit log lies on a 16 MiB tmpfs of its own (the data dir's
/// `audit` a link to it), so that filling it fails the log's writes and nothing else: what a
/// change does then is the log's doing, not the store's. With a user and an app that answered
/// once; `None` when not root (no tmpfs). The gateway flushes its sums only each minute, so
/// the API changes are what first meets the full disk.
fn on_small_disk(mode: &str) -> Option<OnSmallDisk> {
    let Some(disk) = SmallDisk::mount(16) else {
        eprintln!(
            "needs root to mount a small tmpfs; the audit log on a full disk is not exercised"
        );
        return None;
    };
    let data = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(disk.path(), data.path().join("audit")).unwrap();
    let w = Launch::new(BIN)
        .data_dir(data.path())
        .no_demo()
        .arg("--audit")
        .arg(mode)
        .start();
    let lattice = json!({ "levels": ["LOW", "HIGH"] });
    assert_eq!(w.api("PUT", "/v1/lattice", Some(lattice)).status, 200);
    let user = json!({ "name": "ann", "password": PASSWORD, "clearance": "LOW" });
    let r = w.api("POST", "/v1/users", Some(user));
    assert_eq!(r.status, 201, "{}", r.text());
    w.create_demo_app(BIN, "web", json!({}));
    assert_eq!(get_app(&w).status, 200, "{}", get_app(&w).text());
    Some((w, data, disk))
}

/// API changes until the audit log's writes fail (the disk is full): the last answer, and the
/// apps created on the way.
fn until_the_log_fails(w: &Warden, required: bool) -> (String, u16, Value, Vec<String>) {
    let mut created = Vec::new();
    for i in 0..2000 {
        let name = format!("during{i}");
        let r = w.api(
            "POST",
            "/v1/apps",
            Some(json!({"name": name, "command": ["/bin/true"]})),
        );
        let failing = match required {
            true => r.status == 503 && r.text().contains("audit log cannot write"),
            false => w.api("GET", "/readyz", None).json().get("audit").is_some(),
        };
        if failing {
            return (name, r.status, r.json(), created);
        }
        if r.status == 201 {
            created.push(name);
        }
    }
    panic!("the audit log never failed on a full disk");
}

/// The gap records' lost counts, once space is back.
fn gaps_lost(w: &Warden) -> u64 {
    let (ok, out, err) = run(w, &["audit", "--kind", "gap", "--json"]);
    assert!(ok, "{err}");
    let gaps: Vec<Value> = serde_json::from_str(&out).unwrap();
    gaps.iter()
        .filter(|g| {
            g["event"]["why"]
                .as_str()
                .unwrap_or("")
                .contains("cannot write")
        })
        .map(|g| g["event"]["lost"].as_u64().unwrap_or(0))
        .sum()
}

#[test]
fn with_audit_on_a_full_disk_serves_with_the_alarm_and_the_gap_counts_what_it_cost() {
    let Some((w, _data, disk)) = on_small_disk("on") else {
        return;
    };
    let filler = disk.fill();
    let (_, status, body, _) = until_the_log_fails(&w, false);
    // Not required: the change whose record failed went ahead (the gap counts it).
    assert_eq!(status, 201, "{body}");
    let served = get_app(&w);
    assert_eq!(
        served.status,
        200,
        "served while the log cannot write: {}",
        served.text()
    );
    let ready = w.api("GET", "/readyz", None).json();
    assert!(
        ready["audit"]
            .as_str()
            .unwrap_or("")
            .contains("cannot write"),
        "{ready}"
    );
    let metrics = request("GET", &format!("{}/metrics", w.api), &[], b"").text();
    assert!(metrics.contains("warden_audit_writing 0"), "{metrics}");
    let (_, out, _) = run(&w, &["status"]);
    assert!(
        out.contains("audit log: ") && out.contains("cannot write"),
        "{out}"
    );

    std::fs::remove_file(filler).unwrap();
    // Nothing needs to be recorded for the log to heal: its writer tries again by itself.
    wait_until("the alarm to clear", Duration::from_secs(60), || {
        w.api("GET", "/readyz", None)
            .json()
            .get("audit")
            .is_none()
            .then_some(())
    });
    assert!(gaps_lost(&w) > 0, "no gap counts what the full disk cost");
    let (ok, out, err) = run(&w, &["audit", "verify"]);
    assert!(ok, "{out}{err}");
}

#[test]
fn with_audit_required_a_full_disk_refuses_access_and_changes_until_space_is_back() {
    let Some((w, _data, disk)) = on_small_disk("required") else {
        return;
    };
    let operator = json!({"name": "op", "password": PASSWORD, "roles": [{"role": "owner"}]});
    assert_eq!(w.api("POST", "/v1/operators", Some(operator)).status, 201);
    let filler = disk.fill();
    let (refused_app, status, body, made) = until_the_log_fails(&w, true);
    assert_eq!(status, 503, "{body}");
    let why = body["error"].as_str().unwrap_or_default().to_owned();
    assert!(
        why.contains("refuses access until it can: free space under"),
        "{why}"
    );
    assert!(!why.contains(&w.token), "{why}");

    // The gateway: an app's request and a sign-in get 503 saying why.
    let r = get_app(&w);
    assert_eq!(
        r.status,
        503,
        "served while the log cannot write: {}",
        r.text()
    );
    assert!(r.text().contains("audit log cannot write"), "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    // A browser gets it as a page to read.
    let page = request(
        "GET",
        &format!("{}/apps/web/", w.gateway),
        &[
            ("authorization", &basic("ann", PASSWORD)),
            ("accept", "text/html,application/xhtml+xml,*/*;q=0.8"),
        ],
        b"",
    );
    assert_eq!(page.status, 503);
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert!(
        page.text().contains("the audit log cannot write ("),
        "{}",
        page.text()
    );
    // The same over HTTP/2, which hyper serves, not the lane.
    let auth = basic("ann", PASSWORD);
    let (_, h2) = h2c_get(
        &format!("{}/apps/web/", w.gateway),
        &[("authorization", auth.as_str())],
    );
    assert_eq!(h2.status, 503, "served over HTTP/2: {}", h2.text());
    let login = request(
        "POST",
        &format!("{}/login", w.gateway),
        &[("content-type", "application/json")],
        json!({ "name": "ann", "password": PASSWORD })
            .to_string()
            .as_bytes(),
    );
    assert_eq!(login.status, 503, "{}", login.text());
    // So is an operator's login at the API.
    let login = request(
        "POST",
        &format!("{}/v1/login", w.api),
        &[("content-type", "application/json")],
        json!({ "name": "op", "password": PASSWORD })
            .to_string()
            .as_bytes(),
    );
    assert_eq!(login.status, 503, "{}", login.text());
    // Any API change is refused; reads still answer, so the operator sees why.
    let another = w.api(
        "POST",
        "/v1/apps",
        Some(json!({"name": "refused-too", "command": ["/bin/true"]})),
    );
    assert_eq!(another.status, 503, "{}", another.text());
    assert_eq!(w.api("GET", "/v1/apps", None).status, 200);
    let ready = w.api("GET", "/readyz", None).json();
    assert!(
        ready["audit"]
            .as_str()
            .unwrap_or("")
            .contains("cannot write"),
        "{ready}"
    );

    std::fs::remove_file(filler).unwrap();
    // Nothing is recorded while access is refused: the writer heals by itself.
    wait_until("access to resume", Duration::from_secs(60), || {
        (get_app(&w).status == 200).then_some(())
    });
    for name in [refused_app.as_str(), "refused-too"] {
        let r = w.api("GET", &format!("/v1/apps/{name}"), None);
        assert_eq!(
            r.status,
            404,
            "a refused change was acted on: {name}: {}",
            r.text()
        );
    }
    let created = w.api(
        "POST",
        "/v1/apps",
        Some(json!({"name": "after", "command": ["/bin/true"]})),
    );
    assert_eq!(created.status, 201, "{}", created.text());
    assert!(gaps_lost(&w) > 0, "no gap counts what the full disk cost");
    // Every change acted on was on disk before: none went ahead when its record failed.
    let r = w.api("GET", "/v1/audit?kind=change&limit=100000", None);
    let changes: Vec<Value> = serde_json::from_value(r.json()).unwrap();
    for name in &made {
        assert!(
            changes.iter().any(
                |c| c["event"]["target"] == name.as_str() && c["event"]["outcome"] == "pending"
            ),
            "{name} was created without its change on disk"
        );
    }
    let (ok, out, err) = run(&w, &["audit", "verify"]);
    assert!(ok, "{out}{err}");
}

#[test]
fn the_apis_refusals_of_its_token_are_summed_per_period_without_the_token() {
    let w = Launch::new(BIN)
        .no_demo()
        .arg("--audit-flush-ms")
        .arg("1000")
        .start();
    let wrong = "not-the-token-0123456789abcdef";
    for _ in 0..30 {
        let r = request(
            "GET",
            &format!("{}/v1/apps", w.api),
            &[("authorization", &format!("Bearer {wrong}"))],
            b"",
        );
        assert_eq!(r.status, 401);
    }
    for _ in 0..10 {
        let r = request("POST", &format!("{}/v1/users", w.api), &[], b"{}");
        assert_eq!(r.status, 401);
    }
    let sums = |route: &str| -> (u64, usize) {
        let r = w.api("GET", "/v1/audit?kind=refusal&limit=10000", None);
        let records: Vec<Value> = serde_json::from_value(r.json()).unwrap();
        let mine: Vec<&Value> = records
            .iter()
            .map(|r| &r["event"])
            .filter(|e| e["route"] == route)
            .collect();
        for e in &mine {
            assert_eq!(
                (e["status"].as_u64(), e["addr"].as_str()),
                (Some(401), Some("127.0.0.1")),
                "{e}"
            );
        }
        (
            mine.iter().map(|e| e["count"].as_u64().unwrap()).sum(),
            mine.len(),
        )
    };
    let (apps, records) = wait_until(
        "the refusals to be flushed",
        Duration::from_secs(30),
        || {
            let (n, records) = sums("/v1/apps");
            (n == 30 && sums("/v1/users").0 == 10).then_some((n, records))
        },
    );
    assert_eq!(apps, 30);
    // Summed: the 30 tries fell in a period or two of a second, not a record each.
    assert!(records <= 3, "{records} records for 30 refusals");
    let log = std::fs::read_dir(w.dir.join("audit"))
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap_or_default())
        .collect::<String>();
    assert!(!log.contains(wrong), "a presented token reached the log");
}
