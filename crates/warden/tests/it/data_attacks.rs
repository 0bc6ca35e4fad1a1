//! Issue 34's refusals attacked through `warden up`: a hostile app (data/attack.py) runs SQL
//! through its instance's DATABASE_URL, the socket warden gives it, as a real app would.
//! Each test asserts the refusal (PostgreSQL's SQLSTATE) and that the harm did not happen, as
//! warden's admin reads it with psql. Skipped where PostgreSQL 15 is not installed.
//! `crates/data/tests/attacks.rs` tries the same straight to PostgreSQL, without the proxy;
//! `data_sockets.rs` reaches for sockets not the instance's own.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use warden_test_support::http::basic;
use warden_test_support::{request, Launch, Warden};

use crate::data_apps::{admin_sql, postgres_installed, PASSWORD, PSQL};
use crate::BIN;

const DB: &str = "warden_app_vault";

/// The app's `notes` table, owned by its owner role, as a release migration would make it.
const MIGRATION: &str = "DO $$ DECLARE o text; BEGIN \
    SELECT rolname INTO o FROM pg_roles WHERE rolname LIKE 'wo\\_%' \
      AND has_database_privilege(rolname, current_database(), 'CONNECT'); \
    CREATE TABLE public.notes (id serial PRIMARY KEY, body text NOT NULL); \
    EXECUTE format('ALTER TABLE public.notes OWNER TO %I', o); END $$;";

/// A warden with the private PostgreSQL, users `ursula` (U) and `sam` (S), and the app
/// `vault` (data/attack.py) with its `notes` table, under `driver`.
pub(crate) struct Vault {
    pub(crate) w: Warden,
    pub(crate) data_dir: PathBuf,
    /// Mode 0711, so instances' uids reach their own directories under it.
    pub(crate) top: tempfile::TempDir,
    _app: tempfile::TempDir,
}

impl Vault {
    pub(crate) fn start(driver: &str) -> Option<Vault> {
        if !postgres_installed() {
            return None;
        }
        let app = crate::open_dir();
        let script = app.path().join("attack.py");
        std::fs::write(&script, include_str!("data/attack.py")).unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        let (top, data_dir) = crate::data_apps::data_dir_postgres_reaches();
        let w = Launch::new(BIN)
            .no_demo()
            .with_data()
            .data_dir(&data_dir)
            .start();
        let lattice = json!({ "levels": ["U", "S"] });
        assert_eq!(w.api("PUT", "/v1/lattice", Some(lattice)).status, 200);
        for (name, clearance) in [("ursula", "U"), ("sam", "S")] {
            let r = w.api(
                "POST",
                "/v1/users",
                Some(json!({ "name": name, "password": PASSWORD, "clearance": clearance })),
            );
            assert_eq!(r.status, 201, "{}", r.text());
        }
        let v = Vault {
            w,
            data_dir,
            top,
            _app: app,
        };
        v.create_app("vault", driver, true);
        admin_sql(&v.data_dir, DB, MIGRATION);
        Some(v)
    }

    /// Creates an app of the attack script named `name`.
    pub(crate) fn create_app(&self, name: &str, driver: &str, data: bool) {
        let spec = json!({
            "name": name,
            "command": ["python3", self._app.path().join("attack.py")],
            "workdir": self._app.path(),
            "driver": driver,
            "data": data,
            "start_timeout_ms": 30000,
        });
        let r = self.w.api("POST", "/v1/apps", Some(spec));
        assert_eq!(r.status, 201, "{}", r.text());
    }

