//! `--data` on a cluster (issue 34): every node points at the same PostgreSQL and derives the
//! same data key from the cluster's secrets, so instances of one label on two nodes share their
//! rows and their role's password, whichever node attached last.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use warden_data::server::Server;
use warden_test_support::etcd::EtcdCluster;
use warden_test_support::{wait_until, Warden};

use crate::cluster::node;
use crate::data_apps::{notes_app, postgres_installed, MIGRATION, PSQL};
use crate::healing::agent;

/// One PostgreSQL for the whole test, as an operator's would be: warden-data's private server
/// in a directory of its own, reached on its Unix socket. Stopped on drop.
struct TestPostgres {
    server: Option<Server>,
    runtime: tokio::runtime::Runtime,
    dir: tempfile::TempDir,
}

impl TestPostgres {
    fn start() -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let server = runtime
            .block_on(Server::private(dir.path()))
            .expect("the test's PostgreSQL starts");
        Self {
            server: Some(server),
            runtime,
            dir,
        }
    }

    fn socket_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    /// The admin URL every node is given. Its password is one the server never asks for (the
    /// admin logs in by peer authentication, as root, which warden and this test run as): it
    /// is there to show that no node prints it.
    fn url(&self) -> String {
        format!(
            "postgresql://warden_admin:hunter2@/postgres?host={}",
            self.socket_dir().display()
        )
    }

    /// Runs `sql` in `db` as the admin.
    fn admin(&self, db: &str, sql: &str) -> String {
        psql(&self.socket_dir(), "warden_admin", db, sql).unwrap()
    }
}

impl Drop for TestPostgres {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            self.runtime.block_on(s.shutdown());
        }
    }
}

