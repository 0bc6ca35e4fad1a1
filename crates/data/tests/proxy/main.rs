//! The data proxy against a real PostgreSQL: clients as apps run them (psql,
//! tokio-postgres, raw protocol for what no library sends), through the socket an instance
//! would get.

#![allow(clippy::unwrap_used)]

mod bounds;
mod late_cancel;
mod pg;
mod raw;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio_postgres::{AsyncMessage, Client, NoTls};
use warden_data::proxy::{Limits, Listener, Pool, Target};

use pg::{Pg, ROLE};
use raw::{
    query_message, raw_client, raw_client_params, raw_client_with_key, read_all,
    read_all_until_ready, startup,
};

/// A PostgreSQL and one proxy listener in front of it.
struct Setup {
    pg: Pg,
    pool: Pool,
    target: Target,
    listener: Listener,
    _dir: TempDir,
}

impl Setup {
    async fn new(limits: Limits) -> Setup {
        let pg = Pg::start().await;
        let target = pg.target();
        Setup::with_target(pg, target, limits)
    }

    /// A listener for `target` (the server itself, or something in front of it).
    fn with_target(pg: Pg, target: Target, limits: Limits) -> Setup {
        let pool = Pool::new(limits);
        let dir = tempfile::tempdir().unwrap();
        let listener = Listener::bind(
            dir.path().join(".s.PGSQL.5432"),
            target.clone(),
            pool.clone(),
        )
        .unwrap();
        Setup {
            pg,
            pool,
            target,
            listener,
            _dir: dir,
        }
    }

    /// Another instance's socket, same role, same pool.
    fn second_listener(&self) -> (Listener, TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let l = Listener::bind(
            dir.path().join(".s.PGSQL.5432"),
            self.target.clone(),
            self.pool.clone(),
        )
        .unwrap();
        (l, dir)
    }

    fn dir(&self) -> &Path {
        self.listener.path().parent().unwrap()
    }

    /// Waits (bounded) until the pool holds `n` idle connections for the role.
    async fn until_idle(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.pool.idle(&self.target) != n {
            assert!(
                Instant::now() < deadline,
                "the pool never held {n} idle connections"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A tokio-postgres client through the socket in `dir`, as an app would connect: any user,
/// any database name, no password.
async fn connect(dir: &Path) -> Result<Client, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::Config::new()
        .host_path(dir)
        .user("whoever")
        .dbname("ignored")
        .application_name("test-app")
        .connect(NoTls)
        .await?;
    tokio::spawn(conn);
    Ok(client)
}

/// What a refusal said: the server's message and hint, or the client's error.
fn text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} ({})", db.message(), db.hint().unwrap_or("")),
        None => format!("{e}: {:?}", std::error::Error::source(e)),
    }
}

/// The error a client that must be refused gets.
async fn refused(dir: &Path, what: &str) -> tokio_postgres::Error {
    match connect(dir).await {
        Ok(_) => panic!("not {what}"),
        Err(e) => e,
    }
}

async fn backend_pid(c: &Client) -> i32 {
    c.query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn proxy_psql_and_tokio_postgres_query_with_no_password() {
    let s = Setup::new(Limits::default()).await;
    // psql, never prompting (-w): a password request would fail it.
    // tokio's Command: the proxy runs on this test's one thread, so psql must not block it.
    let out = tokio::process::Command::new("/usr/bin/psql")
        .arg(format!("host={} dbname=x user=nobody", s.dir().display()))
        .args([
            "-w",
            "-X",
            "-At",
            "-c",
            "SELECT current_user || ' ' || current_setting('application_name')",
        ])
        .env_remove("PGPASSWORD")
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "psql: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{ROLE} psql")
    );

    let c = connect(s.dir()).await.unwrap();
    let row = c
        .query_one(
            "SELECT current_user::text, current_database()::text, $1::int + 1",
            &[&41i32],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            row.get::<_, String>(0),
            row.get::<_, String>(1),
            row.get::<_, i32>(2)
        ),
        (ROLE.into(), pg::DATABASE.into(), 42)
    );
    let app: String = c
        .query_one("SHOW application_name", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        app, "test-app",
        "an allowed startup parameter reaches the server"
    );
}

