//! Labelled rows, tried from each role they bind, against a real private PostgreSQL.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use warden_auth::lattice::Lattice;
use warden_data::schema::{Admin, Claim, SchemaError};
use warden_data::server::{Endpoint, Server};

const LABELS: [&str; 5] = ["U", "S", "S:{A}", "S:{B}", "S:{A,B}"];

/// Each label writes one row; each sees exactly the rows its label dominates; S:{A} and S:{B}
/// see nothing of each other.
#[tokio::test]
async fn read_down_over_levels_and_categories() {
    let (_dir, server) = private_server().await;
    let admin = Admin::new(&server, key(), lattice());
    app_with_notes(&admin, "notes").await;
    let mut clients = Vec::new();
    for l in LABELS {
        let login = admin.label_role("notes", l, None).await.unwrap();
        let c = connect(&login).await.unwrap();
        c.execute("INSERT INTO notes (body) VALUES ($1)", &[&l])
            .await
            .unwrap();
        clients.push(c);
    }
    let expect: [&[&str]; 5] = [
        &["U"],
        &["S", "U"],
        &["S", "S:{A}", "U"],
        &["S", "S:{B}", "U"],
        &["S", "S:{A,B}", "S:{A}", "S:{B}", "U"],
    ];
    for (i, c) in clients.iter().enumerate() {
        assert_eq!(bodies(c).await, expect[i], "what {} sees", LABELS[i]);
    }
    let shown = admin.show("notes").await.unwrap();
    assert_eq!(shown.tables.len(), 1);
    assert_eq!(shown.tables[0].rows_per_label.len(), 5);
    assert!(shown.size_bytes > 0);
}

