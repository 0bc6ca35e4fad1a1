//! Bounds that make a flood cost only its own: clients per listener (an instance), server
//! connections and waiting clients per app.

use std::time::{Duration, Instant};

use warden_data::proxy::{Limits, Listener};

use super::{connect, refused, text, Setup};

#[tokio::test]
async fn proxy_bounds_clients_per_listener() {
    let s = Setup::new(Limits {
        max_clients: 4,
        ..Limits::default()
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(connect(s.dir()).await.unwrap());
    }
    for _ in 0..20 {
        let err = text(&refused(s.dir(), "refused past the bound").await);
        assert!(err.contains("too many connections"), "{err}");
    }
    let (other, _d) = s.second_listener();
    connect(other.path().parent().unwrap())
        .await
        .unwrap()
        .batch_execute("SELECT 1")
        .await
        .unwrap();
    for c in &held {
        c.batch_execute("SELECT 1").await.unwrap();
    }
    held.pop();
    let deadline = Instant::now() + Duration::from_secs(10);
    while connect(s.dir()).await.is_err() {
        assert!(Instant::now() < deadline, "a freed slot was never reused");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One app's clients past its bound of server connections wait, a bounded number of them,
/// then get 53300; another app's clients are served all along.
#[tokio::test]
async fn proxy_bounds_server_connections_per_app_and_other_apps_are_served() {
    let s = Setup::new(Limits {
        max_server_per_app: 2,
        max_waiting_per_app: 1,
        queue_timeout: Duration::from_secs(30),
        ..Limits::default()
    })
    .await;
    // Two instances of the app (two listeners) hold its two server connections.
    let (second, _d) = s.second_listener();
    let a = connect(s.dir()).await.unwrap();
    let b = connect(second.path().parent().unwrap()).await.unwrap();
    for c in [&a, &b] {
        c.batch_execute("SELECT 1").await.unwrap();
    }
    // The third waits for one of them; the fourth finds the queue full: refused at once.
    let dir = s.dir().to_owned();
    let waiting = tokio::spawn(async move {
        let c = connect(&dir).await?;
        c.query_one("SELECT 3", &[])
            .await
            .map(|r| r.get::<_, i32>(0))
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.pool.waiting(&s.target) != 1 {
        assert!(Instant::now() < deadline, "the third client never waited");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = Instant::now();
    let err = refused(s.dir(), "refused past the app's bound").await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "a client past the queue waited"
    );
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::TOO_MANY_CONNECTIONS),
        "{}",
        text(&err)
    );
    let said = text(&err);
    assert!(
        said.contains("all 2 of its server connections are in use")
            && said.contains("other apps are not affected"),
        "{said}"
    );
    // Another app on the same server and pool is served.
    let other = s.pg.another_app("wl_other", "otherdb").await;
    let dir = tempfile::tempdir().unwrap();
    let _l = Listener::bind(dir.path().join(".s.PGSQL.5432"), other, s.pool.clone()).unwrap();
    let o = connect(dir.path()).await.unwrap();
    let n: i32 = o.query_one("SELECT 7", &[]).await.unwrap().get(0);
    assert_eq!(n, 7);
    // One of the app's clients leaves: the waiting one gets its connection.
    drop(a);
    let got = tokio::time::timeout(Duration::from_secs(20), waiting)
        .await
        .expect("the waiting client was served when a connection came back")
        .unwrap()
        .unwrap();
    assert_eq!(got, 3);
    b.batch_execute("SELECT 1").await.unwrap();
}

/// The pool's per-app bounds do not grow with every app that ever had a client: an app is
/// kept while a connection of it is open, and forgotten once it has none.
#[tokio::test]
async fn proxy_forgets_an_app_once_it_has_no_connection() {
    let s = Setup::new(Limits {
        idle_timeout: Duration::from_millis(300),
        ..Limits::default()
    })
    .await;
    let c = connect(s.dir()).await.unwrap();
    c.batch_execute("SELECT 1").await.unwrap();
    // Several sweeps (every 150 ms) pass while the client holds its connection.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(
        s.pool.apps(),
        1,
        "an app with a connection open was forgotten"
    );
    c.batch_execute("SELECT 1").await.unwrap();
    drop(c);
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.pool.apps() != 0 {
        assert!(
            Instant::now() < deadline,
            "an app with no connection is never forgotten"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An app whose database is dropped goes from the pool at once: its idle connections and
/// its bound.
#[tokio::test]
async fn proxy_forgets_a_dropped_apps_connections_and_bound() {
    let s = Setup::new(Limits::default()).await;
    let c = connect(s.dir()).await.unwrap();
    c.batch_execute("SELECT 1").await.unwrap();
    drop(c);
    s.until_idle(1).await;
    assert_eq!(s.pool.apps(), 1);
    s.pool.forget(&s.target.server, &s.target.database);
    assert_eq!(s.pool.idle(&s.target), 0, "its idle connection is kept");
    assert_eq!(s.pool.apps(), 0, "its bound is kept");
    // The pool still serves the app if it is there again.
    let c = connect(s.dir()).await.unwrap();
    c.batch_execute("SELECT 1").await.unwrap();
}
