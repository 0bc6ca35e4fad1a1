//! Faults of the data plane through `warden up` (issue 34): the private PostgreSQL killed
//! comes back by itself while instances and other apps keep serving, and a flood of
//! connections from one app's instance costs only that app. Skipped where PostgreSQL 15 is
//! not installed.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;
use warden_test_support::http::basic;
use warden_test_support::{request, wait_until, Launch, Response, Warden};

use crate::data_apps::{notes, postgres_installed, PASSWORD, PSQL};
use crate::BIN;

/// What the proxy tells a client while the server is away.
const UNREACHABLE: &str = "warden cannot reach the app's database";

/// A warden with a private PostgreSQL under a data dir the `postgres` user can reach, one
/// user `ursula` at U, a plain app without data, and data apps `names`, each with a `notes`
/// table, running `data/notes.py`.
struct Setup {
    w: Warden,
    data_dir: PathBuf,
    _app_dir: tempfile::TempDir,
    _top: tempfile::TempDir,
}

impl Setup {
    fn start(names: &[&str]) -> Setup {
        let app_dir = crate::open_dir();
        let script = app_dir.path().join("notes.py");
        std::fs::write(&script, include_str!("data/notes.py")).unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        let (top, data_dir) = crate::data_apps::data_dir_postgres_reaches();
        let w = Launch::new(BIN)
            .no_demo()
            .with_data()
            .data_dir(&data_dir)
            .start();
        let lattice = json!({ "levels": ["U"] });
        assert_eq!(w.api("PUT", "/v1/lattice", Some(lattice)).status, 200);
        let user = json!({ "name": "ursula", "password": PASSWORD, "clearance": "U" });
        let r = w.api("POST", "/v1/users", Some(user));
        assert_eq!(r.status, 201, "{}", r.text());
        w.create_demo_app(&crate::app_bin(), "plain", json!({}));
        for name in names {
            let spec = json!({
                "name": name,
                "command": ["python3", &script],
                "workdir": app_dir.path(),
                "driver": "process",
                "data": true,
                "start_timeout_ms": 30000,
            });
            let r = w.api("POST", "/v1/apps", Some(spec));
            assert_eq!(r.status, 201, "{}", r.text());
            migrate(&data_dir, &format!("warden_app_{name}"));
        }
        Setup {
            w,
            data_dir,
            _app_dir: app_dir,
            _top: top,
        }
    }

    fn get(&self, app: &str, path: &str) -> Response {
        request(
            "GET",
            &format!("{}/apps/{app}/{path}", self.w.gateway),
            &[("authorization", &basic("ursula", PASSWORD))],
            b"",
        )
    }

    /// What `app` answers at `path` (`""`: the notes it lists; `?add=TEXT`: adds one and
    /// lists none), which must be 200.
    fn notes(&self, app: &str, path: &str) -> Vec<String> {
        let r = self.get(app, path);
        assert_eq!(r.status, 200, "{}", r.text());
        notes(&r.json())
    }

    /// The postmaster's pid, from its lock file.
    fn postmaster(&self) -> i32 {
        let pid_file = self.data_dir.join("postgres/pgdata/postmaster.pid");
        let text = std::fs::read_to_string(&pid_file).unwrap();
        text.lines().next().unwrap().trim().parse().unwrap()
    }
}