/// A role updates and deletes only rows of exactly its label, and whatever label it writes,
/// its rows carry its own.
#[tokio::test]
async fn no_write_down_no_write_up() {
    let (_dir, server) = private_server().await;
    let admin = Admin::new(&server, key(), lattice());
    app_with_notes(&admin, "notes").await;
    let u = connect(&admin.label_role("notes", "U", None).await.unwrap())
        .await
        .unwrap();
    let s = connect(&admin.label_role("notes", "S", None).await.unwrap())
        .await
        .unwrap();
    let sa = connect(&admin.label_role("notes", "S:{A}", None).await.unwrap())
        .await
        .unwrap();
    for (c, body) in [(&u, "u"), (&s, "s"), (&sa, "sa")] {
        c.execute("INSERT INTO notes (body) VALUES ($1)", &[&body])
            .await
            .unwrap();
    }
    // S sees u and s, but changes only s.
    let n = s
        .execute("UPDATE notes SET body = body || '!'", &[])
        .await
        .unwrap();
    assert_eq!(n, 1, "S updates only its own row");
    let n = s
        .execute("DELETE FROM notes WHERE body = 'u'", &[])
        .await
        .unwrap();
    assert_eq!(n, 0, "S cannot delete a U row (write-down)");
    let n = u
        .execute("DELETE FROM notes WHERE body <> 'u'", &[])
        .await
        .unwrap();
    assert_eq!(n, 0, "U cannot delete what it cannot see (write-up)");
    // The label column is warden's: what S sets is ignored, on insert and on update.
    let u_label: i32 = u
        .query_one("SELECT warden_label FROM notes WHERE body = 'u'", &[])
        .await
        .unwrap()
        .get(0);
    s.execute(
        "INSERT INTO notes (body, warden_label, warden_owner) VALUES ('down', $1, 'x')",
        &[&u_label],
    )
    .await
    .unwrap();
    s.execute(
        "UPDATE notes SET warden_label = $1 WHERE body = 's!'",
        &[&u_label],
    )
    .await
    .unwrap();
    assert_eq!(bodies(&u).await, ["u"], "nothing S wrote reached U");
    assert_eq!(bodies(&s).await, ["down", "s!", "u"]);
    let n: i64 = s
        .query_one(
            "SELECT count(*) FROM notes WHERE warden_owner IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0, "warden_owner is warden's too");
}

/// Two users of one label see and change only their own rows.
#[tokio::test]
async fn per_user_rows_are_the_users_own() {
    let (_dir, server) = private_server().await;
    let admin = Admin::new(&server, key(), lattice());
    app_with_notes(&admin, "notes").await;
    let alice = connect(&admin.label_role("notes", "S", Some("alice")).await.unwrap())
        .await
        .unwrap();
    let bob = connect(&admin.label_role("notes", "S", Some("bob")).await.unwrap())
        .await
        .unwrap();
    alice
        .execute("INSERT INTO notes (body) VALUES ('a')", &[])
        .await
        .unwrap();
    bob.execute(
        "INSERT INTO notes (body, warden_owner) VALUES ('b', 'alice')",
        &[],
    )
    .await
    .unwrap();
    assert_eq!(bodies(&alice).await, ["a"]);
    assert_eq!(
        bodies(&bob).await,
        ["b"],
        "bob's row is bob's whatever he wrote"
    );
    assert_eq!(
        bob.execute("UPDATE notes SET body = 'x'", &[])
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        bob.execute("DELETE FROM notes WHERE body = 'a'", &[])
            .await
            .unwrap(),
        0
    );
    assert_eq!(bodies(&alice).await, ["a"]);
    // Dropping the app takes its database and roles.
    admin.drop_app("notes").await.unwrap();
    let gone = server.admin(None).await.unwrap();
    let roles: i64 = gone
        .query_one(
            "SELECT count(*) FROM pg_roles WHERE rolname ~ '^w[ol]_'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(roles, 0);
    assert!(matches!(
        admin.label_role("notes", "S", None).await,
        Err(SchemaError::NoApp(_))
    ));
}

/// A level inserted in the middle: every role still sees what it should, and the new level's
/// role sits between.
#[tokio::test]
async fn a_lattice_change_keeps_read_down() {
    let (_dir, server) = private_server().await;
    let mut admin = Admin::new(&server, key(), lattice());
    app_with_notes(&admin, "notes").await;
    // Connections made before the change: only set_lattice re-ranks their labels.
    let mut before = Vec::new();
    for l in ["U", "S", "S:{A}"] {
        let c = connect(&admin.label_role("notes", l, None).await.unwrap())
            .await
            .unwrap();
        c.execute("INSERT INTO notes (body) VALUES ($1)", &[&l])
            .await
            .unwrap();
        before.push((l, c));
    }
    let lost = admin
        .set_lattice(Lattice {
            levels: vec!["U".into(), "C".into(), "S".into()],
            categories: vec!["A".into(), "B".into()],
        })
        .await
        .unwrap();
    assert!(lost.is_empty());
    let c = connect(&admin.label_role("notes", "C", None).await.unwrap())
        .await
        .unwrap();
    c.execute("INSERT INTO notes (body) VALUES ('C')", &[])
        .await
        .unwrap();
    assert_eq!(bodies(&c).await, ["C", "U"], "what C sees");
    let expect: [&[&str]; 3] = [&["U"], &["C", "S", "U"], &["C", "S", "S:{A}", "U"]];
    for ((l, c), seen) in before.iter().zip(expect) {
        assert_eq!(bodies(c).await, seen, "what {l} sees after the change");
    }
    // A lattice without S: S's rows are read by no one, and S reads nothing.
    let lost = admin
        .set_lattice(Lattice {
            levels: vec!["U".into(), "C".into()],
            categories: vec!["A".into(), "B".into()],
        })
        .await
        .unwrap();
    assert!(lost.contains(&"S:{}".to_owned()), "{lost:?}");
    assert!(
        bodies(&before[1].1).await.is_empty(),
        "a lost label reads nothing"
    );
    assert_eq!(bodies(&c).await, ["C", "U"], "and is read by no one");
}

/// A declassifier writes at the lower label it was granted, and the write is recorded.
#[tokio::test]
async fn a_declassifier_writes_down_and_is_recorded() {
    let (_dir, server) = private_server().await;
    let admin = Admin::new(&server, key(), lattice());
    app_with_notes(&admin, "stats").await;
    let s = connect(&admin.label_role("stats", "S", None).await.unwrap())
        .await
        .unwrap();
    let u = connect(&admin.label_role("stats", "U", None).await.unwrap())
        .await
        .unwrap();
    let u_label: i32 = {
        u.execute("INSERT INTO notes (body) VALUES ('u')", &[])
            .await
            .unwrap();
        u.query_one("SELECT warden_label FROM notes", &[])
            .await
            .unwrap()
            .get(0)
    };
    let down = "INSERT INTO notes (body, warden_label) VALUES ('mean', $1)";
    s.execute(down, &[&u_label]).await.unwrap();
    assert_eq!(
        bodies(&u).await,
        ["u"],
        "not a declassifier yet: the row stays S"
    );
    admin.declassifier("stats", Some("U")).await.unwrap();
    s.execute(down, &[&u_label]).await.unwrap();
    assert_eq!(bodies(&u).await, ["mean", "u"]);
    let admin_c = server.admin(Some("warden_app_stats")).await.unwrap();
    let n: i64 = admin_c
        .query_one("SELECT count(*) FROM warden.declassified", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
}

/// The audit trail's claims on declassified rows: summed per (from, to) label name; a claim
/// dropped before commit (warden crashed before its records were durable) leaves its rows to
/// the next; rows an open claim holds are skipped by another (a second node); a committed
/// claim's rows are never claimed again.
#[tokio::test]
async fn declassified_rows_are_claimed_once_and_a_dropped_claim_loses_none() {
    let (_dir, server) = private_server().await;
    let admin = Admin::new(&server, key(), lattice());
    app_with_notes(&admin, "stats").await;
    admin.declassifier("stats", Some("U")).await.unwrap();
    let s = connect(&admin.label_role("stats", "S", None).await.unwrap())
        .await
        .unwrap();
    let down = "INSERT INTO notes (body, warden_label) VALUES ($1, warden.declassify_to())";
    let write = |n: usize| {
        let s = &s;
        async move {
            for i in 0..n {
                s.execute(down, &[&format!("row {i}")]).await.unwrap();
            }
        }
    };
    write(3).await;
    let sums = |c: &Claim| {
        c.writes
            .iter()
            .map(|w| (w.from.clone(), w.to.clone(), w.count))
            .collect::<Vec<_>>()
    };
    // Labels as warden names them in the database: canonical, with their categories.
    let three = vec![("S:{}".to_owned(), "U:{}".to_owned(), 3)];
    let claim = admin.claim_declassified("stats").await.unwrap().unwrap();
    assert_eq!(sums(&claim), three);
    // Held by an open claim: another reader gets nothing of it.
    assert!(admin.claim_declassified("stats").await.unwrap().is_none());
    drop(claim);
    // Dropped uncommitted: the same rows again (its connection's end rolled it back).
    let claim = wait_claim(&admin).await;
    assert_eq!(sums(&claim), three);
    claim.commit().await.unwrap();
    assert!(admin.claim_declassified("stats").await.unwrap().is_none());
    write(2).await;
    let claim = admin.claim_declassified("stats").await.unwrap().unwrap();
    assert_eq!(sums(&claim), [("S:{}".to_owned(), "U:{}".to_owned(), 2)]);
}

/// The next claim, once the server has ended a dropped one's session.
async fn wait_claim(admin: &Admin<'_>) -> Claim {
    for _ in 0..100 {
        if let Some(c) = admin.claim_declassified("stats").await.unwrap() {
            return c;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("a dropped claim's rows never came back");
}

/// `warden.declassify_to()` names the granted label only to a session that dominates it, in
/// a marked app: elsewhere it refuses, and nothing is written or recorded.
#[tokio::test]
async fn declassify_to_names_the_granted_label_only_where_it_may_be_written() {
    let (_dir, server) = private_server().await;
    let admin = Admin::new(&server, key(), lattice());
    app_with_notes(&admin, "stats").await;
    let role = |l: &'static str| {
        let admin = &admin;
        async move {
            connect(&admin.label_role("stats", l, None).await.unwrap())
                .await
                .unwrap()
        }
    };
    let (u, sa, sb) = (role("U").await, role("S:{A}").await, role("S:{B}").await);
    let down = "INSERT INTO notes (body, warden_label) VALUES ('down', warden.declassify_to())";
    refused(&sa, down).await;
    admin.declassifier("stats", Some("S:{A}")).await.unwrap();
    refused(&sb, down).await;
    sa.batch_execute(down).await.unwrap();
    admin.declassifier("stats", Some("U")).await.unwrap();
    sb.batch_execute(down).await.unwrap();
    admin.declassifier("stats", None).await.unwrap();
    refused(&sb, down).await;
    assert_eq!(
        bodies(&u).await,
        ["down"],
        "only S:{{B}}'s write under the U mark is U's"
    );
    let shown = admin.show("stats").await.unwrap();
    assert_eq!(
        shown.declassified_writes, 1,
        "S:{{A}} writing at S:{{A}} is not a write down"
    );
    assert_eq!(shown.declassify_to, None);
}

/// A unique key not scoped by label fails labelling, naming the table and index; one that
/// includes warden_label passes.
#[tokio::test]
async fn a_unique_key_not_scoped_by_label_fails_labelling() {
    let (_dir, server) = private_server().await;
    let admin = Admin::new(&server, key(), lattice());
    let owner = admin.create_app("users").await.unwrap();
    let c = connect(&owner).await.unwrap();
    c.batch_execute("CREATE TABLE accounts (id serial PRIMARY KEY, email text UNIQUE)")
        .await
        .unwrap();
    let e = admin.label_tables("users").await.unwrap_err();
    match &e {
        SchemaError::Unlabellable { table, reason } => {
            assert_eq!(table, "accounts");
            assert!(reason.contains("accounts_email_key"), "{reason}");
        }
        other => panic!("expected Unlabellable, got {other:?}"),
    }
    c.batch_execute(
        "ALTER TABLE accounts DROP CONSTRAINT accounts_email_key;\
         ALTER TABLE accounts ADD COLUMN warden_label int;\
         ALTER TABLE accounts ADD UNIQUE (warden_label, email)",
    )
    .await
    .unwrap();
    c.batch_execute(
        "CREATE TABLE slots (id serial PRIMARY KEY, during int4range, \
         EXCLUDE USING gist (during WITH &&))",
    )
    .await
    .unwrap();
    let e = admin.label_tables("users").await.unwrap_err();
    assert!(
        matches!(&e, SchemaError::Unlabellable { table, .. } if table == "slots"),
        "{e:?}"
    );
    c.batch_execute(
        "DROP TABLE slots; \
         CREATE TABLE tokens (id uuid PRIMARY KEY DEFAULT gen_random_uuid())",
    )
    .await
    .unwrap();
    assert_eq!(
        admin.label_tables("users").await.unwrap(),
        ["accounts", "tokens"]
    );
    // Scoped by label: two labels may hold the same key.
    for l in ["U", "S"] {
        let r = connect(&admin.label_role("users", l, None).await.unwrap())
            .await
            .unwrap();
        r.execute("INSERT INTO accounts (email) VALUES ('a@x')", &[])
            .await
            .unwrap();
    }
}

/// A server given by URL (here the private one's socket, as an operator's would be a host) is
/// administered the same way, and its roles log in where the URL points.
#[tokio::test]
async fn an_external_url_is_administered_the_same_way() {
    let (dir, _private) = private_server().await;
    let socket = dir
        .path()
        .join("run")
        .display()
        .to_string()
        .replace('/', "%2F");
    let url = format!("postgresql://warden_admin@{socket}:5432/postgres");
    let server = Server::external(&url).unwrap();
    let admin = Admin::new(&server, key(), lattice());
    app_with_notes(&admin, "ext").await;
    let login = admin.label_role("ext", "S", None).await.unwrap();
    assert!(
        matches!(login.endpoint, Endpoint::Socket { .. }),
        "{login:?}"
    );
    let s = connect(&login).await.unwrap();
    s.execute("INSERT INTO notes (body) VALUES ('s')", &[])
        .await
        .unwrap();
    assert_eq!(bodies(&s).await, ["s"]);
    assert!(!format!("{login:?}").contains(login.password()));
}

/// Instances of one app start at once (a web instance and a worker of one label, or of two
/// labels): their roles are set up at the same moment, each granting on the same database
/// and tables, which PostgreSQL refuses as "tuple concurrently updated" to all but one. Every
/// start gets its role.
#[tokio::test]
async fn roles_set_up_at_once_all_succeed() {
    let (_dir, server) = private_server().await;
    let admin = Admin::new(&server, key(), lattice());
    app_with_notes(&admin, "notes").await;
    // Each start as its own agent call would make it: its own admin, its own connections.
    let admins: Vec<Admin> = (0..2 * LABELS.len())
        .map(|_| Admin::new(&server, key(), lattice()))
        .collect();
    for round in 0..3 {
        let setups = admins
            .iter()
            .zip(LABELS.iter().cycle())
            .map(|(a, l)| a.label_role("notes", l, None));
        for (i, r) in futures_util::future::join_all(setups)
            .await
            .into_iter()
            .enumerate()
        {
            assert!(r.is_ok(), "round {round}, role {i}: {:?}", r.err());
        }
    }
}
