//! Helpers for the crate's tests against a real private PostgreSQL.
#![allow(dead_code, clippy::unwrap_used)]

use tokio_postgres::{Client, Config, NoTls};
use warden_auth::lattice::Lattice;
use warden_data::schema::{Admin, DataKey, RoleLogin};
use warden_data::server::{Endpoint, Server};

/// A private server in a fresh directory (kept alive by the returned guard).
pub async fn private_server() -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::private(dir.path())
        .await
        .expect("private server starts");
    (dir, server)
}

pub fn key() -> DataKey {
    DataKey([7; 32])
}

/// Levels U < S, categories A, B.
pub fn lattice() -> Lattice {
    Lattice {
        levels: vec!["U".into(), "S".into()],
        categories: vec!["A".into(), "B".into()],
    }
}

/// Connects as `login`, the way the proxy will.
pub async fn connect(login: &RoleLogin) -> Result<Client, tokio_postgres::Error> {
    connect_db(login, &login.dbname).await
}

/// Connects as `login` to another database.
pub async fn connect_db(login: &RoleLogin, db: &str) -> Result<Client, tokio_postgres::Error> {
    let mut c = Config::new();
    match &login.endpoint {
        Endpoint::Socket { dir, port } => c.host_path(dir).port(*port),
        Endpoint::Tcp { host, port } => c.host(host).port(*port),
    };
    c.user(&login.role).password(login.password()).dbname(db);
    let (client, conn) = c.connect(NoTls).await?;
    tokio::spawn(conn);
    Ok(client)
}

/// Creates `app` with a `notes` table made by the owner (as a release migration would) and
/// labels it.
pub async fn app_with_notes(admin: &Admin<'_>, app: &str) {
    let owner = admin.create_app(app).await.expect("create app");
    let c = connect(&owner).await.expect("owner connects");
    c.batch_execute("CREATE TABLE notes (id serial PRIMARY KEY, body text NOT NULL)")
        .await
        .expect("migration");
    admin.label_tables(app).await.expect("label tables");
}

/// The bodies of the notes `c` sees, sorted.
pub async fn bodies(c: &Client) -> Vec<String> {
    let rows = c
        .query("SELECT body FROM notes ORDER BY body", &[])
        .await
        .expect("select");
    rows.iter().map(|r| r.get(0)).collect()
}

/// Asserts that `sql` is refused with `insufficient_privilege` (not any error: a typo must
/// not pass for a refusal).
pub async fn refused(c: &Client, sql: &str) {
    let e = c
        .batch_execute(sql)
        .await
        .expect_err(&format!("{sql} must be refused"));
    let code = e.code().map(|c| c.code().to_owned());
    assert_eq!(
        code.as_deref(),
        Some("42501"),
        "{sql}: expected insufficient_privilege, got {e:?}"
    );
}
