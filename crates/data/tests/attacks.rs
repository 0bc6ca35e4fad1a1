//! Attacks on labelled data, each tried by the role it must bind connecting straight to
//! PostgreSQL (the proxy is not in the way), and each refused by PostgreSQL itself.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use warden_data::schema::{owner_role_name, Admin};

/// A label role can do none of what would break labels or signal across them.
#[tokio::test]
async fn a_label_role_is_refused_every_escape() {
    let (_dir, server) = private_server().await;
    let admin = Admin::new(&server, key(), lattice());
    app_with_notes(&admin, "notes").await;
    app_with_notes(&admin, "other").await;
    let s_login = admin.label_role("notes", "S", None).await.unwrap();
    let u_login = admin.label_role("notes", "U", None).await.unwrap();
    let s = connect(&s_login).await.unwrap();
    let owner = owner_role_name("notes");
    let attacks = [
        format!("SET ROLE \"{owner}\""),
        format!("SET ROLE \"{}\"", u_login.role),
        format!("SET SESSION AUTHORIZATION \"{}\"", u_login.role),
        "ALTER TABLE notes DISABLE ROW LEVEL SECURITY".into(),
        "ALTER TABLE notes NO FORCE ROW LEVEL SECURITY".into(),
        "DROP POLICY warden_select ON notes".into(),
        "ALTER TABLE notes DISABLE TRIGGER warden_stamp".into(),
        "CREATE TABLE mine (x int)".into(),
        "CREATE TEMP TABLE mine (x int)".into(),
        "CREATE SCHEMA mine".into(),
        "COPY notes TO PROGRAM 'id'".into(),
        "SELECT pg_read_file('/etc/passwd')".into(),
        "SELECT pg_advisory_lock(1)".into(),
        "SELECT pg_try_advisory_xact_lock(1, 2)".into(),
        "SELECT lo_create(0)".into(),
        "SELECT pg_notify('c', 'secret')".into(),
        "SELECT rolpassword FROM pg_authid".into(),
        "SELECT application_name FROM pg_stat_activity".into(),
        "SELECT n_tup_ins FROM pg_stat_user_tables".into(),
        "SELECT pg_total_relation_size('notes')".into(),
        "SELECT pg_current_wal_lsn()".into(),
        "SELECT txid_current()".into(),
        "SELECT pg_current_xact_id()".into(),
        "SELECT pg_current_snapshot()".into(),
        "SELECT rolconfig FROM pg_roles".into(),
        "SELECT useconfig FROM pg_user".into(),
        "SELECT setconfig FROM pg_db_role_setting".into(),
        "CREATE EXTENSION dblink".into(),
        "CREATE EXTENSION postgres_fdw".into(),
        "SELECT * FROM warden.roles".into(),
        "UPDATE warden.labels SET level = 99".into(),
        "TRUNCATE notes".into(),
    ];
    for sql in &attacks {
        refused(&s, sql).await;
    }
    for db in ["warden_app_other", "postgres", "template1"] {
        let e = connect_db(&s_login, db)
            .await
            .err()
            .unwrap_or_else(|| panic!("connecting to {db} must be refused"));
        assert_eq!(e.code().map(|c| c.code()), Some("42501"), "{db}: {e:?}");
    }
    // Still a working role: the refusals are not a broken connection.
    s.execute("INSERT INTO notes (body) VALUES ('s')", &[])
        .await
        .unwrap();
}

/// The release migration is the app's code and runs as the owner, which owns the tables: the
/// guard refuses what would undo labelling, while an ordinary migration still runs.
#[tokio::test]
async fn the_owner_cannot_undo_labelling() {
    let (_dir, server) = private_server().await;
    let admin = Admin::new(&server, key(), lattice());
    app_with_notes(&admin, "notes").await;
    let s_login = admin.label_role("notes", "S", None).await.unwrap();
    let owner = connect(&admin.owner_role("notes").await.unwrap())
        .await
        .unwrap();
    let s_role = &s_login.role;
    let attacks = [
        "ALTER TABLE notes DISABLE ROW LEVEL SECURITY".to_owned(),
        "ALTER TABLE notes NO FORCE ROW LEVEL SECURITY".into(),
        "DROP POLICY warden_select ON notes".into(),
        "CREATE POLICY open ON notes FOR SELECT USING (true)".into(),
        "ALTER TABLE notes DISABLE TRIGGER warden_stamp".into(),
        "CREATE TABLE drop_box (x text); GRANT SELECT, INSERT ON drop_box TO PUBLIC".into(),
        format!("GRANT TRUNCATE ON notes TO \"{s_role}\""),
        "CREATE TABLE col_box (x text); GRANT SELECT (x), INSERT (x) ON col_box TO PUBLIC".into(),
        "GRANT CREATE ON SCHEMA public TO PUBLIC".into(),
        "CREATE FUNCTION f() RETURNS int LANGUAGE sql SECURITY DEFINER AS 'SELECT 1'".into(),
        "CREATE TABLE box (x text); \
         CREATE RULE copy AS ON INSERT TO notes DO ALSO INSERT INTO box VALUES (NEW.body)"
            .into(),
        "CREATE TABLE child (id serial PRIMARY KEY, \
         note int REFERENCES notes (id) ON DELETE CASCADE)"
            .into(),
    ];
    for sql in &attacks {
        refused(&owner, sql).await;
    }
    // The owner reads nothing either: it has no label.
    let s = connect(&s_login).await.unwrap();
    s.execute("INSERT INTO notes (body) VALUES ('s')", &[])
        .await
        .unwrap();
    assert!(bodies(&owner).await.is_empty());
    // An ordinary migration passes the guard, and relabelling keeps S's view.
    owner
        .batch_execute(
            "ALTER TABLE notes ADD COLUMN tag text; CREATE INDEX ON notes (tag); \
             CREATE TABLE child (id serial PRIMARY KEY, note int REFERENCES notes (id))",
        )
        .await
        .unwrap();
    assert_eq!(
        admin.label_tables("notes").await.unwrap(),
        ["child", "notes"]
    );
    assert_eq!(bodies(&s).await, ["s"]);
}

/// Warden's own connection is a superuser's: the app's code (a trigger) that warden's
/// labelling sets off runs as the owner, and gains nothing.
#[tokio::test]
async fn the_owner_gains_nothing_from_code_labelling_runs() {
    let (_dir, server) = private_server().await;
    let admin = Admin::new(&server, key(), lattice());
    let owner_login = admin.create_app("esc").await.unwrap();
    let owner = connect(&owner_login).await.unwrap();
    let role = &owner_login.role;
    owner
        .batch_execute(&format!(
            "CREATE TABLE t (id serial PRIMARY KEY, x text, warden_label int);\
             INSERT INTO t (x) VALUES ('a');\
             CREATE FUNCTION esc() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
                 ALTER ROLE \"{role}\" SUPERUSER; RETURN NEW; END $$;\
             CREATE TRIGGER esc BEFORE UPDATE ON t FOR EACH ROW EXECUTE FUNCTION esc();"
        ))
        .await
        .unwrap();
    let result = admin.label_tables("esc").await;
    let c = server.admin(None).await.unwrap();
    let superuser: bool = c
        .query_one("SELECT rolsuper FROM pg_roles WHERE rolname = $1", &[role])
        .await
        .unwrap()
        .get(0);
    assert!(!superuser, "the owner made itself superuser");
    assert!(result.is_err(), "the trigger's refusal fails the labelling");
}
