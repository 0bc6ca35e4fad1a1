//! Two escapes a review found in the release phase: the app's code that maintenance (REINDEX,
//! ANALYZE, CLUSTER, VACUUM FULL, autovacuum) would run as the owner over every label's rows,
//! and a policy landing between labelling's checks and what it records as warden's.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use warden_data::schema::{db_name, owner_role_name, Admin, SchemaError};

/// The owner can make nothing that calls its own function (directly or through an operator)
/// where maintenance evaluates it over rows, nor expression statistics; built-in expressions
/// and plain statistics still pass.
#[tokio::test]
async fn the_owner_can_make_nothing_maintenance_would_run_its_code_in() {
    let (_dir, server) = private_server().await;
    let admin = Admin::new(&server, key(), lattice());
    app_with_notes(&admin, "maint").await;
    let o = connect(&admin.owner_role("maint").await.unwrap())
        .await
        .unwrap();
    o.batch_execute(
        "CREATE FUNCTION public.f(t text) RETURNS text IMMUTABLE LANGUAGE plpgsql AS \
             $$BEGIN RAISE NOTICE '%', t; RETURN t; END$$;\
         CREATE FUNCTION public.g(a text, b text) RETURNS boolean IMMUTABLE LANGUAGE plpgsql AS \
             $$BEGIN RAISE NOTICE '%', a; RETURN a = b; END$$;\
         CREATE OPERATOR === (leftarg = text, rightarg = text, function = public.g);\
         CREATE TABLE mine (x text);",
    )
    .await
    .unwrap();
    for sql in [
        "CREATE INDEX ON notes ((f(body)))",
        "CREATE INDEX ON notes (id) WHERE f(body) = 'x'",
        "CREATE INDEX ON notes (id) WHERE body === 'x'",
        "CREATE INDEX ON mine ((f(x)))",
        "ALTER TABLE notes ADD CONSTRAINT c CHECK (f(body) <> '')",
        "CREATE DOMAIN d AS text CHECK (f(VALUE) <> '')",
        "CREATE STATISTICS s ON (f(body)), id FROM notes",
        "CREATE STATISTICS s ON (lower(body)), id FROM notes",
        "CREATE TABLE p (x text) PARTITION BY LIST ((f(x)))",
    ] {
        refused(&o, sql).await;
    }
    let e = o
        .batch_execute("CREATE INDEX notes_f ON notes ((f(body)))")
        .await
        .unwrap_err();
    let text = e.as_db_error().unwrap().message().to_owned();
    assert!(
        text.contains("notes")
            && text.contains("index public.notes_f")
            && text.contains("public.f"),
        "names the table, the index and the function: {text}"
    );
    o.batch_execute(
        "CREATE INDEX ON notes (lower(body));\
         CREATE STATISTICS plain (dependencies) ON id, body FROM notes",
    )
    .await
    .expect("built-in expressions and plain statistics pass");
}

/// What got past the guard (made by a superuser, or before the guard knew of it) fails
/// labelling, naming the table and the object.
#[tokio::test]
async fn labelling_refuses_the_apps_code_where_maintenance_runs() {
    let (_dir, server) = private_server().await;
    let admin = Admin::new(&server, key(), lattice());
    app_with_notes(&admin, "legacy").await;
    let a = server.admin(Some(&db_name("legacy"))).await.unwrap();
    a.batch_execute(
        "CREATE FUNCTION public.f(t text) RETURNS text IMMUTABLE LANGUAGE sql AS $$SELECT t$$;\
         CREATE INDEX notes_f ON public.notes ((public.f(body)))",
    )
    .await
    .unwrap();
    let e = admin.label_tables("legacy").await.unwrap_err();
    match &e {
        SchemaError::Unlabellable { table, reason } => {
            assert_eq!(table, "notes");
            assert!(reason.contains("index public.notes_f"), "{reason}");
            assert!(reason.contains("public.f(text)"), "{reason}");
        }
        other => panic!("expected Unlabellable, got {other:?}"),
    }
    a.batch_execute(
        "DROP INDEX public.notes_f;\
         CREATE STATISTICS public.s ON (lower(body)), id FROM public.notes",
    )
    .await
    .unwrap();
    let e = admin.label_tables("legacy").await.unwrap_err();
    assert!(e.to_string().contains("statistics object"), "{e}");
}

/// Waits (bounded) until a backend of `db` waits for a lock.
async fn until_one_waits(server: &warden_data::server::Server, db: &str) {
    let a = server.admin(None).await.unwrap();
    for _ in 0..200 {
        let n: i64 = a
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 \
                 AND wait_event_type = 'Lock'",
                &[&db],
            )
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no backend of {db} came to wait for a lock");
}

/// A policy the owner makes while labelling runs (its statement held open on another
/// connection) is refused, never recorded as warden's.
#[tokio::test]
async fn a_policy_made_while_labelling_runs_is_never_recorded() {
    let (_dir, server) = private_server().await;
    let admin = Admin::new(&server, key(), lattice());
    app_with_notes(&admin, "race").await;
    let o = connect(&admin.owner_role("race").await.unwrap())
        .await
        .unwrap();
    o.batch_execute("CREATE TABLE t (x text)").await.unwrap();
    // The policy exists, uncommitted, while labelling starts: a check that does not wait for
    // the owner sees no policy.
    o.batch_execute("BEGIN; CREATE POLICY p ON t USING (true) WITH CHECK (true)")
        .await
        .unwrap();
    let labelling = {
        let admin = Admin::new(&server, key(), lattice());
        async move { admin.label_tables("race").await }
    };
    let commit = async {
        until_one_waits(&server, &db_name("race")).await;
        o.batch_execute("COMMIT").await.unwrap();
    };
    let (result, ()) = tokio::join!(labelling, commit);
    let a = server.admin(Some(&db_name("race"))).await.unwrap();
    let recorded: bool = a
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM warden.labelled WHERE relid = 'public.t'::regclass)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        !recorded,
        "t was recorded as labelled with the owner's policy"
    );
    match result {
        Err(SchemaError::Unlabellable { table, reason }) => {
            assert_eq!(table, "t");
            assert!(reason.contains("\"p\""), "{reason}");
        }
        other => panic!("expected t refused for its policy, got {other:?}"),
    }
}

/// A statement the release command left running (its socket closed) is ended before
/// labelling: what it would have done after its sleep never happens.
#[tokio::test]
async fn the_owners_sessions_end_before_labelling() {
    let (_dir, server) = private_server().await;
    let admin = Admin::new(&server, key(), lattice());
    app_with_notes(&admin, "late").await;
    let o = connect(&admin.owner_role("late").await.unwrap())
        .await
        .unwrap();
    o.batch_execute("CREATE TABLE t (x text)").await.unwrap();
    let late = tokio::spawn(async move {
        o.batch_execute("SELECT pg_sleep(3); CREATE POLICY p ON t USING (true) WITH CHECK (true)")
            .await
    });
    let a = server.admin(None).await.unwrap();
    for _ in 0..200 {
        let n: i64 = a
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = $1 \
                 AND query LIKE 'SELECT pg_sleep%'",
                &[&owner_role_name("late")],
            )
            .await
            .unwrap()
            .get(0);
        if n > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    admin.end_owner_sessions("late").await.unwrap();
    let ended = late.await.unwrap();
    assert!(ended.is_err(), "the owner's statement ran to its end");
    let db = server.admin(Some(&db_name("late"))).await.unwrap();
    let policies: i64 = db
        .query_one(
            "SELECT count(*) FROM pg_policies WHERE tablename = 't'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(policies, 0);
    admin.label_tables("late").await.unwrap();
}