/// The app's `notes` table, owned by its owner role, as a release migration would make it;
/// run as warden's admin over psql (peer authentication: the test is warden's OS user).
fn migrate(data_dir: &Path, db: &str) {
    const MIGRATION: &str = "DO $$ DECLARE o text; BEGIN \
        SELECT rolname INTO o FROM pg_roles WHERE rolname LIKE 'wo\\_%' \
          AND has_database_privilege(rolname, current_database(), 'CONNECT'); \
        CREATE TABLE IF NOT EXISTS public.notes (id serial PRIMARY KEY, body text NOT NULL); \
        EXECUTE format('ALTER TABLE public.notes OWNER TO %I', o); END $$;";
    let out = Command::new(PSQL)
        .args(["-X", "-At", "-v", "ON_ERROR_STOP=1", "-h"])
        .arg(data_dir.join("postgres").join("run"))
        .args(["-U", "warden_admin", "-d", db, "-c", MIGRATION])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_killed_private_postgres_comes_back_while_instances_and_other_apps_serve() {
    if !postgres_installed() {
        return;
    }
    let s = Setup::start(&["notes"]);
    assert_eq!(s.notes("notes", "?add=before"), Vec::<String>::new());
    assert_eq!(s.notes("notes", ""), vec!["before"]);
    let instance = |s: &Setup| -> Vec<String> {
        s.w.instances()
            .iter()
            .filter(|i| i["app"] == "notes")
            .map(|i| i["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let before = instance(&s);
    assert_eq!(before.len(), 1, "{before:?}");

    let first = s.postmaster();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Until it is back, each data request either succeeds or says plainly that the database
    // is unreachable and comes back by itself (or, for a pooled session whose backend had not
    // yet seen its postmaster die, PostgreSQL's own words for that); never a hang, never
    // anything else. The app's own routes that need no data, and an app without data, answer
    // all along.
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut said_unreachable = 0;
    loop {
        let r = s.get("notes", "");
        if r.status == 200 {
            assert_eq!(notes(&r.json()), vec!["before"]);
            break;
        }
        let text = r.text();
        let clear = text.contains(UNREACHABLE) && text.contains("retries by itself");
        let postgres_said =
            text.contains("terminating connection due to unexpected postmaster exit");
        assert!(
            r.status == 500 && (clear || postgres_said),
            "{}: {text}",
            r.status
        );
        said_unreachable += 1;
        assert_eq!(s.get("notes", "env").status, 200);
        assert_eq!(s.get("plain", "").status, 200);
        assert!(
            Instant::now() < deadline,
            "the private PostgreSQL never came back"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("{said_unreachable} requests were told the database was unreachable");
    // A new postmaster, the same instance (its socket needed no restart), rows kept.
    assert_ne!(s.postmaster(), first);
    assert_eq!(instance(&s), before);
    assert_eq!(s.notes("notes", "?add=after"), Vec::<String>::new());
    assert_eq!(s.notes("notes", ""), vec!["before", "after"]);
    assert_eq!(s.get("plain", "").status, 200);
}

/// One client's answer to its startup: `Ok(())` when it got a session, else the SQLSTATE
/// and message of the error it got.
fn answer(s: &mut UnixStream) -> Result<(), (String, String)> {
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    loop {
        let mut head = [0u8; 5];
        if let Err(e) = s.read_exact(&mut head) {
            return Err((String::new(), format!("closed without a word: {e}")));
        }
        let len = i32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize - 4;
        let mut body = vec![0u8; len];
        s.read_exact(&mut body).unwrap();
        match head[0] {
            b'Z' => return Ok(()),
            b'E' => {
                let field = |f: u8| {
                    body.split(|&b| b == 0)
                        .find(|x| x.first() == Some(&f))
                        .map(|x| String::from_utf8_lossy(&x[1..]).into_owned())
                        .unwrap_or_default()
                };
                return Err((field(b'C'), field(b'M')));
            }
            _ => {}
        }
    }
}

fn startup() -> Vec<u8> {
    let mut body = 196_608i32.to_be_bytes().to_vec();
    body.extend_from_slice(b"user\0flood\0\0");
    let mut out = ((body.len() + 4) as i32).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

#[test]
fn a_flood_of_connections_from_one_apps_instance_costs_only_that_app() {
    if !postgres_installed() {
        return;
    }
    let s = Setup::start(&["flood", "calm"]);
    assert_eq!(s.notes("flood", ""), Vec::<String>::new());
    assert_eq!(s.notes("calm", "?add=one"), Vec::<String>::new());
    // The flooding instance's socket, where its code would connect.
    let env = s.get("flood", "env").json();
    let socket = Path::new(env["PGHOST"].as_str().unwrap()).join(".s.PGSQL.5432");

    // 200 clients at once, each held open: twice the instance's own bound of clients, and
    // far past its app's bound of server connections.
    let mut flood: Vec<UnixStream> = (0..200)
        .map(|_| {
            let mut c = UnixStream::connect(&socket).unwrap();
            c.write_all(&startup()).unwrap();
            c
        })
        .collect();
    // Meanwhile, another data app reads and writes.
    assert_eq!(s.notes("calm", "?add=two"), Vec::<String>::new());
    assert_eq!(s.notes("calm", ""), vec!["one", "two"]);

    let answers: Vec<_> = flood.iter_mut().map(answer).collect();
    // Each distinct answer and how many got it, for a readable failure.
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    for a in &answers {
        *seen.entry(format!("{a:?}")).or_default() += 1;
    }
    let served = answers.iter().filter(|a| a.is_ok()).count();
    assert!((1..=32).contains(&served), "{seen:#?}");
    let refusals: Vec<&(String, String)> =
        answers.iter().filter_map(|a| a.as_ref().err()).collect();
    assert!(
        refusals.iter().all(|(code, _)| code == "53300"),
        "{seen:#?}"
    );
    // Some were refused by the app's bound of server connections, not only by the
    // instance's bound of clients, and none by PostgreSQL running out.
    assert!(
        refusals
            .iter()
            .any(|(_, m)| m.contains("server connections are in use")),
        "{seen:#?}"
    );
    assert!(
        !refusals
            .iter()
            .any(|(_, m)| m.contains("PostgreSQL refused")),
        "{seen:#?}"
    );
    // Still held: the other app is served, and the flooding app itself once they go.
    assert_eq!(s.notes("calm", ""), vec!["one", "two"]);
    drop(flood);
    wait_until(
        "the flooding app to be served again",
        Duration::from_secs(30),
        || (s.get("flood", "").status == 200).then_some(()),
    );
}