    /// Runs `sql` in `user`'s instance: `{rc, out, err}`.
    pub(crate) fn sql(&self, user: &str, sql: &str) -> Value {
        let r = request(
            "POST",
            &format!("{}/apps/vault/sql", self.w.gateway),
            &[("authorization", &basic(user, PASSWORD))],
            sql.as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    }

    /// Runs `sql` in `user`'s instance, which must succeed; its output.
    pub(crate) fn ok(&self, user: &str, sql: &str) -> String {
        let v = self.sql(user, sql);
        assert_eq!(v["rc"], 0, "{user}: {sql}: {v}");
        v["out"].as_str().unwrap().to_owned()
    }

    /// Runs `sql` in `user`'s instance, which PostgreSQL must refuse with SQLSTATE `code`.
    pub(crate) fn refused(&self, user: &str, sql: &str, code: &str) {
        let v = self.sql(user, sql);
        let err = v["err"].as_str().unwrap_or_default();
        assert!(
            v["rc"] != 0 && err.contains(&format!("ERROR:  {code}:")),
            "{user}: {sql} must be refused with {code}: {v}"
        );
    }

    /// Tries to connect to the Unix socket `path` from `user`'s instance of `app`.
    pub(crate) fn peer(&self, app: &str, user: &str, path: &Path) -> Value {
        self.get(app, user, &format!("peer?path={}", path.display()))
    }

    /// `GET /apps/APP/PATH` as `user`: the JSON answer.
    pub(crate) fn get(&self, app: &str, user: &str, path: &str) -> Value {
        let r = request(
            "GET",
            &format!("{}/apps/{app}/{path}", self.w.gateway),
            &[("authorization", &basic(user, PASSWORD))],
            b"",
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    }

    /// `sql` in the app's database as warden's admin.
    pub(crate) fn admin(&self, sql: &str) -> String {
        admin_sql(&self.data_dir, DB, sql).trim().to_owned()
    }

    /// The host directory of the app's one instance at `label`.
    pub(crate) fn instance_dir(&self, label: &str) -> PathBuf {
        let ids: Vec<String> = self
            .w
            .instances()
            .iter()
            .filter(|i| i["app"] == "vault" && i["label"] == label)
            .map(|i| i["id"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(ids.len(), 1, "{ids:?}");
        self.data_dir.join("instances").join(&ids[0])
    }
}

/// A row's label is the writer's, whatever an insert or update sets, and no instance changes
/// a row of another label (write-down or write-up).
#[test]
fn an_instance_cannot_set_or_change_a_rows_label() {
    let Some(v) = Vault::start("sandbox") else {
        return;
    };
    v.ok("ursula", "INSERT INTO notes (body) VALUES ('low')");
    v.ok("sam", "INSERT INTO notes (body) VALUES ('high')");
    let id = |label: &str| {
        v.admin(&format!(
            "SELECT id FROM warden.labels WHERE label = '{label}'"
        ))
    };
    let (u, s) = (id("U"), id("S"));
    let label_of = |body: &str| {
        v.admin(&format!(
            "SELECT l.label || '/' || coalesce(n.warden_owner, '-') FROM notes n \
             JOIN warden.labels l ON l.id = n.warden_label WHERE n.body = '{body}'"
        ))
    };

    // S plants a row at U (write-down), naming a user too: the trigger stamps S's own.
    v.ok(
        "sam",
        &format!(
            "INSERT INTO notes (body, warden_label, warden_owner) VALUES ('planted', {u}, 'ursula')"
        ),
    );
    assert_eq!(label_of("planted"), "S/-");
    // S relabels its row down, U its row up: each stays where it was.
    v.ok(
        "sam",
        &format!("UPDATE notes SET warden_label = {u} WHERE body = 'high'"),
    );
    v.ok(
        "ursula",
        &format!("UPDATE notes SET warden_label = {s} WHERE body = 'low'"),
    );
    assert_eq!(label_of("high"), "S/-");
    assert_eq!(label_of("low"), "U/-");
    // S reads U's row but neither changes nor deletes it; U does not even see S's.
    for (user, sql) in [
        (
            "sam",
            "UPDATE notes SET body = 'overwritten' WHERE body = 'low' RETURNING id",
        ),
        ("sam", "DELETE FROM notes WHERE body = 'low' RETURNING id"),
        (
            "ursula",
            "UPDATE notes SET body = 'x' WHERE body = 'high' RETURNING id",
        ),
        (
            "ursula",
            "DELETE FROM notes WHERE body = 'high' RETURNING id",
        ),
    ] {
        assert_eq!(v.ok(user, sql), "", "{user}: {sql}");
    }
    assert_eq!(
        v.admin("SELECT string_agg(body, ',' ORDER BY id) FROM notes"),
        "low,high,planted"
    );
    assert_eq!(
        v.ok("ursula", "SELECT body FROM notes ORDER BY id"),
        "low\n"
    );
    assert_eq!(
        v.ok("sam", "SELECT body FROM notes ORDER BY id"),
        "low\nhigh\nplanted\n"
    );
}

/// No instance takes another role (the owner's, another label's) or reads a role's secrets.
#[test]
fn an_instance_cannot_take_another_role_or_read_role_secrets() {
    let Some(v) = Vault::start("sandbox") else {
        return;
    };
    v.ok("ursula", "SELECT 1");
    let mine = v.ok("sam", "SELECT session_user");
    let owner = admin_sql(
        &v.data_dir,
        "postgres",
        "SELECT rolname FROM pg_roles WHERE rolname LIKE 'wo\\_%'",
    );
    let u_role = v.admin(
        "SELECT r.role FROM warden.roles r JOIN warden.labels l ON l.id = r.label_id \
         WHERE l.label = 'U'",
    );
    let superusers = admin_sql(
        &v.data_dir,
        "postgres",
        "SELECT rolname FROM pg_roles WHERE rolsuper",
    );
    // PostgreSQL's predefined roles: programs, files, every table, other sessions.
    let predefined = [
        "pg_execute_server_program",
        "pg_read_server_files",
        "pg_write_server_files",
        "pg_read_all_data",
        "pg_write_all_data",
        "pg_monitor",
        "pg_signal_backend",
    ];
    let roles = [owner.trim(), u_role.as_str()]
        .into_iter()
        .chain(superusers.lines())
        .chain(predefined);
    for role in roles {
        v.refused("sam", &format!("SET ROLE \"{role}\""), "42501");
        v.refused(
            "sam",
            &format!("SET SESSION AUTHORIZATION \"{role}\""),
            "42501",
        );
    }
    for sql in [
        "SELECT rolname, rolpassword FROM pg_authid",
        "SELECT usename, passwd FROM pg_shadow",
        "SELECT rolname FROM pg_roles",
        "SELECT * FROM pg_user",
        "SELECT * FROM warden.roles",
        "SELECT * FROM warden.labels",
    ] {
        v.refused("sam", sql, "42501");
    }
    // Still itself after every try.
    assert_eq!(
        v.ok("sam", "SELECT session_user, current_user"),
        format!("{}|{}\n", mine.trim(), mine.trim())
    );
}

/// No instance changes the schema: row security, policies and the trigger stay, and no table,
/// temporary table, schema, view or function of its own appears.
#[test]
fn an_instance_cannot_change_the_schema_or_turn_row_security_off() {
    let Some(v) = Vault::start("sandbox") else {
        return;
    };
    for sql in [
        "ALTER TABLE notes DISABLE ROW LEVEL SECURITY",
        "ALTER TABLE notes NO FORCE ROW LEVEL SECURITY",
        "DROP POLICY warden_select ON notes",
        "CREATE POLICY open ON notes FOR SELECT USING (true)",
        "ALTER TABLE notes DISABLE TRIGGER warden_stamp",
        "DROP TABLE notes",
        "TRUNCATE notes",
        "CREATE TABLE drop_box (x text)",
        "CREATE TEMP TABLE drop_box (x text)",
        "CREATE SCHEMA drop_box",
        "CREATE VIEW drop_box AS SELECT 1",
        "CREATE FUNCTION drop_box() RETURNS int LANGUAGE sql AS 'SELECT 1'",
        "ALTER TABLE warden.labels DISABLE ROW LEVEL SECURITY",
        // Comments are in catalogs every role reads: a channel, were they writable.
        "DO $$ BEGIN EXECUTE format('COMMENT ON ROLE %I IS ''secret''', session_user); END $$",
        "COMMENT ON DATABASE warden_app_vault IS 'secret'",
        "COMMENT ON TABLE notes IS 'secret'",
        "ALTER DATABASE warden_app_vault SET search_path = 'secret'",
        "CREATE PUBLICATION leak FOR TABLE notes",
    ] {
        v.refused("sam", sql, "42501");
    }
    assert_eq!(
        v.admin(
            "SELECT relrowsecurity, relforcerowsecurity FROM pg_class WHERE oid = 'notes'::regclass"
        ),
        "t|t"
    );
    assert_eq!(
        v.admin("SELECT count(*) FROM pg_policy WHERE polrelid = 'notes'::regclass"),
        "4"
    );
    assert_eq!(
        v.admin("SELECT tgenabled FROM pg_trigger WHERE tgname = 'warden_stamp'"),
        "O"
    );
    assert_eq!(
        v.admin(
            "SELECT (SELECT count(*) FROM pg_class WHERE relname = 'drop_box') \
             + (SELECT count(*) FROM pg_namespace WHERE nspname = 'drop_box') \
             + (SELECT count(*) FROM pg_proc WHERE proname = 'drop_box')"
        ),
        "0"
    );
}

/// No instance runs a program on the server, reads or writes its files, stores large objects
/// outside row security, or reaches another database through dblink or a foreign data wrapper.
#[test]
fn an_instance_cannot_reach_server_programs_files_or_other_databases() {
    let Some(v) = Vault::start("sandbox") else {
        return;
    };
    // A directory the server's OS user could write to, were it told to.
    let marks = v.top.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    std::fs::set_permissions(&marks, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let m = marks.display();
    for sql in [
        format!("COPY (SELECT 1) TO PROGRAM 'cat > {m}/program'"),
        // Through the roles that would allow it, were the instance's a member.
        format!(
            "SET ROLE pg_execute_server_program; COPY (SELECT 1) TO PROGRAM 'cat > {m}/program'"
        ),
        format!("SET ROLE pg_write_server_files; COPY (SELECT 1) TO '{m}/file'"),
        "SET ROLE pg_read_server_files; SELECT pg_read_file('/etc/passwd')".into(),
        format!("COPY (SELECT 1) TO '{m}/file'"),
        format!("COPY notes (body) FROM PROGRAM 'cat > {m}/from'"),
        "COPY notes (body) FROM '/etc/passwd'".into(),
        "SELECT pg_read_file('/etc/passwd')".into(),
        "SELECT pg_read_binary_file('/etc/passwd')".into(),
        "SELECT pg_ls_dir('.')".into(),
        "SELECT pg_stat_file('/etc/passwd')".into(),
        "SELECT lo_import('/etc/passwd')".into(),
        "SELECT lo_create(0)".into(),
        "SELECT lo_from_bytea(0, 'secret')".into(),
        "CREATE EXTENSION dblink".into(),
        "CREATE EXTENSION postgres_fdw".into(),
        "CREATE EXTENSION file_fdw".into(),
        "CREATE FOREIGN DATA WRAPPER leak".into(),
    ] {
        v.refused("sam", &sql, "42501");
    }
    let written: Vec<_> = std::fs::read_dir(&marks).unwrap().collect();
    assert!(written.is_empty(), "{written:?}");
    assert_eq!(v.admin("SELECT count(*) FROM pg_largeobject_metadata"), "0");
    assert_eq!(
        v.admin("SELECT string_agg(extname, ',') FROM pg_extension"),
        "plpgsql"
    );
    assert_eq!(v.admin("SELECT count(*) FROM pg_foreign_data_wrapper"), "0");
}

/// No instance signals across labels: a NOTIFY at S never reaches a LISTEN at U through the
/// proxy, and `pg_notify` and advisory locks are refused.
#[test]
fn an_instance_cannot_signal_across_labels() {
    let Some(v) = Vault::start("sandbox") else {
        return;
    };
    v.ok("ursula", "SELECT 1");
    for sql in [
        "SELECT pg_notify('leak', 'secret')",
        "SELECT pg_listening_channels()",
        "SELECT pg_advisory_lock(1)",
        "SELECT pg_try_advisory_lock(1)",
        "SELECT pg_advisory_xact_lock(1, 2)",
        "SELECT pg_advisory_lock_shared(1)",
        "SELECT pg_try_advisory_xact_lock_shared(1)",
    ] {
        v.refused("sam", sql, "42501");
    }
    // U's server connection, idle in the proxy's pool: S may neither end nor cancel it (one
    // bit a request), nor leave a named prepared transaction every role could list.
    let u_role = v.admin(
        "SELECT r.role FROM warden.roles r JOIN warden.labels l ON l.id = r.label_id \
         WHERE l.label = 'U'",
    );
    let u_backend = admin_sql(
        &v.data_dir,
        "postgres",
        &format!("SELECT pid FROM pg_stat_activity WHERE usename = '{u_role}' LIMIT 1"),
    );
    let u_backend = u_backend.trim();
    assert!(!u_backend.is_empty(), "U's connection is not pooled");
    for f in ["pg_terminate_backend", "pg_cancel_backend"] {
        v.refused("sam", &format!("SELECT {f}({u_backend})"), "42501");
        let sql = format!("SET ROLE pg_signal_backend; SELECT {f}({u_backend})");
        v.refused("sam", &sql, "42501");
    }
    v.refused(
        "sam",
        "BEGIN; INSERT INTO notes (body) VALUES ('x'); PREPARE TRANSACTION 'secret'",
        "55000",
    );
    let alive = admin_sql(
        &v.data_dir,
        "postgres",
        &format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {u_backend}"),
    );
    assert_eq!(alive.trim(), "1");

    // A session through U's instance's socket listens; while it waits, S's instance NOTIFYs
    // (a statement PostgreSQL lets any role run); then the session runs two more queries,
    // after which PostgreSQL has sent it any notification it had.
    let socket_dir = v.instance_dir("U").join("data").join(".pg");
    assert!(socket_dir.join(".s.PGSQL.5432").exists());
    let work = v.top.path().join("notify");
    std::fs::create_dir(&work).unwrap();
    let answer = work.join("answer.json");
    let trigger = work.join("notify.py");
    std::fs::write(
        &trigger,
        "import sys, urllib.request\n\
         url, auth, out = sys.argv[1:4]\n\
         req = urllib.request.Request(url, data=b\"NOTIFY leak, 'secret'\", \
           headers={'authorization': auth})\n\
         open(out, 'wb').write(urllib.request.urlopen(req, timeout=60).read())\n",
    )
    .unwrap();
    let script = work.join("listen.sql");
    std::fs::write(
        &script,
        format!(
            "LISTEN leak;\n\\! python3 '{}' '{}/apps/vault/sql' '{}' '{}'\n\
             SELECT 'after';\nSELECT 'again';\n",
            trigger.display(),
            v.w.gateway,
            basic("sam", PASSWORD),
            answer.display()
        ),
    )
    .unwrap();
    let out = Command::new(PSQL)
        .arg(format!("host={} dbname={DB} user=x", socket_dir.display()))
        .args(["-X", "-At", "-v", "ON_ERROR_STOP=1", "-f"])
        .arg(&script)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    let notified: Value = serde_json::from_slice(&std::fs::read(&answer).unwrap()).unwrap();
    assert_eq!(notified["rc"], 0, "{notified}");
    assert!(
        !stdout.contains("notification") && !stderr.contains("notification"),
        "{stdout}{stderr}"
    );
    assert!(stdout.contains("after\nagain"), "{stdout}{stderr}");
}