/// psql at the socket in `host` as `user`: its output, or its error.
fn psql(host: &Path, user: &str, db: &str, sql: &str) -> Result<String, String> {
    let out = Command::new(PSQL)
        .args(["-X", "-At", "-v", "ON_ERROR_STOP=1", "-h"])
        .arg(host)
        .args(["-U", user, "-d", db, "-c", sql])
        .output()
        .unwrap();
    match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

/// SQL through the socket of instance `id` of `node`, the way the instance itself reaches its
/// database (the socket logs in as the instance's role; the user psql names is ignored).
fn through_instance(node: &Warden, id: &str, sql: &str) -> Result<String, String> {
    let dir = node.dir.join("instances").join(id).join("pg");
    psql(&dir, "warden", "warden_app_notes", sql)
}

/// The ready instances of the notes app at U: node → id.
fn ready_at_u(api: &Warden) -> Vec<(String, String)> {
    let mut all: Vec<(String, String)> = api
        .instances()
        .iter()
        .filter(|i| i["app"] == "notes" && i["label"] == "U" && i["state"] == "ready")
        .map(|i| {
            (
                i["node"].as_str().unwrap().to_owned(),
                i["id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    all.sort();
    all
}

#[test]
fn nodes_of_a_cluster_share_one_postgresql_and_one_password_per_role() {
    if !postgres_installed() {
        return;
    }
    let pg = TestPostgres::start();
    let url = pg.url();
    let cluster = EtcdCluster::start(1);
    let alpha = node(
        &cluster,
        "alpha",
        &["--roles", "gateway,api", "--data", &url],
    )
    .start();
    let beta = agent(&cluster, &alpha, "beta", "127.0.0.2:0", &["--data", &url]);
    let gamma = agent(&cluster, &alpha, "gamma", "127.0.0.3:0", &["--data", &url]);
    for w in [&alpha, &beta, &gamma] {
        let out = w.stdout();
        assert!(
            out.contains("data lives in external postgres://warden_admin@"),
            "{out}"
        );
        assert!(!out.contains("hunter2") && !w.stderr().contains("hunter2"));
        // The key comes from the cluster's secrets: no node keeps one of its own.
        assert!(!w.dir.join("data-key").exists());
    }

    let app_dir = notes_app();
    let lattice = json!({ "levels": ["U", "S"] });
    assert_eq!(alpha.api("PUT", "/v1/lattice", Some(lattice)).status, 200);
    let spec = json!({
        "name": "notes",
        "command": ["python3", app_dir.path().join("notes.py")],
        "workdir": app_dir.path(),
        "driver": "process",
        "data": true,
        "start_timeout_ms": 30000,
    });
    let r = alpha.api("POST", "/v1/apps", Some(spec));
    assert_eq!(r.status, 201, "{}", r.text());
    pg.admin("warden_app_notes", MIGRATION);
    // Two instances at U kept: the scheduler puts one on each agent node, and each node
    // attaches its own (sets the role's password from its data key).
    let r = alpha.api(
        "PATCH",
        "/v1/apps/notes",
        Some(json!({ "desired": { "U": 2 } })),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let placed = wait_until(
        "one notes instance at U on each node",
        Duration::from_secs(60),
        || {
            let r = ready_at_u(&alpha);
            (r.len() == 2 && r[0].0 == "beta" && r[1].0 == "gamma").then_some(r)
        },
    );
    let (on_beta, on_gamma) = (placed[0].1.clone(), placed[1].1.clone());

    // A row written by the instance on beta is read by the instance on gamma, and back.
    through_instance(
        &beta,
        &on_beta,
        "INSERT INTO notes (body) VALUES ('from beta')",
    )
    .unwrap();
    through_instance(
        &gamma,
        &on_gamma,
        "INSERT INTO notes (body) VALUES ('from gamma')",
    )
    .unwrap();
    for (w, id) in [(&beta, &on_beta), (&gamma, &on_gamma)] {
        let seen = through_instance(w, id, "SELECT body FROM notes ORDER BY id").unwrap();
        assert_eq!(seen, "from beta\nfrom gamma\n");
    }

    // beta attaches again (its instance replaced): the role's password it sets is the one
    // gamma's socket logs in with, so gamma's next login, with no pooled connection left to
    // reuse, still works.
    assert_eq!(
        alpha
            .api("DELETE", &format!("/v1/instances/{on_beta}"), None)
            .status,
        204
    );
    let again = wait_until(
        "a new notes instance at U on beta",
        Duration::from_secs(60),
        || {
            ready_at_u(&alpha)
                .into_iter()
                .find(|(n, id)| n == "beta" && *id != on_beta)
                .map(|(_, id)| id)
        },
    );
    through_instance(&beta, &again, "SELECT count(*) FROM notes").unwrap();
    // Every label role's server connection ends (the pools' idle ones too), waiting for each.
    let ended = pg.admin(
        "postgres",
        "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity \
         WHERE usename LIKE 'wl\\_%'",
    );
    assert!(ended.lines().any(|l| l == "t"), "{ended}");
    let seen = through_instance(&gamma, &on_gamma, "SELECT body FROM notes ORDER BY id")
        .unwrap_or_else(|e| panic!("gamma's instance can no longer log in: {e}"));
    assert_eq!(seen, "from beta\nfrom gamma\n");
    let r = alpha.api("GET", "/v1/apps/notes", None).json();
    assert_eq!(r["data"], Value::Bool(true));
}

#[test]
fn a_cluster_node_without_data_url_has_no_data_and_says_to_pass_one() {
    let cluster = EtcdCluster::start(1);
    let w = node(&cluster, "n1", &[]).with_data().start();
    let out = w.stdout();
    assert!(out.contains("data lives in none"), "{out}");
    assert!(out.contains("--data postgres://ADMIN@HOST/DB"), "{out}");
    let r = w.api(
        "POST",
        "/v1/apps",
        Some(json!({ "name": "notes", "command": ["python3"], "data": true })),
    );
    assert_eq!(r.status, 400, "{}", r.text());
}
