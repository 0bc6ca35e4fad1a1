//! What a security review of the data crate found, each tried the way the review's attacker
//! would: an app author whose release migration runs as the owner, or whose instance holds a
//! label role, against warden's real superuser labelling path.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use tokio_postgres::Client;
use warden_data::schema::{owner_role_name, Admin, SchemaError};
use warden_data::server::Server;

async fn is_superuser(server: &Server, role: &str) -> bool {
    let c = server.admin(None).await.unwrap();
    c.query_one("SELECT rolsuper FROM pg_roles WHERE rolname = $1", &[&role])
        .await
        .unwrap()
        .get(0)
}

/// Creates `app` and runs `migration` as its owner; returns the owner's connection and role.
async fn migrate(admin: &Admin<'_>, app: &str, migration: &str) -> (Client, String) {
    let login = admin.create_app(app).await.unwrap();
    let c = connect(&login).await.unwrap();
    c.batch_execute(&migration.replace("{owner}", &login.role))
        .await
        .unwrap();
    (c, login.role)
}

fn unlabellable(e: &SchemaError) -> (&str, &str) {
    match e {
        SchemaError::Unlabellable { table, reason } => (table, reason),
        other => panic!("expected Unlabellable, got {other:?}"),
    }
}

/// Filling a label column the migration made runs the app's triggers; a statement trigger
/// that `RESET ROLE`s (back to the session's superuser, were it warden's admin session) gains
/// nothing: the fill is logged in as the owner.
#[tokio::test]
async fn filling_label_columns_runs_the_apps_triggers_as_the_owner_only() {
    let (_dir, server) = private_server().await;
    let admin = Admin::new(&server, key(), lattice());
    let (_c, role) = migrate(
        &admin,
        "esc",
        "CREATE TABLE t (id serial PRIMARY KEY, x text, warden_label int);\
         INSERT INTO t (x) VALUES ('a');\
         CREATE FUNCTION esc() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             RESET ROLE; ALTER ROLE \"{owner}\" SUPERUSER; RETURN NULL; END $$;\
         CREATE TRIGGER esc BEFORE UPDATE ON t FOR EACH STATEMENT EXECUTE FUNCTION esc();",
    )
    .await;
    let result = admin.label_tables("esc").await;
    assert!(
        !is_superuser(&server, &role).await,
        "the owner made itself superuser"
    );
    assert!(result.is_err(), "the trigger's refusal fails the labelling");
}

/// Label columns of the app's own type (a domain whose CHECK calls the app's function, which
/// warden's trigger would run) or with a default fail labelling, and the guard keeps them
/// plain afterwards; warden's SECURITY DEFINER functions are owned by no superuser.
#[tokio::test]
async fn label_columns_are_plain_and_warden_functions_run_as_no_superuser() {
    let (_dir, server) = private_server().await;
    let admin = Admin::new(&server, key(), lattice());
    let (c, role) = migrate(
        &admin,
        "dom",
        "CREATE FUNCTION esc(int) RETURNS boolean LANGUAGE plpgsql AS $$ BEGIN \
             ALTER ROLE \"{owner}\" SUPERUSER; RETURN true; END $$;",
    )
    .await;
    // A domain calling the app's function is refused at once (the owner's guard); one of
    // built-in checks only is still no label column.
    refused(&c, "CREATE DOMAIN esc_lbl AS int CHECK (esc(VALUE))").await;
    c.batch_execute(
        "CREATE DOMAIN lbl AS int CHECK (VALUE > 0);\
         CREATE TABLE t (id serial PRIMARY KEY, x text, warden_label lbl);",
    )
    .await
    .unwrap();
    let e = admin.label_tables("dom").await.unwrap_err();
    let (table, reason) = unlabellable(&e);
    assert_eq!(table, "t");
    assert!(reason.contains("warden_label (public.lbl)"), "{reason}");
    c.batch_execute(
        "ALTER TABLE t ALTER COLUMN warden_label TYPE int;\
         ALTER TABLE t ADD COLUMN warden_owner text DEFAULT 'x'",
    )
    .await
    .unwrap();
    let e = admin.label_tables("dom").await.unwrap_err();
    assert!(unlabellable(&e).1.contains("warden_owner"), "{e:?}");
    c.batch_execute("ALTER TABLE t ALTER COLUMN warden_owner DROP DEFAULT")
        .await
        .unwrap();
    admin.label_tables("dom").await.unwrap();
    for sql in [
        "ALTER TABLE t ALTER COLUMN warden_label SET DEFAULT 1",
        "ALTER TABLE t ALTER COLUMN warden_owner SET DEFAULT 'x'",
    ] {
        refused(&c, sql).await;
    }
    let s = connect(&admin.label_role("dom", "S", None).await.unwrap())
        .await
        .unwrap();
    s.execute("INSERT INTO t (x) VALUES ('s')", &[])
        .await
        .unwrap();
    assert!(!is_superuser(&server, &role).await);
    let a = server.admin(Some("warden_app_dom")).await.unwrap();
    let by_superusers: Vec<String> = a
        .query(
            "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_roles r ON r.oid = p.proowner \
             WHERE p.pronamespace = 'warden'::regnamespace AND p.prosecdef AND r.rolsuper",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        by_superusers.is_empty(),
        "owned by a superuser: {by_superusers:?}"
    );
}