#[tokio::test]
async fn proxy_refuses_startup_parameters_off_the_allow_list() {
    let s = Setup::new(Limits::default()).await;
    let r = tokio_postgres::Config::new()
        .host_path(s.dir())
        .user("x")
        .options("-c statement_timeout=1")
        .connect(NoTls)
        .await;
    let err = text(&r.err().expect("options refused"));
    assert!(
        err.contains("does not take the startup parameter \"options\""),
        "{err}"
    );
    connect(s.dir())
        .await
        .unwrap()
        .simple_query("SELECT 1")
        .await
        .unwrap();
}

#[tokio::test]
async fn proxy_pools_server_connections_and_resets_them() {
    let s = Setup::new(Limits::default()).await;
    let mut pids = HashSet::new();
    for _ in 0..200 {
        let c = connect(s.dir()).await.unwrap();
        pids.insert(backend_pid(&c).await);
        drop(c);
        // Each client leaves before the next comes, as an app's short-lived connections do;
        // waiting for the reset keeps a loaded machine's slow one from counting as a miss
        // (CI once saw a fifth backend).
        s.until_idle(1).await;
    }
    assert!(
        pids.len() <= 4,
        "200 clients opened {} server backends",
        pids.len()
    );
    let admin = s.pg.admin().await;
    let n: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = $1",
            &[&ROLE],
        )
        .await
        .unwrap()
        .get(0);
    assert!(n <= 4, "{n} backends for the role");

    // Session state of one client is not seen by the next on the same server connection.
    s.until_idle(pids.len().min(8)).await;
    let idle = s.pool.idle(&s.target);
    let a = connect(s.dir()).await.unwrap();
    let pid = backend_pid(&a).await;
    a.batch_execute("CREATE SCHEMA IF NOT EXISTS other; SET search_path = other; SET statement_timeout = '123s'; PREPARE p AS SELECT 1; CREATE TEMP TABLE t (x int);").await.unwrap();
    drop(a);
    // Once A's connection is back, it is the newest idle one, the one B gets.
    s.until_idle(idle).await;
    let b = connect(s.dir()).await.unwrap();
    assert_eq!(
        backend_pid(&b).await,
        pid,
        "the next client got the same server connection"
    );
    let path: String = b.query_one("SHOW search_path", &[]).await.unwrap().get(0);
    assert!(!path.contains("other"), "search_path leaked: {path}");
    let timeout: String = b
        .query_one("SHOW statement_timeout", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(timeout, "0");
    assert!(
        b.batch_execute("EXECUTE p").await.is_err(),
        "a prepared statement leaked"
    );
    assert!(
        b.batch_execute("SELECT * FROM t").await.is_err(),
        "a temp table leaked"
    );
    drop(b);
    s.until_idle(idle).await;

    // A client that sends a query and Terminate at once, without waiting for the answer,
    // leaves a connection that is drained, reset and kept.
    let mut raw = raw_client(s.listener.path()).await;
    let mut msg = query_message("SELECT pg_sleep(0.2)");
    msg.extend_from_slice(&[b'X', 0, 0, 0, 4]);
    raw.write_all(&msg).await.unwrap();
    drop(raw);
    s.until_idle(idle).await;
}

#[tokio::test]
async fn proxy_startup_parameters_do_not_carry_to_the_next_client() {
    let s = Setup::new(Limits::default()).await;
    let params = [
        ("user", "x"),
        ("TimeZone", "Asia/Tokyo"),
        ("application_name", "first"),
    ];
    let (mut a, _) = raw_client_params(s.listener.path(), &params).await;
    let said = {
        a.write_all(&query_message("SHOW TimeZone")).await.unwrap();
        read_all_until_ready(&mut a).await
    };
    assert!(said.contains("Asia/Tokyo"), "{said}");
    a.write_all(&[b'X', 0, 0, 0, 4]).await.unwrap();
    drop(a);
    // The pool's one connection, reset and then given the first client's parameters again
    // (the next client of an app most likely sends the same ones), goes to a client that
    // sends others: it has its own and the role's defaults, nothing of the first's.
    s.until_idle(1).await;
    let b = connect(s.dir()).await.unwrap();
    let tz: String = b.query_one("SHOW TimeZone", &[]).await.unwrap().get(0);
    assert_ne!(tz, "Asia/Tokyo");
    let app: String = b
        .query_one("SHOW application_name", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(app, "test-app");
}

#[tokio::test]
async fn proxy_client_leaving_inside_a_transaction_leaves_it_behind() {
    let s = Setup::new(Limits {
        max_idle: 1,
        ..Limits::default()
    })
    .await;
    let setup = connect(s.dir()).await.unwrap();
    setup.batch_execute("CREATE TABLE t (x int)").await.unwrap();
    drop(setup);
    s.until_idle(1).await;
    let a = connect(s.dir()).await.unwrap();
    let pid = backend_pid(&a).await;
    a.batch_execute("BEGIN; INSERT INTO t VALUES (1);")
        .await
        .unwrap();
    drop(a);
    // Wait until the proxy has dealt with that connection: closed (correct) or pooled.
    let admin = s.pg.admin().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let alive: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .await
            .unwrap()
            .get(0);
        if alive == 0 || s.pool.idle(&s.target) == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the abandoned connection was neither closed nor pooled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let b = connect(s.dir()).await.unwrap();
    let xid: Option<i64> = b
        .query_one("SELECT txid_current_if_assigned()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        xid, None,
        "the next client is inside the abandoned transaction"
    );
    let n: i64 = b
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 0);
}