/// A table the owner gives a policy named like warden's is not labelled, and no label role
/// is granted it.
#[tokio::test]
async fn a_policy_named_like_wardens_grants_nothing() {
    let (_dir, server) = private_server().await;
    let admin = Admin::new(&server, key(), lattice());
    app_with_notes(&admin, "notes").await;
    let owner = connect(&admin.owner_role("notes").await.unwrap())
        .await
        .unwrap();
    owner
        .batch_execute(
            "CREATE TABLE leak (x text); ALTER TABLE leak ENABLE ROW LEVEL SECURITY;\
             CREATE POLICY warden_select ON leak USING (true) WITH CHECK (true)",
        )
        .await
        .unwrap();
    let s = connect(&admin.label_role("notes", "S", None).await.unwrap())
        .await
        .unwrap();
    refused(&s, "INSERT INTO leak VALUES ('secret')").await;
    assert_eq!(admin.show("notes").await.unwrap().tables.len(), 1);
}

/// Only an index's key columns scope it by label: `INCLUDE (warden_label)` does not.
#[tokio::test]
async fn an_included_label_column_does_not_scope_a_key() {
    let (_dir, server) = private_server().await;
    let admin = Admin::new(&server, key(), lattice());
    migrate(
        &admin,
        "inc",
        "CREATE TABLE acc (id serial PRIMARY KEY, email text, warden_label int);\
         CREATE UNIQUE INDEX acc_email ON acc (email) INCLUDE (warden_label);",
    )
    .await;
    let e = admin.label_tables("inc").await.unwrap_err();
    let (table, reason) = unlabellable(&e);
    assert_eq!(table, "acc");
    assert!(reason.contains("acc_email"), "{reason}");
}

/// DDL that evaluates the migration's code over a labelled table's rows (outside row
/// security) is refused once the table holds rows: a rewrite before it starts (the leaking
/// function never runs), a CHECK, an expression or partial index when the command ends (its
/// writes undone). The same DDL on a labelled table still empty passes.
#[tokio::test]
async fn ddl_evaluating_code_over_labelled_rows_is_refused() {
    let (_dir, server) = private_server().await;
    let admin = Admin::new(&server, key(), lattice());
    app_with_notes(&admin, "notes").await;
    app_with_notes(&admin, "empty").await;
    let s = connect(&admin.label_role("notes", "S", None).await.unwrap())
        .await
        .unwrap();
    s.execute("INSERT INTO notes (body) VALUES ('secret')", &[])
        .await
        .unwrap();
    let leak = "CREATE TABLE box (x text); CREATE SEQUENCE calls;\
         CREATE FUNCTION leak(text) RETURNS text LANGUAGE plpgsql AS $$ BEGIN \
             PERFORM nextval('calls'); INSERT INTO box VALUES ($1); RETURN $1; END $$;\
         CREATE FUNCTION ileak(text) RETURNS text LANGUAGE plpgsql IMMUTABLE AS $$ BEGIN \
             RETURN leak($1); END $$;";
    let attacks = [
        "ALTER TABLE notes ALTER COLUMN body TYPE varchar USING leak(body)",
        "ALTER TABLE notes ADD CONSTRAINT c CHECK (leak(body) IS NOT NULL)",
        "CREATE INDEX ON notes (ileak(body))",
        "CREATE INDEX ON notes (id) WHERE ileak(body) IS NOT NULL",
    ];
    for app in ["notes", "empty"] {
        let owner = connect(&admin.owner_role(app).await.unwrap())
            .await
            .unwrap();
        owner.batch_execute(leak).await.unwrap();
        for (i, sql) in attacks.iter().enumerate() {
            // On an empty table a rewrite evaluates nothing; what is stored to be evaluated
            // later (by REINDEX, ANALYZE, a validation) is refused with or without rows.
            if app == "empty" && i == 0 {
                owner.batch_execute(sql).await.unwrap();
                continue;
            }
            refused(&owner, sql).await;
            if i == 0 {
                let called: bool = owner
                    .query_one("SELECT is_called FROM calls", &[])
                    .await
                    .unwrap()
                    .get(0);
                assert!(!called, "the rewrite ran the migration's code");
            }
        }
        let boxed: i64 = owner
            .query_one("SELECT count(*) FROM box", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(boxed, 0, "{app}: a row reached the migration's table");
    }
    // What passed on the empty table is labelled.
    admin.label_tables("empty").await.unwrap();
}

/// A role's own settings and password are warden's again whenever warden hands out its
/// login; every app and role has a connection limit, and every role an idle-in-transaction timeout and a
/// temporary-file limit.
#[tokio::test]
async fn role_settings_and_password_are_reset_and_bounded() {
    let (_dir, server) = private_server().await;
    let admin = Admin::new(&server, key(), lattice());
    app_with_notes(&admin, "notes").await;
    let login = admin.label_role("notes", "S", None).await.unwrap();
    let s = connect(&login).await.unwrap();
    s.batch_execute(
        "ALTER ROLE CURRENT_USER SET search_path = 'signal';\
         ALTER ROLE CURRENT_USER IN DATABASE warden_app_notes SET search_path = 'signal';\
         ALTER ROLE CURRENT_USER PASSWORD 'mine'",
    )
    .await
    .unwrap();
    let login = admin.label_role("notes", "S", None).await.unwrap();
    let s = connect(&login)
        .await
        .expect("warden's password works again");
    let path: String = s.query_one("SHOW search_path", &[]).await.unwrap().get(0);
    assert_ne!(path, "signal");
    let a = server.admin(None).await.unwrap();
    let per_db: i64 = a
        .query_one(
            "SELECT count(*) FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole \
             WHERE r.rolname = $1 AND s.setdatabase <> 0",
            &[&login.role],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        per_db, 0,
        "the role's own settings for its database are left"
    );
    let app_limit: i32 = a
        .query_one(
            "SELECT datconnlimit FROM pg_database WHERE datname = 'warden_app_notes'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(app_limit, 48, "one app's connections are bounded");
    for role in [login.role.clone(), owner_role_name("notes")] {
        let row = a
            .query_one(
                "SELECT rolconnlimit, array_to_string(rolconfig, ',') FROM pg_roles \
                 WHERE rolname = $1",
                &[&role],
            )
            .await
            .unwrap();
        let (limit, config): (i32, String) = (row.get(0), row.get(1));
        assert_eq!(limit, 32, "{role}");
        assert!(
            config.contains("idle_in_transaction_session_timeout=60s")
                && config.contains("temp_file_limit=1GB"),
            "{role}: {config}"
        );
    }
}

/// An app trigger running after warden's cannot put another user's name on a row: a row's
/// user is exactly the writer's (none for a role of no user).
#[tokio::test]
async fn an_app_trigger_cannot_spoof_a_rows_user() {
    let (_dir, server) = private_server().await;
    let admin = Admin::new(&server, key(), lattice());
    migrate(
        &admin,
        "spoof",
        "CREATE TABLE notes (id serial PRIMARY KEY, body text);\
         CREATE FUNCTION spoof() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             IF NEW.body = 'planted' THEN NEW.warden_owner := 'alice'; END IF; \
             RETURN NEW; END $$;\
         ALTER TABLE notes ADD COLUMN warden_owner text;\
         CREATE TRIGGER zz_spoof BEFORE INSERT ON notes FOR EACH ROW EXECUTE FUNCTION spoof();",
    )
    .await;
    admin.label_tables("spoof").await.unwrap();
    let s = connect(&admin.label_role("spoof", "S", None).await.unwrap())
        .await
        .unwrap();
    let e = s
        .execute("INSERT INTO notes (body) VALUES ('planted')", &[])
        .await
        .unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("42501"), "{e:?}");
    s.execute("INSERT INTO notes (body) VALUES ('plain')", &[])
        .await
        .unwrap();
    let alice = connect(&admin.label_role("spoof", "S", Some("alice")).await.unwrap())
        .await
        .unwrap();
    assert!(bodies(&alice).await.is_empty());
}

/// A label role cannot choose or change a serial key's value (a duplicate-key error would
/// tell it a row of another label holds that id), and the guard keeps a key not scoped by
/// label off a labelled table (labelling would refuse it only after the migration committed).
#[tokio::test]
async fn keys_are_not_probes() {
    let (_dir, server) = private_server().await;
    let admin = Admin::new(&server, key(), lattice());
    app_with_notes(&admin, "notes").await;
    let s = connect(&admin.label_role("notes", "S", None).await.unwrap())
        .await
        .unwrap();
    s.execute("INSERT INTO notes (body) VALUES ('s')", &[])
        .await
        .unwrap();
    refused(&s, "INSERT INTO notes (id, body) VALUES (1, 'probe')").await;
    refused(&s, "UPDATE notes SET id = 7").await;
    s.execute("UPDATE notes SET body = 's2'", &[])
        .await
        .unwrap();
    let owner = connect(&admin.owner_role("notes").await.unwrap())
        .await
        .unwrap();
    refused(&owner, "CREATE UNIQUE INDEX notes_body ON notes (body)").await;
    refused(&owner, "ALTER TABLE notes ADD UNIQUE (body)").await;
    owner
        .batch_execute("CREATE UNIQUE INDEX notes_scoped ON notes (warden_label, body)")
        .await
        .unwrap();
}