#[tokio::test]
async fn proxy_cancels_what_a_departed_client_left_running() {
    let s = Setup::new(Limits {
        server_timeout: Duration::from_secs(1),
        ..Limits::default()
    })
    .await;
    let mut raw = raw_client(s.listener.path()).await;
    raw.write_all(&query_message("SELECT pg_sleep(60)"))
        .await
        .unwrap();
    let admin = s.pg.admin().await;
    let running = "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(60)' AND state = 'active'";
    let deadline = Instant::now() + Duration::from_secs(10);
    while admin
        .query_one(running, &[])
        .await
        .unwrap()
        .get::<_, i64>(0)
        == 0
    {
        assert!(Instant::now() < deadline, "the query never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(raw);
    // Far less than the sleep's 60 s: the proxy waits a second for an answer, then cancels.
    let deadline = Instant::now() + Duration::from_secs(20);
    while admin
        .query_one(running, &[])
        .await
        .unwrap()
        .get::<_, i64>(0)
        != 0
    {
        assert!(
            Instant::now() < deadline,
            "the departed client's query still runs"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn proxy_drops_every_notification() {
    let s = Setup::new(Limits::default()).await;
    let (listener, mut conn) = tokio_postgres::Config::new()
        .host_path(s.dir())
        .user("x")
        .connect(NoTls)
        .await
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(m)) = std::future::poll_fn(|cx| conn.poll_message(cx)).await {
            if let AsyncMessage::Notification(n) = m {
                let _ = tx.send(n.payload().to_owned());
            }
        }
    });
    listener.batch_execute("LISTEN ch").await.unwrap();
    let other = connect(s.dir()).await.unwrap();
    other
        .batch_execute("NOTIFY ch, 'by statement'; SELECT pg_notify('ch', 'by function');")
        .await
        .unwrap();
    // The listener's next statements read whatever the server queued for it first.
    tokio::time::sleep(Duration::from_millis(200)).await;
    listener.batch_execute("SELECT 1").await.unwrap();
    listener.batch_execute("SELECT 1").await.unwrap();
    assert!(rx.try_recv().is_err(), "a notification crossed the proxy");
}

#[tokio::test]
async fn proxy_refuses_malformed_startups_and_huge_messages() {
    let s = Setup::new(Limits {
        max_message: 1 << 20,
        ..Limits::default()
    })
    .await;
    let sock = s.listener.path().to_owned();
    let mut raw = UnixStream::connect(&sock).await.unwrap();
    raw.write_all(&[0, 0, 0, 3]).await.unwrap();
    assert!(read_all(&mut raw).await.contains("invalid startup packet"));
    let mut raw = UnixStream::connect(&sock).await.unwrap();
    raw.write_all(&[0x7f, 0, 0, 0]).await.unwrap();
    assert!(read_all(&mut raw).await.contains("invalid startup packet"));
    let mut raw = UnixStream::connect(&sock).await.unwrap();
    raw.write_all(&startup(&[("user", "x")], 2 << 16))
        .await
        .unwrap();
    assert!(read_all(&mut raw)
        .await
        .contains("unsupported frontend protocol 2.0"));

    let c = connect(s.dir()).await.unwrap();
    let huge = "x".repeat(2 << 20);
    let err = c
        .query_one("SELECT length($1)", &[&huge])
        .await
        .unwrap_err();
    let err = err
        .as_db_error()
        .map(|e| e.message().to_owned())
        .unwrap_or_else(|| err.to_string());
    assert!(err.contains("past the data socket's bound"), "{err}");
    // A raw message claiming 2 GB is refused from its header alone.
    let mut raw = raw_client(&sock).await;
    raw.write_all(&[b'Q', 0x7f, 0xff, 0xff, 0xff])
        .await
        .unwrap();
    assert!(read_all(&mut raw)
        .await
        .contains("past the data socket's bound"));

    // Well-behaved clients of this listener and of another still work.
    let ok: i32 = connect(s.dir())
        .await
        .unwrap()
        .query_one("SELECT 7", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(ok, 7);
    let (other, _d) = s.second_listener();
    connect(other.path().parent().unwrap())
        .await
        .unwrap()
        .batch_execute("SELECT 1")
        .await
        .unwrap();
}

#[tokio::test]
async fn proxy_closes_a_client_whose_startup_is_late() {
    let limits = Limits {
        max_clients: 1,
        startup_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let s = Setup::new(limits).await;
    // A client that connects and says nothing holds the listener's only slot, until the
    // startup timeout closes it.
    let mut silent = UnixStream::connect(s.listener.path()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut buf = Vec::new();
    let closed = tokio::time::timeout(Duration::from_secs(10), silent.read_to_end(&mut buf)).await;
    assert!(
        matches!(closed, Ok(Ok(0))),
        "a silent client was not closed: {closed:?}"
    );
    connect(s.dir())
        .await
        .unwrap()
        .batch_execute("SELECT 1")
        .await
        .unwrap();
}

#[tokio::test]
async fn proxy_says_unreachable_while_postgres_is_down_and_recovers() {
    let s = Setup::new(Limits::default()).await;
    connect(s.dir())
        .await
        .unwrap()
        .batch_execute("SELECT 1")
        .await
        .unwrap();
    s.until_idle(1).await;
    s.pg.stop();
    // A client with no parameters to set, so only the pool's liveness check stands between
    // it and the dead idle connection.
    let mut raw = UnixStream::connect(s.listener.path()).await.unwrap();
    raw.write_all(&startup(&[("user", "x")], 196_608))
        .await
        .unwrap();
    let said = read_all(&mut raw).await;
    assert!(
        said.contains("warden cannot reach the app's database")
            && said.contains("it retries by itself")
            && said.contains("08006"),
        "{said}"
    );
    let err = refused(s.dir(), "refused while down").await;
    let msg = err
        .as_db_error()
        .map(|e| format!("{} {:?}", e.message(), e.hint()))
        .unwrap_or_default();
    assert!(
        msg.contains("warden cannot reach the app's database") && msg.contains("retry"),
        "{err}: {msg}"
    );
    s.pg.start_again();
    let ok: i32 = connect(s.dir())
        .await
        .unwrap()
        .query_one("SELECT 8", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(ok, 8);
}

#[tokio::test]
async fn proxy_forwards_only_the_cancels_it_handed_out() {
    let s = Setup::new(Limits::default()).await;
    let c = connect(s.dir()).await.unwrap();
    let token = c.cancel_token();
    let started = Instant::now();
    let sleeping = tokio::spawn(async move { c.batch_execute("SELECT pg_sleep(60)").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    token.cancel_query(NoTls).await.unwrap();
    let err = sleeping.await.unwrap().unwrap_err();
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::QUERY_CANCELED),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));

    // A made-up key, and the right key sent to another listener, cancel nothing.
    let sock: PathBuf = s.listener.path().to_owned();
    let (mut raw, key) = raw_client_with_key(&sock).await;
    let (other, _d) = s.second_listener();
    raw.write_all(&query_message("SELECT pg_sleep(1.5)"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (path, key) in [(sock.as_path(), (key.0 ^ 1, key.1)), (other.path(), key)] {
        let mut cancel = UnixStream::connect(path).await.unwrap();
        let mut p = 16i32.to_be_bytes().to_vec();
        for v in [80_877_102, key.0, key.1] {
            p.extend_from_slice(&i32::to_be_bytes(v));
        }
        cancel.write_all(&p).await.unwrap();
        read_all(&mut cancel).await;
    }
    let answer = read_all_until_ready(&mut raw).await;
    assert!(!answer.contains("canceling statement"), "{answer}");
    assert!(answer.contains("SELECT 1"), "{answer}");
}
